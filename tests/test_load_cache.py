"""mixc.load's cache is bounded (the CACHE_SIZE modules used last) and clearable
(mixc.clear_cache): a module that leaves it leaves sys.modules and linecache too, while every
cached module stays registered under its name (torch.compile looks it up there)."""

from __future__ import annotations

import linecache
import sys

import pytest
import torch

import mixc
from mixc import driver


def _spec(n: int) -> str:
    return f"mixer m{n}\nin x\nparam p = {n}\ny_t = p * x_t\n"


def _registered(module) -> bool:
    return sys.modules.get(module.__name__) is module and module.__file__ in linecache.cache


@pytest.fixture
def small_cache(monkeypatch):
    mixc.clear_cache()
    monkeypatch.setattr(driver, "CACHE_SIZE", 3)
    yield
    mixc.clear_cache()


def test_the_cache_keeps_the_modules_used_last(small_cache) -> None:
    modules = [mixc.load(text=_spec(n)) for n in range(3)]
    assert mixc.load(text=_spec(0)) is modules[0]  # used again: now the newest
    later = [mixc.load(text=_spec(n)) for n in range(3, 5)]  # evicts 1, then 2
    assert len(driver._CACHE) == 3
    for module in (modules[0], *later):
        assert _registered(module)
    for module in modules[1:]:
        assert module.__name__ not in sys.modules
        assert module.__file__ not in linecache.cache
    assert mixc.load(text=_spec(1)) is not modules[1]  # compiled again


def test_many_distinct_specs_do_not_grow_the_process(small_cache) -> None:
    names_before, lines_before = set(sys.modules), set(linecache.cache)
    for n in range(12):
        mixc.load(text=_spec(n))
    assert len(set(sys.modules) - names_before) == 3
    assert len(set(linecache.cache) - lines_before) == 3


def test_clear_cache_unregisters_every_module_and_they_still_run(small_cache) -> None:
    modules = [mixc.load(text=_spec(n)) for n in range(2)]
    mixc.clear_cache()
    assert not driver._CACHE
    x = torch.ones(1, 2, 1)
    for n, module in enumerate(modules):
        assert module.__name__ not in sys.modules
        assert module.__file__ not in linecache.cache
        assert torch.equal(module.chunk(x)[0], n * x)


def test_a_module_that_fails_to_import_leaves_nothing(small_cache, monkeypatch) -> None:
    lines_before = set(linecache.cache)
    monkeypatch.setattr(driver, "compile_source", lambda source, backend: "import not_a_module_x\n")
    with pytest.raises(mixc.MixcError, match="not_a_module_x"):
        mixc.load(text=_spec(0))
    assert set(linecache.cache) == lines_before and not driver._CACHE

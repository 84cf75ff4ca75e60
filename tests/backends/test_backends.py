"""Backends are `Backend` objects that render a lowered program, and the Triton backend shares
the PyTorch renderer through the public interface docs/adding-a-backend.md describes, nothing
else. The lowered program itself: what its dump says of the shipped specs' kernel calls."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from mixc.backends import BACKENDS, Backend, get
from mixc.backends.pytorch import kernels as pytorch_kernels
from mixc.driver import plan
from mixc.errors import MixcError
from mixc.lowering import dump, lower
from mixc.lowering import program as program_types
from tests.mixers import ROOT

DOC = ROOT / "docs" / "adding-a-backend.md"
TRITON = ROOT / "mixc" / "backends" / "triton"


def test_every_backend_is_a_backend_named_as_registered():
    assert set(BACKENDS) == {"pytorch", "triton"}
    for name, backend in BACKENDS.items():
        assert isinstance(backend, Backend)
        assert backend.name == name
        assert get(name) is backend


def test_an_unknown_backend_is_refused_with_the_known_ones():
    with pytest.raises(MixcError, match="unknown backend 'cuda'; available: pytorch, triton"):
        get("cuda")


def _documented() -> set[str]:
    """The names the doc's table of the PyTorch backend's public interface gives."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## A backend that differs only in its kernels", 1)[1]
    rows = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("| ")]
    names = set()
    for row in rows[1:]:  # after the header
        first = row.split(" | ")[0]
        names |= {m.split("(")[0] for m in re.findall(r"`([\w.]+)(?:\([^`]*\))?`", first)}
    return names


def _pytorch_names_used_by_triton() -> set[str]:
    """Every name of the PyTorch backend the Triton package imports or reads off a module of it
    (`kernels.DEFINITIONS` counts as `kernels.DEFINITIONS`)."""
    used = set()
    for path in TRITON.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "mixc.backends.pytorch"
            ):
                prefix = node.module.removeprefix("mixc.backends.pytorch").lstrip(".")
                for a in node.names:
                    full = f"{prefix}.{a.name}" if prefix else a.name
                    if full == "kernels":
                        aliases[a.asname or a.name] = "kernels"
                    else:
                        used.add(full)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id in aliases:
                    used.add(f"{aliases[node.value.id]}.{node.attr}")
    return used


def test_the_triton_backend_uses_only_the_documented_interface():
    documented = _documented()
    assert {"render_module", "KernelLibrary", "kernels.kernel_source"} <= documented
    used = _pytorch_names_used_by_triton()
    assert used, "the Triton backend reads nothing of the PyTorch backend?"
    # a kernel file calls PyTorch kernel definitions by name (the doc says so): any of
    # kernels.DEFINITIONS, imported from the file that defines it
    definitions = {
        f"kernels.{file}.{name}" for name, (file, _, _) in pytorch_kernels.DEFINITIONS.items()
    }
    other = used - definitions
    assert other <= documented, f"undocumented: {sorted(other - documented)}"
    assert not any(n.rsplit(".", 1)[-1].startswith("_") for n in other)


def test_the_program_is_immutable():
    for name in program_types.__all__:
        kind = getattr(program_types, name)
        if dataclasses.is_dataclass(kind):
            assert kind.__dataclass_params__.frozen, name


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("deltanet", ["H: chunk_delta from the carried states", "beta = beta_t [scalar]"]),
        ("deltaproduct", ["chunk_delta from the carried states, 2 sub-tokens a token"]),
        ("rwkv6", ["read a token early (S_{t-1} q_t)", "H: 1 products, decayed by exp(w_t)"]),
        ("mlstm", ["H and n: chunk_scalar_decay_stable", "log_scale = i_t"]),
        ("gated_retention", ["parallel:", "parallel_scalar_decay from zero"]),
    ],
)
def test_the_dump_shows_each_forms_kernel_calls(spec, says):
    text = dump(lower(plan(ROOT / "specs" / f"{spec}.mix")))
    for line in says:
        assert line in text, text


def test_explain_prints_the_program(capsys):
    from mixc.cli import main

    assert main(["explain", str(ROOT / "specs" / "gated_deltanet.mix"), "--program"]) == 0
    out = capsys.readouterr().out
    assert "H: chunk_delta from the carried states" in out
    assert "v[H] = v_t (times beta_t)" in out

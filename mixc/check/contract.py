"""The module under test: the spec compiled in-process, a module, or a module file mixc did not
write (hand-edited, or a third party's), and the compiled-module contract it must keep (the
spec's inputs, parameters and states, in order, and the forms)."""

from __future__ import annotations

import importlib.util
import os
import types
from pathlib import Path

from mixc.check.ranges import InputRanges
from mixc.errors import MixcError
from mixc.files import require_regular
from mixc.frontend.spec import Spec

__all__ = ["check_contract", "load_module", "module_under_test"]


def load_module(path: str | os.PathLike) -> types.ModuleType:
    """Import a module file by path (a compiled module, or any file with the same contract)."""
    path = Path(path)
    try:  # a directory, a device, a pipe (which would block the import) is refused
        require_regular(path, "module file")
    except FileNotFoundError:
        raise MixcError(f"{path}: no such module file") from None
    except OSError as exc:
        raise MixcError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise MixcError(f"{str(path)!r}: not a module file name") from None
    name = f"mixc_fuzz_target_{abs(hash(str(path.resolve()))) & 0xFFFFFFFF:08x}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise MixcError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # any error importing user code
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        raise MixcError(f"{path}: cannot import{where}: {type(exc).__name__}: {exc}") from None
    return module


def check_contract(r: InputRanges, module: types.ModuleType, where: str) -> None:
    """The module must declare the spec's inputs, parameters and states, and define the forms."""
    missing = [n for n in ("INPUTS", "STATES", "recurrent", "step") if not hasattr(module, n)]
    if missing:
        raise MixcError(f"{where}: not a mixc module: it defines no {', '.join(missing)}")

    def names(attr: str) -> tuple[str, ...]:
        try:
            return tuple(entry[0] for entry in getattr(module, attr, ()))
        except (TypeError, IndexError):
            raise MixcError(f"{where}: {attr} should be ((name, shape), ...)") from None

    for attr, want, what in (
        ("INPUTS", r.inputs, "inputs"),
        ("PARAMS", r.params, "parameters without a default"),
        ("PARAM_DEFAULTS", r.defaults, "parameters with a default"),
        ("STATES", r.states, "states"),
    ):
        got = names(attr)
        if got != want:
            raise MixcError(
                f"{where} does not match the spec: its {attr} are ({', '.join(got)}) "
                f"but the spec's {what} are ({', '.join(want)})"
            )


def module_under_test(
    spec: Spec, module: types.ModuleType | str | os.PathLike | None, backend: str
) -> tuple[types.ModuleType, str]:
    """(the module, how to name it): the spec compiled in-process by `backend`, a module, or a
    module file."""
    if module is None:
        from mixc.driver import load

        return load(spec.source, backend), "the compiled module"
    if isinstance(module, types.ModuleType):
        return module, getattr(module, "__file__", None) or module.__name__
    return load_module(module), str(module)

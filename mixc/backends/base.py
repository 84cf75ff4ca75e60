"""What a backend is: an object that renders a lowered program as a module's source text."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from mixc.lowering.program import Program


@runtime_checkable
class Backend(Protocol):
    """A backend renders a program (`mixc.lowering`) and decides nothing the program decides.

    `name` is what `--backend` calls it. `supports(program)` is None where `render` can render
    the program, else the reason it cannot (an "NYI: ..." a user reads). `render(program)` is
    the generated module's source text, the same bytes for the same program. `kernel_notes`
    are the lines `mixc explain --backend` prints about the kernels the program's calls run
    on this backend (none where there is nothing to add)."""

    name: str

    def supports(self, program: Program) -> str | None: ...

    def render(self, program: Program) -> str: ...

    def kernel_notes(self, program: Program) -> tuple[str, ...]: ...

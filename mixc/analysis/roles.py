"""What each read of a spec does: the roles (key, value, decay, erase, query, skip, ...) that
the names an expression reads play for the state or output that reads them. `mixc explain`
lists them per input; `mixc graph` labels its edges with them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mixc.frontend.ir import Expr, Name, Timed, walk

if TYPE_CHECKING:
    from mixc.analysis.plan import Plan

__all__ = ["Role", "read_roles"]


@dataclass(frozen=True)
class Role:
    """A role ("key", "query", ...) and the state or output it is for: a query read by an output
    is the query of a state ("query of H")."""

    role: str
    of: str

    def __str__(self) -> str:
        return f"{self.role} of {self.of}"


def read_roles(plan: Plan) -> dict[tuple[str, str], tuple[Role, ...]]:
    """(name read, the state or output reading it) -> its roles there, in a fixed order: a
    state's key, value and write scale, then its transition's roles (its class's `roles`:
    decay, erase, ...); an output's state reads ("read"), queries, readout scales and skip."""
    found: dict[tuple[str, str], list[Role]] = {}

    def add(role: str, e: Expr | None, reader: str, of: str | None = None) -> None:
        names = sorted({n.name for n in walk(e) if isinstance(n, Timed | Name)}) if e else ()
        for name in names:
            roles = found.setdefault((name, reader), [])
            if Role(role, of or reader) not in roles:
                roles.append(Role(role, of or reader))

    for s in plan.states:
        for w in s.writes:
            add("key", w.key, s.name)
            add("value", w.value, s.name)
            add("write scale", w.scale, s.name)
        for tr in s.transition.acting:
            for role, e in tr.transition_class.roles(tr):
                add(role, e, s.name)
    for o in plan.outputs:
        for r in o.readouts:
            add("read", Name(r.state), o.name)
            add("query", r.query, o.name, r.state)
            add("scale", r.scale, o.name, r.state)
        add("skip", o.skip, o.name)
    return {edge: tuple(roles) for edge, roles in found.items()}

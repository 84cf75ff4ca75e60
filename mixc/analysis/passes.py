"""Pipelines of states: which state's chunked pass must run before which.

A state's update may read other states through their readouts (`o_t = H1_t q_t` in
`H2_t = H2_{t-1} + o_t u_t^T`), and a readout's query may read other readouts (`Vs_t p_t` with
`p_t = exp(Ks_t q_t) / ...`). Given the readouts it reads, each state is still a linear
recurrence of its own class, so when these reads form no cycle the chunked form runs one pass
per level, a state's level being one more than the deepest state it reads; the readouts of
earlier passes are per-token inputs of later ones. A cycle (M reads H_{t-1}, H reads M_t) has
no such order: the spec keeps recurrent and step, and the reason names the cycle.
"""

from __future__ import annotations

import networkx as nx

from mixc.analysis.facts import Readout, StateFacts
from mixc.analysis.outputs import readout_name
from mixc.frontend.ir import Expr, Name, walk

__all__ = ["passes"]


def passes(
    states: tuple[StateFacts, ...], readouts: tuple[Readout, ...]
) -> tuple[dict[str, int], str | None]:
    """Each state's level (0: reads no other state), and why there is no order when the states
    read each other in a cycle (then every level is 0)."""
    g = _graph(states, readouts)
    if not nx.is_directed_acyclic_graph(g):
        edges = nx.find_cycle(g)
        return {s.name: 0 for s in states}, _cycle_text(g, edges)
    levels: dict[str, int] = {}
    for name in nx.topological_sort(g):
        levels[name] = max((levels[p] + 1 for p in g.predecessors(name)), default=0)
    return levels, None


def _graph(states, readouts) -> nx.DiGraph:
    """An edge A -> B, labelled with the readout, where B's pass needs a readout of A: B's
    update reads it, or a query of one of B's readouts does."""
    by_name = {readout_name(r.index): r for r in readouts}
    g = nx.DiGraph()
    g.add_nodes_from(s.name for s in states)
    for s in states:
        for name in s.reads:
            r = by_name[name]
            if r.state != s.name and not g.has_edge(r.state, s.name):
                g.add_edge(r.state, s.name, readout=r)
    for r in readouts:
        for inner in _named(r.query, by_name):
            if not g.has_edge(inner.state, r.state):
                g.add_edge(inner.state, r.state, readout=inner)
    return g


def _named(e: Expr, by_name: dict[str, Readout]) -> list[Readout]:
    return [by_name[n.name] for n in walk(e) if isinstance(n, Name) and n.name in by_name]


def _cycle_text(g: nx.DiGraph, edges) -> str:
    names = [u for u, _ in edges] + [edges[0][0]]
    reads = []
    for u, v in edges:
        r = g.edges[u, v]["readout"]
        at = f" at line {r.span.line}, column {r.span.column}" if r.span else ""
        reads.append(f"{v} reads {r.read}{at}")
    return (
        f"NYI: the states read each other's readouts in a cycle ({' -> '.join(names)}: "
        f"{'; '.join(reads)}); the chunked form runs one pass per state after the states it "
        "reads, and a cycle has no such order; recurrent and step carry every state"
    )

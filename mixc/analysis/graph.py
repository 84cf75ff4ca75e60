"""The dependency graph of a spec (what `mixc graph` draws and what shows which state an output
reads); the order of evaluation comes from the verifier (`equation_order`)."""

from __future__ import annotations

import networkx as nx

from mixc.algebra.expand import inline
from mixc.frontend.ir import Expr, Mixer, Name, Timed, walk

__all__ = ["dependency_graph", "inline_lets_only"]


def dependency_graph(mixer: Mixer) -> nx.DiGraph:
    """Nodes: every input, parameter, state and equation target, with `kind`. Edges: reads,
    labelled with `lag` (0 or 1)."""
    g = nx.DiGraph()
    for d in mixer.inputs:
        g.add_node(d.name, kind="input")
    for p in mixer.params:
        g.add_node(p.name, kind="param")
    for s in mixer.states:
        g.add_node(s.name, kind="state")
    outputs = {e.target for e in mixer.outputs}
    states = {s.name for s in mixer.states}
    for eq in mixer.equations:
        if eq.target not in states:
            g.add_node(eq.target, kind="output" if eq.target in outputs else "value")
    lets_only = _lets_only(mixer)
    for eq in mixer.equations:
        body = inline(lets_only, eq.value) if mixer.lets else eq.value
        for n in walk(body):
            if isinstance(n, Timed):
                lag = -n.offset
                if g.has_edge(n.name, eq.target):
                    lag = min(lag, g.edges[n.name, eq.target]["lag"])
                g.add_edge(n.name, eq.target, lag=lag)
            elif isinstance(n, Name) and n.name in g:
                g.add_edge(n.name, eq.target, lag=0)
    return g


def inline_lets_only(mixer: Mixer, e: Expr) -> Expr:
    if not mixer.lets:
        return e
    return inline(_lets_only(mixer), e)


def _lets_only(mixer: Mixer) -> Mixer:
    """`mixer` without its equations: what inlining its lets, and not its values, reads. One
    for all the equations of a spec (`inline` tables the lets of the mixer it is given)."""
    return Mixer(mixer.name, lets=mixer.lets, states=mixer.states)

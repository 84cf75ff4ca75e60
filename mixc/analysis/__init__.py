"""Analyses: pure functions from a verified spec to immutable facts, ending in one plan.

`analyze(spec)` finds, for every state, whether its update is affine in the state's previous
value, which transition class it belongs to (the first rule of the registry in
`mixc.transitions` that matches), its write term and log-space gates; for every output, its
readouts; and groups the states into chunked passes (`mixc.analysis.plan`). `costs(plan)` is the
cost model.

Import from the modules: `mixc.analysis.plan` (analyze, Plan), `mixc.analysis.facts`,
`mixc.analysis.cost`; this package imports nothing, so the transition classes can use the facts
without an import cycle.

Expressions in the facts are canonical (`mixc.algebra.canon`): equal math gives equal text, and
the rules compare canonical text, never the spelling.
"""

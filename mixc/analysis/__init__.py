"""Analyses: pure functions from a verified spec to immutable facts, ending in one plan.

`analyze(spec)` finds, for every state, whether its update is affine in the state's previous
value, which transition class it belongs to (the first rule of the registry in
`mixc.transitions` that matches), its write term and log-space gates; for every output, its
readouts; and groups the states into chunked passes (`mixc.analysis.plan`). `costs(plan)` is the
cost model.

Import from the modules: `mixc.analysis.plan` (analyze, Plan), `mixc.analysis.facts`,
`mixc.analysis.cost`. The transition classes (`mixc.transitions`) sit below the analysis: it
imports them, never the other way round.

Expressions in the facts are canonical (`mixc.algebra.canon`): equal math gives equal text, and
the rules compare canonical text, never the spelling.
"""

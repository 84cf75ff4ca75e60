"""A state of angles over whole sequences: a state that only feeds angles (see
`angle_states`), with no transition, summed in float64 by one cumulative sum instead of a
kernel call (Mamba-3's Th_t = Th_{t-1} + dt_t w_t, read at t and at t-1: both reads from the
one sum, the second shifted a token)."""

from __future__ import annotations

from mixc.backends.pytorch.context import Context, sums_angles
from mixc.backends.pytorch.lines import Lines, comment
from mixc.backends.pytorch.names import local, note, size
from mixc.backends.pytorch.pyexpr import constant, literal
from mixc.frontend import ir
from mixc.frontend.ir import Binary, Expr
from mixc.lowering.program import Call


class AngleSums(Context):
    """Renders the sum of a group of angle states (`summed` says which calls) where the
    sequence forms would call a kernel (it comes before SequenceForms among a module's
    bases: `emit_call` passes every other call on to it)."""

    def emit_call(self, out: Lines, call: Call, packed: bool) -> None:
        if self.summed(call):
            self.emit_angle_sum(out, call, packed)
        else:
            super().emit_call(out, call, packed)  # type: ignore[misc]

    def summed(self, call: Call) -> bool:
        """Whether `call` is a sum of angle states (see `sums_angles`)."""
        return sums_angles(call, self.angle_states)

    def tanh_summed(self, call: Call) -> bool:
        """Whether `call` sums angles s tanh(x) (`_tanh_angle_sums`, see `scaled_tanh`)."""
        if not self.summed(call):
            return False
        (step,) = call.steps
        return constant(step.key) == 1 and scaled_tanh(step.values) is not None

    def emit_angle_sum(self, out: Lines, call: Call, packed: bool) -> None:
        """The group's states before and after each token's update, from one cumulative sum
        in float64 (`_angle_sums`); each readout the one its query reads (times the query, a
        constant), the final states into the states' names (the chunked form)."""
        seqlens = ", cu_seqlens" if packed else ""
        out(comment(f"{' and '.join(call.states)}: {call.label}, angles summed in float64"))
        (step,) = call.steps
        e = self.wide(self.seq_expr({"tanh": "_wide_tanh"}))
        key = constant(step.key)
        parts = []
        for v in step.values:
            value = v.expr if v.scale is None else Binary("@", v.scale, v.expr)
            text = e(value)
            parts.append(text if key == 1 else f"{literal(key)} * ({text})")
        group = call.group
        tanh = scaled_tanh(step.values) if key == 1 else None
        added = parts[0] if len(parts) == 1 else f"_torch.cat([{', '.join(parts)}], -2)"
        if tanh is None:
            out(f"{local('v', group)} = {added}{note('added at each token')}")
        if call.initial:
            initial = self.initial_angles(call)
        else:  # from zero
            rows = " + ".join(size(s.width) for s in call.slots)
            initial = f'_torch.zeros(_sizes["B"], _sizes["NH"], {rows}, 1, dtype=_torch.float64, device=_device)'
        sums = {True: local("before", group), False: local("after", group)}
        final = local("S", group)
        reads = []  # (readout, what it reads): a state's readout by a query of 1 is the state
        for query in call.queries:
            c = 1.0 if query.query is None else constant(query.query)
            for r in query.readouts:
                if c == 1 and len(call.slots) == 1:
                    sums[query.previous] = r.name
                    continue
                text = sums[query.previous]
                text = (
                    text if len(call.slots) == 1 else f"{text}[..., {sum_rows(call, r.state)}, :]"
                )
                reads.append((r, text if c == 1 else f"{literal(c)} * {text}"))
        single = len(call.slots) == 1 and call.initial
        last = call.slots[0].state if single else final if call.initial else "_"
        found = f"{sums[True]}, {sums[False]}, {last}"
        if tanh is None:
            out(f"{found} = _angle_sums({local('v', group)}, {initial}{seqlens})")
        else:  # the angles computed where they are summed
            scale, x = e(tanh[0]), self.seq_expr()(tanh[1]) if is_leaf(tanh[1]) else e(tanh[1])
            summed = f"_tanh_angle_sums({scale}, {x}, {initial}{seqlens})"
            shown = f"{tanh[0]} tanh({tanh[1]}) added at each token"
            out(f"{found} = {summed}{note(shown)}")
        for r, text in reads:
            out(f"{r.name} = {text}{note(r.shown)}")
        if call.initial and not single:
            names = [s.state for s in call.slots]
            widths = ", ".join(size(s.width) for s in call.slots)
            out(f"{', '.join(names)} = {final}.split([{widths}], -2)")

    def initial_angles(self, call: Call) -> str:
        """The group's carried states [B, NH, rows, 1], one after the other."""
        names = [s.state for s in call.slots]
        return names[0] if len(names) == 1 else f"_torch.cat([{', '.join(names)}], -2)"


def scaled_tanh(values) -> tuple[Expr, Expr] | None:
    """(s, x) where a group's angles are one scale times a tanh, s tanh(x) (Mamba-3's pi dt_t
    tanh(w_t)), which `_tanh_angle_sums` computes in the buffer it sums them in; else None."""
    if len(values) != 1:
        return None
    (v,) = values
    if v.scale is None or not isinstance(v.expr, ir.Call) or v.expr.func != "tanh":
        return None
    return (v.scale, v.expr.args[0]) if len(v.expr.args) == 1 else None


def is_leaf(e: Expr) -> bool:
    """Whether e is a name read as it is (an input, a parameter), which `_tanh_angle_sums`
    widens itself, exactly: no float64 copy of it first."""
    return isinstance(e, ir.Name | ir.Timed)


def sum_rows(call: Call, state: str) -> str:
    """The slice of the group's rows that `state` holds, as text (`a:a + R`)."""
    start: list[str] = []
    for s in call.slots:
        if s.state == state:
            first = " + ".join(size(w) for w in start) or "0"
            return f"{first}:{first} + {size(s.width)}" if start else f":{size(s.width)}"
        start.append(s.width)
    raise ValueError(state)

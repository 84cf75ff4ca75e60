"""A state of angles over whole sequences: a state that only feeds angles (see
`angle_states`), with no transition, summed in float64 by one cumulative sum instead of a
kernel call (Mamba-3's Th_t = Th_{t-1} + dt_t w_t, read at t and at t-1: both reads from the
one sum, the second shifted a token)."""

from __future__ import annotations

from mixc.backends.pytorch.context import Context, sums_angles
from mixc.backends.pytorch.lines import Lines, comment
from mixc.backends.pytorch.names import local, note, size
from mixc.backends.pytorch.pyexpr import constant, literal
from mixc.frontend.ir import Binary
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
        added = parts[0] if len(parts) == 1 else f"_torch.cat([{', '.join(parts)}], -2)"
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
        out(f"{found} = _angle_sums({local('v', group)}, {initial}{seqlens})")
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


def sum_rows(call: Call, state: str) -> str:
    """The slice of the group's rows that `state` holds, as text (`a:a + R`)."""
    start: list[str] = []
    for s in call.slots:
        if s.state == state:
            first = " + ".join(size(w) for w in start) or "0"
            return f"{first}:{first} + {size(s.width)}" if start else f":{size(s.width)}"
        start.append(s.width)
    raise ValueError(state)

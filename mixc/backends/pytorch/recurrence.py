"""The token-by-token forms, rendered from the program: `_recurrence` (the loop over tokens),
`recurrent` (it, over whole or packed sequences) and `step` (it, for one token)."""

from __future__ import annotations

from mixc.backends.pytorch.context import Context
from mixc.backends.pytorch.lines import Lines, string
from mixc.backends.pytorch.names import note, tuple_line, tuple_text
from mixc.backends.pytorch.pyexpr import PyExpr
from mixc.lowering.program import BackwardLoop, Update


class RecurrentForms(Context):
    """Renders `_recurrence`, `recurrent` and `step`."""

    def emit_recurrence(self, out: Lines) -> None:
        recurrence = self.program.recurrence
        states = ", ".join(self.carried)
        params = ", ".join([self.args(), *self.carried, "_sizes, _dtype, _device"])
        out(f"def _recurrence({params}):", 0)
        out('"""Run the recurrence over [B, T, NH, ..] inputs; returns outputs and new states."""')
        backward = recurrence.backward
        self.emit_tokens(out, (*(() if backward is None else backward.sliced), *recurrence.sliced))
        if backward is not None:
            self.emit_backward_loop(out, backward)
        out("_ys = []")
        out('for _t in _range(_sizes["T"]):')
        self.emit_slices(out, recurrence.sliced)
        if self.positioned:
            out(f"pos_t = _pos.to(_torch.float64){note('the position, in float64')}", 2)
        if backward is not None and backward.reads:
            kept = tuple_text([name for name, _ in backward.reads], one=True)
            out(f"{kept.strip('()')} = _kept[_t]", 2)
        with self.point(out, 2):
            e = self.step_expr()
            for update in recurrence.updates:
                own = self.wide(e) if update.state in self.angle_states else e
                out(f"{update.state}_t = {self.update_text(update, own)}{note(update.shown)}", 2)
            y = e(recurrence.output)
            out(f"_ys.append({y}){note(f'{self.output.target}_t = {recurrence.shown}')}", 2)
        ahead = [u.state for u in recurrence.updates]
        if backward is not None and ahead:
            out(f"{', '.join(ahead)} = {', '.join(f'{s}_t' for s in ahead)}", 2)
        elif backward is None and self.carried:
            now = [f"{s}_t" for s in self.states] + [f"{x}_t" for x in self.lagged]
            now += ["_pos + 1"] if self.positioned else []
            out(f"{states} = {', '.join(now)}", 2)
        out(f"return _torch.stack(_ys, 1), {self.state_tuple()}")
        out("", 0)
        out("", 0)

    @staticmethod
    def emit_tokens(out: Lines, sliced: tuple[str, ...]) -> None:
        """Each input the loops slice, split into its tokens once, as `_tokens_x` (views: one
        operation, whose backward is one stack, where a slice a token has each token's
        gradient filled into a zero tensor of the whole input and summed; under torch.compile
        one node, where slices are one a token forward and two backward)."""
        names = list(dict.fromkeys(sliced))
        if names:
            tokens = ", ".join(f"_tokens_{x}" for x in names)
            out(f"{tokens} = {', '.join(f'{x}.unbind(1)' for x in names)}")

    @staticmethod
    def emit_slices(out: Lines, sliced: tuple[str, ...]) -> None:
        """Each input of `sliced` at token _t, as `x_t`, from its tokens (`emit_tokens`)."""
        if sliced:
            names = ", ".join(f"{x}_t" for x in sliced)
            out(f"{names} = {', '.join(f'_tokens_{x}[_t]' for x in sliced)}", 2)

    def emit_backward_loop(self, out: Lines, loop: BackwardLoop) -> None:
        """The backward states from the last token to the first, keeping at each token the
        readouts of them the output reads (`_kept`, then put in time order)."""
        out("_kept = []  # the readouts of the backward states at each token, from the last")
        out('for _t in _range(_sizes["T"] - 1, -1, -1):')
        self.emit_slices(out, loop.sliced)
        with self.point(out, 2):
            e = self.step_expr()
            for update in loop.updates:
                own = self.wide(e) if update.state in self.angle_states else e
                out(f"{update.state}_t = {self.update_text(update, own)}{note(update.shown)}", 2)
            for name, read in loop.reads:
                out(f"{name} = {e(read)}{note(read)}", 2)
        out(f"_kept.append({tuple_text([name for name, _ in loop.reads], one=True)})", 2)
        back = [u.state for u in loop.updates]
        out(f"{', '.join(back)} = {', '.join(f'{s}_t' for s in back)}", 2)
        out("_kept.reverse()")

    @staticmethod
    def update_text(update: Update, e: PyExpr) -> str:
        """One state's new value: as written, its products, or decayed (each gate's factor on
        its side, the key side's entry by entry) plus its writes."""
        if update.expr is not None:
            return e(update.expr)
        if update.decays is None:
            return e.terms(list(update.writes))
        decayed = update.state
        for d in update.decays:
            factor = e(d.factor)
            if d.side == "key":
                decayed = f"{decayed} * {factor}.mT" if d.from_log else f"{decayed} * ({factor}).mT"
            else:
                decayed = f"{factor} * {decayed}"
        return f"{decayed} + {e.terms(list(update.writes))}" if update.writes else decayed

    def recurrence_call(self, states: str) -> str:
        """The call of `_recurrence` with the carried `states` (empty for a stateless mixer)."""
        args = ", ".join([self.args(), *([states] if states else []), "_sizes, _dtype, _device"])
        return f"_recurrence({args})"

    def emit_recurrent(self, out: Lines) -> None:
        options = ("initial_state=None", "output_final_state=False", "cu_seqlens=None")
        out(f"def recurrent({self.signature(*options)}):", 0)
        self.docstring(out, "recurrent")
        out('_check_flag("output_final_state", output_final_state)')
        out(f"_out_dtype = _output_dtype(_INPUTS, {self.inputs[0]})")
        self.prologue(out, True, "initial_state", packed=True)
        states = ", ".join(self.carried)
        out("if cu_seqlens is None:")
        out(f"{self.output.target}, {self.state_tuple()} = {self.recurrence_call(states)}", 2)
        out("else:")
        self.emit_packed_loop(out)
        out(f"{self.output.target} = _torch.cat(_outputs, 1)", 2)
        if self.carried:  # a stateless mixer has no final states to join
            out(
                f"{states}, = (_torch.cat(_parts, 0) for _parts in _zip(*_finals))"
                if len(self.carried) == 1
                else f"{states} = (_torch.cat(_parts, 0) for _parts in _zip(*_finals))",
                2,
            )
        self.finish(out, self.output.target, self.final_states(), optional=True)
        out("", 0)
        out("", 0)

    def emit_packed_loop(self, out: Lines) -> None:
        """The recurrence run over each packed sequence from its own initial state."""
        out("_outputs, _finals = [], []", 2)
        out("_bounds = _zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())", 2)
        out("for _n, (_start, _end) in _enumerate(_bounds):", 2)
        per_token = set(self.inputs)
        sliced = ", ".join(
            f"{a}[:, _start:_end]" if a in per_token else a
            for a in self.inputs + self.required + self.defaulted
        )
        out("if _end == _start:  # an empty sequence keeps its initial state", 3)
        own = [f"{s}[_n : _n + 1]" for s in self.carried]
        tuple_line(out, "_finals.append(", own, ")", 4, one=True)
        out("continue", 4)
        out("_piece = _dict(_sizes, T=_end - _start)", 3)
        args = ", ".join([sliced, *own, "_piece, _dtype, _device"])
        out(f"_y, _s = _recurrence({args})", 3)
        out("_outputs.append(_y)", 3)
        out("_finals.append(_s)", 3)

    def emit_no_step(self, out: Lines) -> None:
        """`step` of a mixer that has none (a non-causal one): it says why."""
        out(f"def step({self.signature('state=None')}):", 0)
        out('"""No step form exists for this mixer: use chunk or recurrent."""')
        reason = f"no step form: {self.program.no_step} (spec {self.spec.source.filename})"
        out(f"_fail({string(reason)})")
        out("", 0)
        out("", 0)

    def emit_step(self, out: Lines) -> None:
        out(f"def step({self.signature('state=None')}):", 0)
        self.docstring(out, "step")
        out(f"_out_dtype = _output_dtype(_INPUTS, {self.inputs[0]})")
        self.prologue(out, False, "state")
        states = ", ".join(self.carried)
        out(f"{self.output.target}, {self.state_tuple()} = {self.recurrence_call(states)}")
        self.finish(out, f"{self.output.target}[:, 0]", self.final_states())

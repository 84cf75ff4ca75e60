"""What every form's renderer shares: the spec's names and the module's, expressions as text,
common subexpressions, and the lines that open and close a form (its arguments checked and laid
out, its states unpacked, its output and final states returned)."""

from __future__ import annotations

import contextlib

from mixc.backends.pytorch.docstrings import FormDocs
from mixc.backends.pytorch.lines import Lines, string
from mixc.backends.pytorch.names import fresh, local, local_base, note, size, tuple_line, tuple_text
from mixc.backends.pytorch.pyexpr import TURNING, PyExpr, Shared, constant
from mixc.frontend.ir import Expr, Timed, angle_params, angle_states
from mixc.frontend.shapes import SCALAR
from mixc.lowering.program import Call, Program, Slot


class Context:
    """The program being rendered, and the pieces of text every form is made of."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.mixer = program.mixer
        self.spec = program.spec
        self.typer = program.typer
        self.inputs = [d.name for d in self.mixer.inputs]
        self.required = [p.name for p in self.mixer.params if p.default is None]
        self.defaulted = [p.name for p in self.mixer.params if p.default is not None]
        self.states = [s.name for s in self.mixer.states]
        self.lagged = [d.name for d in self.mixer.lagged]
        # the local names of what the forms carry from token to token: the states, then each
        # lagged input's previous token (`_prev_x`, x at t-1)
        # and `_pos`, the position of the next token, where the spec reads pos_t
        self.positioned = self.mixer.positioned
        self.angle_params = angle_params(self.mixer)
        self.angle_states = wide_states(program)  # kept and summed in float64
        self.carried = self.states + [local("prev", x) for x in self.lagged]
        self.carried += ["_pos"] if self.positioned else []
        self.output = self.mixer.outputs[0]
        self.readouts = dict(program.readouts)
        pipeline = bool(self.program.summary.runs)
        left = any(s.summary_action == "left" for s in self.program.states)
        shape = self.spec.shapes[self.output.target]
        self.docs = FormDocs(self.mixer, shape, pipeline, left, self.angle_states)
        # the points of common subexpressions (see Shared): recorded by the first run of the
        # mixer's functions, replayed with their locals by the second
        self._points: list[Shared] = []
        self._replay: list[Shared] | None = None
        self._point: Shared | None = None

    # -- expressions -------------------------------------------------------------------------

    def seq_expr(self, functions: dict[str, str] | None = None) -> PyExpr:
        """Expressions over whole sequences: spec names are the prepared tensors."""

        def names(e: Expr) -> str:
            if isinstance(e, Timed) and e.offset == -1:  # a lagged input, shifted by a token
                return local("prev", e.name)
            return self.readouts.get(e.name, e.name)  # a readout by its local

        if self.angle_states:  # summed angles (Mamba-3's Th): a turn reduces its angle first
            functions = {TURNING: "_turning_summed", **(functions or {})}
        return PyExpr(self.typer, names, functions, self._point, compact_angles=True)

    def wide(self, e: PyExpr) -> PyExpr:
        """`e` with every name it reads in float64 (the angle states and parameters are): the
        update of a state of angles (see `angle_states`), summed in float64."""
        kept = self.angle_states | self.angle_params

        def names(x: Expr) -> str:
            text = e.names(x)
            return text if x.name in kept else f"{text}.double()"

        return PyExpr(self.typer, names, e.functions, e.shared, e.compact_angles)

    def gate_expr(self) -> PyExpr:
        """Expressions of a kernel's gate arguments: a log-gate's log is `_log_gate`."""
        return self.seq_expr({"log": "_log_gate"})

    def step_expr(self) -> PyExpr:
        """Expressions inside the recurrence: q_t is a slice, H the previous state, H_t the new."""

        def names(e: Expr) -> str:
            if isinstance(e, Timed) and e.offset == -1:
                return local("prev", e.name) if e.name in self.lagged else e.name
            if isinstance(e, Timed) and e.offset == 1:  # a backward state before its update
                return e.name
            if isinstance(e, Timed):
                return f"{e.name}_t"
            return self.readouts.get(e.name, e.name)  # a backward state's readout by its local

        return PyExpr(self.typer, names, shared=self._point)

    @staticmethod
    def in_time(text: str, reverse: bool, packed: str) -> str:
        """A tensor in the kernels' layout, in reverse time order where `reverse` (a call of a
        backward state's group)."""
        return f"_reverse_tokens({text}{packed})" if reverse else text

    def seq_layout(self, packed: str, reverse: bool):
        """`seq(layout, text)`: `text` in the kernels' layout (`_seq_<layout>`), reversed in
        time where `reverse` (each packed sequence within its bounds)."""

        def seq(layout: str, text: str) -> str:
            return self.in_time(f"_seq_{layout}({text}, _sizes{packed})", reverse, packed)

        return seq

    def tensor(self, expr: Expr, e: PyExpr | None = None) -> str:
        """An expression as a tensor: a constant (a column's key of 1, log(0.9)) as [1, 1]."""
        value = (e or self.seq_expr())(expr)
        if constant(expr) is not None:
            return f"_torch.full((1, 1), {value}, dtype=_dtype, device=_device)"
        return value

    @contextlib.contextmanager
    def point(self, out: Lines, indent: int):
        """Expressions emitted inside share their common subexpressions (see Shared): lines at
        `indent` of `out` where no name they read is rebound."""
        if self._replay is None:
            shared = Shared()
            self._points.append(shared)
        else:
            shared = self._replay.pop(0)
        shared.out = lambda line: out(line, indent)
        outer, self._point = self._point, shared
        try:
            yield
        finally:
            self._point = outer

    def share(self, taken: set[str]) -> None:
        """After the first run: the locals of each point's common subexpressions, named so
        that none is a name in `taken` (every private name of the module) or another local."""
        spec_names = dict(self.program.names)
        for shared in self._points:  # one a function: its locals' names differ from each other
            shared.recording = False
            own = set(taken)
            shared.locals = {
                text: fresh(local_base(e, spec_names), own) for text, e in shared.choose().items()
            }
        self._replay = list(self._points)

    # -- signatures and layouts --------------------------------------------------------------

    def docstring(self, out: Lines, form: str) -> None:
        """The docstring of `form`: its arguments' shapes and dtypes, what it returns."""
        first, *rest = self.docs.lines(form)
        out(f'"""{first}')
        for line in rest:
            out(line)
        out('"""')

    def state_tuple(self) -> str:
        """`(H,)` or `(H, z)`: the states (and lagged inputs) as a tuple expression or unpacking
        target."""
        carried = self.carried
        return f"({carried[0]},)" if len(carried) == 1 else f"({', '.join(carried)})"

    def signature(self, *extra: str) -> str:
        args = self.inputs + self.required
        kw = [f"{p}=None" for p in self.defaulted] + list(extra)
        return ", ".join(args + (["*", *kw] if kw else []))

    def args(self) -> str:
        return ", ".join(self.inputs + self.required + self.defaulted)

    def call_args(self) -> str:
        """The mixer's arguments as a call passes them on (the defaulted ones by keyword)."""
        return ", ".join(self.inputs + self.required + [f"{p}={p}" for p in self.defaulted])

    @staticmethod
    def widths(slots: tuple[Slot, ...]) -> list[str]:
        return [size(s.width) for s in slots]

    # -- opening and closing a form ----------------------------------------------------------

    def prologue(
        self, out: Lines, sequence: bool, states_from: str | None, packed: bool = False
    ) -> None:
        out(f"{self.args()}, _sizes, _dtype = _prepare({self.call_args()}, _sequence={sequence})")
        out(f"_device = {self.inputs[0]}.device")
        batch = '_sizes["B"]'
        if packed:
            packed_batch = "_check_cu_seqlens(cu_seqlens, _sizes, _device)"
            out(f'_batch = _sizes["B"] if cu_seqlens is None else {packed_batch}')
            batch = "_batch"
        if states_from is not None:
            where = f"_sizes, _dtype, _device, {batch}, {string(states_from)}"
            if self.angle_states:  # kept in float64
                wide = ", ".join(string(s) for s in sorted(self.angle_states))
                where += f", wide=({wide},)"
            call = f"_prepare_states(_STATES, {states_from}, {where})"
            if self.carried:
                out(f"{self.state_tuple()} = {call}")
            else:  # a stateless mixer: checks that no state is given (None or ())
                out(call)
            for d in self.mixer.lagged:
                if not d.shape:  # a scalar input's last token, laid out as its tokens are
                    prev = local("prev", d.name)
                    out(f"{prev} = {prev}[..., None, None]")
            if self.positioned:  # laid out as a scalar per token
                out("_pos = _pos[..., None, None]")

    def emit_sign_checks(self, out: Lines, checks) -> None:
        """The run-time check of each decay the caller passes whose sign the spec cannot prove,
        before a form takes its log: none for a decay written provably positive."""
        for c in checks:
            decay = str(c.decay)
            out(
                f"_check_decay_sign({c.name}, {string(c.name)}, {string(decay)}, {string(c.state)})"
            )

    def finish(
        self,
        out: Lines,
        y: str,
        final: list[str] | None,
        optional: bool = False,
        indent: int = 1,
    ) -> None:
        """Return the output `y` in the module's layout and the final states `final` (None:
        none), only where output_final_state asks for them if `optional`; at `indent`."""
        shape = self.spec.shapes[self.output.target]
        # squeeze, not [..., 0]: the backward of an index fills a zero tensor and copies into it
        index = (
            ".squeeze(-1).squeeze(-1)"
            if shape == SCALAR
            else ".squeeze(-1)"
            if shape[1] == "1"
            else ""
        )
        read = y != self.output.target and not y.startswith(self.output.target)
        shown = note(f"{self.output.target}_t = {self.output.value}") if read else ""
        out(f"{self.output.target} = {y}{index}.to(_out_dtype){shown}", indent)
        text = "None" if final is None else tuple_text(final)
        if optional:
            if len(text) > 60:  # a long tuple of final states: on lines of its own
                tuple_line(out, "_final = ", final, "", indent)
                text = "_final"
            text = f"({text} if output_final_state else None)"
        out(f"return {self.output.target}, {text}", indent)

    def final_states(self, lagged: str = "prev") -> list[str]:
        """The final states in the module's layout; each lagged input's last token from its
        local `local(lagged, x)`."""
        names = self.states + [local(lagged, x) for x in self.lagged]
        names += ["_pos"] if self.positioned else []
        squeeze = {0: ".squeeze(-1).squeeze(-1)", 1: ".squeeze(-1)", 2: ""}
        return [
            f"{name}{squeeze[len(d.shape)]}"
            for name, d in zip(names, self.mixer.carried, strict=True)
        ]

    def emit_shifts(self, out: Lines, packed: bool, carried: bool, read=None) -> None:
        """Each lagged input at t-1, `_prev_x`: x one token later, each sequence starting from
        the carried token (zeros without one), for those of `read` (None: every one); with
        `carried`, also the token to carry on, `_last_x`."""
        seqlens = ", cu_seqlens" if packed else ""
        for x in self.lagged:
            prev = local("prev", x)
            if carried:
                last = local("last", x)
                out(f"{last} = _last_tokens({x}, {prev}{seqlens})  # carried to the next call")
            first = prev if carried else "None"
            if read is not None and x not in read:
                continue
            out(f"{prev} = _shift_tokens({x}, {first}{seqlens})  # {x}_{{t-1}}")

    def emit_split_states(
        self, out: Lines, slots: tuple[Slot, ...], source: str, role: str | None = None
    ) -> None:
        """Kernel-layout [B, NH, K, width] -> each state of the group in its own layout, into
        the state's name (or with a `role`, its local `local(role, name)`)."""
        names = [s.state if role is None else local(role, s.state) for s in slots]
        if len(slots) == 1:
            out(f"{names[0]} = {source}{'' if slots[0].vector else '.mT'}")
            return
        out(f"{', '.join(names)} = {source}.split([{', '.join(self.widths(slots))}], -1)")
        for s, name in zip(slots, names, strict=True):
            if not s.vector:
                out(f"{name} = {name}.mT")


def sums_angles(call: Call, wide: frozenset[str]) -> bool:
    """Whether `call` is a sum of angle states (those of `wide`), which the sequence forms
    compute as one cumulative sum in float64: every state of it in `wide` and read entry by
    entry (a column), no transition (identity, no gate), one write a token of a constant key,
    forward in time, every query a constant."""
    (step, *more) = call.steps
    return (
        not more
        and call.label == "identity"
        and not call.reverse
        and call.log_scale is None
        and all(s.state in wide and s.shape[1] == "1" and not s.vector for s in call.slots)
        and all(a.expr is None for a in step.args)
        and constant(step.key) is not None
        and all(q.query is None or constant(q.query) is not None for q in call.queries)
    )


def wide_states(program: Program) -> frozenset[str]:
    """The states the forms keep in float64: those that only feed angles (`angle_states`)
    and that every kernel call holding one sums as angles (`sums_angles`); another (a decaying
    state of angles) stays in the compute dtype, as its kernel runs."""
    found = angle_states(program.mixer)
    parallel = program.parallel.calls if program.parallel is not None else ()
    calls = [*program.calls, *parallel, *program.summary.runs]
    return frozenset(s for s in found if all(sums_angles(c, found) for c in calls if s in c.states))

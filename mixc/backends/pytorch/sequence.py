"""The forms over whole sequences, rendered from the program: `chunk` (and its stand-in where
there is no chunked form), `parallel` and `summary`, each a run of kernel calls."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from mixc.backends.pytorch.context import Context
from mixc.backends.pytorch.epilogue import emit_in_place, in_place, owned_writes
from mixc.backends.pytorch.folds import (
    decays_in_kernel,
    emit_first_writes,
    emit_fold_inputs,
    fold_correction,
    fold_start,
    shifted,
)
from mixc.backends.pytorch.lines import Lines, comment, string
from mixc.backends.pytorch.names import local, note, tuple_text
from mixc.backends.pytorch.pyexpr import TURNING
from mixc.backends.pytorch.release import release_kernel_inputs
from mixc.frontend import ir
from mixc.frontend.ir import Binary, Expr
from mixc.lowering.program import Call, Program, QueryRead, SequenceForm, Step, SummaryCall


class SequenceForms(Context):
    """Renders `chunk`, `parallel` and `summary`."""

    def emit_chunk(self, out: Lines, form: SequenceForm) -> None:
        options = ("initial_state=None", "output_final_state=False", "chunk_size=CHUNK_SIZE")
        start = len(out.lines)
        out(f"def chunk({self.signature(*options, 'cu_seqlens=None')}):", 0)
        self.docstring(out, "chunk")
        out("_check_chunk_size(chunk_size)")
        out('_check_flag("output_final_state", output_final_state)')
        out(f"_out_dtype = _output_dtype(_INPUTS, {self.inputs[0]})")
        self.prologue(out, True, "initial_state", packed=True)
        self.emit_sign_checks(out, form.sign_checks)
        out('if _sizes["B"] == 0:  # an empty batch: no chunk to run, every step is empty')
        states = ", ".join(self.carried)
        out(f"{self.output.target}, {self.state_tuple()} = {self.recurrence_call(states)}", 2)
        self.finish(out, self.output.target, self.final_states(), optional=True, indent=2)
        emit_first_writes(self, out, form.calls)
        self.emit_shifts(out, packed=True, carried=True, read=shifted(form))
        if self.positioned:
            shown = note("each token's position, and the next token's, carried on")
            out(f"pos, _pos = _positions(_pos, _sizes, _device, cu_seqlens){shown}")
        if in_place(self, form):
            out(owned_writes(self, form))
        calls = len(out.lines)
        with self.point(out, 1):
            for call in form.calls:
                self.emit_call(out, call, packed=True)
            y = self.emit_output(out, form)
        self.finish(out, y, self.final_states(lagged="last"), optional=True)
        release_kernel_inputs(out.lines, start, calls, self.kernels)
        out("", 0)
        out("", 0)

    def emit_no_chunk(self, out: Lines) -> None:
        options = ("initial_state=None", "output_final_state=False", "chunk_size=CHUNK_SIZE")
        out(f"def chunk({self.signature(*options)}):", 0)
        out('"""No chunked form exists for this spec: use recurrent or step."""')
        reason = self.program.no_chunk.replace("NYI: ", "")
        out(f"_fail({string(f'NYI: no chunked form ({reason}). Use recurrent() or step().')})")
        out("", 0)
        out("", 0)

    def emit_parallel(self, out: Lines, form: SequenceForm) -> None:
        out(f"def parallel({self.signature()}):", 0)
        self.docstring(out, "parallel")
        out(f"_out_dtype = _output_dtype(_INPUTS, {self.inputs[0]})")
        self.prologue(out, True, None)
        self.emit_sign_checks(out, form.sign_checks)
        self.emit_shifts(out, packed=False, carried=False)
        if self.positioned:
            out(f"pos, _ = _positions(None, _sizes, _device){note('from 0')}")
        if in_place(self, form):
            out(owned_writes(self, form))
        with self.point(out, 1):
            for call in form.calls:
                self.emit_call(out, call, packed=False)
            y = self.emit_output(out, form)
        self.finish(out, y, None)
        out("", 0)
        out("", 0)

    # -- a kernel call -----------------------------------------------------------------------

    def emit_inputs(
        self,
        out: Lines,
        group: str,
        steps: tuple[Step, ...],
        packed: str,
        log_scale=None,
        joined: bool = False,
        reverse: bool = False,
        turned: bool = False,
    ) -> list[str]:
        """Key, value (the group's values side by side) and the class's arguments of one call,
        as locals; returns the arguments as the call passes them. `log_scale`: the write scale's
        log; `joined`, `reverse`: see emit_sub_token_inputs; `turned`: the kernel turns a rotated
        key (_turned_seq)."""
        if len(steps) > 1:
            return self.emit_sub_token_inputs(out, group, steps, packed, joined, reverse)
        (step,) = steps
        e = self.seq_expr()
        seq = self.seq_layout(packed, reverse)
        key = _turned_seq(self, step.key, packed) if turned else None
        out(f"{local('k', group)} = {key or seq('vector', self.tensor(step.key))}")
        values = []
        if any(v.expr is None for v in step.values):  # a vector state: a value of 1
            sizes = '_sizes["B"], _sizes["T"], _sizes["NH"], 1, 1'
            out(f"_ones = _torch.ones({sizes}, dtype=_dtype, device=_device)")
        for v in step.values:
            if v.expr is None:
                value = "_ones" if v.scale is None else f"{e(v.scale)} * _ones"
            else:
                value = e(v.expr if v.scale is None else Binary("@", v.scale, v.expr))
            values.append(value)
        value = values[0] if len(values) == 1 else f"_torch.cat([{', '.join(values)}], -2)"
        out(f"{local('v', group)} = {seq('vector', value)}")
        kernel_args = []
        gate = self.gate_expr()
        for arg in step.args:
            if arg.expr is None:
                continue
            if arg.layout == "bound":
                kernel_args.append(f"{arg.name}={float(arg.expr.text)!r}")
                continue
            value = self.tensor(arg.expr, gate)  # a constant gate, e.g. log(0.9), as a tensor
            name = local(arg.name, group)
            out(f"{name} = {seq(arg.layout, value)}{note(arg.expr)}")
            kernel_args.append(f"{arg.name}={name}")
        if log_scale is not None:
            shown = note(f"the write scale exp({log_scale}), as its log")
            out(f"{local('s', group)} = {seq('scalar', e(log_scale))}{shown}")
            kernel_args.append(f"log_scale={local('s', group)}")
        return kernel_args

    def emit_sub_token_inputs(
        self,
        out: Lines,
        group: str,
        steps: tuple[Step, ...],
        packed: str,
        joined: bool,
        reverse: bool,
    ) -> list[str]:
        """Key, value and the class's arguments of a call that applies several steps a token:
        each step's (reversed in time before, for a backward call; `reverse`), interleaved along
        time into sub-tokens (`_sub_tokens`), an argument a step lacks (no decay) as zeros; or
        (`joined`: one transition, then writes only) the keys and values as lists, one a write,
        the arguments the first step's."""
        gate = self.gate_expr()
        seq = self.seq_layout(packed, reverse)
        parts: dict[str, list[str | None]] = {"k": [], "v": []}
        for i, step in enumerate(steps, 1):
            (v,) = step.values
            value = v.expr if v.scale is None else Binary("@", v.scale, v.expr)
            for arg, expr, layout, how in (
                ("k", step.key, "vector", None),
                ("v", value, "vector", None),
                *((a.name, a.expr, a.layout, gate) for a in step.args),
            ):
                parts.setdefault(arg, [])
                if expr is None:
                    parts[arg].append(None)
                    continue
                name = local(f"{arg}{i}", group)
                text = self.tensor(expr, how)
                out(f"{name} = {seq(layout, text)}{note(expr)}")
                parts[arg].append(name)
        return _combined_steps(out, group, steps, parts, joined)

    def emit_call(self, out: Lines, call: Call, packed: bool) -> None:
        """One kernel call, each of its queries' readouts into its local, and (from the first
        query's call) the final states in their own layouts."""
        seqlens = ", cu_seqlens" if packed else ""
        initial = local("S0", call.group)
        reads = f", reading {', '.join(call.reads)}" if call.reads else ""
        ordered = native(call, self.library)
        if call.reverse:
            reads += ", backward in time" if ordered else ", on the time-reversed sequence"
        out(comment(f"{' and '.join(call.states)}: {call.label} -> {call.kernel}{reads}"))
        moved = call.reverse and not ordered  # inputs reversed in time before the kernel
        turned = _turns(call, self.library) and all(q.query is not None for q in call.queries)
        if call.lag is not None:
            kernel_args = emit_fold_inputs(self, out, call, seqlens, turned and _turned_seq)
        else:
            kernel_args = self.emit_inputs(
                out, call.group, call.steps, seqlens, call.log_scale, call.joined, moved, turned
            )
        kernel_args += ["reverse=True"] * (ordered and call.reverse)  # and strict=, below
        call = replace(call, reverse=moved)
        if call.initial:
            s0 = [s.state if s.vector else f"{s.state}.mT" for s in call.slots]
            s0_text = s0[0] if len(s0) == 1 else f"_torch.cat([{', '.join(s0)}], -1)"
            out(f"{initial} = {fold_start(call, s0_text)}")
        if call.stacked:
            _emit_stacked(self, out, call, kernel_args, seqlens)
        decayed = decays_in_kernel(call, self.library)
        # the fold's k_t . q_t from the kernel's scores, where it returns them
        dots = decayed and call.initial and call.kernel in self.library.diagonal
        for i, query in enumerate(call.queries):
            strict = ["strict=True"] if ordered and (query.previous or call.lag) else []
            strict += ["decayed=True"] * decayed + ["diagonal=True"] * dots
            # a folded call reads G_{t-1} q_t: strict where the kernel takes it, else its
            # inclusive read one token later, moved back (as any read before the update)
            query = replace(query, previous=not strict and (query.previous or bool(call.lag)))
            o = f"_o{i + 1}" if call.stacked else "_o"
            if not call.stacked:
                _emit_query(self, out, call, query, kernel_args + strict, seqlens, turned)
            if call.log_scale is not None and i == 0:  # the rows' scale, exp(-m_t)
                scale = self.in_time("_torch.exp(-_m)[..., None]", call.reverse, seqlens)
                out(f"{call.unscale} = _from_seq({scale}{seqlens})")
            if query.previous or call.reverse:
                out(_moved_back(call, query, initial, seqlens))
            fold_correction(self, out, call, query, seqlens, decayed, dots)
            if len(call.slots) == 1:
                parts = [o]
            else:
                parts = [local("o", s) for s in call.states]
                out(f"{', '.join(parts)} = {o}.split([{', '.join(self.widths(call.slots))}], -1)")
            for r in query.readouts:
                part = parts[call.states.index(r.state)]
                out(f"{r.name} = _from_seq({part}{seqlens}){note(r.shown)}")
            if i == 0 and call.initial:
                self.emit_split_states(out, call.slots, "_S")

    def emit_output(self, out: Lines, form: SequenceForm) -> str:
        """The output from its readouts; returns the variable that holds it."""
        o = form.output
        if o.expr is None or emit_in_place(self, out, form):
            return o.name
        out(f"{o.name} = {self.seq_expr()(o.expr)}{note(o.shown)}")
        return o.name

    # -- the summary -------------------------------------------------------------------------

    def emit_summary(self, out: Lines) -> None:
        summary = self.program.summary
        options = ("initial_state=None",) if summary.runs else ()
        out(f"def summary({self.signature(*options, 'chunk_size=CHUNK_SIZE')}):", 0)
        self.docstring(out, "summary")
        if summary.missing is not None:
            out(f"_fail({string(f'NYI: no transition summary ({summary.missing})')})")
            out("", 0)
            out("", 0)
            return
        out("_check_chunk_size(chunk_size)")
        first = self.inputs[0]
        out(f"if _empty_batch({first}):  # B = 0: checked, then one zero token's summary, emptied")
        out(f"_prepare({self.call_args()}, _sequence=True)", 2)
        each = tuple_text(self.inputs, one=True)
        out(f"_one = [_x.new_zeros(1, 1, *_x.shape[2:]) for _x in {each}]", 2)
        rest = "".join(f", {p}" for p in self.required)
        rest += "".join(f", {p}={p}" for p in self.defaulted)
        out(f"return _no_sequences(_summary(*_one{rest}, chunk_size=chunk_size))", 2)
        self.prologue(out, True, "initial_state" if summary.runs else None)
        self.emit_sign_checks(out, summary.sign_checks)
        transitions, finals = {}, {}
        runs = {run.group: run for run in summary.runs}
        with self.point(out, 1):
            for call in summary.calls:
                if call.group in runs:  # its readouts are what a later state's update reads
                    self.emit_call(out, runs[call.group], packed=False)
                if call.action == "elementwise":
                    self.emit_elementwise_summary(out, call, transitions, finals)
                else:
                    self.emit_probed_summary(out, call, transitions, finals)
        pieces = [transitions[s] for s in self.states]
        final_pieces = [finals[s] for s in self.states]
        if len(self.states) == 1:
            out(f"return {pieces[0]}, {final_pieces[0]}")
        else:
            out(f"return ({', '.join(pieces)}), ({', '.join(final_pieces)})")
        out("", 0)
        out("", 0)

    def emit_probed_summary(self, out: Lines, call: SummaryCall, transitions, finals) -> None:
        """One group's (P, F): its kernel run on probes (`_emit_probe`)."""
        probing = "on probes: zero writes from an identity state"
        along = " (along the rows)" if call.probe[1] == "rows" else ""
        out(comment(f"{' and '.join(s.state for s in call.slots)}: {call.kernel} {probing}{along}"))
        kernel_args = self.emit_inputs(out, call.group, call.steps, "")
        # one P per group (a pipeline's groups each probe their own)
        P = "_P" if len(self.program.summary.calls) == 1 else local("P", call.group)
        _emit_probe(out, call, kernel_args, P)
        self.emit_split_states(out, call.slots, "_F0")
        for s in call.slots:
            column = not s.vector and s.shape[1] == "1"  # one key channel: P is a number
            final = s.state if not (s.vector or column) else f"{s.state}.squeeze(-1)"
            transitions[s.state] = f"{P}.mT" if not column else f"{P}[..., 0].expand_as({final})"
            finals[s.state] = final

    def emit_elementwise_summary(self, out: Lines, call: SummaryCall, transitions, finals) -> None:
        """A group that acts on its state entry by entry, as G ⊙ S_0 + F: F from a zero state,
        G (the product of the gates) from a state of ones with no writes."""
        k, v = local("k", call.group), local("v", call.group)
        states = " and ".join(s.state for s in call.slots)
        out(comment(f"{states}: {call.kernel} from zeros (F) and, with no writes, ones (G)"))
        kernel_args = self.emit_inputs(out, call.group, call.steps, "")
        q0 = f"_torch.zeros_like({k})"
        args = ", ".join([q0, f"{k}", f"{v}", *kernel_args])
        out(f"_o, _F0 = _{call.kernel}({args}, chunk_size=chunk_size)")
        out("_S1 = _torch.ones_like(_F0)")
        args = ", ".join([q0, f"{k}", f"_torch.zeros_like({v})", *kernel_args])
        out(f"_o, _G = _{call.kernel}({args}, initial_state=_S1, chunk_size=chunk_size)")
        self.emit_split_states(out, call.slots, "_F0")
        self.emit_split_states(out, call.slots, "_G", role="G")
        for s in call.slots:
            vector = s.shape[1] == "1"  # a row or a column, in its own layout [B, NH, K]
            transitions[s.state] = local("G", s.state) + ("" if not vector else ".squeeze(-1)")
            finals[s.state] = s.state if not vector else f"{s.state}.squeeze(-1)"


def native(call: Call, library) -> bool:
    """Whether the call's kernel runs a backward state, and reads a state before the token's
    update, itself (it is among the library's `ordered`, one step a token): then nothing
    reverses or moves its inputs and outputs."""
    return call.kernel in library.ordered and len(call.steps) == 1


def _emit_stacked(
    forms: SequenceForms, out: Lines, call: Call, args: list[str], seqlens: str
) -> None:
    """The kernel run once with every query of the call (`Call.stacked`), their outputs
    `_o1`, `_o2`, ... at each token."""
    k, v = local("k", call.group), local("v", call.group)
    names = [f"_q{i}" for i in range(1, len(call.queries) + 1)]
    for name, query in zip(names, call.queries):
        out(f"{name} = {_query(forms, call, query, k, seqlens, False)}")
    init = f"initial_state={local('S0', call.group)}, chunk_size=chunk_size"
    shown = note(f"{len(names)} queries of one state, one pass")
    queries = f"[{', '.join(names)}]"
    outs = ", ".join(f"_o{i}" for i in range(1, len(names) + 1))
    out(f"({outs}), _S = _{call.kernel}({', '.join([queries, k, v, *args])}, {init}){shown}")


def _emit_query(
    forms: SequenceForms,
    out: Lines,
    call: Call,
    query: QueryRead,
    args: list[str],
    seqlens: str,
    turned=False,
) -> None:
    """The kernel run with one query (zeros for none), its output `_o` at each token."""
    k, v = local("k", call.group), local("v", call.group)
    out(f"_q = {_query(forms, call, query, k, seqlens, turned)}")
    steps = len(call.steps) if len(call.steps) > 1 and not call.joined else 0
    if steps and query.query is not None:  # the query at each token's last sub-token
        zeros = ", ".join(["_torch.zeros_like(_q)"] * (steps - 1))
        out(f"_q = _sub_tokens([{zeros}, _q])")
    if query.previous:  # S_{t-1} q_t is the kernel's S_s q_{s+1} one token later
        back = (f", True{seqlens}", ", in reverse time order") if call.reverse else ("", "")
        out(f"_q_next = _next_tokens(_q{back[0]})  # the next token's query{back[1]}")
    first = "_q_next" if query.previous else "_q"
    args = ", ".join([first, k, v, *args])
    if not call.initial:
        out(f"_o = _{call.kernel}({args})")
    else:
        takes = call.kernel in rounded_kernels(forms.program, forms.library.operands)
        operands = ", operands=_out_dtype" if takes else ""
        init = f"initial_state={local('S0', call.group)}, chunk_size=chunk_size{operands}"
        found = "_o, _S" if call.log_scale is None else "_o, _m, _S"
        found += f", {local('qk', call.group)}" if "diagonal=True" in args else ""
        out(f"{found} = _{call.kernel}({args}, {init})")
    if steps:
        out(f"_o = _o[:, :, {steps - 1}::{steps}]  # each token's last sub-token")


def _moved_back(call: Call, query: QueryRead, initial: str, seqlens: str) -> str:
    """The line that moves a kernel's output `_o` back into place, where the kernel ran on
    moved inputs: one token later for a read before the update (S_{t-1} q_t, from the state
    entering at the first token), and back in time order for a backward state."""
    if not query.previous:
        return f"_o = _reverse_tokens(_o{seqlens})  # back in time order"
    first = f"_final_tokens(_q{seqlens})" if call.reverse else "_q[:, :, :1]"
    start = f"{first} @ {initial}" if call.initial else "_torch.zeros_like(_o[:, :, :1])"
    back = (f", True{seqlens}", ", back in time order") if call.reverse else ("", "")
    return f"_o = _previous_tokens(_o, {start}{back[0]})  # S_{{t-1}} q_t{back[1]}"


def _turns(call: Call, library) -> bool:
    """Whether the call's kernel is one that turns a rotated query or key as it splits it into
    chunks (KernelLibrary.turned), in a call of one step a token forward in time."""
    return call.kernel in library.turned and len(call.steps) == 1 and not call.reverse


def _query(
    forms: SequenceForms, call: Call, query: QueryRead, k: str, seqlens: str, turned: bool
) -> str:
    """The query of one kernel run in the kernels' layout: zeros for none (joined writes: k is a
    list, one key a write), a rotation the kernel turns (_turned_seq) where the call can
    (`turned`: _turns of the call as it came, before a native backward call's replace)."""
    if query.query is None:
        return f"_torch.zeros_like({k}{'[0]' if call.joined else ''})"
    if turned and not query.previous:
        turned = _turned_seq(forms, query.query, seqlens)
        if turned:
            return turned
    # a query read one token early is reversed with its shift (_next_tokens)
    seq = forms.seq_layout(seqlens, call.reverse and not query.previous)
    return seq("vector", forms.tensor(query.query))


def _turned_seq(forms: SequenceForms, e: Expr, packed: str) -> str | None:
    """`e`, an interleaved rotation, as a kernel's input that the kernel turns (`_seq_turned`);
    None for another expression."""
    if not isinstance(e, ir.Call) or e.func != "rotate_interleaved":
        return None
    x, theta = e.args
    shape = forms.typer.shape_of
    d = shape(x)[0]
    turning = ir.Call(TURNING, (theta, ir.Number(d) if d.isdigit() else ir.Name(d)))
    turn = forms.seq_expr()._emit(turning)[0]
    plus = ""
    if isinstance(x, ir.Binary) and x.op == "+" and shape(x.left) == shape(x.right) == shape(x):
        # a vector and its bias: added as the kernel copies each span (as _rotated adds them)
        x, plus = x.left, f", plus={forms.tensor(x.right)}"
    return f"_seq_turned({forms.tensor(x)}, {turn}, _sizes{packed}{plus})"


def rounded_kernels(program: Program, operands: Collection[str]) -> set[str]:
    """The kernels among `operands` (a library's, those that can round what they multiply to
    a caller's 16-bit dtype) that the chunked form calls with `operands=`: none where a
    readout divides (`_divides_by_readout`), else every one it calls (but in one pass of
    several queries, `Call.stacked`, which runs without)."""
    if _divides_by_readout(program):
        return set()
    return {c.kernel for c in program.calls if c.initial and not c.stacked} & set(operands)


def _divides_by_readout(program: Program) -> bool:
    """Whether the output, or a later call's query, key or value, divides by something a
    readout computes: a normaliser (y = H q / (z . q)) or a softmax over a state's readout.
    The gradient of the query then sums the numerator's terms and the normaliser's, which
    cancel (to 0 at K = 1), and a kernel that rounds its output's gradient to bfloat16 rounds
    each term by itself: the rounding mixc fuzz's bfloat16 rule models then costs up to a
    third of a gradient's scale (linear_attention_normalized, transformer_vq, gsa), above
    MODEL_CAP (docs/fuzzing.md), so such a mixer's kernels multiply float32."""
    readouts = {name for name, _ in program.readouts}
    exprs = [program.chunk.output.expr] if program.chunk is not None else []
    for call in program.calls:
        exprs += [q.query for q in call.queries]
        for step in call.steps:
            exprs += [step.key, *(v.expr for v in step.values), *(a.expr for a in step.args)]
    for e in exprs:
        for node in ir.walk(e) if e is not None else ():
            if isinstance(node, Binary) and node.op == "/":
                if any(isinstance(x, ir.Name) and x.name in readouts for x in ir.walk(node.right)):
                    return True
    return False


def _emit_probe(out: Lines, call: SummaryCall, kernel_args: list[str], P: str) -> None:
    """The kernel run on probes into `_F0` (F in the kernel's layout) and `P`: an identity
    initial state beside a zero one along the axis the transition leaves alone (`call.probe`),
    zeros beside the write vector along it. Along the columns the final state is S_0 P + F;
    along the rows, P S_0 + F (each as the state, the kernel state's transpose, sees it)."""
    free, axis = call.probe
    acted = "k" if free == "v" else "v"
    rows = axis == "rows"
    x, other = local(free, call.group), local(acted, call.group)
    out(f"_K = {other}.shape[-1]")
    out(f"_width = {x}.shape[-1]")
    out(f"_{free} = _torch.cat([{x}, {x}.new_zeros(*{x}.shape[:-1], _K)], -1)")
    dim, shape = ("-2", "_width + _K, _K") if rows else ("-1", "_K, _width + _K")
    zeros = "_torch.zeros(_width, _K)" if rows else "_torch.zeros(_K, _width)"
    out(f"_S0 = _torch.cat([{zeros}, _torch.eye(_K)], {dim})")
    k = local("k", call.group)
    out(f"_S0 = _S0.to(dtype=_dtype, device=_device).expand(*{k}.shape[:2], {shape})")
    pair = {free: f"_{free}", acted: other}
    query = f"_torch.zeros_like({pair['k'] if not rows else '_' + free})"
    args = ", ".join([query, pair["k"], pair["v"], *kernel_args])
    out(f"_o, _S = _{call.kernel}({args}, initial_state=_S0, chunk_size=chunk_size)")
    out(f"_F0, {P} = _S.split([_width, _K], {dim})")


def _combined_steps(
    out: Lines, group: str, steps: tuple[Step, ...], parts: dict, joined: bool
) -> list[str]:
    """The several steps' locals of each argument (`parts`) made one: the keys and values each a
    list, one a write (`joined`: the kernel reads them together as rank 2 and up, with no copy
    joining them; the other arguments the first step's), a factor shared by
    a token's sub-tokens, or the steps interleaved into sub-tokens; returns the class's
    arguments as the call passes them."""
    kernel_args = []
    factors = {a.name for step in steps for a in step.args if a.layout == "factor"}
    for arg, locals_ in parts.items():
        present = [p for p in locals_ if p is not None]
        if not present:
            continue
        if joined and arg not in ("k", "v"):  # the transition's, on the first step only
            kernel_args.append(f"{arg}={present[0]}")
            continue
        if joined:
            shown = note(f"{len(steps)} writes a token, taken together")
            out(f"{local(arg, group)} = [{', '.join(present)}]{shown}")
        elif arg in factors:  # one factor for every step: a step without a gate has 0
            shown = note(f"shared by the {len(steps)} sub-tokens of a token")
            out(f"{local(arg, group)} = _sub_token_factor({present[0]}, {len(steps)}){shown}")
        else:
            pieces = ", ".join(p or f"_torch.zeros_like({present[0]})" for p in locals_)
            shown = note(f"{len(steps)} sub-tokens a token, one per step")
            out(f"{local(arg, group)} = _sub_tokens([{pieces}]){shown}")
        if arg not in ("k", "v"):
            kernel_args.append(f"{arg}={local(arg, group)}")
    return kernel_args

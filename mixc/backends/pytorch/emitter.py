"""The PyTorch backend: facts -> a standalone module with chunk, recurrent, parallel and step.

The chunked form comes from one lowering per transition class (`LOWERINGS`): each maps a group
of states to a kernel call with its query, key, value and log-gates, written as spec
expressions. Kernels and runtime helpers are copied verbatim from `_torch_kernels.py` and
`_torch_runtime.py`, so the generated file imports only torch.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from mixc.algebra.expand import Expander, NotAffine, inline
from mixc.analysis import Facts, StateFacts
from mixc.backends.pytorch import kernels as _torch_kernels
from mixc.backends.pytorch import runtime as _torch_runtime
from mixc.backends.pytorch.pyexpr import PyExpr, constant
from mixc.errors import NotYetImplemented
from mixc.frontend.ir import Binary, Call, Expr, Name, Timed, walk
from mixc.frontend.verify import SCALAR, Symbol, typer_for
from mixc.version import __version__

NAME = "pytorch"

# ----------------------------------------------------------------------------- lowerings


@dataclass(frozen=True)
class KernelCall:
    """How one group of states runs chunked: a kernel and its per-token arguments."""

    kernel: str
    args: tuple[
        tuple[str, Expr | None, str], ...
    ]  # (kernel argument, spec expression, "vector" | "scalar")
    parallel: str | None = None  # the quadratic form's kernel, when the class has one


def _sum(a: Expr | None, b: Expr | None) -> Expr | None:
    if a is None:
        return b
    return a if b is None else Binary("+", a, b)


def _lower_scalar(s: StateFacts) -> KernelCall:
    return KernelCall(
        "chunk_scalar_decay",
        (("g", s.transition.log("scalar"), "scalar"),),
        "parallel_scalar_decay",
    )


def _lower_diagonal(s: StateFacts) -> KernelCall:
    tr = s.transition
    scalar, key, value = tr.log("scalar"), tr.log("key"), tr.log("value")
    if key is not None or value is None:
        key = _sum(key, scalar)
    else:
        value = _sum(value, scalar)
    return KernelCall("chunk_diagonal", (("gk", key, "vector"), ("gv", value, "vector")))


def _lower_delta(s: StateFacts) -> KernelCall:
    tr = s.transition
    if str(tr.key) != str(s.writes[0].key):
        raise NotYetImplemented(
            f"the delta rule of {s.name} erases along {tr.key} but writes along {s.writes[0].key}; "
            "the chunked form needs the same key in both",
            tr.span,
        )
    return KernelCall(
        "chunk_delta", (("beta", tr.beta, "scalar"), ("g", tr.log("scalar"), "scalar"))
    )


#: One lowering per transition class with a chunked form.
LOWERINGS: dict[str, Callable[[StateFacts], KernelCall]] = {
    "identity": _lower_scalar,
    "scalar constant": _lower_scalar,
    "scalar data-dependent": _lower_scalar,
    "diagonal key-side": _lower_diagonal,
    "diagonal value-side": _lower_diagonal,
    "elementwise gate": _lower_diagonal,
    "identity minus rank-1": _lower_delta,
    "scalar decay times identity minus rank-1": _lower_delta,
}


def supports(facts: Facts) -> str | None:
    """None if this backend compiles `facts`; otherwise the reason."""
    if len(facts.mixer.outputs) != 1:
        names = ", ".join(e.target for e in facts.mixer.outputs)
        return f"NYI: a compiled module returns one output; this spec has {len(facts.mixer.outputs)} ({names})"
    return None


# ----------------------------------------------------------------------------- emission


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "", indent: int = 1) -> None:
        self.lines.append(("    " * indent + text) if text else "")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _source_of(module, names) -> str:
    return "\n\n\n".join(inspect.getsource(getattr(module, n)).rstrip() for n in names)


def emit(facts: Facts) -> str:
    """The generated module's source text (deterministic: same spec, same bytes)."""
    reason = supports(facts)
    if reason:
        raise NotYetImplemented(
            reason, facts.mixer.outputs[-1].span if facts.mixer.outputs else None
        )
    return _Module(facts).source()


class _Module:
    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.mixer = facts.mixer
        self.spec = facts.spec
        typer = typer_for(self.mixer, self.spec.shapes)
        for o in facts.outputs:
            for r in o.readouts:
                shape = typer.symbols[r.state].shape
                typer.symbols[f"_r{r.index}"] = Symbol(
                    "param", SCALAR if shape[1] == "1" else (shape[0], "1")
                )
        self.typer = typer
        self.expander = Expander(self.mixer, typer, {s.name for s in self.mixer.states})
        self.inputs = [d.name for d in self.mixer.inputs]
        self.required = [p.name for p in self.mixer.params if p.default is None]
        self.defaulted = [p.name for p in self.mixer.params if p.default is not None]
        self.states = [s.name for s in self.mixer.states]
        self.output = self.mixer.outputs[0]
        self.calls = {}
        if facts.chunkable:
            for group in facts.groups:
                self.calls[group] = LOWERINGS[facts.state(group[0]).transition.cls](
                    facts.state(group[0])
                )
        self.has_parallel = facts.chunkable and all(c.parallel for c in self.calls.values())

    # -- pieces ------------------------------------------------------------------------------

    def seq_expr(self) -> PyExpr:
        """Expressions over whole sequences: spec names are the prepared tensors."""

        def names(e: Expr) -> str:
            return e.name

        return PyExpr(self.typer, names)

    def step_expr(self) -> PyExpr:
        """Expressions inside the recurrence: q_t is a slice, H the previous state, H_t the new."""

        def names(e: Expr) -> str:
            if isinstance(e, Timed):
                return e.name if e.offset == -1 else f"{e.name}_t"
            return e.name

        return PyExpr(self.typer, names)

    def state_tuple(self) -> str:
        """`(H,)` or `(H, z)`: the states as a tuple expression or unpacking target."""
        return f"({self.states[0]},)" if len(self.states) == 1 else f"({', '.join(self.states)})"

    def signature(self, *extra: str) -> str:
        args = self.inputs + self.required
        kw = [f"{p}=None" for p in self.defaulted] + list(extra)
        return ", ".join(args + (["*", *kw] if kw else []))

    def args(self) -> str:
        return ", ".join(self.inputs + self.required + self.defaulted)

    def layout(self, decls) -> str:
        def tup(items: list[str]) -> str:
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"

        return tup(
            [
                f'("{d.name}", {tup([repr(s).replace(chr(39), chr(34)) for s in d.shape])})'
                for d in decls
            ]
        )

    def kernel_names(self) -> list[str]:
        return sorted(
            {c.kernel for c in self.calls.values()}
            | ({c.parallel for c in self.calls.values()} if self.has_parallel else set())
        )

    # -- the module --------------------------------------------------------------------------

    def source(self) -> str:
        text = self.spec.source.text
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        out = _Lines()
        header = f"# Generated by mixc {__version__} from {self.spec.source.filename}: edit the spec, not this file."
        out(header, 0)
        out(f"# spec sha256: {digest}", 0)
        out("#", 0)
        for line in text.rstrip("\n").splitlines():
            out(f"#   {line}".rstrip(), 0)
        title = self.mixer.description or self.mixer.name
        out(f'"""{_doc(title)} (compiled by mixc).', 0)
        out("", 0)
        out("Forms, all computing the same function:", 0)
        if self.facts.chunkable:
            out("  chunk      chunked parallel form, for training and prefill", 0)
        if self.has_parallel:
            out("  parallel   quadratic masked form (attention-like), for short sequences", 0)
        out("  recurrent  token by token", 0)
        out("  step       one token, for decoding", 0)
        for s in self.facts.states:
            out(f"State {s.name}: {s.transition.cls} ({s.transition.rule.split(':')[0]}).", 0)
        if not self.facts.chunkable:
            out(f"No chunked form: {_doc(self.facts.reason)}", 0)
        out('"""', 0)
        out("", 0)
        out("import math  # noqa: F401", 0)
        out("", 0)
        out("import torch", 0)
        out("import torch.nn.functional as F  # noqa: F401", 0)
        out("", 0)
        out("try:", 0)
        out("from mixc.errors import InputError as MixcError")
        out("except ImportError:  # the module runs without mixc installed", 0)
        out("class MixcError(ValueError):")
        out('"""A compiled mixer was called with a wrong argument."""', 2)
        out("", 0)
        out("", 0)
        plain = all(c.isprintable() or c == "\n" for c in text) and not text.endswith('"')
        if '"""' in text or "\\" in text or not plain:
            out(f"SPEC = {text!r}", 0)
        else:
            out(f'SPEC = """\\\n{text}"""', 0)
        out(f'SPEC_HASH = "sha256:{digest}"', 0)
        out(f'MIXC_VERSION = "{__version__}"', 0)
        out(f'NAME = "{self.mixer.name}"', 0)
        out(f"INPUTS = {self.layout(self.mixer.inputs)}", 0)
        out(f"PARAMS = {self.layout([p for p in self.mixer.params if p.default is None])}", 0)
        out(
            f"PARAM_DEFAULTS = {self.layout([p for p in self.mixer.params if p.default is not None])}",
            0,
        )
        out(f"STATES = {self.layout(self.mixer.states)}", 0)
        out(f'OUTPUT = "{self.output.target}"', 0)
        forms = (
            (["chunk"] if self.facts.chunkable else [])
            + (["parallel"] if self.has_parallel else [])
            + ["recurrent", "step"]
        )
        out(
            f"FORMS = ({', '.join(repr(f) for f in forms)},)  # the forms that compute (chunk raises NYI otherwise)",
            0,
        )
        classes = ", ".join(f'"{s.name}": "{s.transition.cls}"' for s in self.facts.states)
        out(f"CLASSES = {{{classes}}}", 0)
        out("", 0)
        out("", 0)
        runtime = [
            n
            for n, _ in inspect.getmembers(_torch_runtime, inspect.isfunction)
            if n.startswith("_")
        ]
        runtime.sort(key=lambda n: inspect.getsourcelines(getattr(_torch_runtime, n))[1])
        out("# ---- runtime helpers (the same in every mixc module) " + "-" * 38, 0)
        out("", 0)
        out("", 0)
        out(_source_of(_torch_runtime, runtime), 0)
        if self.calls:
            out("", 0)
            out("", 0)
            out("# ---- kernels, one per transition class " + "-" * 51, 0)
            out("", 0)
            out("", 0)
            out(_torch_kernels.kernel_source(self.kernel_names()), 0)
        out("", 0)
        out("", 0)
        out("# ---- this mixer " + "-" * 74, 0)
        out("", 0)
        out("", 0)
        self.emit_prepare(out)
        if self.facts.chunkable:
            self.emit_chunk(out)
        else:
            self.emit_no_chunk(out)
        if self.has_parallel:
            self.emit_parallel(out)
        self.emit_summary(out)
        self.emit_recurrence(out)
        self.emit_recurrent(out)
        self.emit_step(out)
        return out.text().rstrip("\n") + "\n"

    def emit_prepare(self, out: _Lines) -> None:
        out(f"def _prepare({self.signature('sequence')}):", 0)
        out('"""Check and lay out every argument; fill parameter defaults (h = head index)."""')
        inputs = ", ".join(self.inputs)
        unpack = f"({inputs},)" if len(self.inputs) == 1 else f"({inputs})"
        out(f"{unpack}, _sizes, _dtype = _prepare_inputs(INPUTS, [{inputs}], sequence)")
        out(f"_device = {self.inputs[0]}.device")
        if self.defaulted:
            out('_h = torch.arange(_sizes["NH"], dtype=_dtype, device=_device)')
        defaults = {p.name: p.default for p in self.mixer.params}

        def default_names(e: Expr) -> str:
            return "_h" if isinstance(e, Name) and e.name == "h" else e.name

        scalar_typer = PyExpr(self.typer, default_names)
        for p in self.mixer.params:
            if p.default is not None:
                out(f"if {p.name} is None:")
                out(f"{p.name} = {scalar_typer(defaults[p.name])}  # {p.default}", 2)
            dims = "".join(f'"{d}", ' for d in p.shape).rstrip(" ")
            out(
                f'{p.name} = _prepare_param("{p.name}", {p.name}, ({dims}), _sizes, _dtype, _device)'
            )
        out(f"return {self.args()}, _sizes, _dtype")
        out("", 0)
        out("", 0)

    def prologue(
        self, out: _Lines, sequence: bool, states_from: str | None, packed: bool = False
    ) -> None:
        call = ", ".join(self.inputs + self.required + [f"{p}={p}" for p in self.defaulted])
        out(f"{self.args()}, _sizes, _dtype = _prepare({call}, sequence={sequence})")
        out(f"_device = {self.inputs[0]}.device")
        batch = '_sizes["B"]'
        if packed:
            out(
                '_batch = _sizes["B"] if cu_seqlens is None else _check_cu_seqlens(cu_seqlens, _sizes)'
            )
            batch = "_batch"
        if states_from is not None:
            out(
                f"{self.state_tuple()} = _prepare_states(STATES, {states_from}, _sizes, _dtype, _device, {batch})"
            )

    def finish(self, out: _Lines, y: str, final: str) -> None:
        shape = self.spec.shapes[self.output.target]
        # squeeze, not [..., 0]: the backward of an index fills a zero tensor and copies into it
        index = (
            ".squeeze(-1).squeeze(-1)"
            if shape == SCALAR
            else ".squeeze(-1)"
            if shape[1] == "1"
            else ""
        )
        out(f"{self.output.target} = {y}{index}.to(_out_dtype)")
        out(f"return {self.output.target}, {final if ' if ' not in final else f'({final})'}")

    def final_states(self) -> str:
        parts = [
            f"{s}.squeeze(-1)" if self.typer.symbols[s].shape[1] == "1" else s for s in self.states
        ]
        return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"

    def emit_chunk(self, out: _Lines) -> None:
        out(
            f"def chunk({self.signature('initial_state=None', 'output_final_state=False', 'chunk_size=64', 'cu_seqlens=None')}):",
            0,
        )
        out('"""Chunked parallel form. Returns (output, final state or None).')
        out("")
        out("With cu_seqlens = [0, end_1, ..., T] (B = 1), runs each packed sequence from its own")
        out("initial state (one per sequence) and returns one final state per sequence.")
        out('"""')
        out("if chunk_size < 1 or chunk_size & (chunk_size - 1):")
        out('_fail(f"chunk_size: expected a power of two, got {chunk_size}")', 2)
        out(f"_out_dtype = {self.inputs[0]}.dtype")
        self.prologue(out, True, "initial_state", packed=True)
        readout_vars = self.emit_groups(out, parallel=False)
        self.emit_output(out, readout_vars)
        self.finish(
            out, f"{self.output.target}", f"{self.final_states()} if output_final_state else None"
        )
        out("", 0)
        out("", 0)

    def emit_no_chunk(self, out: _Lines) -> None:
        out(
            f"def chunk({self.signature('initial_state=None', 'output_final_state=False', 'chunk_size=64')}):",
            0,
        )
        out('"""No chunked form exists for this spec: use recurrent or step."""')
        reason = self.facts.reason.replace("NYI: ", "")
        out(f"_fail({('NYI: no chunked form (' + reason + '). Use recurrent() or step().')!r})")
        out("", 0)
        out("", 0)

    def emit_parallel(self, out: _Lines) -> None:
        out(f"def parallel({self.signature()}):", 0)
        out('"""Quadratic masked form, from a zero state. Returns (output, None)."""')
        out(f"_out_dtype = {self.inputs[0]}.dtype")
        self.prologue(out, True, None)
        readout_vars = self.emit_groups(out, parallel=True)
        self.emit_output(out, readout_vars)
        self.finish(out, f"{self.output.target}", "None")
        out("", 0)
        out("", 0)

    def emit_kernel_args(self, out: _Lines, group, call: KernelCall, packed: str) -> list[str]:
        """Key, value (the group's values side by side) and the class's arguments of one group."""
        e = self.seq_expr()
        facts = [self.facts.state(s) for s in group]
        name = group[0]
        out(f"_k_{name} = _seq_vector({e(facts[0].writes[0].key)}, _sizes{packed})")
        values = []
        for s in facts:
            w = s.writes[0]
            if w.value is None:
                value = 'torch.ones(_sizes["B"], _sizes["T"], _sizes["NH"], 1, 1, dtype=_dtype, device=_device)'
                if w.scale is not None:
                    value = f"{e(w.scale)} * {value}"
            else:
                value = e(w.value if w.scale is None else Binary("@", w.scale, w.value))
            values.append(value)
        value = values[0] if len(values) == 1 else f"torch.cat([{', '.join(values)}], -2)"
        out(f"_v_{name} = _seq_vector({value}, _sizes{packed})")
        kernel_args = []
        for arg, expr, kind in call.args:
            if expr is None:
                kernel_args.append("None")
                continue
            value = e(expr)
            if constant(expr) is not None:  # a constant gate, e.g. log(0.9): make it a tensor
                value = f"torch.full((1, 1), {value}, dtype=_dtype, device=_device)"
            out(f"_{arg}_{name} = _seq_{kind}({value}, _sizes{packed})  # {expr}")
            kernel_args.append(f"_{arg}_{name}")
        return kernel_args

    def widths(self, group) -> list[str]:
        return [
            ("1" if self.facts.state(s).vector else _size(self.facts.state(s).shape[0]))
            for s in group
        ]

    def emit_groups(self, out: _Lines, parallel: bool) -> dict[int, str]:
        """One kernel call per (group, query); returns readout index -> variable."""
        e = self.seq_expr()
        readout_vars = {}
        readouts = [r for o in self.facts.outputs for r in o.readouts]
        packed = "" if parallel else ", cu_seqlens"
        for group, call in self.calls.items():
            facts = [self.facts.state(s) for s in group]
            name = group[0]
            out(
                f"# {' and '.join(group)}: {facts[0].transition.cls} -> {call.parallel if parallel else call.kernel}"
            )
            kernel_args = self.emit_kernel_args(out, group, call, packed)
            if not parallel:
                s0 = [f"{s.name}.mT" if not s.vector else s.name for s in facts]
                s0_text = s0[0] if len(s0) == 1 else f"torch.cat([{', '.join(s0)}], -1)"
                out(f"_S0_{name} = {s0_text}")
            queries = [r for r in readouts if r.state in group]
            distinct: list[Expr] = []
            for r in queries:
                if str(r.query) not in map(str, distinct):
                    distinct.append(r.query)
            if not distinct and not parallel:
                distinct = [None]
            widths = self.widths(group)
            for i, query in enumerate(distinct):
                q_text = (
                    f"_seq_vector({e(query)}, _sizes{packed})"
                    if query is not None
                    else f"torch.zeros_like(_k_{name})"
                )
                out(f"_q = {q_text}")
                args = ", ".join(["_q", f"_k_{name}", f"_v_{name}", *kernel_args])
                if parallel:
                    out(f"_o = {call.parallel}({args})")
                else:
                    out(f"_o, _S = {call.kernel}({args}, _S0_{name}, chunk_size)")
                if len(group) == 1:
                    parts = ["_o"]
                else:
                    parts = [f"_o_{s}" for s in group]
                    out(f"{', '.join(parts)} = _o.split([{', '.join(widths)}], -1)")
                for r in queries:
                    if str(r.query) == str(query):
                        out(
                            f"_r{r.index} = _from_seq({parts[group.index(r.state)]}{packed})  # {Binary('.' if self.facts.state(r.state).vector else '@', Timed(r.state, 0), r.query)}"
                        )
                        readout_vars[r.index] = f"_r{r.index}"
                if i == 0 and not parallel:
                    self.emit_split_states(out, group, "_S")
        return readout_vars

    def emit_split_states(self, out: _Lines, group, source: str) -> None:
        """Kernel-layout [B, NH, K, width] -> each state of the group in its own layout."""
        facts = [self.facts.state(s) for s in group]
        if len(group) == 1:
            out(f"{group[0]} = {source}{'' if facts[0].vector else '.mT'}")
            return
        out(f"{', '.join(group)} = {source}.split([{', '.join(self.widths(group))}], -1)")
        for s in facts:
            if not s.vector:
                out(f"{s.name} = {s.name}.mT")

    def summary_reason(self) -> str | None:
        if not self.facts.chunkable:
            return self.facts.reason.replace("NYI: ", "")
        for group in self.calls:
            tr = self.facts.state(group[0]).transition
            if tr.log("value") is not None:
                return f"{group[0]} has a value-side gate; the summary covers transitions on the key side"
        return None

    def emit_summary(self, out: _Lines) -> None:
        out(f"def summary({self.signature('chunk_size=64')}):", 0)
        out(
            '"""The action of the sequence on the state, for context parallelism: returns (P, F), one of'
        )
        out(
            "each per state, such that the final state is `initial @ P + F` for every initial state"
        )
        out("(P: [B, NH, K, K]; F: the final state from a zero initial state). Summaries compose")
        out("associatively: (P1, F1) then (P2, F2) is (P1 @ P2, F1 @ P2 + F2).")
        out('"""')
        reason = self.summary_reason()
        if reason is not None:
            out(f"_fail({('NYI: no transition summary (' + reason + ')')!r})")
            out("", 0)
            out("", 0)
            return
        self.prologue(out, True, None)
        transitions, finals = {}, {}
        for group, call in self.calls.items():
            name = group[0]
            out(
                f"# {' and '.join(group)}: {call.kernel} on probes: zero writes from an identity state"
            )
            kernel_args = self.emit_kernel_args(out, group, call, "")
            out(f"_K = _k_{name}.shape[-1]")
            out(f"_width = _v_{name}.shape[-1]")
            out(f"_v = torch.cat([_v_{name}, _v_{name}.new_zeros(*_v_{name}.shape[:-1], _K)], -1)")
            out(
                "_S0 = torch.cat([torch.zeros(_K, _width), torch.eye(_K)], -1).to(dtype=_dtype, device=_device)"
            )
            out(f"_S0 = _S0.expand(*_k_{name}.shape[:2], _K, _width + _K)")
            args = ", ".join([f"torch.zeros_like(_k_{name})", f"_k_{name}", "_v", *kernel_args])
            out(f"_o, _S = {call.kernel}({args}, _S0, chunk_size)")
            out("_F, _P = _S.split([_width, _K], -1)")
            self.emit_split_states(out, group, "_F")
            for s in group:
                transitions[s] = "_P.mT"
                finals[s] = s if not self.facts.state(s).vector else f"{s}.squeeze(-1)"
        pieces = [transitions[s] for s in self.states]
        final_pieces = [finals[s] for s in self.states]
        if len(self.states) == 1:
            out(f"return {pieces[0]}, {final_pieces[0]}")
        else:
            out(f"return ({', '.join(pieces)}), ({', '.join(final_pieces)})")
        out("", 0)
        out("", 0)

    def emit_output(self, out: _Lines, readout_vars) -> None:
        o = self.facts.outputs[0]
        out(f"{o.name} = {self.seq_expr()(o.expr)}  # {self.output.value}")

    # -- the recurrence ----------------------------------------------------------------------

    def emit_recurrence(self, out: _Lines) -> None:
        states = ", ".join(self.states)
        out(f"def _recurrence({self.args()}, {states}, _sizes, _dtype, _device):", 0)
        out('"""Run the recurrence over [B, T, NH, ..] inputs; returns outputs and new states."""')
        out("_ys = []")
        out('for _t in range(_sizes["T"]):')
        used = {
            n.name
            for eq in self.mixer.equations
            for n in _walk_inlined(self.mixer, eq.value)
            if isinstance(n, Timed)
        }
        sliced = [i for i in self.inputs if i in used]
        if sliced:
            out(
                f"{', '.join(f'{i}_t' for i in sliced)} = {', '.join(f'{i}[:, _t]' for i in sliced)}",
                2,
            )
        e = self.step_expr()
        for name in self.facts.order:
            if name not in self.states:
                continue
            eq = self.mixer.update(name)
            body = inline(self.mixer, eq.value)
            try:
                text = self.gated_update(name, e) or e.terms(self.expander.expand(body))
            except NotAffine:
                text = e(body)
            out(f"{name}_t = {text}  # {eq.value}", 2)
        y = inline(self.mixer, self.output.value)
        out(f"_ys.append({e(y)})  # {self.output.target}_t = {self.output.value}", 2)
        if self.states:
            out(f"{states} = {', '.join(f'{s}_t' for s in self.states)}", 2)
        out(f"return torch.stack(_ys, 1), {self.state_tuple()}")
        out("", 0)
        out("", 0)

    def gated_update(self, name: str, e: PyExpr) -> str | None:
        """A decaying update as `exp(log-gate) * state + writes`: the decay comes from its
        log-gate, as in the chunked form, so a decay near 1 (sigmoid(10), 1 - sigmoid(-10))
        keeps accurate gradients. None for other classes (emitted from the expanded terms)."""
        s = self.facts.state(name)
        tr = s.transition
        if tr.cls not in (
            "scalar constant",
            "scalar data-dependent",
            "diagonal key-side",
            "diagonal value-side",
        ):
            return None
        if tr.gate is not None or not s.writes:
            return None
        decayed = name
        for g in tr.gates:  # the decay from its log-gate, unless the log is just log(x)
            log = g.log
            plain = isinstance(log, Call) and log.func == "log"
            factor = e(log.args[0]) if plain else f"torch.exp({e(log)})"
            if g.side == "scalar":
                decayed = f"{factor} * {decayed}"
            elif g.side == "key" and not s.vector:
                decayed = f"{decayed} * ({factor}).mT" if plain else f"{decayed} * {factor}.mT"
            else:  # value side, or the only axis of a vector state
                decayed = f"{factor} * {decayed}"
        writes = [
            t
            for t in self.expander.expand(inline(self.mixer, self.mixer.update(name).value))
            if not any(self.expander.has_state(a) for a in t.chain + t.scalars + t.gates)
        ]
        return f"{decayed} + {e.terms(writes)}" if writes else decayed

    def emit_recurrent(self, out: _Lines) -> None:
        out(
            f"def recurrent({self.signature('initial_state=None', 'output_final_state=False', 'cu_seqlens=None')}):",
            0,
        )
        out('"""Token-by-token form. Returns (output, final state or None).')
        out("")
        out(
            "With cu_seqlens = [0, end_1, ..., T] (B = 1), each packed sequence starts from its own"
        )
        out("initial state (one per sequence); one final state per sequence is returned.")
        out('"""')
        out(f"_out_dtype = {self.inputs[0]}.dtype")
        self.prologue(out, True, "initial_state", packed=True)
        states = ", ".join(self.states)
        out("if cu_seqlens is None:")
        out(
            f"{self.output.target}, {self.state_tuple()} = _recurrence({self.args()}, {states}, _sizes, _dtype, _device)",
            2,
        )
        out("else:")
        out("_outputs, _finals = [], []", 2)
        out(
            "for _n, (_start, _end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):",
            2,
        )
        per_token = self.inputs
        sliced = ", ".join(
            f"{a}[:, _start:_end]" if a in per_token else a
            for a in self.inputs + self.required + self.defaulted
        )
        out("if _end == _start:  # an empty sequence keeps its initial state", 3)
        own = [f"{s}[_n : _n + 1]" for s in self.states]
        out(
            f"_finals.append({f'({own[0]},)' if len(own) == 1 else f'({chr(44).join(own)})'.replace(',', ', ')})",
            4,
        )
        out("continue", 4)
        out("_piece = dict(_sizes, T=_end - _start)", 3)
        out(
            f"_y, _s = _recurrence({sliced}, {', '.join(f'{s}[_n : _n + 1]' for s in self.states)}, _piece, _dtype, _device)",
            3,
        )
        out("_outputs.append(_y)", 3)
        out("_finals.append(_s)", 3)
        out(f"{self.output.target} = torch.cat(_outputs, 1)", 2)
        out(
            f"{states}, = (torch.cat(_parts, 0) for _parts in zip(*_finals))"
            if len(self.states) == 1
            else f"{states} = (torch.cat(_parts, 0) for _parts in zip(*_finals))",
            2,
        )
        self.finish(
            out, self.output.target, f"{self.final_states()} if output_final_state else None"
        )
        out("", 0)
        out("", 0)

    def emit_step(self, out: _Lines) -> None:
        out(f"def step({self.signature('state=None')}):", 0)
        out('"""One token: inputs [B, NH, ..] without T. Returns (output, new state)."""')
        out(f"_out_dtype = {self.inputs[0]}.dtype")
        self.prologue(out, False, "state")
        states = ", ".join(self.states)
        out(
            f"{self.output.target}, {self.state_tuple()} = _recurrence({self.args()}, {states}, _sizes, _dtype, _device)"
        )
        self.finish(out, f"{self.output.target}[:, 0]", self.final_states())


def _size(symbol: str) -> str:
    return symbol if symbol.isdigit() else f'_sizes["{symbol}"]'


def _doc(text: str | None) -> str:
    return (text or "").replace("\\", "\\\\").replace('"""', "'''")


def _walk_inlined(mixer, e: Expr):
    return walk(inline(mixer, e))

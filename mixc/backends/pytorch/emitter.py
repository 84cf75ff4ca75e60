"""The PyTorch backend's emitter: a plan -> a standalone module with chunk, recurrent, parallel,
summary and step.

Each group of the plan names the backend-neutral kernel its class runs (`scalar_decay`,
`diagonal`, `delta`) and the kernel's arguments as spec expressions; this backend implements
kernel `X` as `chunk_X` (and `parallel_X` where the class has a quadratic form) in
`kernels/X.py`. Kernels and runtime helpers are copied verbatim into the generated file, so it
imports only torch.

The spec's names are the arguments and locals of the mixer's own functions (`chunk`, `step`,
...), so those functions read every global through a private alias (`_torch`, `_INPUTS`,
`_range`, `_chunk_delta`; see `_ALIASES`): no spec name starts with an underscore, so an input
named `torch`, `range` or `chunk_delta` shadows nothing they call. Their other locals are
private too, but a spec name's value at one token (`q_t`: no spec name ends in `_t`) and the
forms' options (`initial_state`, `chunk_size`, ...), which the verifier reserves. A local that
holds something of a spec name is named by `_local` (`_prev_x`, `_k_H`); one that holds a
common subexpression (see `Shared`: computed once where it repeats, `_kk_kappa`) is named after
what the spec calls it and kept apart from every other private name of the module.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import re
import textwrap
from pathlib import Path

from mixc.algebra.expand import inline
from mixc.analysis.plan import GroupPlan, Plan
from mixc.backends.pytorch import kernels as _torch_kernels
from mixc.backends.pytorch.docstrings import FormDocs
from mixc.backends.pytorch.lines import Lines, comment, doc_line, string
from mixc.backends.pytorch.pyexpr import PyExpr, Shared, constant
from mixc.frontend.ir import Binary, Call, Expr, Name, Neg, Timed, walk
from mixc.frontend.shapes import SCALAR
from mixc.version import __version__

NAME = "pytorch"
_RUNTIME = Path(__file__).with_name("runtime.py")

#: The globals the mixer's functions read besides the kernels, each under the private name it
#: is bound to at the top of the mixer's section; one line per group: modules, module
#: constants, Python built-ins. A kernel `chunk_X` is read as `_chunk_X`.
_ALIASES = (
    {"_torch": "torch", "_F": "torch.nn.functional"},
    {"_INPUTS": "INPUTS", "_STATES": "STATES"},
    {"_dict": "dict", "_enumerate": "enumerate", "_range": "range", "_zip": "zip"},
)


def _chunk_kernel(group: GroupPlan) -> str:
    return f"chunk_{group.kernel}"


def _stable_kernel(group: GroupPlan) -> str:
    """The kernel that carries the group's write scale in log space (`GroupPlan.log_scale`)."""
    return f"chunk_{group.transition_class.stable_kernel}"


def _parallel_kernel(group: GroupPlan) -> str:
    return f"parallel_{group.kernel}"


def supports(plan: Plan) -> str | None:
    """None if this backend compiles `plan`; otherwise the reason."""
    outputs = plan.mixer.outputs
    if len(outputs) != 1:
        names = ", ".join(e.target for e in outputs)
        return f"NYI: a compiled module returns one output; this spec has {len(outputs)} ({names})"
    for group in plan.groups:
        if group.kernel is not None and _chunk_kernel(group) not in _torch_kernels.KERNELS:
            return f"NYI: the PyTorch backend has no kernel {_chunk_kernel(group)} ({group.transition_class})"
    return None


# ----------------------------------------------------------------------------- emission


@functools.cache
def _runtime_source() -> str:
    """The runtime helpers (every top-level `_name` function of runtime.py) as written, in
    source order. Read as text, not imported: compiling a spec needs no torch."""
    text = _RUNTIME.read_text(encoding="utf-8")
    lines = text.splitlines()
    helpers = [
        node
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_")
    ]
    return "\n\n\n".join("\n".join(lines[n.lineno - 1 : n.end_lineno]) for n in helpers)


def emit(plan: Plan) -> str:
    """The generated module's source text (deterministic: same spec, same bytes), for a plan
    this backend `supports`."""
    return _Module(plan).source()


class _Module:
    #: The kernel library the module copies its kernels from (kernel_source), and the modules it
    #: imports: another backend that differs only in its kernels changes these two.
    kernels = _torch_kernels
    imports: tuple[str, ...] = ("torch",)

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.mixer = plan.mixer
        self.spec = plan.spec
        self.typer = plan.typer
        self.inputs = [d.name for d in self.mixer.inputs]
        self.required = [p.name for p in self.mixer.params if p.default is None]
        self.defaulted = [p.name for p in self.mixer.params if p.default is not None]
        self.states = [s.name for s in self.mixer.states]
        self.lagged = [d.name for d in self.mixer.lagged]
        # the local names of what the forms carry from token to token: the states, then each
        # lagged input's previous token (`_prev_x`, x at t-1)
        self.carried = self.states + [_local("prev", x) for x in self.lagged]
        self.output = self.mixer.outputs[0]
        self.docs = FormDocs(self.mixer, self.spec.shapes[self.output.target])
        self.groups = plan.groups if plan.chunkable else ()
        self.has_parallel = plan.forms.parallel is None
        # the points of common subexpressions (see Shared): recorded by the first run of the
        # mixer's functions, replayed with their locals by the second
        self._points: list[Shared] = []
        self._replay: list[Shared] | None = None
        self._point: Shared | None = None

    # -- pieces ------------------------------------------------------------------------------

    def seq_expr(self, functions: dict[str, str] | None = None) -> PyExpr:
        """Expressions over whole sequences: spec names are the prepared tensors."""

        def names(e: Expr) -> str:
            if isinstance(e, Timed) and e.offset == -1:  # a lagged input, shifted by a token
                return _local("prev", e.name)
            return e.name

        return PyExpr(self.typer, names, functions, self._point)

    def gate_expr(self) -> PyExpr:
        """Expressions of a kernel's gate arguments: a log-gate's log is `_log_gate`."""
        return self.seq_expr({"log": "_log_gate"})

    def step_expr(self) -> PyExpr:
        """Expressions inside the recurrence: q_t is a slice, H the previous state, H_t the new."""

        def names(e: Expr) -> str:
            if isinstance(e, Timed) and e.offset == -1:
                return _local("prev", e.name) if e.name in self.lagged else e.name
            if isinstance(e, Timed):
                return f"{e.name}_t"
            return e.name

        return PyExpr(self.typer, names, shared=self._point)

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
        spec_names = _spec_names(self.mixer)
        for shared in self._points:  # one a function: its locals' names differ from each other
            shared.recording = False
            own = set(taken)
            shared.locals = {
                text: _fresh(_local_base(e, spec_names), own) for text, e in shared.choose().items()
            }
        self._replay = list(self._points)

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

    def layout(self, decls) -> str:
        def tup(items: list[str]) -> str:
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"

        return tup([f"({string(d.name)}, {tup([string(s) for s in d.shape])})" for d in decls])

    def kernel_names(self) -> list[str]:
        return sorted(
            {_chunk_kernel(g) for g in self.groups}
            | {_stable_kernel(g) for g in self.groups if g.log_scale is not None}
            | ({_parallel_kernel(g) for g in self.groups} if self.has_parallel else set())
        )

    # -- the module --------------------------------------------------------------------------

    def source(self) -> str:
        library = Lines()
        self.emit_library(library)
        mixer = Lines()
        self.emit_mixer(mixer, library.text())
        body = library.text() + "\n\n" + mixer.text()
        out = Lines()
        self.emit_header(out)
        self.emit_imports(out)
        self.emit_constants(out)
        return out.text() + "\n\n" + body.rstrip("\n") + "\n"

    def emit_header(self, out: Lines) -> None:
        """The spec, its hash and a docstring saying which forms the module has and why."""
        text = self.spec.source.text
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        origin = f"mixc {__version__} from {self.spec.source.filename}"
        out(comment(f"Generated by {origin}: edit the spec, not this file."), 0)
        out(f"# spec sha256: {digest}", 0)
        out("#", 0)
        for line in text.rstrip("\n").split("\n"):  # the lexer's lines: a \r shows as such
            out(comment(f"  {line.removesuffix(chr(13))}").rstrip(), 0)
        title = self.mixer.description or self.mixer.name
        out(f'"""{doc_line(title)} (compiled by mixc).', 0)
        out("", 0)
        out("Forms, all computing the same function:", 0)
        if self.plan.chunkable:
            out("  chunk      chunked parallel form, for training and prefill", 0)
        if self.has_parallel:
            out("  parallel   quadratic masked form (attention-like), for short sequences", 0)
        out("  recurrent  token by token", 0)
        out("  step       one token, for decoding", 0)
        for s in self.plan.states:
            out(doc_line(f"State {s.name}: {s.transition.label} ({s.transition.rule.name})."), 0)
        if not self.plan.chunkable:
            for line in textwrap.wrap(f"No chunked form: {self.plan.reason}", 100):
                out(doc_line(line), 0)
        out('"""', 0)
        out("", 0)

    def emit_imports(self, out: Lines) -> None:
        """torch (torch.nn.functional comes with it), and the error the module raises."""
        for module in self.imports:
            out(f"import {module}", 0)
        out("", 0)
        out("try:", 0)
        out("from mixc.errors import InputError as MixcError")
        out("except ImportError:  # the module runs without mixc installed", 0)
        out("class MixcError(ValueError):")
        out('"""A compiled mixer was called with a wrong argument."""', 2)
        out("", 0)
        out("", 0)

    def emit_constants(self, out: Lines) -> None:
        text = self.spec.source.text
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        # one string over many lines where nothing in the text can end or escape it early
        plain = all(c.isprintable() or c == "\n" for c in text) and not text.endswith('"')
        if '"""' in text or "\\" in text or not plain:
            out(f"SPEC = {string(text)}", 0)
        else:
            out.lines.append(f'SPEC = """\\\n{text}"""')
        out(f'SPEC_HASH = "sha256:{digest}"', 0)
        out(f'MIXC_VERSION = "{__version__}"', 0)
        out(f"NAME = {string(self.mixer.name)}", 0)
        out(f"INPUTS = {self.layout(self.mixer.inputs)}", 0)
        out(f"PARAMS = {self.layout([p for p in self.mixer.params if p.default is None])}", 0)
        defaults = self.layout([p for p in self.mixer.params if p.default is not None])
        out(f"PARAM_DEFAULTS = {defaults}", 0)
        out(f"STATES = {self.layout(self.mixer.carried)}", 0)
        out(f"OUTPUT = {string(self.output.target)}", 0)
        forms = ", ".join(string(f) for f in self.plan.forms.names())
        out(f"FORMS = ({forms},)  # the forms that compute (chunk raises NYI otherwise)", 0)
        classes = ", ".join(
            f"{string(s.name)}: {string(s.transition.label)}" for s in self.plan.states
        )
        out(f"CLASSES = {{{classes}}}", 0)
        actions = ", ".join(
            f"{string(s.name)}: {string(s.transition.transition_class.summary_action)}"
            for s in self.plan.states
        )
        out(f"SUMMARY_ACTIONS = {{{actions}}}  # how summary()'s P acts: S_0 @ P or P * S_0", 0)
        chunk = self.plan.chunk_size
        for line in textwrap.wrap(f"chunk's default chunk size: {chunk.why}", 96):
            out.lines.append(comment(line))
        out(f"CHUNK_SIZE = {chunk.size}", 0)

    def emit_library(self, out: Lines) -> None:
        """The runtime helpers and the kernels this module calls, copied from their source."""
        out("# ---- runtime helpers (the same in every mixc module) " + "-" * 38, 0)
        out("", 0)
        out("", 0)
        out.lines.append(_runtime_source())  # as written, not re-wrapped
        if self.groups or self.lagged:
            out("", 0)
            out("", 0)
            out("# ---- kernels, one per transition class " + "-" * 51, 0)
            out("", 0)
            out("", 0)
            shifts = ["_shift_tokens", "_last_tokens"] if self.lagged else []
            shifts += ["_sub_tokens"] if any(g.sub_tokens for g in self.groups) else []
            out.lines.append(self.kernels.kernel_source(self.kernel_names() + shifts))

    def emit_mixer(self, out: Lines, library: str) -> None:
        """This mixer's functions, each without assignments it never reads, after the aliases
        they read their globals by. Emitted twice: the first run finds the common
        subexpressions (see Shared), the second computes each once."""
        first = self.emit_functions(wrapped=False)  # its names are those of the wrapped lines
        taken = {a for group in _ALIASES for a in group} | {f"_{k}" for k in self.kernel_names()}
        taken |= set(re.findall(r"\b_\w+", library + "\n".join(first.lines)))
        self.share(taken)
        functions = self.emit_functions()
        out("# ---- this mixer " + "-" * 74, 0)
        out("", 0)
        self.emit_aliases(out, "\n".join(functions.lines))
        out("", 0)
        out("", 0)
        out.lines += functions.lines
        if any(re.search(r"\b_summary\(", line) for line in functions.lines):
            out("", 0)
            out("", 0)
            out("_summary = summary  # what summary calls itself by (an input may be `summary`)", 0)

    def emit_functions(self, wrapped: bool = True) -> Lines:
        functions = Lines(wrapped)
        self.emit_prepare(functions)
        if self.plan.chunkable:
            self.emit_chunk(functions)
        else:
            self.emit_no_chunk(functions)
        if self.has_parallel:
            self.emit_parallel(functions)
        self.emit_summary(functions)
        self.emit_recurrence(functions)
        self.emit_recurrent(functions)
        self.emit_step(functions)
        functions.lines = _without_unread(functions.lines)
        return functions

    def emit_aliases(self, out: Lines, functions: str) -> None:
        """The private names `functions` read their globals by (those of `_ALIASES` they use,
        and their kernels), bound to the globals."""
        out("# The functions below take the spec's names as arguments and locals. No spec name", 0)
        out("# starts with an underscore, so none can shadow these names they read globals by.", 0)
        kernels = {f"_{k}": k for k in self.kernel_names()}
        for group in (*_ALIASES, *({a: k} for a, k in kernels.items())):
            used = {a: g for a, g in group.items() if re.search(rf"\b{a}\b", functions)}
            if used:
                out(f"{', '.join(used)} = {', '.join(used.values())}", 0)

    def emit_prepare(self, out: Lines) -> None:
        out(f"def _prepare({self.signature('_sequence')}):", 0)
        out('"""Check and lay out every argument; fill parameter defaults (h = head index)."""')
        inputs = ", ".join(self.inputs)
        unpack = f"({inputs},)" if len(self.inputs) == 1 else f"({inputs})"
        out(f"{unpack}, _sizes, _dtype = _prepare_inputs(_INPUTS, [{inputs}], _sequence)")
        out(f"_device = {self.inputs[0]}.device")
        if self.defaulted:
            out('_h = _torch.arange(_sizes["NH"], dtype=_dtype, device=_device)')
        defaults = {p.name: p.default for p in self.mixer.params}

        def default_names(e: Expr) -> str:
            return "_h" if isinstance(e, Name) and e.name == "h" else e.name

        scalar_typer = PyExpr(self.typer, default_names)
        # a shaped parameter's default takes its sizes from the inputs and the other parameters
        # (the verifier makes sure they give them), so it is filled after them
        shaped = [p for p in self.mixer.params if p.default is not None and p.shape]
        for p in [p for p in self.mixer.params if p not in shaped] + shaped:
            if p.default is not None:
                out(f"if {p.name} is None:")
                out(f"{p.name} = {scalar_typer(defaults[p.name])}{_note(p.default)}", 2)
                if p.shape:  # one value per head (h), the same in every entry of the head
                    ones = ", ".join(["1"] * len(p.shape))
                    sizes = ", ".join(_size(d) for d in p.shape)
                    where = "dtype=_dtype, device=_device"
                    out(f"{p.name} = _torch.as_tensor({p.name}, {where}).reshape(-1, {ones})", 2)
                    out(f'{p.name} = {p.name}.expand(_sizes["NH"], {sizes})', 2)
            dims = "".join(f"{string(d)}, " for d in p.shape).rstrip(" ")
            where = "_sizes, _dtype, _device"
            out(f"{p.name} = _prepare_param({string(p.name)}, {p.name}, ({dims}), {where})")
        out(f"return {self.args()}, _sizes, _dtype")
        out("", 0)
        out("", 0)

    def prologue(
        self, out: Lines, sequence: bool, states_from: str | None, packed: bool = False
    ) -> None:
        call = ", ".join(self.inputs + self.required + [f"{p}={p}" for p in self.defaulted])
        out(f"{self.args()}, _sizes, _dtype = _prepare({call}, _sequence={sequence})")
        out(f"_device = {self.inputs[0]}.device")
        batch = '_sizes["B"]'
        if packed:
            packed_batch = "_check_cu_seqlens(cu_seqlens, _sizes, _device)"
            out(f'_batch = _sizes["B"] if cu_seqlens is None else {packed_batch}')
            batch = "_batch"
        if states_from is not None:
            where = f"_sizes, _dtype, _device, {batch}, {string(states_from)}"
            call = f"_prepare_states(_STATES, {states_from}, {where})"
            if self.carried:
                out(f"{self.state_tuple()} = {call}")
            else:  # a stateless mixer: checks that no state is given (None or ())
                out(call)
            for d in self.mixer.lagged:
                if not d.shape:  # a scalar input's last token, laid out as its tokens are
                    prev = _local("prev", d.name)
                    out(f"{prev} = {prev}[..., None, None]")

    def emit_sign_checks(self, out: Lines) -> None:
        """The chunked forms' run-time check of each decay the caller passes whose sign the spec
        cannot prove (`Plan.sign_checks`): none for a decay written provably positive."""
        for c in self.plan.sign_checks:
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
        note = _note(f"{self.output.target}_t = {self.output.value}") if read else ""
        out(f"{self.output.target} = {y}{index}.to(_out_dtype){note}", indent)
        text = "None" if final is None else _tuple(final)
        if optional:
            if len(text) > 60:  # a long tuple of final states: on lines of its own
                _tuple_line(out, "_final = ", final, "", indent)
                text = "_final"
            text = f"({text} if output_final_state else None)"
        out(f"return {self.output.target}, {text}", indent)

    def final_states(self, lagged: str = "prev") -> list[str]:
        """The final states in the module's layout; each lagged input's last token from its
        local `_local(lagged, x)`."""
        names = self.states + [_local(lagged, x) for x in self.lagged]
        squeeze = {0: ".squeeze(-1).squeeze(-1)", 1: ".squeeze(-1)", 2: ""}
        return [
            f"{name}{squeeze[len(d.shape)]}"
            for name, d in zip(names, self.mixer.carried, strict=True)
        ]

    def emit_shifts(self, out: Lines, packed: bool, carried: bool) -> None:
        """Each lagged input at t-1, `_prev_x`: x one token later, each sequence starting from
        the carried token (zeros without one); with `carried`, also the token to carry on,
        `_last_x`."""
        seqlens = ", cu_seqlens" if packed else ""
        for x in self.lagged:
            prev = _local("prev", x)
            if carried:
                last = _local("last", x)
                out(f"{last} = _last_tokens({x}, {prev}{seqlens})  # carried to the next call")
            first = prev if carried else "None"
            out(f"{prev} = _shift_tokens({x}, {first}{seqlens})  # {x}_{{t-1}}")

    def emit_chunk(self, out: Lines) -> None:
        options = ("initial_state=None", "output_final_state=False", "chunk_size=CHUNK_SIZE")
        out(f"def chunk({self.signature(*options, 'cu_seqlens=None')}):", 0)
        self.docstring(out, "chunk")
        out("_check_chunk_size(chunk_size)")
        out('_check_flag("output_final_state", output_final_state)')
        out(f"_out_dtype = _output_dtype(_INPUTS, {self.inputs[0]})")
        self.prologue(out, True, "initial_state", packed=True)
        self.emit_sign_checks(out)
        out('if _sizes["B"] == 0:  # an empty batch: no chunk to run, every step is empty')
        states = ", ".join(self.carried)
        out(f"{self.output.target}, {self.state_tuple()} = {self.recurrence_call(states)}", 2)
        self.finish(out, self.output.target, self.final_states(), optional=True, indent=2)
        self.emit_shifts(out, packed=True, carried=True)
        with self.point(out, 1):
            self.emit_groups(out, parallel=False)
            y = self.emit_output(out, scaled=True)
        self.finish(out, y, self.final_states(lagged="last"), optional=True)
        out("", 0)
        out("", 0)

    def emit_no_chunk(self, out: Lines) -> None:
        options = ("initial_state=None", "output_final_state=False", "chunk_size=CHUNK_SIZE")
        out(f"def chunk({self.signature(*options)}):", 0)
        out('"""No chunked form exists for this spec: use recurrent or step."""')
        reason = self.plan.reason.replace("NYI: ", "")
        out(f"_fail({string(f'NYI: no chunked form ({reason}). Use recurrent() or step().')})")
        out("", 0)
        out("", 0)

    def emit_parallel(self, out: Lines) -> None:
        out(f"def parallel({self.signature()}):", 0)
        self.docstring(out, "parallel")
        out(f"_out_dtype = _output_dtype(_INPUTS, {self.inputs[0]})")
        self.prologue(out, True, None)
        self.emit_sign_checks(out)
        self.emit_shifts(out, packed=False, carried=False)
        with self.point(out, 1):
            self.emit_groups(out, parallel=True)
            y = self.emit_output(out)
        self.finish(out, y, None)
        out("", 0)
        out("", 0)

    def emit_kernel_args(
        self, out: Lines, group: GroupPlan, packed: str, stable: bool = False
    ) -> list[str]:
        """Key, value (the group's values side by side) and the class's arguments of one group;
        `stable`: the values without their write scale, which is passed as its log."""
        if group.sub_tokens:
            return self.emit_sub_token_args(out, group, packed)
        e = self.seq_expr()
        state_facts = [self.plan.state(s) for s in group.states]
        name = group.name
        key = self.tensor(state_facts[0].writes[0].key)
        out(f"{_local('k', name)} = _seq_vector({key}, _sizes{packed})")
        values = []
        if any(s.writes[0].value is None for s in state_facts):  # a vector state: a value of 1
            sizes = '_sizes["B"], _sizes["T"], _sizes["NH"], 1, 1'
            out(f"_ones = _torch.ones({sizes}, dtype=_dtype, device=_device)")
        for s in state_facts:
            w = s.writes[0]
            scale = None if stable else w.scale
            if w.value is None:
                value = "_ones"
                if scale is not None:
                    value = f"{e(scale)} * {value}"
            else:
                value = e(w.value if scale is None else Binary("@", scale, w.value))
            values.append(value)
        value = values[0] if len(values) == 1 else f"_torch.cat([{', '.join(values)}], -2)"
        out(f"{_local('v', name)} = _seq_vector({value}, _sizes{packed})")
        kernel_args = []
        gate = self.gate_expr()
        for arg in group.args:
            if arg.expr is None:
                continue
            if arg.layout == "bound":
                kernel_args.append(f"{arg.name}={float(arg.expr.text)!r}")
                continue
            value = self.tensor(arg.expr, gate)  # a constant gate, e.g. log(0.9), as a tensor
            local = _local(arg.name, name)
            out(f"{local} = _seq_{arg.layout}({value}, _sizes{packed}){_note(arg.expr)}")
            kernel_args.append(f"{arg.name}={local}")
        if stable:
            scale = group.log_scale
            note = _note(f"the write scale exp({scale}), as its log")
            out(f"{_local('s', name)} = _seq_scalar({e(scale)}, _sizes{packed}){note}")
            kernel_args.append(f"log_scale={_local('s', name)}")
        return kernel_args

    def emit_sub_token_args(self, out: Lines, group: GroupPlan, packed: str) -> list[str]:
        """Key, value and the class's arguments of a group that applies several steps a token:
        each step's, interleaved along time into sub-tokens (`_sub_tokens`), an argument a step
        lacks (no decay) as zeros."""
        name, n = group.name, len(group.sub_tokens)
        gate = self.gate_expr()
        parts: dict[str, list[str | None]] = {"k": [], "v": []}
        layouts = {"k": "vector", "v": "vector"}
        for i, sub in enumerate(group.sub_tokens, 1):
            w = sub.write
            value = w.value if w.scale is None else Binary("@", w.scale, w.value)
            for arg, expr, layout, how in (
                ("k", w.key, "vector", None),
                ("v", value, "vector", None),
                # a step's bound would not hold for the other steps' sub-tokens
                *((a.name, a.expr, a.layout, gate) for a in sub.args if a.layout != "bound"),
            ):
                parts.setdefault(arg, [])
                layouts[arg] = layout
                if expr is None:
                    parts[arg].append(None)
                    continue
                local = _local(f"{arg}{i}", name)
                out(
                    f"{local} = _seq_{layout}({self.tensor(expr, how)}, _sizes{packed}){_note(expr)}"
                )
                parts[arg].append(local)
        kernel_args = []
        for arg, locals_ in parts.items():
            present = [p for p in locals_ if p is not None]
            if not present:
                continue
            pieces = ", ".join(p or f"_torch.zeros_like({present[0]})" for p in locals_)
            note = _note(f"{n} sub-tokens a token, one per step")
            out(f"{_local(arg, name)} = _sub_tokens([{pieces}]){note}")
            if arg not in ("k", "v"):
                kernel_args.append(f"{arg}={_local(arg, name)}")
        return kernel_args

    def tensor(self, expr: Expr, e: PyExpr | None = None) -> str:
        """An expression as a tensor: a constant (a column's key of 1, log(0.9)) as [1, 1]."""
        value = (e or self.seq_expr())(expr)
        if constant(expr) is not None:
            return f"_torch.full((1, 1), {value}, dtype=_dtype, device=_device)"
        return value

    def widths(self, group) -> list[str]:
        return [
            ("1" if self.plan.state(s).vector else _size(self.plan.state(s).shape[0]))
            for s in group
        ]

    def emit_groups(self, out: Lines, parallel: bool) -> None:
        """One kernel call per (group, query), each readout into its variable `_r<index>`."""
        packed = "" if parallel else ", cu_seqlens"
        for group in self.groups:
            states = group.states
            state_facts = [self.plan.state(s) for s in states]
            name = group.name
            k, v, initial = _local("k", name), _local("v", name), _local("S0", name)
            stable = group.log_scale is not None and not parallel
            kernel = _parallel_kernel(group) if parallel else _chunk_kernel(group)
            kernel = _stable_kernel(group) if stable else kernel
            out(comment(f"{' and '.join(states)}: {group.transition.label} -> {kernel}"))
            kernel_args = self.emit_kernel_args(out, group, packed, stable)
            if not parallel:
                s0 = [f"{s.name}.mT" if not s.vector else s.name for s in state_facts]
                s0_text = s0[0] if len(s0) == 1 else f"_torch.cat([{', '.join(s0)}], -1)"
                out(f"{initial} = {s0_text}")
            queries = list(group.queries) or ([] if parallel else [None])
            widths = self.widths(states)
            for i, query in enumerate(queries):
                q_text = (
                    f"_seq_vector({self.tensor(query.expr)}, _sizes{packed})"
                    if query is not None
                    else f"_torch.zeros_like({k})"
                )
                out(f"_q = {q_text}")
                steps = len(group.sub_tokens)
                if steps and query is not None:  # the query at each token's last sub-token
                    zeros = ", ".join(["_torch.zeros_like(_q)"] * (steps - 1))
                    out(f"_q = _sub_tokens([{zeros}, _q])")
                previous = query is not None and query.offset == -1
                if previous:  # S_{t-1} q_t is the kernel's S_s q_{s+1} one token later
                    out("_q_next = _F.pad(_q[:, :, 1:], (0, 0, 0, 1))  # the next token's query")
                first = "_q_next" if previous else "_q"
                args = ", ".join([first, f"{k}", f"{v}", *kernel_args])
                if parallel:
                    out(f"_o = _{kernel}({args})")
                else:
                    init = f"initial_state={initial}, chunk_size=chunk_size"
                    found = "_o, _S" if not stable else "_o, _m, _S"
                    out(f"{found} = _{kernel}({args}, {init})")
                if steps:
                    out(f"_o = _o[:, :, {steps - 1}::{steps}]  # each token's last sub-token")
                if stable and i == 0:  # the rows' scale, exp(-m_t)
                    unscale = group.unscale.name
                    out(f"{unscale} = _from_seq(_torch.exp(-_m)[..., None]{packed})")
                if previous:
                    start = (
                        "_torch.zeros_like(_o[:, :, :1])"
                        if parallel
                        else f"_q[:, :, :1] @ {initial}"
                    )
                    out(f"_o = _torch.cat([{start}, _o[:, :, :-1]], 2)  # S_{{t-1}} q_t")
                if len(states) == 1:
                    parts = ["_o"]
                else:
                    parts = [_local("o", s) for s in states]
                    out(f"{', '.join(parts)} = _o.split([{', '.join(widths)}], -1)")
                for r in query.readouts if query is not None else ():
                    read = Binary("." if self.plan.state(r.state).vector else "@", r.read, r.query)
                    part = parts[states.index(r.state)]
                    out(f"_r{r.index} = _from_seq({part}{packed}){_note(read)}")
                if i == 0 and not parallel:
                    self.emit_split_states(out, states, "_S")

    def emit_split_states(self, out: Lines, group, source: str, role: str | None = None) -> None:
        """Kernel-layout [B, NH, K, width] -> each state of the group in its own layout, into
        the state's name (or with a `role`, its local `_local(role, name)`)."""
        state_facts = [self.plan.state(s) for s in group]
        names = [s if role is None else _local(role, s) for s in group]
        if len(group) == 1:
            out(f"{names[0]} = {source}{'' if state_facts[0].vector else '.mT'}")
            return
        out(f"{', '.join(names)} = {source}.split([{', '.join(self.widths(group))}], -1)")
        for s, name in zip(state_facts, names, strict=True):
            if not s.vector:
                out(f"{name} = {name}.mT")

    def emit_summary(self, out: Lines) -> None:
        out(f"def summary({self.signature('chunk_size=CHUNK_SIZE')}):", 0)
        self.docstring(out, "summary")
        missing = self.plan.forms.summary
        if missing is not None:
            out(f"_fail({string(f'NYI: no transition summary ({missing.text})')})")
            out("", 0)
            out("", 0)
            return
        out("_check_chunk_size(chunk_size)")
        first = self.inputs[0]
        out(f"if _empty_batch({first}):  # B = 0: checked, then one zero token's summary, emptied")
        call = ", ".join(self.inputs + self.required + [f"{p}={p}" for p in self.defaulted])
        out(f"_prepare({call}, _sequence=True)", 2)
        each = _tuple(self.inputs, one=True)
        out(f"_one = [_x.new_zeros(1, 1, *_x.shape[2:]) for _x in {each}]", 2)
        rest = "".join(f", {p}" for p in self.required)
        rest += "".join(f", {p}={p}" for p in self.defaulted)
        out(f"return _no_sequences(_summary(*_one{rest}, chunk_size=chunk_size))", 2)
        self.prologue(out, True, None)
        self.emit_sign_checks(out)
        transitions, finals = {}, {}
        with self.point(out, 1):
            for plan in self.groups:
                self.emit_group_summary(out, plan, transitions, finals)
        pieces = [transitions[s] for s in self.states]
        final_pieces = [finals[s] for s in self.states]
        if len(self.states) == 1:
            out(f"return {pieces[0]}, {final_pieces[0]}")
        else:
            out(f"return ({', '.join(pieces)}), ({', '.join(final_pieces)})")
        out("", 0)
        out("", 0)

    def emit_group_summary(self, out: Lines, plan: GroupPlan, transitions, finals) -> None:
        """One group's (P, F): its kernel run on probes."""
        if plan.transition_class.summary_action == "elementwise":
            self.emit_elementwise_summary(out, plan, transitions, finals)
            return
        group, name, kernel = plan.states, plan.name, _chunk_kernel(plan)
        k, v = _local("k", name), _local("v", name)
        probing = "on probes: zero writes from an identity state"
        out(comment(f"{' and '.join(group)}: {kernel} {probing}"))
        kernel_args = self.emit_kernel_args(out, plan, "")
        out(f"_K = {k}.shape[-1]")
        out(f"_width = {v}.shape[-1]")
        out(f"_v = _torch.cat([{v}, {v}.new_zeros(*{v}.shape[:-1], _K)], -1)")
        out("_S0 = _torch.cat([_torch.zeros(_K, _width), _torch.eye(_K)], -1)")
        where = "dtype=_dtype, device=_device"
        out(f"_S0 = _S0.to({where}).expand(*{k}.shape[:2], _K, _width + _K)")
        args = ", ".join([f"_torch.zeros_like({k})", f"{k}", "_v", *kernel_args])
        out(f"_o, _S = _{kernel}({args}, initial_state=_S0, chunk_size=chunk_size)")
        out("_F0, _P = _S.split([_width, _K], -1)")
        self.emit_split_states(out, group, "_F0")
        for s in group:
            transitions[s] = "_P.mT"
            finals[s] = s if not self.plan.state(s).vector else f"{s}.squeeze(-1)"

    def emit_elementwise_summary(self, out: Lines, plan: GroupPlan, transitions, finals) -> None:
        """A group that acts on its state entry by entry, as G ⊙ S_0 + F: F from a zero state,
        G (the product of the gates) from a state of ones with no writes."""
        group, name, kernel = plan.states, plan.name, _chunk_kernel(plan)
        k, v = _local("k", name), _local("v", name)
        out(
            comment(f"{' and '.join(group)}: {kernel} from zeros (F) and, with no writes, ones (G)")
        )
        kernel_args = self.emit_kernel_args(out, plan, "")
        q0 = f"_torch.zeros_like({k})"
        args = ", ".join([q0, f"{k}", f"{v}", *kernel_args])
        out(f"_o, _F0 = _{kernel}({args}, chunk_size=chunk_size)")
        out("_S1 = _torch.ones_like(_F0)")
        args = ", ".join([q0, f"{k}", f"_torch.zeros_like({v})", *kernel_args])
        out(f"_o, _G = _{kernel}({args}, initial_state=_S1, chunk_size=chunk_size)")
        self.emit_split_states(out, group, "_F0")
        self.emit_split_states(out, group, "_G", role="G")
        for s in group:
            # a vector state (a row or a column) in its own layout [B, NH, K]
            vector = self.plan.state(s).shape[1] == "1"
            transitions[s] = _local("G", s) + ("" if not vector else ".squeeze(-1)")
            finals[s] = s if not vector else f"{s}.squeeze(-1)"

    def emit_output(self, out: Lines, scaled: bool = False) -> str:
        """The output from its readouts (`scaled`: from the chunked form's readouts, scaled
        where a group carries its write scale in log space); returns the variable that holds
        it."""
        o = self.plan.outputs[0]
        expr = o.scaled if scaled and o.scaled is not None else o.expr
        if isinstance(expr, Name):
            return expr.name
        out(f"{o.name} = {self.seq_expr()(expr)}{_note(self.output.value)}")
        return o.name

    # -- the recurrence ----------------------------------------------------------------------

    def emit_recurrence(self, out: Lines) -> None:
        states = ", ".join(self.carried)
        params = ", ".join([self.args(), *self.carried, "_sizes, _dtype, _device"])
        out(f"def _recurrence({params}):", 0)
        out('"""Run the recurrence over [B, T, NH, ..] inputs; returns outputs and new states."""')
        out("_ys = []")
        out('for _t in _range(_sizes["T"]):')
        used = {
            n.name
            for eq in self.mixer.equations
            for n in _walk_inlined(self.mixer, eq.value)
            if isinstance(n, Timed)
        }
        sliced = [i for i in self.inputs if i in used]
        if sliced:
            names, slices = (", ".join(f"{i}{x}" for i in sliced) for x in ("_t", "[:, _t]"))
            out(f"{names} = {slices}", 2)
        with self.point(out, 2):
            e = self.step_expr()
            for name in self.plan.order:
                if name not in self.states:
                    continue
                eq = self.mixer.update(name)
                state = self.plan.state(name)
                if state.terms is None:  # not affine: the update as written
                    text = e(inline(self.mixer, eq.value))
                else:
                    text = self.gated_update(name, e) or e.terms(list(state.terms))
                out(f"{name}_t = {text}{_note(eq.value)}", 2)
            y = e(inline(self.mixer, self.output.value))
            out(f"_ys.append({y}){_note(f'{self.output.target}_t = {self.output.value}')}", 2)
        if self.carried:
            now = [f"{s}_t" for s in self.states] + [f"{x}_t" for x in self.lagged]
            out(f"{states} = {', '.join(now)}", 2)
        out(f"return _torch.stack(_ys, 1), {self.state_tuple()}")
        out("", 0)
        out("", 0)

    def gated_update(self, name: str, e: PyExpr) -> str | None:
        """A decaying update as `exp(log-gate) * state + writes`: the decay comes from its
        log-gate, as in the chunked form, so a decay near 1 (sigmoid(10), 1 - sigmoid(-10))
        keeps accurate gradients. None for other classes (emitted from the expanded terms)."""
        s = self.plan.state(name)
        tr = s.transition
        if not tr.transition_class.step_decays(tr) or not s.writes:
            return None
        decayed = name
        for g in tr.gates:  # the decay from its log-gate, unless the log is just log(x)
            log = g.log
            plain = isinstance(log, Call) and log.func == "log"
            factor = e(log.args[0] if plain else Call("exp", (log,), span=log.span))
            if g.side == "scalar":
                decayed = f"{factor} * {decayed}"
            elif g.side == "key" and not s.vector:
                decayed = f"{decayed} * ({factor}).mT" if plain else f"{decayed} * {factor}.mT"
            else:  # value side, or the only axis of a vector state
                decayed = f"{factor} * {decayed}"
        ex = self.plan.expander
        writes = [
            t for t in s.terms if not any(ex.has_state(a) for a in t.chain + t.scalars + t.gates)
        ]
        return f"{decayed} + {e.terms(writes)}" if writes else decayed

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
        _tuple_line(out, "_finals.append(", own, ")", 4, one=True)
        out("continue", 4)
        out("_piece = _dict(_sizes, T=_end - _start)", 3)
        own_states = [f"{s}[_n : _n + 1]" for s in self.carried]
        args = ", ".join([sliced, *own_states, "_piece, _dtype, _device"])
        out(f"_y, _s = _recurrence({args})", 3)
        out("_outputs.append(_y)", 3)
        out("_finals.append(_s)", 3)
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

    def emit_step(self, out: Lines) -> None:
        out(f"def step({self.signature('state=None')}):", 0)
        self.docstring(out, "step")
        out(f"_out_dtype = _output_dtype(_INPUTS, {self.inputs[0]})")
        self.prologue(out, False, "state")
        states = ", ".join(self.carried)
        out(f"{self.output.target}, {self.state_tuple()} = {self.recurrence_call(states)}")
        self.finish(out, f"{self.output.target}[:, 0]", self.final_states())


#: Assignments the emitter writes in every function, dropped where the function never reads them.
_OPTIONAL = re.compile(r"^\s+(_device|_batch|_out_dtype) = ")
_READ = {name: re.compile(rf"\b{name}\b") for name in ("_device", "_batch", "_out_dtype")}


def _without_unread(lines: list[str]) -> list[str]:
    """`lines` without optional assignments (`_OPTIONAL`) their function never reads again."""
    text = "\n".join(lines)
    starts, at = [], 0  # where each line starts in `text`
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    starts.append(at)
    out: list[str] = []
    end = len(lines)  # the line that ends the function of the lines below it
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        found = _OPTIONAL.match(line)
        read = found and _READ[found.group(1)].search(text, starts[i + 1], starts[end] - 1)
        if not found or read:  # an optional assignment is kept where the function reads it
            out.append(line)
        if line.startswith("def "):
            end = i
    return out[::-1]


def _tuple(items: list[str], one: bool = False) -> str:
    """`a`, or `(a, b)`, or with `one` a tuple even of one item, `(a,)`."""
    if len(items) == 1:
        return f"({items[0]},)" if one else items[0]
    return f"({', '.join(items)})"


def _tuple_line(
    out: Lines, head: str, items: list[str], tail: str, indent: int, one: bool = False
) -> None:
    """`head + tuple + tail` for the tuple of `items` (see `_tuple`): on one line where it
    fits, else one item a line."""
    text = _tuple(items, one)
    if len(head + text + tail) + 4 * indent <= 100:
        out(head + text + tail, indent)
        return
    out(head + "(", indent)
    for item in items:
        out(item + ",", indent + 1)
    out(")" + tail, indent)


def _local(role: str, name: str) -> str:
    """The local that holds what `role` says of spec name `name`: `_prev_x` (input x at t-1),
    `_last_x` (its last token, carried to the next call), a group's kernel arguments (`_k_H`,
    `_v_H`, `_S0_H`, `_beta_H`, `_k1_H` for its first sub-token). Every such name starts with
    an underscore, which no spec name can. The role is written without its underscores
    (`g_scale` as `gscale`), so it ends at the second underscore and two locals are the same
    only for the same role and name (`_g_scale_H` would be g_scale of H and g of scale_H)."""
    return f"_{role.replace('_', '')}_{name}"


#: What an operation's local is called when it repeats (see `_local_base`).
_OPERATIONS = {
    "*": "product",
    "@": "product",
    ".": "dot",
    "/": "ratio",
    "+": "sum",
    "-": "difference",
    "^": "power",
}


def _spec_names(mixer) -> dict[Expr, str]:
    """The names the spec gives computations: each per-token value's (`i_t = exp(...)`: `i`)
    and each call of a let function (`kk(kappa_t)`: `kk_kappa`, its arguments' names after
    the function's where all are names), keyed by the expression they inline to."""
    states = {s.name for s in mixer.states}
    lets = {fn.name for fn in mixer.lets}
    names: dict[Expr, str] = {}
    for eq in mixer.equations:
        if eq.target not in states:
            names.setdefault(inline(mixer, eq.value), eq.target)
    for eq in mixer.equations:
        for node in walk(eq.value):
            if isinstance(node, Call) and node.func in lets:
                names.setdefault(inline(mixer, node), _named(node.func, node.args))
    return names


def _named(base: str, operands) -> str:
    """`base` followed by the names among `operands` where each is a name or a constant."""
    names = [x.name for x in operands if isinstance(x, Name | Timed)]
    if names and all(isinstance(x, Name | Timed) or constant(x) is not None for x in operands):
        return "_".join([base, *names])
    return base


def _local_base(e: Expr, spec_names: dict[Expr, str]) -> str:
    """What the local of a common subexpression is named after: the spec's name for it, else
    its function or operation followed by its operands' names (`sigmoid_alpha`,
    `product_beta_k`, `scaled_beta` for 2 * beta) or, for a function of one computation, that
    computation's name (`exp_logsigmoid_f`)."""
    if e in spec_names:
        return spec_names[e]
    if isinstance(e, Call):
        if len(e.args) == 1 and isinstance(e.args[0], Call):
            inner = f"{e.func}_{_local_base(e.args[0], spec_names)}"
            return inner if len(inner) <= 24 else e.func
        return _named(e.func, e.args)
    if isinstance(e, Binary):
        scaled = e.op in "*@" and sum(constant(x) is not None for x in (e.left, e.right)) == 1
        return _named("scaled" if scaled else _OPERATIONS[e.op], (e.left, e.right))
    return _named("negated" if isinstance(e, Neg) else "transposed", (e.operand,))


def _fresh(base: str, taken: set[str]) -> str:
    """`_base`, or `_base2`, `_base3`, ... : the first not in `taken` (which it joins). It
    starts with an underscore, so it is no spec name."""
    name, n = f"_{base}", 2
    while name in taken:
        name, n = f"_{base}{n}", n + 1
    taken.add(name)
    return name


def _size(symbol: str) -> str:
    return symbol if symbol.isdigit() else f"_sizes[{string(symbol)}]"


def _note(what: object) -> str:
    """A trailing comment saying what a line computes (a spec expression, shown as written)."""
    return "  " + comment(str(what))


def _walk_inlined(mixer, e: Expr):
    return walk(inline(mixer, e))

"""A program rendered as one standalone module: the header, the module's tables, the runtime
helpers and kernels it carries, and the mixer's functions (see `render_module`)."""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import textwrap
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mixc.backends.pytorch.angles import AngleSums
from mixc.backends.pytorch.kernels import definitions, kernel_source, reached
from mixc.backends.pytorch.lines import Lines, comment, doc_line, string
from mixc.backends.pytorch.names import note, size, tuple_text, without_unread
from mixc.backends.pytorch.pyexpr import PyExpr
from mixc.backends.pytorch.recurrence import RecurrentForms
from mixc.backends.pytorch.sequence import SequenceForms, rounded_kernels
from mixc.frontend.ir import CHANNEL, Expr, Name, walk
from mixc.lowering.program import Program
from mixc.version import __version__

#: The runtime helpers (runtime.py) by name, as `kernels.definitions` reads a kernel file.
_RUNTIME = definitions(("runtime",), Path(__file__).parent)

#: The globals the mixer's functions read besides the kernels, each under the private name it
#: is bound to at the top of the mixer's section; one line per group: modules, module
#: constants, Python built-ins. A kernel `chunk_X` is read as `_chunk_X`.
_ALIASES = (
    {"_torch": "torch", "_F": "torch.nn.functional"},
    {"_INPUTS": "INPUTS", "_STATES": "STATES"},
    {"_dict": "dict", "_enumerate": "enumerate", "_range": "range", "_zip": "zip"},
)


@dataclass(frozen=True)
class KernelLibrary:
    """The kernels a rendered module calls by the program's kernel names and carries as source:
    `kernels` names those it has, `definitions` every definition a module may copy (the kernels
    and their helpers, by name, as `kernels.definitions` reads them: the module copies those it
    uses, and imports no kernel package), and `imports` the modules that text needs; the
    kernels in `operands` take `operands=`, the dtype of the caller's inputs, which the module
    widens to its compute dtype before any kernel sees them (a kernel that
    multiplies 16-bit operands, as a Triton kernel on the tensor cores, rounds the arguments
    `operands` names for it, and its products' other operands, to it). The PyTorch backend's library is its own kernel package; another backend
    renders the same module around its own library. The kernels in `ordered` take `reverse=`
    and `strict=`: a state that runs backward in time, or is read before the token's update,
    runs through them as it is; another kernel gets its inputs reversed and moved one token
    instead, and its outputs moved back. The kernels in `turned` take a rotated
    query or key as a _Turned (its rotation applied as the kernel splits it into chunks: see
    _seq_turned). The kernels in `decayed` take `decayed=` with `strict=`: a folded write's
    readout reads the state after the token's decay, before its write; those in `diagonal`
    also return q_t . k_t (or None), which that readout's correction reads."""

    kernels: Collection[str]
    definitions: Mapping[str, tuple[str, str, frozenset[str]]]
    imports: tuple[str, ...]
    operands: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    turned: Collection[str] = ()
    ordered: Collection[str] = ()
    decayed: Collection[str] = ()
    diagonal: Collection[str] = ()


def render_module(program: Program, library: KernelLibrary) -> str:
    """The module's source text (deterministic: same program, same bytes)."""
    return _Module(program, library).source()


def missing_kernels(program: Program, library: KernelLibrary) -> list[str]:
    """The kernels the program calls that `library` lacks."""
    return [k for k in kernel_names(program) if k not in library.kernels]


def kernel_names(program: Program) -> list[str]:
    """Every kernel the program's forms call, sorted."""
    calls = [*program.calls, *(program.parallel.calls if program.parallel else ())]
    return sorted({c.kernel for c in calls} | {c.kernel for c in program.summary.calls})


class _Module(AngleSums, SequenceForms, RecurrentForms):
    """The whole module: the forms' functions (SequenceForms, RecurrentForms) and around them
    what makes the file stand alone."""

    def __init__(self, program: Program, library: KernelLibrary) -> None:
        super().__init__(program)
        self.library = library
        self.kernels = kernel_names(program)

    def source(self) -> str:
        mixer = Lines()
        self.emit_mixer(mixer)
        library = Lines()
        self.emit_library(library, mixer.text())
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
        if self.program.chunk is not None:
            out("  chunk      chunked parallel form, for training and prefill", 0)
        if self.program.parallel is not None:
            out("  parallel   quadratic masked form (attention-like), for short sequences", 0)
        out("  recurrent  token by token", 0)
        if "step" in self.program.forms:
            out("  step       one token, for decoding", 0)
        for s in self.program.states:
            out(doc_line(f"State {s.name}: {s.label} ({s.rule})."), 0)
        if self.program.chunk is None:
            for line in textwrap.wrap(f"No chunked form: {self.program.no_chunk}", 100):
                out(doc_line(line), 0)
        if self.program.no_step is not None:
            for line in textwrap.wrap(f"No step form: {self.program.no_step}", 100):
                out(doc_line(line), 0)
        out('"""', 0)
        out("", 0)

    def emit_imports(self, out: Lines) -> None:
        """The library's modules, and the error the module raises."""
        for module in self.library.imports:
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
        out(f"INPUTS = {_layout(self.mixer.inputs)}", 0)
        out(f"PARAMS = {_layout([p for p in self.mixer.params if p.default is None])}", 0)
        defaults = _layout([p for p in self.mixer.params if p.default is not None])
        out(f"PARAM_DEFAULTS = {defaults}", 0)
        out(f"STATES = {_layout(self.mixer.carried)}", 0)
        out(f"OUTPUT = {string(self.output.target)}", 0)
        forms = ", ".join(string(f) for f in self.program.forms)
        out(f"FORMS = ({forms},)  # the forms that compute (chunk raises NYI otherwise)", 0)
        called = {c.kernel for c in self.program.calls if not self.summed(c)}  # angles: no kernel
        rounded = sorted(called & rounded_kernels(self.program, self.library.operands))
        if rounded:  # what mixc fuzz --dtype bfloat16 models (docs/fuzzing.md)
            pairs = ", ".join(
                f"{string(k)}: {tuple_text([string(a) for a in self.library.operands[k]], True)}"
                for k in rounded
            )
            out(comment("the kernels that round these arguments to 16-bit inputs' dtype"), 0)
            out(f"OPERANDS = {{{pairs}}}", 0)
        classes = ", ".join(f"{string(s.name)}: {string(s.label)}" for s in self.program.states)
        out(f"CLASSES = {{{classes}}}", 0)
        actions = ", ".join(
            f"{string(s.name)}: {string(s.summary_action)}" for s in self.program.states
        )
        left = any(s.summary_action == "left" for s in self.program.states)
        acts = "S_0 @ P, P @ S_0 or P * S_0" if left else "S_0 @ P or P * S_0"
        out(f"SUMMARY_ACTIONS = {{{actions}}}  # how summary()'s P acts: {acts}", 0)
        if self.program.summary.runs:
            order = ", ".join(
                string(s.state) for call in self.program.summary.calls for s in call.slots
            )
            shown = "a pipeline's states in the order its passes run"
            out(f"SUMMARY_ORDER = ({order},)  # {shown}", 0)
        chunk = self.program.chunk_size
        for line in textwrap.wrap(f"chunk's default chunk size: {chunk.why}", 96):
            out.lines.append(comment(line))
        out(f"CHUNK_SIZE = {chunk.size}", 0)

    def emit_library(self, out: Lines, mixer: str) -> None:
        """The runtime helpers and the kernels that the mixer's functions (`mixer`, their text)
        use, directly or through each other, copied from their source in its order (see
        `copied`), and the registration of the operators they call under torch.compile."""
        needed, registers = self.copied(mixer)
        head = "# ---- runtime helpers (those this module uses) "
        out(head + "-" * (92 - len(head)), 0)
        out("", 0)
        out("", 0)
        out.lines.append(kernel_source(needed & _RUNTIME.keys(), _RUNTIME))  # as written
        kernels = needed & self.library.definitions.keys()
        if kernels:
            out("", 0)
            out("", 0)
            out("# ---- kernels, one per transition class " + "-" * 51, 0)
            out("", 0)
            out("", 0)
            out.lines.append(kernel_source(kernels, self.library.definitions))
        if registers:
            # what the operators run: the kernels' definitions and the runtime helpers they use
            every = {**_RUNTIME, **self.library.definitions}
            self.emit_registration(out, registers, kernel_source(kernels, every))

    def copied(self, mixer: str) -> tuple[set[str], list[str]]:
        """The definitions of runtime.py and of the library that the text `mixer` reads (no
        local of it has one's name: see `emit_mixer`) and every one they reach, and the
        registrations among them: those that set an operator of `_Operators` (operators.py) that
        the rest reads, which the module calls once it has defined them all."""
        every = {**_RUNTIME, **self.library.definitions}
        clash = sorted(_RUNTIME.keys() & self.library.definitions.keys())
        if clash:  # a module would keep only one of the two copies
            raise RuntimeError(f"{', '.join(clash)}: defined by runtime.py and the kernels")
        used = _identifiers(mixer) & every.keys()
        registers: list[str] = []
        while True:
            needed = reached([*used, *registers], every)
            read = set().union(*(_operators(every[n][1])[0] for n in needed))
            found = [n for n, (_, text, _) in every.items() if _operators(text)[1] & read]
            if found == registers:
                return needed, registers
            registers = found

    def emit_registration(self, out: Lines, registers: list[str], kernels: str) -> None:
        """The statements that register the kernels as operators for torch.compile, in a
        namespace named by the hash of `kernels`, the text the operators run (the same kernels,
        the same operators)."""
        digest = hashlib.sha256(kernels.encode("utf-8")).hexdigest()[:16]
        out("", 0)
        out("", 0)
        out("# torch.compile calls each kernel as one opaque operator (see operators.py in", 0)
        out("# mixc's kernels), in a namespace named by a hash of the kernels' text above", 0)
        for register in registers:  # an assignment: the module has no bare expression statement
            out(
                f'{register.replace("_register", "_operator")} = {register}("mixc_{digest}", globals())',
                0,
            )

    def emit_mixer(self, out: Lines) -> None:
        """This mixer's functions, each without assignments it never reads, after the aliases
        they read their globals by. Emitted twice: the first run finds the common
        subexpressions (see Shared), the second computes each once. The names they take take
        none a module may copy (runtime.py's and the library's: the same whatever it copies)."""
        first = self.emit_functions(wrapped=False)  # its names are those of the wrapped lines
        taken = {a for group in _ALIASES for a in group} | {f"_{k}" for k in self.kernels}
        taken |= _RUNTIME.keys() | self.library.definitions.keys()
        taken |= set(re.findall(r"\b_\w+", "\n".join(first.lines)))
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
        if self.program.chunk is not None:
            self.emit_chunk(functions, self.program.chunk)
        else:
            self.emit_no_chunk(functions)
        if self.program.parallel is not None:
            self.emit_parallel(functions, self.program.parallel)
        self.emit_summary(functions)
        self.emit_recurrence(functions)
        self.emit_recurrent(functions)
        if self.program.no_step is None:
            self.emit_step(functions)
        else:
            self.emit_no_step(functions)
        functions.lines = without_unread(functions.lines)
        return functions

    def emit_prepare(self, out: Lines) -> None:
        out(f"def _prepare({self.signature('_sequence')}):", 0)
        out('"""Check and lay out every argument; fill parameter defaults (h = head index)."""')
        inputs = ", ".join(self.inputs)
        unpack = f"({inputs},)" if len(self.inputs) == 1 else f"({inputs})"
        out(f"{unpack}, _sizes, _dtype = _prepare_inputs(_INPUTS, [{inputs}], _sequence)")
        out(f"_device = {self.inputs[0]}.device")
        if self.defaulted:
            out('_h = _torch.arange(_sizes["NH"], dtype=_dtype, device=_device)')
        # a shaped parameter's default takes its sizes from the inputs and the other parameters
        # (the verifier makes sure they give them), so it is filled after them
        shaped = [p for p in self.mixer.params if p.default is not None and p.shape]
        for p in [p for p in self.mixer.params if p not in shaped] + shaped:
            if p.default is not None:
                self.emit_default(out, p)
            dims = "".join(f"{string(d)}, " for d in p.shape).rstrip(" ")
            dtype = "_torch.float64" if p.name in self.angle_params else "_dtype"
            where = f"_sizes, {dtype}, _device"
            out(f"{p.name} = _prepare_param({string(p.name)}, {p.name}, ({dims}), {where})")
        out(f"return {self.args()}, _sizes, _dtype")
        out("", 0)
        out("", 0)

    def emit_default(self, out: Lines, p) -> None:
        """Fill the parameter `p` from its default where the caller gives none: one value per
        head (h), the same in every entry of the head, or one per channel (idx) of a vector. An
        angle parameter (see `angle_params`) is computed in float64."""
        angle = p.name in self.angle_params
        channel = any(isinstance(n, Name) and n.name == CHANNEL for n in walk(p.default))
        dtype = "_torch.float64" if angle else "_dtype"
        where = f"dtype={dtype}, device=_device"
        head = "_h"
        if angle:
            out(f'_h64 = _torch.arange(_sizes["NH"], {where})')
            head = "_h64"
        if channel:
            out(f"_idx = _torch.arange({size(p.shape[0])}, {where})")
            head = f"{head}[:, None]"

        def default_names(e: Expr) -> str:
            if isinstance(e, Name) and e.name == "h":
                return head
            return "_idx" if isinstance(e, Name) and e.name == CHANNEL else e.name

        value = PyExpr(self.typer, default_names)(p.default)
        out(f"if {p.name} is None:")
        out(f"{p.name} = {value}{note(p.default)}", 2)
        if p.shape:
            ones = ", ".join(["1"] * len(p.shape))
            sizes = ", ".join(size(d) for d in p.shape)
            shaped = f"_torch.as_tensor({p.name}, {where})"
            out(f"{p.name} = {shaped}{'' if channel else f'.reshape(-1, {ones})'}", 2)
            out(f'{p.name} = {p.name}.expand(_sizes["NH"], {sizes})', 2)

    def emit_aliases(self, out: Lines, functions: str) -> None:
        """The private names `functions` read their globals by (those of `_ALIASES` they use,
        and their kernels), bound to the globals."""
        out("# The functions below take the spec's names as arguments and locals. No spec name", 0)
        out("# starts with an underscore, so none can shadow these names they read globals by.", 0)
        kernels = {f"_{k}": k for k in self.kernels}
        for group in (*_ALIASES, *({a: k} for a, k in kernels.items())):
            used = {a: g for a, g in group.items() if re.search(rf"\b{a}\b", functions)}
            if used:
                out(f"{', '.join(used)} = {', '.join(used.values())}", 0)


def _layout(decls) -> str:
    """The names and shapes of `decls` as a tuple literal: ((name, (dims..)), ...)."""

    def tup(items: list[str]) -> str:
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"

    return tup([f"({string(d.name)}, {tup([string(s) for s in d.shape])})" for d in decls])


@functools.cache
def _operators(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The attributes of `_Operators` (the registered operators: operators.py) that the
    definition `text` reads, and those it sets (as `_Operators.x` or `functions["_Operators"].x`,
    the class in a module's globals): a registration sets an operator that a kernel reads."""
    read, written = set(), set()
    for node in ast.walk(ast.parse(text)) if "_Operators" in text else ():
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        named = isinstance(owner, ast.Name) and owner.id == "_Operators"
        key = isinstance(owner, ast.Subscript) and isinstance(owner.slice, ast.Constant)
        if named or (key and owner.slice.value == "_Operators"):
            (read if isinstance(node.ctx, ast.Load) else written).add(node.attr)
    return frozenset(read), frozenset(written)


def _identifiers(text: str) -> set[str]:
    """Every word of the code `text` that could be a name: each name it binds or reads, and
    words of its comments and docstrings too (a superset: a helper a comment names is copied
    unused, one the code reads is never missed). A regular expression, not symtable: a large
    spec's mixer is megabytes of code, which symtable took 0.85 s to read, this 0.17 s."""
    return set(re.findall(r"\b[A-Za-z_]\w*", text))

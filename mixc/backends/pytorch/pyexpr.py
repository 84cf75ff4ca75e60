"""IR expressions -> Python source over tensors laid out as [..., rows, cols].

Vectors are columns [.., d, 1], scalars [.., 1, 1], matrices [.., m, n], so one emitter serves
every form: whole sequences ([B, T, NH, .., ..]), single steps ([B, NH, .., ..]) and per-head
parameters ([NH, .., ..]) broadcast against each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mixc.backends.pytorch.fused import fused_sum
from mixc.backends.pytorch.lines import string
from mixc.errors import SpecAnalysisError
from mixc.frontend.builtins import BUILTINS, ROTATIONS
from mixc.frontend.constants import FLOATS, Folder, constant
from mixc.frontend.ir import (
    POSITION,
    Binary,
    Call,
    Expr,
    Identity,
    Name,
    Neg,
    Number,
    Timed,
    Transpose,
    angle_reads,
    walk,
)
from mixc.frontend.shapes import IDENTITY, SCALAR, Shape, Symbol, Typer
from mixc.lowering.program import Product

# Python operator precedence, for minimal parentheses
_ADD, _MUL, _UNARY, _POW, _ATOM = 1, 2, 3, 4, 5

#: The built-ins of two arguments, each emitted as a clamp where one argument is a constant:
#: max(x, c) is x.clamp(min=c) (torch's maximum takes tensors only), min(x, c) x.clamp(max=c).
_CLAMPS = {"max": "min", "min": "max"}

#: The built-ins whose helper takes the compute dtype, to which it rounds a float64 angle.
_ANGLED = ("cos", "sin")

_NOT_SIZE = Symbol("input", SCALAR)

#: The emitter's call of a rotation's turn e^(i theta) (computed by `_turning`): made by the
#: emitter, never by a spec (a spec's calls are to built-ins, its lets inlined before), so that
#: rotations by the same angles share one turn.
TURNING = "turn"


def literal(value: float) -> str:
    """A number as a Python literal. Refuses inf and nan, which have none (their repr would
    read as a name): a constant of the spec that the algebra folded past float64's range."""
    if not math.isfinite(value):
        raise SpecAnalysisError(
            f"a constant of this spec is {value}, outside the range of a float64",
            hint="write the constant with a smaller magnitude (at most about 1.8e308)",
        )
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _turning_call(py: PyExpr, theta: Expr, d: Expr) -> str:
    """The call of `_turning` that `py` emits: the turn by the angles theta of the pairs of a
    vector of d entries. Over whole sequences the angle is computed from compacted views of what
    it reads (_compact): once for the values its broadcast axes repeat, its turn expanded back;
    and where it has an angle for each of the d entries (the first d / 2 read) and is
    elementwise along them, from the first d / 2 rows of its vectors only."""
    size = d.text if isinstance(d, Number) else f"_sizes[{string(d.name)}]"
    if not py.compact_angles:  # a token's angle: nothing to gain per call
        return f"_turning_of({py._emit(theta)[0]}, {size}, _dtype)"
    rows = py.shape(theta)[0]
    read = rows == (d.text if isinstance(d, Number) else d.name)
    read = read and _rowwise(theta, py.shape)
    leaves: list[str] = []

    def compacted(x: Expr) -> str:
        leaves.append(py.names(x))
        cut = f", {size} // 2" if read and py.shape(x)[0] == rows != "1" else ""
        return f"_compact({leaves[-1]}{cut})"

    emitter = PyExpr(py.typer, compacted, py.functions)
    scaled = _position_scaled(theta, py.shape)  # a position times frequencies: see _turning_at
    angle = ", ".join(emitter._emit(x)[0] for x in scaled or (theta,))
    reads = "".join(f", {leaf}" for leaf in dict.fromkeys(leaves))
    turning = "_turning_at" if scaled else py.functions.get(TURNING, "_turning_of")
    return f"{turning}({angle}, {size}, _dtype{reads})"


def _position_scaled(angle: Expr, shape: Callable[[Expr], Shape]) -> tuple[Expr, Expr] | None:
    """(a scalar that reads no per-token name but the position, frequencies that read none)
    where `angle` is their product (RoPE's pos_t theta), which _turning_at may build from two
    small tables; None for any other angle."""
    if not isinstance(angle, Binary) or angle.op not in ("*", "@"):
        return None
    for scale, freq in ((angle.left, angle.right), (angle.right, angle.left)):
        timed = [n.name for n in walk(scale) if isinstance(n, Timed)]
        if shape(scale) != SCALAR or shape(freq) == SCALAR or set(timed) != {POSITION}:
            continue
        if not any(isinstance(n, Timed) for n in walk(freq)):
            return scale, freq
    return None


def _rowwise(angle: Expr, shape: Callable[[Expr], Shape]) -> bool:
    """Whether each row of the column `angle` is computed from the same row of the columns it
    reads alone (and from scalars): elementwise operations and functions of such columns and
    products with scalars, no other product of matrices, no transpose, no sum over rows. Its first rows are then those of the
    first rows of its columns."""
    column = (shape(angle)[0], "1")
    for node in walk(angle):
        scaled = isinstance(node, Binary) and SCALAR in (shape(node.left), shape(node.right))
        if isinstance(node, Binary) and node.op in ("@", ".") and not scaled:  # a scalar's scales
            return False
        if isinstance(node, Call) and not getattr(BUILTINS.get(node.func), "elementwise", False):
            return False
        if isinstance(node, Transpose | Identity):
            return False
        if isinstance(node, Name | Timed) and shape(node) not in (SCALAR, column):
            return False
    return True


def computes(e: Expr, constant_of: Callable[[Expr], float | None] = constant) -> bool:
    """Whether `e` is a computation worth a local when it repeats: a call or an operation, not
    a name, a constant, a negated name or a transpose (a view: `x.mT` of a shared x reads as
    well as a local would). constant_of: constant, or an emitter's remembering one."""
    while isinstance(e, Neg) and constant_of(e) is None:
        e = e.operand
    return not (
        isinstance(e, Name | Timed | Number | Identity | Transpose) or constant_of(e) is not None
    )


def _negated_product(
    e: Expr, shape: Callable[[Expr], Shape], constant_of: Callable[[Expr], float | None]
) -> Expr | None:
    """For -(a * b) (or a / b, or a product with a scalar written `@`): the same product with
    one factor negated, the smaller one (the first on a tie): negation is exact, so (-a) * b
    is -(a * b) to the bit, and negating a [.., 1, 1] gate costs less than negating the whole
    product. None for anything else (a matrix product, whose factors may both be large)."""
    if not isinstance(e, Binary) or e.op not in ("*", "/", "@"):
        return None
    left, right = shape(e.left), shape(e.right)
    if IDENTITY in (left, right) or (e.op == "@" and SCALAR not in (left, right)):
        return None

    def size(x: Expr, s: Shape) -> tuple[int, int]:
        return (0 if constant_of(x) is not None else 1, sum(d != "1" for d in s))

    def negated(x: Expr) -> Expr:
        return x.operand if isinstance(x, Neg) else Neg(x, span=x.span)

    if size(e.right, right) < size(e.left, left):
        return Binary(e.op, e.left, negated(e.right), span=e.span)
    return Binary(e.op, negated(e.left), e.right, span=e.span)


class Shared:
    """The common subexpressions of one point of a generated function: a run of its lines at
    one indent, where no name the expressions read is rebound (a function's body before its
    return, a loop's body before its states move on). A computation (`computes`) that occurs
    more than once among the expressions emitted there is computed once, into a local, on
    the line before its first use; same text at the same point is the same value, so the
    outputs are those of the code written out in full, to the bit.

    The emitter runs twice. In the first run the point records the tree of computations each
    expression emits (`trees`); `choose` then picks what to share: the longest repeated text,
    then again on what is left, so `f(g(x))` twice is one local, and g(x) gets its own only
    if it is used elsewhere too. In the second run the point emits with those locals. The
    rotations of one turn are locals too, defined together by one _rotated_all call at the
    first one's use (one operator under torch.compile): those whose vector reads no state."""

    def __init__(self) -> None:
        self.trees: list[tuple[str, Expr, list]] = []
        self._open: list[list] = []
        self.recording = True
        self.locals: dict[str, str] = {}  # plain text -> local
        self.out: Callable[[str], None] = lambda line: None
        self._defined: set[str] = set()
        # the rotations recorded (text -> (function, turn's text), expression); those chosen
        # to be turned together: each text -> its group, in order of first occurrence
        self._rotations: dict[str, tuple[tuple[str, str], Expr]] = {}
        self.grouped: dict[str, list[tuple[str, Expr]]] = {}

    def emit(self, py: PyExpr, e: Expr) -> tuple[str, int]:
        # a call goes straight to PyExpr._call, as _compute would send it: a Python frame
        # fewer for each level of a deep nest of calls (the parser allows MAX_DEPTH levels)
        call = isinstance(e, Call)
        if self.recording:
            self._open.append([])
            text, level = (py._call(e), _ATOM) if call else py._compute(e)
            inner = self._open.pop()
            (self._open[-1] if self._open else self.trees).append((text, e, inner))
            self._record_rotation(py, e, text, inner)
            return text, level
        text = py.plain(e)
        local = self.locals.get(text)
        if local is None:
            return (py._call(e), _ATOM) if call else py._compute(e)
        if local not in self._defined and text in self.grouped:
            self._define_group(py, text)
        if local not in self._defined:
            self._defined.add(local)
            self.out(f"{local} = {py._call(e) if call else py._compute(e)[0]}")
        return local, _ATOM

    def _record_rotation(self, py: PyExpr, e: Expr, text: str, inner: list) -> None:
        """Note the rotation `e` (emitted as `text`) by its function and its turn's text,
        where it may be turned with the others of that turn (_hoistable)."""
        turns = [t for t, x, _ in inner if isinstance(x, Call) and x.func == TURNING]
        if isinstance(e, Call) and e.func in ROTATIONS and turns and _hoistable(py, e.args[0]):
            self._rotations.setdefault(text, ((e.func, turns[0]), e))

    def _define_group(self, py: PyExpr, text: str) -> None:
        """Define the local of the rotation `text` with those of the others of its turn not
        defined yet, in one call of _rotated_all: the turn computed once (one operator call
        under torch.compile), each vector as the rotation alone would turn it."""
        members = [
            (t, m)
            for t, m in self.grouped[text]
            if self.locals[t] not in self._defined and (t == text or py.plain(m) == t)
        ]
        if len(members) < 2:
            return
        calls = [py.rotation(m) for _, m in members]
        sums = ", ".join(f"({x}, {plus})" for _, x, _, plus in calls)
        targets = ", ".join(self.locals[t] for t, _ in members)
        self._defined.update(self.locals[t] for t, _ in members)
        self.out(f"{targets} = _rotated_all({calls[0][0]}, {calls[0][2]}, {sums})")

    def choose(self) -> dict[str, Expr]:
        """The texts to share (in order of first occurrence), each with its expression."""
        groups: dict[tuple[str, str], list[tuple[str, Expr]]] = {}
        for text, (key, e) in self._rotations.items():
            groups.setdefault(key, []).append((text, e))
        shared = [g for g in groups.values() if len(g) > 1]
        self.grouped = {t: g for g in shared for t, _ in g}
        chosen: dict[str, Expr] = {t: e for g in shared for t, e in g}  # each group's locals
        while True:
            counts: dict[str, list] = {}  # text -> [count, expression, computations inside]
            for tree in self.trees:
                _count(tree, counts, chosen)
            pending = list(chosen)  # each local's own definition, once (one inside another's
            while any(t in counts for t in pending):  # once that one's is counted)
                for text in [t for t in pending if t in counts]:
                    pending.remove(text)
                    for tree in counts[text][2]:
                        _count(tree, counts, chosen)
            repeated = [t for t, (n, _, _) in counts.items() if n > 1 and t not in chosen]
            if not repeated:
                order = list(counts)
                return {t: chosen[t] for t in sorted(chosen, key=order.index)}
            pick = max(repeated, key=len)  # the first of the longest: max keeps the first
            chosen[pick] = counts[pick][1]


def _hoistable(py: PyExpr, x: Expr) -> bool:
    """Whether the vector `x` of a rotation reads the spec's inputs (at any token), parameters
    and sizes only, which are bound before any line of a point, and turns nothing itself: its
    rotation may then be computed with an earlier one of its turn, before its own first use (a
    state's readout is bound within the point, after the call that computes it)."""
    mixer = py.typer.mixer
    inputs, params = {d.name for d in mixer.inputs}, {p.name for p in mixer.params}
    for node in walk(x):
        if isinstance(node, Call) and node.func in ROTATIONS:
            return False
        if isinstance(node, Timed) and node.name not in inputs:
            return False
        if isinstance(node, Name) and node.name not in params and not py._size(node.name):
            return False
    return True


def _count(tree: tuple[str, Expr, list], counts: dict[str, list], chosen: dict) -> None:
    """Count the computations of `tree` as emitted once those `chosen` are locals: a local's
    computations inside it are not emitted where it is used."""
    text, e, inside = tree
    counts.setdefault(text, [0, e, inside])[0] += 1
    if text not in chosen:
        for t in inside:
            _count(t, counts, chosen)


class PyExpr:
    """Emits expressions. `names` maps a spec reference to a Python variable: Timed refs by
    (name, offset), plain names by name; `functions` maps a built-in to the callable that
    computes it instead of its torch function (a log-gate's log: the runtime's _log_gate)."""

    def __init__(
        self,
        typer: Typer,
        names: Callable[[Expr], str],
        functions: dict[str, str] | None = None,
        shared: Shared | None = None,
        compact_angles: bool = False,
    ) -> None:
        self.typer = typer
        self.names = names
        self.functions = functions or {}
        self.shared = shared
        self.compact_angles = compact_angles  # whole sequences: see _call's TURNING
        self._plain_emitter: _PlainExpr | None = None
        self.constant = Folder(FLOATS).value
        self.positioned = typer is not None and typer.mixer.positioned

    def shape(self, e: Expr) -> Shape:
        return self.typer.shape_of(e)

    def __call__(self, e: Expr) -> str:
        text = self._emit(e)[0]
        if self.positioned and POSITION in angle_reads(self.typer.mixer, e)[1]:
            return f"({text}).to(_dtype)"  # a position read outside an angle: float64 until here
        return text

    def _emit(self, e: Expr) -> tuple[str, int]:
        value = self.constant(e)
        if value is None and isinstance(e, Number):  # folded by the algebra past float64's range
            value = float(e.text)
        if value is not None:
            text = literal(value)
            return text, (_UNARY if text.startswith("-") else _ATOM)
        if isinstance(e, Name) and self._size(e.name):
            return f"_torch.full((), _sizes[{string(e.name)}], dtype=_dtype, device=_device)", _ATOM
        if isinstance(e, Timed | Name):
            return self.names(e), _ATOM
        if isinstance(e, Identity):
            raise ValueError("I is emitted by its parent")
        if self.shared is not None and computes(e, self.constant):
            return self.shared.emit(self, e)
        if isinstance(e, Call):  # as _compute would, a frame fewer
            return self._call(e), _ATOM
        return self._compute(e)

    def _size(self, name: str) -> bool:
        """Whether `name` is a size read as a number."""
        return self.typer is not None and self.typer.symbols.get(name, _NOT_SIZE).kind == "size"

    def plain(self, e: Expr) -> str:
        """`e` as it reads without common subexpressions bound to locals: what identifies it
        among the expressions of one point (the same text there is the same value)."""
        if self._plain_emitter is None:
            self._plain_emitter = _PlainExpr(
                self.typer, self.names, self.functions, self.compact_angles
            )
        return self._plain_emitter._emit(e)[0]

    def _compute(self, e: Expr) -> tuple[str, int]:
        """`e` from its operands (each of which may be a common subexpression's local)."""
        if isinstance(e, Neg):
            first = _negated_product(e.operand, self.shape, self.constant)
            if first is not None:  # -(a * b) as (-a) * b: the same value, a smaller negation
                return self._compute(first)
            return "-" + self._wrap(e.operand, _UNARY), _UNARY
        if isinstance(e, Transpose):
            if self.shape(e.operand) == SCALAR:
                return self._emit(e.operand)
            return self._wrap(e.operand, _ATOM) + ".mT", _ATOM
        if isinstance(e, Call):
            return self._call(e), _ATOM
        assert isinstance(e, Binary)
        return self._binary(e)

    def _wrap(self, e: Expr, level: int) -> str:
        text, own = self._emit(e)
        return f"({text})" if own < level else text

    def _call(self, e: Call) -> str:
        if e.func in _CLAMPS:
            clamp = _CLAMPS[e.func]
            for x, c in (e.args, reversed(e.args)):
                if self.constant(c) is not None:
                    return f"{self._wrap(x, _ATOM)}.clamp({clamp}={self._emit(c)[0]})"
            first, second = (self._emit(x)[0] for x in e.args)
            return f"{BUILTINS[e.func].torch}({first}, {second})"
        if e.func in _ANGLED:  # the angle may be float64 (a position): see _cos
            return f"{BUILTINS[e.func].torch}({self._emit(e.args[0])[0]}, _dtype)"
        if e.func in ROTATIONS:
            rotate, x, turn, plus = self.rotation(e)  # see _rotated and _turning_of
            return f"_rotated({rotate}, {x}, {turn}{'' if plus == 'None' else ', ' + plus})"
        if e.func == TURNING:
            return _turning_call(self, *e.args)
        if BUILTINS[e.func].arity != 1:
            raise NotImplementedError(
                f"the PyTorch emitter has no rule for {e.func}, a built-in of "
                f"{BUILTINS[e.func].arity} arguments: add one to PyExpr._call"
            )
        (arg,) = e.args
        if e.func == "sum":
            return f"{self._wrap(arg, _ATOM)}.sum((-2, -1), keepdim=True)"
        if e.func == "diag":
            inner = ".squeeze(-1)" if self.shape(arg)[1] == "1" else ".squeeze(-2)"
            return f"{BUILTINS['diag'].torch}({self._wrap(arg, _ATOM)}{inner})"
        # the operand through _emit, not __call__: every level of a deep nest of calls costs
        # as few Python frames as it can (the parser allows MAX_DEPTH levels)
        return f"{self.functions.get(e.func, BUILTINS[e.func].torch)}({self._emit(arg)[0]})"

    def rotation(self, e: Call) -> tuple[str, str, str, str]:
        """The rotation `e`'s function, vector, turn and addend ('None' for none) as emitted:
        a vector and its bias added inside the rotation (see _rotated)."""
        # the turn e^(i theta) of each pair, a call of its own: q's and k's share it
        x, theta = e.args
        d = self.shape(x)[0]
        turning = Call(TURNING, (theta, Number(d) if d.isdigit() else Name(d)))
        rotate, turn = BUILTINS[e.func].torch, self._emit(turning)[0]
        shape = self.shape(x)
        if isinstance(x, Binary) and x.op == "+" and self.shape(x.left) == shape:
            if self.shape(x.right) == shape:
                left, right = (self._emit(y)[0] for y in (x.left, x.right))
                return rotate, left, turn, right
        return rotate, self._emit(x)[0], turn, "None"

    def eye(self, shape: Shape) -> str:
        n = shape[0]
        size = n if n.isdigit() else f"_sizes[{string(n)}]"
        return f"_torch.eye({size}, dtype=_dtype, device=_device)"

    def _binary(self, e: Binary) -> tuple[str, int]:
        a, b = self.shape(e.left), self.shape(e.right)
        op = e.op
        if IDENTITY in (a, b) and op in ("@",):
            return self._emit(e.right if a == IDENTITY else e.left)
        if op in "+-*/" and IDENTITY in (a, b):
            shape = self.shape(e)
            left = (
                self.eye(shape)
                if a == IDENTITY
                else self._wrap(e.left, _ADD if op in "+-" else _MUL)
            )
            right = (
                self.eye(shape)
                if b == IDENTITY
                else self._wrap(e.right, (_ADD if op in "+-" else _MUL) + 1)
            )
            return f"{left} {op} {right}", (_ADD if op in "+-" else _MUL)
        if op == "^":
            return f"{self._wrap(e.left, _POW + 1)} ** {self._wrap(e.right, _UNARY)}", _POW
        if op == ".":
            left, right = self._wrap(e.left, _ATOM), self._wrap(e.right, _MUL + 1)
            lrow, rrow = a[0] == "1" and a != SCALAR, b[0] == "1" and b != SCALAR
            left = left if lrow else f"{left}.mT"
            right = f"{right}.mT" if rrow else right
            return f"{left} @ {right}", _MUL
        if op == "@" and SCALAR not in (a, b):
            scaled = self._diagonal_product(e.left, e.right)
            if scaled is not None:
                return scaled, _MUL
            # an outer product (a column times a row) as a broadcast product (_outer)
            op = "*" if a[1] == "1" and b[0] == "1" else "@"
            return f"{self._wrap(e.left, _MUL)} {op} {self._wrap(e.right, _MUL + 1)}", _MUL
        complement = self._complement(e)
        if complement is not None:
            return complement, _ATOM
        fused = fused_sum(self, e)
        if fused is not None:
            return fused, _ATOM
        py = {"+": "+", "-": "-", "*": "*", "/": "/", "@": "*"}[op]
        level = _ADD if py in "+-" else _MUL
        return f"{self._wrap(e.left, level)} {py} {self._wrap(e.right, level + 1)}", level

    def _diagonal(self, e: Expr, side: str) -> str | None:
        """For a factor diag(d) of a matrix product, d as the column (`side` "left": it scales
        the rows of what follows) or the row ("right": the columns of what precedes) that
        multiplies elementwise; None for any other factor. A product by diag(d) is then O(n m),
        not a [n, n] matrix built and multiplied by every token (the recurrent and step forms of
        a diagonal gate)."""
        if not (isinstance(e, Call) and e.func == "diag"):
            return None
        (d,) = e.args
        column = self.shape(d)[1] == "1"
        text = self._wrap(d, _ATOM)
        return text if column == (side == "left") else f"{text}.mT"

    def _diagonal_product(self, left: Expr, right: Expr) -> str | None:
        """`diag(d) @ B` as `d * B` and `A @ diag(d)` as `A * d^T` (see _diagonal), or None."""
        rows = self._diagonal(left, "left")
        if rows is not None:
            return f"{rows} * {self._wrap(right, _MUL + 1)}"
        columns = self._diagonal(right, "right")
        if columns is not None:
            return f"{self._wrap(left, _MUL)} * {columns}"
        return None

    def _complement(self, e: Binary) -> str | None:
        """`1 - sigmoid(x)` as `sigmoid(-x)`: equal, but where sigmoid(x) is near 1 the
        difference keeps few of its digits (in float32, 1 - sigmoid(5) has a relative error near
        1e-5), while sigmoid(-x) keeps them all. None for anything else."""
        right = e.right
        if not (e.op == "-" and isinstance(right, Call) and right.func == "sigmoid"):
            return None
        if "sigmoid" in self.functions or self.constant(e.left) != 1.0:
            return None
        return f"{BUILTINS['sigmoid'].torch}(-{self._wrap(right.args[0], _UNARY)})"

    # -- sums of terms (affine updates), with products associated cheaply -------------------

    def terms(self, terms: list[Product]) -> str:
        out = ""
        for t in terms:
            text = self.term(t, abs_coeff=True)
            if not out:
                out = f"-{text}" if t.coeff < 0 else text
            else:
                out += f" - {text}" if t.coeff < 0 else f" + {text}"
        return out or "0"

    def term(self, t: Product, abs_coeff: bool = False) -> str:
        coeff = abs(t.coeff) if abs_coeff else t.coeff
        factors = []
        if coeff != 1:
            factors.append(literal(float(coeff)))
        factors += [self._wrap(s, _MUL + 1) for s in t.scalars]
        if t.chain:
            factors.append(self._chain(list(t.chain)))
        factors += [self._wrap(g, _MUL + 1) for g in t.gates]
        return " * ".join(factors) if factors else "1"

    def _chain(self, chain: list[Expr]) -> str:
        """A matrix product, parenthesised in the cheapest order (sizes other than 1 count 64)."""
        if len(chain) == 1:
            return self._wrap(chain[0], _MUL + 1)
        dims = [self.shape(chain[0])[0]] + [self.shape(a)[1] for a in chain]
        cost = [[0] * len(chain) for _ in chain]
        split = [[0] * len(chain) for _ in chain]

        def n(d: str) -> int:
            return 1 if d == "1" else 64

        diagonal = [isinstance(x, Call) and x.func == "diag" for x in chain]  # not emitted

        def scales(i: int, s: int, j: int) -> bool:
            """Whether the product of [i, s] and [s + 1, j] is one by a lone diag(d)."""
            return (i == s and diagonal[i]) or (s + 1 == j and diagonal[j])

        for length in range(2, len(chain) + 1):
            for i in range(len(chain) - length + 1):
                j = i + length - 1
                cost[i][j] = math.inf
                for s in range(i, j):
                    inner = 1 if scales(i, s, j) else n(dims[s + 1])  # elementwise: no sum
                    c = cost[i][s] + cost[s + 1][j] + n(dims[i]) * inner * n(dims[j + 1])
                    if c < cost[i][j]:
                        cost[i][j], split[i][j] = c, s

        def build(i: int, j: int, top: bool) -> str:
            if i == j:
                return self._wrap(chain[i], _MUL + 1)
            s = split[i][j]
            if i == s and diagonal[i]:
                text = f"{self._diagonal(chain[i], 'left')} * {build(s + 1, j, False)}"
            elif s + 1 == j and diagonal[j]:
                text = f"{build(i, s, False)} * {self._diagonal(chain[j], 'right')}"
            else:  # an outer product (no sum: an inner size of 1) as a broadcast product
                op = "*" if dims[s + 1] == "1" else "@"
                text = f"{build(i, s, op == '@')} {op} {build(s + 1, j, False)}"
            return text if top else f"({text})"

        return f"({build(0, len(chain) - 1, True)})"


class _PlainExpr(PyExpr):
    """A PyExpr without common subexpressions that remembers each node's text (by identity,
    holding the node so that its id is not reused): emitting has no side effects there, so the
    texts PyExpr.plain asks for cost one emission of each subtree, not one for each level."""

    def __init__(
        self, typer: Typer, names: Callable[[Expr], str], functions: dict, compact_angles: bool
    ) -> None:
        super().__init__(typer, names, functions, compact_angles=compact_angles)
        self._texts: dict[int, tuple[Expr, tuple[str, int]]] = {}

    def _emit(self, e: Expr) -> tuple[str, int]:
        known = self._texts.get(id(e))
        if known is None or known[0] is not e:
            known = self._texts[id(e)] = (e, super()._emit(e))
        return known[1]

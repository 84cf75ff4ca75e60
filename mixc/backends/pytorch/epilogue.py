"""The output of a form over whole sequences computed in place of a readout where nothing
records it: a kernel's readout is a fresh tensor of the sequence's size, and where the output
reads it once, elementwise, each operation along the way can write its result over it
(`out=`) instead of into fresh memory. On CPU fresh memory of a sequence's size costs more than
the pass that fills it (its pages are faulted in one by one), so an epilogue such as Mamba-3's
`(H_t C_t + D x_t) * silu(z_t)` costs one fresh tensor (silu's) where it cost three.

Which operations: the chain (the spine) from the output's root down to one readout, through
elementwise sums, differences, products and quotients each of the readout's shape (no
broadcast makes the result larger than the tensor it is written over), where the readout is
read nowhere else (not twice in the output, not by a later call's inputs) and the other
operand of each step reads no float64 angle (its result would not fit a compute-dtype tensor).
At run time `_unrecorded` and `_spare` keep the results fresh under autograd and torch.compile,
or where the readout shares memory with an argument; the values are the same to the bit
(`a + b * c` is the one addcmul it is otherwise, `_add_skip` for a skip term: fused.py).
"""

from __future__ import annotations

from mixc.backends.pytorch.fused import product, skip_arguments
from mixc.backends.pytorch.lines import Lines
from mixc.backends.pytorch.names import note
from mixc.frontend.ir import Binary, Expr, Name, Number, Timed, walk
from mixc.frontend.shapes import IDENTITY, SCALAR
from mixc.lowering.program import SequenceForm

__all__ = ["emit_in_place", "in_place", "owned_writes"]

_FUNCTIONS = {"+": "add", "-": "sub", "*": "mul", "@": "mul", "/": "div"}


def owned_writes(forms, form: SequenceForm) -> str:
    """The line that says whether the form's epilogue may write over its readouts: `_own`,
    the storages of every argument and initial state (see `_unrecorded`)."""
    names = forms.inputs + forms.required + forms.defaulted
    names += forms.carried if any(c.initial for c in form.calls) else []
    shown = "  # None where autograd or a compiler records the form: no result in place"
    return f"_own = _unrecorded({', '.join(names)}){shown}"


def in_place(forms, form: SequenceForm) -> bool:
    """Whether the form writes anything over its kernels' outputs: a folded call's correction
    (always) or an output with a spine."""
    return any(c.lag is not None for c in form.calls) or _spine(forms, form) is not None


def _spine(forms, form: SequenceForm) -> list[tuple[Binary, bool]] | None:
    """The output's operations from the root down to the readout they write over (innermost
    last), each with whether the spine goes on through its left operand; None where there is
    none."""
    expr = form.output.expr
    if expr is None:
        return None
    reads = [n.name for n in walk(expr) if isinstance(n, Name | Timed)]
    later = {r for c in form.calls for r in c.reads}
    wide = forms.angle_states | forms.angle_params
    shape = forms.typer.shape_of

    def owned(e: Expr) -> bool:
        if not isinstance(e, Name | Timed) or e.name not in forms.readouts:
            return False
        return reads.count(e.name) == 1 and forms.readouts[e.name] not in later

    def down(e: Expr) -> list[tuple[Binary, bool]] | None:
        if not isinstance(e, Binary) or e.op not in _FUNCTIONS:
            return None
        a, b = shape(e.left), shape(e.right)
        if IDENTITY in (a, b) or (e.op == "@" and SCALAR not in (a, b)):
            return None
        for left, side, other in ((True, e.left, e.right), (False, e.right, e.left)):
            if any(isinstance(n, Name | Timed) and n.name in wide for n in walk(other)):
                continue
            if isinstance(other, Number) and e.op in "-/" and not left:
                continue  # torch.sub(2, x) takes no number first
            if shape(side) != shape(e):
                continue
            if owned(side):
                return [(e, left)]
            below = down(side)
            if below is not None:
                return [(e, left), *below]
        return None

    return down(expr)


def emit_in_place(forms, out: Lines, form: SequenceForm) -> bool:
    """The output's lines, its spine's operations written over the readout (`_spare`); False
    (nothing emitted) where it has no spine."""
    spine = _spine(forms, form)
    if spine is None:
        return False
    e = forms.seq_expr()
    y = form.output.name
    inner, left = spine[-1]
    current = e(inner.left if left else inner.right)
    for i in reversed(range(len(spine))):
        step, left = spine[i]
        other = step.right if left else step.left
        into = f"out=_spare({current}, _own)"
        factors = product(e, other)
        if factors is not None and (step.op == "+" or (step.op == "-" and left)):
            value = ", value=-1" if step.op == "-" else ""
            skip = skip_arguments(e, *factors)  # a skip term: see fused.py
            if skip is not None:
                text = f"_add_skip({current}, {skip}{value}, {into})"
            else:
                a, b = (e(f) for f in factors)
                text = f"_torch.addcmul({current}, {a}, {b}{value}, {into})"
        else:
            commutes = step.op in "+*@"
            first, second = (current, e(other)) if left or commutes else (e(other), current)
            text = f"_torch.{_FUNCTIONS[step.op]}({first}, {second}, {into})"
        shown = note(form.output.shown) if i == 0 else ""
        out(f"{y} = {text}{shown}")
        current = y
    return True

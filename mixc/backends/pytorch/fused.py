"""A sum with a product among its terms as one call: `a + b * c` as torch.addcmul(a, b, c), one
pass and one full-size result instead of two; and where the product is a skip term (a per-token
tensor by per-head parameters: Mamba's D x_t), as the runtime's `_add_skip`, the same value,
whose backward sums the parameters' gradients over the tokens in float64. Each such gradient
sums a product over every token and channel whose terms largely cancel: in float32 its rounding
follows the order of the sum, which eager torch and inductor choose differently (Mamba-3
MIMO's D: 1.6e-5 from float64 compiled, 3.0e-6 eagerly; with the float64 sum 6.4e-6 and 3.9e-6,
benchmarks/compile.py)."""

from __future__ import annotations

from mixc.frontend.ir import Binary, Expr, Name, Timed, walk
from mixc.frontend.shapes import IDENTITY, SCALAR

__all__ = ["fused_sum", "product", "skip_arguments"]


def product(py, x: Expr) -> tuple[Expr, Expr] | None:
    """The factors of `x` where it is an elementwise product (or one by a scalar) with no
    constant factor, as the emitter `py` fuses it into a sum; else None."""
    if not isinstance(x, Binary) or x.op not in ("*", "@"):
        return None
    if x.op == "@" and SCALAR not in (py.shape(x.left), py.shape(x.right)):
        return None
    if any(py.constant(f) is not None for f in (x.left, x.right)):
        return None
    return x.left, x.right


def fused_sum(py, e: Binary) -> str | None:
    """`a + b * c` (elementwise, or with a scalar factor) as torch.addcmul(a, b, c), or
    _add_skip for a skip term (see skip_arguments); None where it does not apply (a number
    among the operands, a matrix product, a difference whose product comes first)."""
    if e.op not in ("+", "-") or IDENTITY in (py.shape(e.left), py.shape(e.right)):
        return None
    pairs = [(e.left, e.right)] + ([(e.right, e.left)] if e.op == "+" else [])
    for base, other in pairs:
        factors = product(py, other)
        if factors is None or py.constant(base) is not None:
            continue
        value = ", value=-1" if e.op == "-" else ""
        skip = skip_arguments(py, *factors)
        if skip is not None:
            return f"_add_skip({py(base)}, {skip}{value})"
        return f"_torch.addcmul({py(base)}, {py(factors[0])}, {py(factors[1])}{value})"
    return None


def skip_arguments(py, a: Expr, b: Expr) -> str | None:
    """The arguments of `_add_skip` after the addend (x, then each parameter) where, over whole
    sequences, one of the factors a, b of a term reads the tokens and the other is a product of
    parameters; None for any other term (and in a token's step, whose gradient autograd sums
    over the steps)."""
    if not py.compact_angles or py.typer is None:
        return None
    params = {p.name for p in py.typer.mixer.params}

    def factors(x: Expr) -> list[Expr] | None:
        if isinstance(x, Name):
            return [x] if x.name in params else None
        pair = product(py, x)
        if pair is None:
            return None
        left, right = factors(pair[0]), factors(pair[1])
        return None if left is None or right is None else left + right

    for x, p in ((a, b), (b, a)):
        found = factors(p)
        if found is not None and any(isinstance(n, Timed) for n in walk(x)):
            return ", ".join([py(x), *(py(f) for f in found)])
    return None

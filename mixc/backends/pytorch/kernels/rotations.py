"""Rotations by angles under torch.compile: one opaque operator for the vectors turned by one angle.

Traced, the complex numbers of a turn cost inductor a kernel (a C++ build) for each step around
them (cos and sin written into a complex buffer, the copies of the pairs, the stack and cat after
the complex product, as many in the backward). So under torch.compile, in a module that
registered it (_register_rotations), a rotation (functions.py: _turning_of, _rotated,
_rotated_all) is the operator `rotate`: it takes the angles theta [..., p, 1] and every vector
they turn (each as one or two addends: a vector and its bias, added inside), computes the turn
once, as eagerly (_turning: cos and sin of the float64 angles), and returns each vector turned,
fresh and contiguous.

Its backward, the operator `rotate_backward`, computes the gradients directly (no rotation run
again under autograd). A turn by the angle a of the pair z = z_a + i z_b is z e^(ia), so for the
output's gradient g (a pair as g_a + i g_b):

- the gradient of z is g e^(-ia): the output's gradient turned back, by the same rotation with
  the conjugate turn (entries in no pair pass unchanged); an addend's is that, summed over the
  axes the sum broadcast it along (a bias over the tokens);
- the gradient of the angle is Im(conj(z) dz) = z_a dz_b - z_b dz_a (dz: z's gradient), the
  cross product of each pair of the input with its gradient, summed over the vectors turned by
  the angle and over the axes the turn broadcast it along; 0 for angles no pair reads (p = d:
  the first d / 2 are read).

Each pair's two entries are where the rotation takes them (_pair_views: halves, the halves of
the whole vector, or neighbours).
"""

import torch


def _pair_views(rotate, x, n):
    """The two entries of each of the n pairs that the rotation named `rotate` turns, from
    x [..., d, 1]: ([..., n], [..., n]) views (functions.py: _rotate takes entries i and i + n,
    _rotate_halves i and i + d // 2, _rotate_interleaved 2i and 2i + 1)."""
    if rotate == "_rotate_interleaved":
        pairs = x[..., : 2 * n, 0].unflatten(-1, (n, 2))
        return pairs[..., 0], pairs[..., 1]
    half = x.shape[-2] // 2 if rotate == "_rotate_halves" else n
    return x[..., :n, 0], x[..., half : half + n, 0]


def _turn(functions, theta, d, dtype, back=False):
    """The turn by the angles theta (its conjugate if `back`), computed on the values theta's
    broadcast axes repeat (_compact) and expanded to theta's leading axes, as eagerly."""
    turn = functions["_turning"](functions["_compact"](theta), d, dtype)
    turn = turn.conj_physical() if back else turn
    return turn.expand(*theta.shape[:-2], turn.shape[-1])


def _rotations(functions, rotate, xs, plus, theta, d, dtype):
    """The operator `rotate`: each x + plus (plus None: x) turned by theta, by the rotation
    named `rotate` among `functions` (a module's globals), the turn computed once."""
    turning, fn = _turn(functions, theta, d, dtype), functions[rotate]
    return [fn(x if p is None else x + p, turning).contiguous() for x, p in zip(xs, plus)]


def _rotation_grads(functions, rotate, xs, plus, added, theta, d, dtype, grads, wanted):
    """The operator `rotate_backward`: the gradients of the wanted tensors among xs, plus (the
    addends present, added[i] the index of xs[i]'s, -1: none) and theta (wanted: a flag for
    each, in that order), computed directly (this file's docstring); 0 for those that no
    output's gradient reaches."""
    back, fn = _turn(functions, theta, d, dtype, back=True), functions[rotate]
    n, count = back.shape[-1], len(xs)
    found, angle = [None] * (count + len(plus)), None
    for i, (x, j, g) in enumerate(zip(xs, added, grads)):
        if g is None:
            continue
        dz = fn(g, back)  # z's gradient: g turned back
        for k, t in ((i, x), (count + j, None if j < 0 else plus[j])):
            if t is not None and wanted[k]:
                d_t = dz.sum_to_size(t.shape)
                found[k] = d_t if found[k] is None else found[k] + d_t
        if wanted[-1]:
            z = x if j < 0 else x + plus[j]
            (za, zb), (da, db) = _pair_views(rotate, z, n), _pair_views(rotate, dz, n)
            cross = za * db - zb * da
            angle = cross if angle is None else angle + cross
    out = []
    for f, t, w in zip(found, [*xs, *plus], wanted):
        if w:  # as the fake says: contiguous, in t's dtype, and no other output
            fresh = f is not None and f.dtype == t.dtype and f.is_contiguous()
            fresh = fresh and not any(f is o for o in out)
            out.append(
                f if fresh else t.new_zeros(t.shape) if f is None else t.new_empty(t.shape).copy_(f)
            )
    if wanted[-1]:
        d_theta = theta.new_zeros(theta.shape)
        if angle is not None:
            d_theta[..., :n, 0] = angle.sum_to_size(*theta.shape[:-2], n)
        out.append(d_theta)
    return out


def _aligned(xs, plus, added):
    """The addends beside each of xs: plus[added[i]] for xs[i], None where added[i] < 0 (the
    operators take the addends present only: autograd gives no gradient to a list with Nones)."""
    return [None if i < 0 else plus[i] for i in added]


def _rotated_like(shapes, key, tensors, find):
    """Fake outputs [(shape, dtype), ...] as find() gives them (the rotation run on fake
    tensors: tens of operations), found once per key and sizes, dtypes and devices of the
    tensors and kept in `shapes`: the compiler asks a fake implementation the same question
    several times per call (tracing, autograd, partitioning), and a recurrence's tokens ask it
    once a token each. Symbolic sizes are never kept."""
    described = tuple((tuple(x.shape), x.dtype, x.device) for x in tensors)
    if all(type(n) is int for shape, _, _ in described for n in shape):
        key = (*key, *described)
        if key not in shapes:
            shapes[key] = find()
        found = shapes[key]
    else:
        found = find()
    return [tensors[0].new_empty(shape, dtype=dtype) for shape, dtype in found]


def _define_rotation(namespace, functions):
    """Register the operators `rotate` and `rotate_backward` of `namespace` over the rotations
    of the module whose globals are `functions` (_rotated and _rotated_all call `rotate`): xs
    the vectors, plus the addends present, added the index in plus of each vector's (-1: none)."""
    head = "(str rotate, Tensor[] xs, Tensor[] plus, int[] added, Tensor theta, int d, ScalarType dtype"

    def forward(rotate, xs, plus, added, theta, d, dtype):
        with torch.no_grad():
            return _rotations(functions, rotate, xs, _aligned(xs, plus, added), theta, d, dtype)

    shapes = {}  # what the rotation gives on fake tensors, by its arguments (_rotated_like)

    def fake(rotate, xs, plus, added, theta, d, dtype):
        def find():
            found = _rotations(functions, rotate, xs, _aligned(xs, plus, added), theta, d, dtype)
            return [(y.shape, y.dtype) for y in found]

        key = (rotate, tuple(added), d, dtype)
        return _rotated_like(shapes, key, [*xs, *plus, theta], find)

    def backward(rotate, xs, plus, added, theta, d, dtype, grads, wanted):
        with torch.no_grad():
            return _rotation_grads(functions, rotate, xs, plus, added, theta, d, dtype, grads,
                                   wanted)  # fmt: skip

    def backward_fake(rotate, xs, plus, added, theta, d, dtype, grads, wanted):
        return [t.new_empty(t.shape) for t, w in zip((*xs, *plus, theta), wanted) if w]

    rotate = torch.library.custom_op(f"{namespace}::rotate", forward, mutates_args=(),
                                     schema=f"{head}) -> Tensor[]")  # fmt: skip
    rotate.register_fake(fake)
    rotate_backward = torch.library.custom_op(
        f"{namespace}::rotate_backward", backward, mutates_args=(),
        schema=f"{head}, Tensor?[] grads, bool[] wanted) -> Tensor[]",
    )  # fmt: skip
    rotate_backward.register_fake(backward_fake)

    def save(ctx, inputs, output):
        rotate, xs, plus, added, theta, d, dtype = inputs
        ctx.save_for_backward(*xs, *plus, theta)
        ctx.arguments = (rotate, added, d, dtype, len(xs))

    def formula(ctx, grads):
        rotate, added, d, dtype, count = ctx.arguments
        saved, needs = ctx.saved_tensors, ctx.needs_input_grad
        xs, plus, theta = list(saved[:count]), list(saved[count:-1]), saved[-1]
        wanted = [*needs[1], *needs[2], needs[4]]
        found = iter(rotate_backward(rotate, xs, plus, added, theta, d, dtype, list(grads), wanted))
        d_xs = [next(found) if w else None for w in wanted[:count]]
        d_plus = [next(found) if w else None for w in wanted[count:-1]]
        return None, d_xs, d_plus, None, next(found) if wanted[-1] else None, None, None

    rotate.register_autograd(formula, setup_context=save)


def _register_rotations(namespace, functions):
    """Register the operators `rotate` and `rotate_backward` over the rotations among
    `functions` (a module's globals) under `namespace` (as operators.py's _register_spans
    does), unless they are registered already, and let _rotated and _rotated_all call them
    under torch.compile from now on (through the module's _Operators, copied from operators.py
    beside them). Returns the operator `rotate`."""
    ops = getattr(torch.ops, namespace)
    if not hasattr(ops, "rotate"):
        _define_rotation(namespace, functions)
    functions["_Operators"].rotate = ops.rotate
    return ops.rotate

"""The chunked form of a state whose lagged write is folded into its token's own write
(`mixc.analysis.folds`): G_t = a_t G_{t-1} + (d_t + c_{t+1}) v_t k_t^T run by the class's
rank-1 kernel from G_0 = H_0 + c_1 v_0 k_0^T, each readout less c_{t+1} v_t (k_t . q_t)."""

from __future__ import annotations

from mixc.backends.pytorch.lines import Lines
from mixc.backends.pytorch.names import local, note
from mixc.backends.pytorch.pyexpr import PyExpr
from mixc.frontend import ir
from mixc.frontend.ir import Expr, Timed, walk
from mixc.lowering.program import Call, QueryRead, SequenceForm

__all__ = [
    "decays_in_kernel",
    "emit_first_writes",
    "emit_fold_inputs",
    "fold_correction",
    "fold_start",
    "shifted",
]


def emit_first_writes(forms, out: Lines, calls: tuple[Call, ...]) -> None:
    """Each folded call's lagged value and key before each sequence's first token, v_0 and k_0
    [batch, NH, d, 1]: from the carried inputs (`_prev_x`) and the states entering the call,
    so emitted before the shifts and the passes rebind them."""
    states = set(forms.states)

    def names(e: Expr) -> str:
        if isinstance(e, Timed):  # at t-1: a carried input, or a state as it enters
            return e.name if e.name in states else local("prev", e.name)
        return e.name

    e = PyExpr(forms.typer, names)
    for call in calls:
        if call.lag is None:
            continue
        value, key = call.lag.first
        shown = note(f"{call.lag.lagged.value}, before each sequence's first token")
        out(f"{local('v0', call.group)} = {e(value)}{shown}")
        shown = note(f"{call.lag.lagged.key}, before each sequence's first token")
        out(f"{local('k0', call.group)} = {e(key)}{shown}")


def emit_fold_inputs(forms, out: Lines, call: Call, packed: str, turned) -> list[str]:
    """The folded call's key (`turned`: where the kernel turns a rotated key, the function
    that writes it so, `_turned_seq`; else False), its value
    (d_t + c_{t+1}) v_t, c_t and c_{t+1}, and the class's arguments; returns the arguments as
    the call passes them."""
    group, lag = call.group, call.lag
    seq = forms.seq_layout(packed, False)
    (step,) = call.steps
    (value,) = step.values
    c, c_next, x = local("c", group), local("c_next", group), local("x", group)
    shown = note(f"c_t = {lag.coeff}: the lagged write's scale less the decay")
    out(f"{c} = {seq('scalar', forms.tensor(lag.coeff))}{shown}")
    out(f"{c_next} = _next_tokens({c})  # c_{{t+1}}, 0 at each sequence's last token")
    key = turned(forms, step.key, packed) if turned else None
    out(f"{local('k', group)} = {key or seq('vector', forms.tensor(step.key))}")
    out(f"{x} = {seq('vector', forms.tensor(value.expr))}")
    d = "1" if value.scale is None else seq("scalar", forms.tensor(value.scale))
    if value.scale is not None:
        out(f"{local('d', group)} = {d}{note(value.scale)}")
        d = local("d", group)
    shown = note(f"({value.scale or 1} + c_{{t+1}}) {value.expr}")
    out(f"{local('v', group)} = ({d} + {c_next})[..., None] * {x}{shown}")
    kernel_args = []
    for arg in step.args:
        if arg.expr is None:
            continue
        name = local(arg.name, group)
        out(f"{name} = {seq(arg.layout, forms.tensor(arg.expr, forms.gate_expr()))}")
        kernel_args.append(f"{arg.name}={name}")
    return kernel_args


def fold_start(call: Call, initial: str) -> str:
    """The state entering the call's kernel: `initial`, and for a folded call with the lagged
    write at each sequence's first token, c_1 k_0 v_0^T (in the kernels' layout)."""
    if call.lag is None:
        return initial
    g = call.group
    first = f"{local('k0', g)}, {local('v0', g)}, {local('c', g)}"
    return f"_lagged_start({initial}, {first})  # G_0 = H_0 + c_1 v_0 k_0^T"


def _gated(call: Call) -> bool:
    (step,) = call.steps
    return any(a.expr is not None and a.name == "g" for a in step.args)


def decays_in_kernel(call: Call, library) -> bool:
    """Whether a folded call's kernel reads a_t G_{t-1} q_t itself (`decayed`, with strict): the
    state after the token's decay, before its write, where the kernel takes that read and the
    transition has a decay a_t."""
    return call.lag is not None and _gated(call) and call.kernel in library.decayed


def fold_correction(
    forms,
    out: Lines,
    call: Call,
    query: QueryRead,
    packed: str,
    decayed: bool = False,
    dots: bool = False,
) -> None:
    """For a folded call (none else), the lines that make H_t q_t = a_t G_{t-1} q_t + d_t v_t
    (k_t . q_t) from the kernel's output `_o`, read before the token's update (strict: G_{t-1}
    q_t, which reads no later token, where G_t q_t would read c_{t+1}; `decayed`: a_t G_{t-1}
    q_t, the kernel's read after the token's decay). `dots`: the kernel returned k_t . q_t
    (`_qk`, the diagonal of the scores it computes), or None where autograd or a compiler
    records it: then computed here."""
    if call.lag is None:
        return
    (step,) = call.steps
    (value,) = step.values
    dot = _dot(forms, step.key, query.query)
    seq = forms.seq_layout(packed, False)
    g = call.group
    into = "out=_spare(_o, _own)"  # the kernel's fresh output, where nothing records it
    if _gated(call) and not decayed:
        out(f"_o = _torch.mul(_o, {local('g', g)}.exp()[..., None], {into})")
    d = "" if value.scale is None else f"{local('d', g)} * "
    if dots:
        qk = local("qk", g)
        out(f"{local('kq', g)} = {qk} if {qk} is not None else {seq('scalar', dot)}  # k_t . q_t")
    else:
        out(f"{local('kq', g)} = {seq('scalar', dot)}  # k_t . q_t")
    scale = f"({d}{local('kq', g)})[..., None]"
    shown = "  # H_t q_t = a_t G_{t-1} q_t + d_t v_t (k_t . q_t)"
    out(f"_o = _torch.addcmul(_o, {scale}, {local('x', g)}, {into}){shown}")


def _dot(forms, key: Expr, query: Expr) -> str:
    """k_t . q_t in the mixer's layout [B, T, NH, 1, 1]; on the unturned vectors where both are
    turned by the same angle (a turn keeps dot products)."""
    same = (
        isinstance(key, ir.Call)
        and isinstance(query, ir.Call)
        and key.func == query.func
        and key.func in ("rotate", "rotate_interleaved")
        and str(key.args[1]) == str(query.args[1])
        and forms.typer.shape_of(key.args[0]) == forms.typer.shape_of(query.args[0])
    )
    if same:
        key, query = key.args[0], query.args[0]
    # one matmul a token (k^T q, [.., 1, 1]): no product of the sequence's size to sum
    dot = ir.Binary(".", key, query)
    e = forms.seq_expr()
    if any(isinstance(n, ir.Call) for n in walk(dot)) or not _sums(dot):
        return e(dot)
    # a vector plus its bias (or any sum): summed and multiplied a slice of tokens at a time,
    # the sums no tensors of the sequence's size (`_tokenwise`); the names read are the
    # function's arguments, its text emitted without the point's shared subexpressions
    bare = PyExpr(forms.typer, e.names, e.functions, None, e.compact_angles)
    names = sorted({bare(n) for n in walk(dot) if isinstance(n, ir.Name | Timed)} - {""})
    names = [n for n in names if n.isidentifier()]  # not a size, read as a number
    args = ", ".join(names)
    text = bare(dot)
    shape = forms.typer.shape_of(key)
    if shape == forms.typer.shape_of(query) and shape[1] == "1":
        # two columns: the products summed (on CPU 0.75x the cost of a matmul a token)
        text = f"(({bare(key)}) * ({bare(query)})).sum(-2, keepdim=True)"
    return f"_tokenwise(lambda {args}: {text}, {args})"


def _sums(e: Expr) -> bool:
    """Whether e adds or subtracts anywhere (what _tokenwise would spare a whole tensor of)."""
    return any(isinstance(n, ir.Binary) and n.op in "+-" for n in walk(e))


def shifted(form: SequenceForm) -> set[str]:
    """The inputs that `form` reads at t-1 over whole sequences (a folded call reads its lagged
    write before the first token only): those it shifts by a token."""
    exprs: list[Expr | None] = [form.output.expr]
    for call in form.calls:
        exprs += [call.log_scale, call.lag.coeff if call.lag else None]
        exprs += [q.query for q in call.queries]
        for step in call.steps:
            exprs += [step.key, *(a.expr for a in step.args)]
            exprs += [x for v in step.values for x in (v.expr, v.scale)]
    return {
        n.name
        for e in exprs
        if e is not None
        for n in walk(e)
        if isinstance(n, Timed) and n.offset == -1
    }

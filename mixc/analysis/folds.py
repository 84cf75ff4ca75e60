"""A write of the previous token's value and key under this token's decay, folded into that
token's own write (Mamba-3's trapezoid): one rank-1 write a token instead of two.

Take an update with a scalar decay a_t (1 without one), a write of this token and a lagged copy
of it, the previous token's write carried through this token's decay:

    H_t = a_t H_{t-1} + a_t c_t v_{t-1} k_{t-1}^T + d_t v_t k_t^T

(v and k are any expressions of the token, v_{t-1} and k_{t-1} the same expressions one token
earlier; c_t and d_t scalars). The lagged write of token t + 1, a_{t+1} c_{t+1} v_t k_t^T, is
token t's own outer product decayed once more, so it can be written at token t already. Let

    G_t = H_t + c_{t+1} v_t k_t^T        (c past a sequence's last token: 0)

Then G_t - a_t G_{t-1} = H_t - a_t H_{t-1} + c_{t+1} v_t k_t^T - a_t c_t v_{t-1} k_{t-1}^T
= (d_t + c_{t+1}) v_t k_t^T: G runs the same transition with ONE write a token,

    G_t = a_t G_{t-1} + (d_t + c_{t+1}) v_t k_t^T,   G_0 = H_0 + c_1 v_0 k_0^T,

where v_0 and k_0 are the lagged write's value and key at the first token (the carried token
before it, its states' values entering the sequence). G_t holds token t+1's c, so a readout of
H at t reads G before the token's update, which holds no later token:
H_t = a_t G_{t-1} + d_t v_t k_t^T, so H_t q_t = a_t G_{t-1} q_t + d_t v_t (k_t . q_t) (no
difference of large terms either). At a sequence's last token c_{t+1} = 0, so the final state
is G's. Nothing here is approximated; the only new quantities are
c shifted one token earlier and a dot product a token (k_t . q_t, computed on the unturned
vectors when k and q are turned by the same angle, which a turn leaves unchanged).

The algebra needs the lagged write's scale to hold the decay a_t as a factor (c_t = scale / a_t
is read off the expansion, never divided), one state a pass, the readouts at t (a readout of
H_{t-1} would need v_{t-1}), and a transition that acts on an outer product as on a number: a
scalar decay (`TransitionClass.folds_lag`). The chunked form then runs the class's rank-1
kernel; the quadratic form and the token-by-token forms keep the writes as written.
"""

from __future__ import annotations

from dataclasses import dataclass

from mixc.algebra.canon import Canon
from mixc.algebra.expand import Term
from mixc.analysis.facts import Readout, StateFacts, WriteTerm
from mixc.analysis.outputs import readout_name
from mixc.frontend.ir import Binary, Call, Expr, Name, Neg, Number, Timed, Transpose

__all__ = ["LagFold", "lag_fold"]


@dataclass(frozen=True)
class LagFold:
    """A state's two writes as one: `write` (this token's, v_t k_t^T times d_t), `lagged` (the
    previous token's, as written), `coeff` (c_t: the lagged write's scale less the transition's
    decay) and the lagged write's value and key before a sequence's first token (`first`: v_0,
    k_0 from the carried inputs at t-1 and the states entering it, each readout of a state at
    t-1 written as the state)."""

    write: WriteTerm
    lagged: WriteTerm
    coeff: Expr
    first: tuple[Expr, Expr]


def lag_fold(state: StateFacts, readouts, queries, canon: Canon) -> LagFold | None:
    """The fold of `state`'s two writes (module docstring), or None where it does not hold:
    `readouts` every readout of the spec, `queries` the state's readout queries (all at t)."""
    tr = state.transition
    if (
        len(state.writes) != 2
        or not tr.transition_class.folds_lag
        or state.backward
        or state.vector
        or state.column
        or len(tr.gates) > 1
        or any(q.offset != 0 for q in queries)
    ):
        return None
    by_name = {readout_name(r.index): r for r in readouts}
    for lagged, write in (state.writes, reversed(state.writes)):
        if lagged.scale is None or write.value is None or lagged.value is None:
            continue
        value, key = _earlier(write.value, by_name), _earlier(write.key, by_name)
        if value is None or key is None:
            continue
        if str(canon(value)) != str(canon(lagged.value)):
            continue
        if str(canon.column(key)) != str(canon.column(lagged.key)):
            continue
        first = [_at_first_token(e, by_name) for e in (lagged.value, lagged.key)]
        coeff = _less_decay(lagged.scale, tr.gates, canon)
        if coeff is not None and None not in first:
            return LagFold(write, lagged, coeff, tuple(first))
    return None


def _earlier(e: Expr, by_name: dict[str, Readout]) -> Expr | None:
    """`e` one token earlier (inputs and readouts at t read at t-1), None where it reads
    something at t-1 already or the position."""
    if isinstance(e, Timed):
        return None if e.offset != 0 or e.name == "pos" else Timed(e.name, -1)
    if isinstance(e, Name) and e.name in by_name:
        r = by_name[e.name]
        if r.offset != 0:
            return None
        earlier = next(
            (
                readout_name(o.index)
                for o in by_name.values()
                if (o.state, str(o.query), o.offset, o.entrywise, o.scale)
                == (r.state, str(r.query), -1, r.entrywise, r.scale)
            ),
            None,
        )
        return None if earlier is None else Name(earlier)
    if isinstance(e, Call):
        args = [_earlier(a, by_name) for a in e.args]
        return None if None in args else Call(e.func, tuple(args))
    if isinstance(e, Neg | Transpose):
        inner = _earlier(e.operand, by_name)
        return None if inner is None else type(e)(inner)
    if isinstance(e, Binary):
        left, right = _earlier(e.left, by_name), _earlier(e.right, by_name)
        return None if left is None or right is None else Binary(e.op, left, right)
    return e


def _at_first_token(e: Expr, by_name: dict[str, Readout]) -> Expr | None:
    """`e`, a lagged write's value or key, before a sequence's first token: each readout in it
    (of a state at t-1, read entry by entry) as that state, Th_{t-1}; None where it reads
    another readout."""
    if isinstance(e, Name) and e.name in by_name:
        r = by_name[e.name]
        return Timed(r.state, -1) if r.entrywise and r.offset == -1 else None
    if isinstance(e, Call):
        args = [_at_first_token(a, by_name) for a in e.args]
        return None if None in args else Call(e.func, tuple(args))
    if isinstance(e, Neg | Transpose):
        inner = _at_first_token(e.operand, by_name)
        return None if inner is None else type(e)(inner)
    if isinstance(e, Binary):
        left, right = _at_first_token(e.left, by_name), _at_first_token(e.right, by_name)
        return None if left is None or right is None else Binary(e.op, left, right)
    return e


def _less_decay(scale: Expr, gates, canon: Canon) -> Expr | None:
    """c_t: `scale` with the decay taken out of every term (the decay: exp of the gate's log,
    or the decay as written), or None where some term lacks it. No gate: the decay is 1."""
    if not gates:
        return scale
    (gate,) = gates
    decays = {str(canon(Call("exp", (gate.log,)))), str(canon(gate.decay))}
    terms = canon.combine(list(canon.ex.expand(scale)))
    out = []
    for t in terms:
        at = next((i for i, s in enumerate(t.scalars) if str(canon(s)) in decays), None)
        if at is None:
            return None
        out.append(Term(coeff=t.coeff, scalars=t.scalars[:at] + t.scalars[at + 1 :]))
    return canon.terms(out) if out else Number("0")

"""The cost model: FLOPs and bytes per token and head of each form, as formulas in the sizes.

`costs(plan)` is a pure function of the plan. Each transition class computes its own chunked and
quadratic cost (`TransitionClass.cost`) from the dimensions of its group (`GroupDims`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mixc.algebra.formula import Formula
from mixc.analysis.plan import GroupPlan, Plan
from mixc.transitions.cost import IO_BYTES, FormCost, GroupDims

__all__ = ["Costs", "GroupCost", "costs"]


@dataclass(frozen=True)
class GroupCost:
    states: tuple[str, ...]
    label: str
    recurrent: FormCost
    chunked: FormCost | None  # None: no chunked form
    quadratic: FormCost | None  # None: no quadratic form
    note: str


@dataclass(frozen=True)
class Costs:
    chunk: str  # the chunk-size symbol (C, unless the spec uses C as a size)
    seq: str  # the sequence-length symbol (T, unless the spec uses T as a size)
    io: Formula  # bytes of per-token inputs read and outputs written
    groups: tuple[GroupCost, ...]
    recurrent: FormCost
    chunked: FormCost | None
    quadratic: FormCost | None

    @property
    def symbols(self) -> tuple[str, ...]:
        forms = [self.recurrent, self.chunked, self.quadratic]
        forms += [f for g in self.groups for f in (g.recurrent, g.chunked, g.quadratic)]
        used = set(self.io.symbols)
        for f in forms:
            if f is not None:
                used |= f.flops.symbols | f.bytes.symbols
        return tuple(sorted(used))


def _numel(shape: tuple[str, ...]) -> Formula:
    out = Formula.const(1)
    for d in shape:
        out = out * Formula.size(d)
    return out


def costs(plan: Plan) -> Costs:
    """Per-token, per-head cost of the recurrent, chunked and quadratic forms, as formulas in the
    spec's sizes, the chunk size C and the sequence length T. A pure function of the plan.

    Conventions: a multiply-add is 2 FLOPs, an elementwise op (exp included) 1; a matrix product
    (m x n)(n x p) is 2 m n p. Per state group, d_k is the key size, d_v the summed value widths
    (a vector state adds 1), r the write rank, n_q the number of distinct readout queries, and
    d_g the gated size (d_k for a key-side gate, d_v value-side, both for an outer product).
    Lower-order FLOPs (O(d) or O(1) per token, such as cumulative sums of gates) are dropped.

    FLOPs per token:

    - Recurrent (O(d_k d_v) per token): decay d_k d_v (2 d_k d_v for an
      outer-product gate, none for the identity), write 2 r d_k d_v, readout 2 n_q d_k d_v; the
      delta rule's erase S^T k and rank-1 update add 4 d_k d_v. A transition in no class (general
      dense, full gate, not affine) is not modelled: its count is a lower bound.
    - Chunked, scalar decay: n_q (2 C r (d_k + d_v) + (2 or 1) C r) for Q K^T, the decay mask
      and P V inside the chunk, 2 n_q d_k d_v for Q S_0, 2 r d_k d_v for K^T V, d_k d_v / C to
      decay the state once per chunk: O(C (d_k + d_v) + d_k d_v).
    - Chunked, diagonal gate (sub-chunks of c = 16): the same matmuls, plus C d_g / 16 to rescale
      keys between sub-chunks and 5 c d_g for the diagonal blocks done elementwise in log space.
    - Chunked, delta rule (UT transform): K K^T 2 C d_k, the unit-triangular solve C^2 / 3
      (C^3 / 3 per chunk), W = T K 2 C d_k, U = T V 2 C d_v, W S_0 and K^T V_new 4 d_k d_v, the
      mask (C, or 2 C with decays), plus n_q (2 C d_k + 2 C d_v + 2 d_k d_v) for the output.
    - Quadratic (one masked T x T product, from a zero state): the chunked intra-chunk terms
      with C = T and no state terms: O(T d) per token, O(T^2 d) in all. A diagonal gate needs
      its decay per channel and pair (5 T d_g instead of the matmul's 2 T d_g); the delta rule is
      its chunked form with one chunk of T tokens (T^2 / 3 for the solve).

    Bytes per token (forward only, inputs and outputs in 2 bytes, states and intermediates in
    fp32): every form reads the per-token inputs and writes the outputs once (`io`). The
    recurrent form reads and writes the state every token (8 d_k d_v; a fused kernel that keeps
    the state on chip would not); the chunked form once per chunk (8 d_k d_v / C) plus its
    C x C intermediates (scores, decay mask; A and T for the delta rule; per-channel decay
    factors for a diagonal gate); the quadratic form its T x T matrices (per channel for a
    diagonal gate).
    """
    mixer = plan.mixer
    dims = {d for decl in (*mixer.inputs, *mixer.params, *mixer.states) for d in decl.shape}
    chunk = "C" if "C" not in dims else "C_chunk"
    seq = "T" if "T" not in dims else "T_seq"
    C, T = Formula.size(chunk), Formula.size(seq)
    io = Formula.total(
        [IO_BYTES * _numel(d.shape) for d in mixer.inputs]
        + [IO_BYTES * _numel(tuple(x for x in o.shape if x != "1")) for o in plan.outputs]
    )
    groups = [_group_cost(plan, group, C, T) for group in plan.groups]
    base = FormCost(Formula(), io)
    recurrent = FormCost.total([base, *(g.recurrent for g in groups)])
    chunked = quadratic = None
    if all(g.chunked is not None for g in groups):
        chunked = FormCost.total([base, *(g.chunked for g in groups)])
    if all(g.quadratic is not None for g in groups):
        quadratic = FormCost.total([base, *(g.quadratic for g in groups)])
    if not groups:
        chunked = quadratic = None
    return Costs(chunk, seq, io, tuple(groups), recurrent, chunked, quadratic)


def _group_cost(plan: Plan, group: GroupPlan, C: Formula, T: Formula) -> GroupCost:
    states = [plan.state(n) for n in group.states]
    lead = states[0]
    tr = lead.transition
    dv = Formula.total(Formula.size(s.width) for s in states)
    dk = Formula.size(lead.key_size)
    dg = Formula()
    if "key" in tr.sides:
        dg = dg + dk
    if "value" in tr.sides:
        dg = dg + dv
    d = GroupDims(dk, dv, max(1, lead.rank), len(group.queries), dg, C, T)
    parts = tr.parts  # several steps a token run as that many sub-tokens
    if len(parts) > 1:
        d = GroupDims(dk, dv, 1, len(group.queries), dg, C, len(parts) * T)
    recurrent = FormCost(
        sum(p.transition_class.recurrent_flops(p, d) for p in parts), d.state_bytes
    )
    tr = tr.lead_step
    if not tr.transition_class.modelled:
        note = (
            "recurrent only; the transition itself is not modelled (no class), so its count is "
            "a lower bound"
        )
        return GroupCost(group.states, tr.label, recurrent, None, None, note)
    if not tr.chunkable:
        note = f"recurrent only: {tr.reason}"
        return GroupCost(group.states, tr.label, recurrent, None, None, note)
    found = tr.transition_class.cost(tr, d)
    steps = len(parts)
    if steps > 1:
        per_token = [
            None if f is None else FormCost(steps * f.flops, steps * f.bytes)
            for f in (found.chunked, found.quadratic)
        ]
        note = f"{found.note}; {steps} sub-tokens a token (a quadratic form over {steps} T of them)"
        found = replace(found, chunked=per_token[0], quadratic=per_token[1], note=note)
    return GroupCost(group.states, tr.label, recurrent, found.chunked, found.quadratic, found.note)

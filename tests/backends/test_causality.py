"""Causality, bit for bit: the output at token t depends on nothing after t, in every form.

Whatever the tokens after t hold (other values, NaN, inf, finite values that overflow inside a
chunk), the outputs up to t are the same bits.
A chunked form multiplies whole chunks at once and a parallel form the whole sequence, so a
later token meets every earlier one in a matrix product; a mask applied by multiplication
(0 * inf = NaN) or a triangular product over a non-finite row then carries it backwards in time.
The recurrent form cannot: it is the reference for what a non-finite token does (it makes its
own output, and every one after it, non-finite).

An input's delay is how many tokens its first effect on the output waits: 0 for an input read at
its own token, 1 for one read only as `x_{t-1}` or only through a state read before the token's
update (`H_{t-1} r_t`). It comes from the analysis, not from the spec's name: the fewest lags
on a path from the input to the output in the plan's dependency graph (each read `n_{t-1}` an
edge of lag 1). Tokens after t changed in an input of delay d leave the outputs up to t + d the
same bits, and a NaN there reaches the output at exactly t + d + 1."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest
import torch

import mixc
from mixc.analysis.plan import analyze
from mixc.check import sample_inputs, sample_states
from tests.mixers import SIZES, VARIANTS

ROOT = Path(__file__).parents[2]
#: The causal shipped specs: a non-causal one (with a backward state) reads later tokens by
#: design, and tests/backends/test_noncausal.py checks the reverse property for it.
SPECS = {p.stem: p for p in sorted(ROOT.glob("specs/*.mix")) if mixc.load_spec(p).mixer.causal}
SOURCES = {
    **SPECS,
    "value_gate": mixc.Source(VARIANTS["value_gate"]),
    "outer_gate": mixc.Source(VARIANTS["outer_gate"]),
    "token_shift": mixc.Source(VARIANTS["token_shift"]),
}
T, B, NH = 13, 2, 2


def _forms(module, states, length=T):
    """Each form as inputs -> outputs [B, length, ...], from the same initial states."""
    forms = {"recurrent": lambda *a: module.recurrent(*a, initial_state=states)[0]}
    if "chunk" in module.FORMS:
        for size in (4, 16):
            forms[f"chunk{size}"] = lambda *a, size=size: module.chunk(
                *a, initial_state=states, chunk_size=size
            )[0]
    if "parallel" in module.FORMS:
        forms["parallel"] = lambda *a: module.parallel(*a)[0]

    def step_loop(*args, upto=length):
        """The outputs at the first `upto` tokens: the loop hands the step one token at a time,
        so it stops after the last output a check reads."""
        n_in, state, ys = len(module.INPUTS), states, []
        for t in range(upto):
            y, state = module.step(*[a[:, t] for a in args[:n_in]], *args[n_in:], state=state)
            ys.append(y)
        return torch.stack(ys, 1)

    forms["step"] = step_loop
    return forms


def _bits(x):
    return x.view(torch.int32)


def _delays(plan, output):
    """Each input's delay to `output`: the fewest lags on a path of the dependency graph."""
    delays = {}
    for d in plan.mixer.inputs:
        lags = nx.single_source_dijkstra_path_length(plan.graph, d.name, weight="lag")
        delays[d.name] = lags[output]
    return delays


def _later(x, t, kind, generator):
    """x with every token after t replaced: by other random values, or by the number `kind`
    names (NaN, +-inf, a large finite value)."""
    x = x.clone()
    if kind == "random":
        x[:, t + 1 :] = 3 * torch.randn(x[:, t + 1 :].shape, generator=generator)
    else:
        x[:, t + 1 :] = float(kind)
    return x


#: Known leaks, each pinned as a strict xfail: remove the entry when the kernel is fixed.
LEAKS: dict[str, str] = {}
#: Checked only with -m slow: Mamba-3 MIMO (10 inputs, 40 s on 2 loaded cores) runs the same
#: forms as Mamba-3 SISO and mamba3_trapezoid, which are checked by default.
SLOW = {"mamba3_mimo"}


def _marks(name: str) -> list:
    marks = [pytest.mark.xfail(reason=LEAKS[name], strict=True)] if name in LEAKS else []
    return marks + [pytest.mark.slow] * (name in SLOW)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in SOURCES])
def test_outputs_up_to_t_do_not_depend_on_later_tokens(name):
    check_causal(SOURCES[name], "pytorch", T, (5, 7))  # inside a chunk of 4, and starting one


#: What the tokens after t are replaced with: other values, NaN, infinities, and finite values
#: large enough to overflow inside a chunk's products (a chunk's triangular inverse times them).
KINDS = ("random", "nan", "inf", "-inf", "1000", "1e30", "-1e30", "3e38")


def _run_or_refuse(run, args, where, **upto):
    """The form's outputs on `args`, or None where it refuses them as the module promises: a
    chunked form whose decay is an input it cannot prove positive checks that input at run
    time, so later tokens that make it negative are an InputError naming the decay (an answer
    about the input, not an output that depends on later tokens)."""
    try:
        return run(*args, **upto)
    except mixc.MixcError as err:
        assert "has negative entries" in str(err), (where, str(err))
        assert any((a < 0).any() for a in args if isinstance(a, torch.Tensor)), where
        return None


def check_causal(source, backend, length, tokens, forms=None, kinds=KINDS, batch=B, heads=NH):
    """Every form of the module `backend` compiles (or those named in `forms`), on `length`
    tokens of `batch` sequences of `heads` heads: the outputs up to each of `tokens` do not change, bit for bit, whatever the later
    tokens hold, nor (for an input of delay d) up to t + d; a NaN reaches token t + d + 1.
    Each input's later tokens are replaced by each of `kinds` in turn, and every input's at
    once by NaN and by each infinity."""
    module = mixc.load(source, backend)
    spec = mixc.load_spec(source)
    delays = _delays(analyze(spec), module.OUTPUT)
    first = min(delays.values())  # the first token all inputs changed at once can reach
    args = sample_inputs(spec, SIZES, length, batch=batch, heads=heads, seed=1)
    states = tuple(sample_states(spec, SIZES, batch=batch, heads=heads, seed=2))
    states = states[0] if len(states) == 1 else states
    n_in = len(module.INPUTS)
    generator = torch.Generator().manual_seed(3)
    for form, run in _forms(module, states, length).items():
        if forms is not None and form not in forms:
            continue
        base = run(*args)
        for t in tokens:
            for i, (input_name, _) in enumerate(module.INPUTS):
                for kind in kinds:
                    changed = list(args)
                    changed[i] = _later(args[i], t, kind, generator)
                    where = f"{form}: {input_name} = {kind} after token {t}"
                    kept = t + 1 + delays[input_name]  # the outputs before it stay the same
                    # the step loop up to the last output read here (not the whole sequence)
                    upto = {"upto": min(kept + 1, length)} if form == "step" else {}
                    y = _run_or_refuse(run, changed, where, **upto)
                    if y is None:
                        continue
                    assert torch.equal(_bits(y[:, :kept]), _bits(base[:, :kept])), where
                    if kind == "nan":
                        assert not torch.isfinite(y[:, kept]).all(), where
            kept = t + 1 + first
            for kind in ("nan", "inf", "-inf"):
                everything = [_later(a, t, kind, generator) for a in args[:n_in]] + args[n_in:]
                where = f"{form}: every input = {kind} after token {t}"
                y = _run_or_refuse(run, everything, where)
                if y is None:
                    continue
                assert torch.equal(_bits(y[:, :kept]), _bits(base[:, :kept])), where
                if kind == "nan":
                    assert torch.isnan(y[:, kept:]).any(-1).all(), where

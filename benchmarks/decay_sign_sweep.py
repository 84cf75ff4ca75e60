"""Sweep: random specs, chunk and parallel against recurrent on plain N(0, 1) inputs (issue 33,
case 6: a decay whose sign is not proven gave NaN from the chunked forms, silently).

Draws specs from `mixc.check.random_specs` (every transition form, GATE_FORMS) and, to reach
decays of any sign, the same kind of specs with hostile decays (`HOSTILE`: tanh, silu,
log(sigmoid), sum, dot products, raw inputs and parameters, relu) in every gate position.
Each spec is compiled (a module that does not load is a failure) and every chunked form it
offers is run on N(0, 1) inputs and parameters (no input ranges: the inputs an unwary caller
passes) in float64, against recurrent. Outcomes:

- agree: relative RMS error below 1e-6 (both finite);
- refused: the form raised the run-time sign check that the plan announces (`Plan.sign_checks`,
  shown by explain and check);
- no chunked form: the plan says so (explain, check and FORMS agree);
- unstable: recurrent itself is not finite, or is beyond 1e12 (a decay above 1 or a delta rule
  with an unnormalised key, both warned by explain), and the chunked form differs;
- FAIL: anything else (NaN or a disagreement explain and check did not announce, a module that
  does not load, an unexpected exception).

    PYTHONPATH=. python benchmarks/decay_sign_sweep.py --specs 1000
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys

import torch

import mixc
from mixc.check import random_specs
from mixc.errors import InputError, MixcError

SIZES = {"K": 3, "N": 3, "Dk": 3, "E": 3, "V": 2, "P": 2, "Dv": 2, "M": 2}

#: Decays of any sign, written in each gate position of the hostile specs.
HOSTILE = (
    "tanh(a_t)",
    "silu(a_t)",
    "log(sigmoid(a_t))",
    "sum(k_t)",
    "q_t . k_t",
    "a_t - 0.5",
    "-sigmoid(a_t)",
    "sigmoid(a_t) tanh(a_t)",
    "a_t",
    "lam",
    "relu(a_t)",
    "a_t^2",
    "exp(a_t)",
    "abs(a_t)",
)
#: Gate positions: (template with {d} a scalar decay, {g} a vector decay over K).
POSITIONS = (
    "H_t = {d} H_{{t-1}} + v_t k_t^T",
    "H_t = H_{{t-1}} diag({g}) + v_t k_t^T",
    "H_t = {d} H_{{t-1}} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T",
    "H_t = H_{{t-1}} diag({g}) - beta_t H_{{t-1}} diag({g}) k_t k_t^T + beta_t v_t k_t^T",
)


def _vector(decay: str) -> str:
    """A decay over K: the scalar input a_t becomes the vector b_t."""
    if decay == "lam":
        return "mu"
    decay = decay.replace("sigmoid(a_t) tanh(a_t)", "sigmoid(a_t) ⊙ tanh(a_t)")
    return decay.replace("a_t", "b_t").replace("sum(k_t)", "k_t").replace("q_t . k_t", "q_t")


def hostile_specs() -> list[str]:
    head = "mixer hostile\nin q[K], k[K], v[V], a, b[K], beta\nparam lam, mu[K]\nstate H[V, K]\n"
    out = []
    for decay, position in itertools.product(HOSTILE, POSITIONS):
        body = position.format(d=f"({decay})", g=_vector(decay))
        out.append(head + body + "\ny_t = H_t q_t\n")
    return out


def drawn_specs(n: int) -> list[str]:
    """`n` distinct specs of random_specs over every form (derandomized: the same every run)."""
    from hypothesis import HealthCheck, Phase, given, settings

    seen: dict[str, None] = {}

    @settings(
        max_examples=n * 3,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(random_specs())
    def draw(text: str) -> None:
        if len(seen) < n:
            seen[text] = None

    draw()
    return list(seen)


def _args(spec, seed: int, T: int = 19):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for d in spec.mixer.inputs:
        dims = [int(s) if s.isdigit() else SIZES.get(s, 3) for s in d.shape]
        out.append(torch.randn(2, T, 2, *dims, generator=gen, dtype=torch.float64))
    for p in spec.mixer.params:
        if p.default is None:
            dims = [int(s) if s.isdigit() else SIZES.get(s, 3) for s in p.shape]
            out.append(torch.randn(2, *dims, generator=gen, dtype=torch.float64))
    return out


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm().clamp_min(1e-12))


def judge(text: str, seed: int = 0) -> list[tuple[str, str]]:
    """(outcome, detail) for each chunked form of one spec."""
    try:
        spec = mixc.load_spec(text=text)
        facts = mixc.analyze(spec)
        module = mixc.load(spec)
    except MixcError as exc:  # refused at compile time: fine, if it is a located message
        return [("refused at compile time", str(exc).splitlines()[0])]
    except Exception as exc:  # a module that does not load, or a form that crashes: a failure
        return [("FAIL", f"load: {type(exc).__name__}: {exc}")]
    forms = [f for f in ("chunk", "parallel") if f in module.FORMS]
    if not facts.chunkable:
        try:
            module.chunk(*_args(spec, seed))
        except MixcError as exc:
            if "NYI: no chunked form" in str(exc) and "chunk" not in module.FORMS:
                return [("no chunked form", facts.forms.chunk.kind)]
        return [("FAIL", "chunk() of a spec without a chunked form did not raise NYI")]
    args = _args(spec, seed)
    try:
        ref, _ = module.recurrent(*args)
    except Exception as exc:  # a module that does not load, or a form that crashes: a failure
        return [("FAIL", f"recurrent: {type(exc).__name__}: {exc}")]
    out = []
    for form in forms:
        try:
            y, _ = getattr(module, form)(*args)
        except InputError as exc:
            names = {c.name for c in facts.sign_checks}
            announced = "has negative entries" in str(exc) and str(exc).split(":")[0] in names
            out.append(("refused" if announced else "FAIL", f"{form}: {exc}"))
            continue
        except Exception as exc:  # a module that does not load, or a form that crashes: a failure
            out.append(("FAIL", f"{form}: {type(exc).__name__}: {exc}"))
            continue
        huge = not torch.isfinite(ref).all() or ref.abs().max() > 1e12
        if torch.isfinite(y).all() and torch.isfinite(ref).all() and _rel(y, ref) < 1e-6:
            out.append(("agree", form))
        elif huge and facts.warnings:
            out.append(("unstable", f"{form}: recurrent reaches {float(ref.abs().max()):.3g}"))
        else:
            detail = "NaN" if torch.isnan(y).any() else f"rel {_rel(y, ref):.3g}"
            out.append(("FAIL", f"{form}: {detail} (recurrent max {float(ref.abs().max()):.3g})"))
    return out


def sweep(n_random: int = 1000, seed: int = 0, log=None) -> dict:
    """Run every spec; returns {"specs": count, "outcomes": Counter, "failures": [...]}."""
    texts = [("random", t) for t in drawn_specs(n_random)] + [
        ("hostile", t) for t in hostile_specs()
    ]
    outcomes: collections.Counter = collections.Counter()
    per_source: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    for i, (source, text) in enumerate(texts):
        for outcome, detail in judge(text, seed + i):
            outcomes[outcome] += 1
            per_source[source][outcome] += 1
            if outcome == "FAIL":
                failures.append((text, detail))
                if log:
                    print(f"FAIL {detail}\n{text}", file=log)
        if i % 200 == 0:  # keep the module cache small
            mixc.clear_cache()
    return {
        "specs": len(texts),
        "outcomes": outcomes,
        "per_source": dict(per_source),
        "failures": failures,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", type=int, default=1000, help="random specs to draw")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = sweep(args.specs, args.seed, log=sys.stdout)
    print(f"specs: {result['specs']}")
    for source, counts in result["per_source"].items():
        print(f"  {source}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print("forms judged: " + ", ".join(f"{k} {v}" for k, v in sorted(result["outcomes"].items())))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

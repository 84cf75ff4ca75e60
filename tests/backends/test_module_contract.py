"""The compiled module's contract beyond exactness: precision, numerics at the extremes, head
broadcasting, prefill-then-decode, argument errors, determinism, atomic writes, NYI."""

from __future__ import annotations

import ast
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

import mixc
from mixc.frontend.ir import angle_states
from mixc.oracle.interpret import interpret
from tests.mixers import VARIANTS, positional, random_states, rel, spec_inputs

ROOT = Path(__file__).parents[2]
SPECS = sorted(ROOT.glob("specs/*.mix"))
CHUNKED = [p for p in SPECS if mixc.analyze(mixc.load_spec(p)).chunkable]
IDS = [p.stem for p in SPECS]


def _bf16_bound(spec, inputs, params, states, y_ref):
    """The error of the reference loop itself run with bf16-rounded inputs in fp32: the floor a
    bf16 computation can reach. The compiled module may be at most 3x worse (and at most 5e-3)."""
    rounded = {n: x.to(torch.bfloat16).double() for n, x in inputs.items()}
    y32 = interpret(spec, rounded, params, states or None)[0][spec.mixer.outputs[0].target]
    return rel(y32.to(torch.bfloat16), y_ref)


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_bf16_inputs_accumulate_in_fp32(path):
    spec, module = mixc.load_spec(path), mixc.load(path)
    inputs, params = spec_inputs(spec, T=100, generator=torch.Generator().manual_seed(1))
    rounded = {n: x.to(torch.bfloat16) for n, x in inputs.items()}
    y_ref = interpret(spec, {n: x.double() for n, x in rounded.items()}, params)[0][
        spec.mixer.outputs[0].target
    ]
    bound = min(5e-3, 3 * max(_bf16_bound(spec, inputs, params, {}, y_ref), 1e-3))
    # parameters stay float32, as in a bf16 model's float32 master weights
    args = positional(spec, rounded, {n: p.float() for n, p in params.items()})
    forms = {"recurrent": module.recurrent}
    if path in CHUNKED:
        forms["chunk"] = lambda *a, **kw: module.chunk(*a, chunk_size=16, **kw)
    for name, form in forms.items():
        y, state = form(*args, output_final_state=True)
        assert y.dtype == torch.bfloat16, name
        states = state if isinstance(state, tuple) else (state,)
        # a state that only feeds angles (Mamba-3's Th) is kept in float64
        wide = angle_states(spec.mixer)
        dtypes = [torch.float64 if d.name in wide else torch.float32 for d in spec.mixer.carried]
        assert [s.dtype for s in states] == dtypes, name
        assert rel(y, y_ref) <= bound, f"{name}: {rel(y, y_ref):.2e} > {bound:.2e}"


def test_fp64_stays_fp64():
    module = mixc.load(ROOT / "specs/gla.mix")
    spec = mixc.load_spec(ROOT / "specs/gla.mix")
    inputs, params = spec_inputs(spec, T=9)
    y, s = module.chunk(*positional(spec, inputs, params), output_final_state=True, chunk_size=4)
    assert y.dtype == torch.float64 and s.dtype == torch.float64


@pytest.mark.parametrize("strength", ["near-zero", "near-one"])
@pytest.mark.parametrize("path", CHUNKED, ids=[p.stem for p in CHUNKED])
def test_extreme_decays_long_sequences_stay_finite(path, strength):
    """Decays near 0 (log-gates around -30) and near 1 (around -1e-6), T = 4096."""
    spec, module = mixc.load_spec(path), mixc.load(path)
    inputs, params = spec_inputs(spec, B=1, T=4096, NH=2, dtype=torch.float32)
    scale = 30.0 if strength == "near-zero" else 1e-6
    for name in ("g", "a"):
        if name in inputs:
            base = -torch.rand_like(inputs[name]) - 0.5
            inputs[name] = (
                base * scale
                if name == "g"
                else (torch.logit(torch.exp(base * scale)).clamp(-60, 60))
            )
    if "dt" in inputs:
        inputs["dt"] = torch.full_like(inputs["dt"], 50.0 if strength == "near-zero" else 1e-6)
    leaves = [x.clone().requires_grad_(True) for x in positional(spec, inputs, params)]
    y, state = module.chunk(*leaves, output_final_state=True, chunk_size=64)
    states = state if isinstance(state, tuple) else (state,)
    assert torch.isfinite(y).all() and all(torch.isfinite(s).all() for s in states)
    y.square().mean().backward()
    for x in leaves:
        assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("path", CHUNKED, ids=[p.stem for p in CHUNKED])
def test_one_head_inputs_broadcast(path):
    spec, module = mixc.load_spec(path), mixc.load(path)
    # share the key-like input across heads (the only one, for a spec with one input)
    first = spec.mixer.inputs[min(1, len(spec.mixer.inputs) - 1)].name
    inputs, params = spec_inputs(spec, T=20, heads={first: 1})
    y_ref = interpret(spec, inputs, params)[0][spec.mixer.outputs[0].target]
    y, _ = module.chunk(*positional(spec, inputs, params), chunk_size=8)
    assert rel(y, y_ref) <= 1e-12
    expanded = dict(inputs, **{first: inputs[first].expand(-1, -1, 3, *inputs[first].shape[3:])})
    y_full, _ = module.chunk(*positional(spec, expanded, params), chunk_size=8)
    assert rel(y, y_full) <= 1e-14


def test_grouped_heads_broadcast_like_mamba2():
    path = ROOT / "specs/mamba2.mix"
    spec, module = mixc.load_spec(path), mixc.load(path)
    inputs, params = spec_inputs(spec, T=10, NH=4, heads={"B": 2, "C": 2})
    y_ref = interpret(spec, inputs, params)[0]["y"]
    y, _ = module.chunk(*positional(spec, inputs, params), chunk_size=4)
    assert rel(y, y_ref) <= 1e-12


#: The causal shipped specs: a non-causal one has no step (tests/backends/test_noncausal.py).
CAUSAL = [p for p in SPECS if mixc.load_spec(p).mixer.causal]


@pytest.mark.parametrize("path", CAUSAL, ids=[p.stem for p in CAUSAL])
def test_prefill_with_chunk_then_step_continues_exactly(path):
    spec, module = mixc.load_spec(path), mixc.load(path)
    inputs, params = spec_inputs(spec, T=40, dtype=torch.float32)
    args = positional(spec, inputs, params)
    n = len(spec.mixer.inputs)
    y_all, _ = module.recurrent(*args)
    prefill = module.chunk if path in CHUNKED else module.recurrent
    kw = {"chunk_size": 16} if path in CHUNKED else {}
    _, state = prefill(
        *[a[:, :29] if i < n else a for i, a in enumerate(args)], output_final_state=True, **kw
    )
    ys = []
    for t in range(29, 40):
        y_t, state = module.step(
            *[a[:, t] if i < n else a for i, a in enumerate(args)], state=state
        )
        ys.append(y_t)
    assert rel(torch.stack(ys, 1), y_all[:, 29:]) <= 1e-5


def test_initial_state_tuple_for_several_states():
    path = ROOT / "specs/linear_attention_normalized.mix"
    spec, module = mixc.load_spec(path), mixc.load(path)
    inputs, params = spec_inputs(spec, T=5)
    states = random_states(spec)
    states["z"] = states["z"].abs() + 1
    y, (H, z) = module.chunk(
        *positional(spec, inputs, params),
        initial_state=(states["H"], states["z"]),
        output_final_state=True,
    )
    ref_y, ref_s = interpret(spec, inputs, params, states)
    assert (
        rel(y, ref_y["y"]) <= 1e-12 and rel(H, ref_s["H"]) <= 1e-12 and rel(z, ref_s["z"]) <= 1e-12
    )
    assert H.shape == (2, 3, 6, 8) and z.shape == (2, 3, 8)


def test_parameter_defaults_are_keyword_overrides():
    module = mixc.load(ROOT / "specs/retnet.mix")
    spec = mixc.load_spec(ROOT / "specs/retnet.mix")
    inputs, _ = spec_inputs(spec, T=12)
    args = positional(spec, inputs, {})
    gamma = torch.tensor([0.9, 0.5, 0.25], dtype=torch.float64)
    y, _ = module.chunk(*args, gamma=gamma, chunk_size=4)
    assert rel(y, interpret(spec, inputs, {"gamma": gamma})[0]["y"]) <= 1e-12
    y_default, _ = module.chunk(*args, chunk_size=4)
    assert rel(y_default, interpret(spec, inputs, {})[0]["y"]) <= 1e-12


BAD_ARGS = [
    (
        lambda a: [a[0][..., :5], *a[1:]],
        "k: expected K = 5 (as in an earlier argument) in [B, T, NH, K], got 8",
    ),
    (lambda a: [a[0][0], *a[1:]], "q: expected 4 dimensions [B, T, NH, K], got shape [7, 3, 8]"),
    (lambda a: [a[0].long(), *a[1:]], "q: expected a floating-point tensor, got torch.int64"),
    (lambda a: [a[0][:, :5], *a[1:]], "k: expected T = 5 (as in an earlier argument)"),
    (lambda a: [a[0], a[1][:, :, :2], *a[2:]], "k: 2 heads do not divide the 3 heads"),
    (lambda a: [a[0], a[1].numpy(), *a[2:]], "k: expected a torch.Tensor, got ndarray"),
    (
        lambda a: [a[0].to("meta"), *a[1:]],
        "k: expected a tensor on meta (like the first input), got one on cpu",
    ),
]


@pytest.mark.parametrize("mutate,message", BAD_ARGS)
def test_wrong_arguments_name_the_argument(mutate, message):
    spec = mixc.load_spec(ROOT / "specs/deltanet.mix")
    module = mixc.load(ROOT / "specs/deltanet.mix")
    inputs, params = spec_inputs(spec, T=7)
    args = mutate(positional(spec, inputs, params))
    with pytest.raises(mixc.MixcError) as info:
        module.chunk(*args)
    assert message in str(info.value)


def test_empty_sequence_is_a_clear_error_in_every_form():
    spec = mixc.load_spec(ROOT / "specs/gated_retention.mix")
    module = mixc.load(ROOT / "specs/gated_retention.mix")
    args = positional(spec, *spec_inputs(spec, T=0))
    for form in (module.chunk, module.parallel, module.recurrent):
        with pytest.raises(mixc.MixcError, match=r"q: the sequence is empty \(T = 0\)"):
            form(*args)


def test_wrong_initial_state_and_chunk_size():
    spec = mixc.load_spec(ROOT / "specs/gla.mix")
    module = mixc.load(ROOT / "specs/gla.mix")
    args = positional(spec, *spec_inputs(spec, T=7))
    with pytest.raises(
        mixc.MixcError,
        match=r"initial_state H: expected shape \[B, NH, V, K\] = \[2, 3, 6, 8\], got \[2, 3, 8, 6\]",
    ):
        module.chunk(*args, initial_state=torch.zeros(2, 3, 8, 6, dtype=torch.float64))
    with pytest.raises(mixc.MixcError, match="chunk_size: expected a power of two, got 12"):
        module.chunk(*args, chunk_size=12)


def test_sequential_only_spec_chunk_raises_nyi_with_reason():
    nonaffine = "mixer squash\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = tanh(H_{t-1}) + v_t k_t^T\ny_t = H_t q_t\n"
    module = mixc.load(text=nonaffine)
    q = torch.randn(1, 5, 2, 4)
    y, _ = module.recurrent(q, q, torch.randn(1, 5, 2, 3))
    assert y.shape == (1, 5, 2, 3)
    with pytest.raises(
        mixc.MixcError, match=r"NYI: no chunked form \(H: not affine: tanh\(...\) of a state"
    ):
        module.chunk(q, q, torch.randn(1, 5, 2, 3))


def test_generated_source_is_deterministic_across_processes(tmp_path):
    code = "import mixc, sys; sys.stdout.write(mixc.compile_source('specs/mamba2.mix'))"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout
        for seed in (1, 2)
    ]
    assert (
        runs[0]
        == runs[1]
        == mixc.compile_source(ROOT / "specs/mamba2.mix").replace(
            str(ROOT / "specs/mamba2.mix"), "specs/mamba2.mix"
        )
    )


def test_compile_writes_atomically_and_never_clobbers(tmp_path):
    out = tmp_path / "mixer.py"
    out.write_text("precious\n")
    bad = tmp_path / "bad.mix"
    bad.write_text("mixer bad\nin q[K]\nstate H[K]\nH_t = H_{t-1} + q_t q_t\ny_t = H_t\n")
    run = subprocess.run(
        [sys.executable, "-m", "mixc", "compile", str(bad), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr and "bad.mix:4:" in run.stderr
    assert out.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.mix", "mixer.py"]
    run = subprocess.run(
        [sys.executable, "-m", "mixc", "compile", str(ROOT / "specs/gla.mix"), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert out.read_text().startswith("# Generated by mixc")


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_the_module_carries_only_the_definitions_it_uses(path):
    """Every top-level function and class of a module (runtime helpers, kernels, their helpers
    and the mixer's own) is reached from its public forms or its other top-level statements (the
    aliases, the operators' registration), through the names the definitions read."""
    tree = ast.parse(mixc.compile_source(path))
    defined = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}

    def read(node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in defined}

    wanted = [name for name in defined if not name.startswith("_")]  # chunk, step, ...
    wanted += [name for node in tree.body if node.__class__ is ast.Assign for name in read(node)]
    reached: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name not in reached:
            reached.add(name)
            wanted += read(defined[name])
    assert sorted(set(defined) - reached) == []


def test_generated_file_imports_only_torch_and_runs_standalone(tmp_path):
    out = tmp_path / "gla_compiled.py"
    subprocess.run(
        [sys.executable, "-m", "mixc", "compile", str(ROOT / "specs/gla.mix"), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    text = out.read_text()
    imports = sorted(
        {line.split()[1] for line in text.splitlines() if line.startswith(("import ", "from "))}
    )
    assert "torch" in imports and set(imports) <= {"math", "torch", "torch.nn.functional"}
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.startswith('mixc'): raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "import torch, gla_compiled as m\n"
        "y, s = m.chunk(*[torch.randn(1, 9, 2, 4)] * 3, torch.randn(1, 9, 2, 4).sigmoid().log(), output_final_state=True)\n"
        "try:\n    m.chunk(torch.zeros(1), *[torch.randn(1, 9, 2, 4)] * 3)\nexcept ValueError as e:\n    print(type(e).__name__, e)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("MixcError q: expected 4 dimensions")


def test_load_registers_source_for_tracebacks():
    module = mixc.load(ROOT / "specs/deltanet.mix")
    try:
        module.recurrent(
            torch.zeros(1, 2, 1, 4),
            torch.zeros(1, 2, 1, 4),
            torch.zeros(1, 2, 1, 3),
            "not a tensor",
        )
    except mixc.MixcError as exc:
        frames = traceback.format_exception(exc)
    text = "".join(frames)
    assert "<mixc:deltanet:" in text and "_fail(f" in text
    assert module.SPEC.startswith("# DeltaNet") and module.STATES == (("H", ("V", "K")),)
    assert module.INPUTS == (("q", ("K",)), ("k", ("K",)), ("v", ("V",)), ("beta", ()))


def test_variant_specs_get_their_class():
    expected = {
        "value_gate": "diagonal value-side",
        "outer_gate": "elementwise gate",
        "normalized_gated_retention": "scalar data-dependent",
        "delta_spelled_out": "identity minus rank-1",
        "gated_delta_const": "scalar decay times identity minus rank-1",
        "gla_gate_skip": "diagonal key-side",
        "mamba_like_value_scale": "scalar data-dependent",
    }
    for name, cls in expected.items():
        module = mixc.load(text=VARIANTS[name])
        assert set(module.CLASSES.values()) == {cls}, name

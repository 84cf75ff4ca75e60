"""The Triton backend, its kernels run by triton's interpreter on CPU (tests/conftest.py sets
TRITON_INTERPRET=1 before anything imports triton). Skipped, with the reason, without triton.

Every form of every shipped spec against the float64 oracle (the fuzzer, gradients included):
every shipped spec's chunked form runs a Triton kernel (what explain says where one would fall
back to the PyTorch kernel); causality with non-finite later tokens, packed sequences, 16-bit inputs, and the module
the backend writes (imports, fallback notes, the refusal to run on a CPU tensor outside the
interpreter).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import mixc
from mixc.analysis.plan import analyze
from mixc.check import Example, check, input_ranges
from mixc.check.forms import _forms
from mixc.check.fuzz import DTYPES, fuzz
from mixc.driver import compile_source
from mixc.errors import MixcError
from tests.backends.test_causality import KINDS, check_causal
from tests.backends.test_varlen import check_packed

triton = pytest.importorskip("triton", reason="the Triton backend needs triton (mixc[triton])")
if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - set by tests/conftest.py
    pytest.skip(
        "the Triton kernels run on CPU only in triton's interpreter", allow_module_level=True
    )

from mixc.backends.triton import BACKEND as TRITON  # noqa: E402
from mixc.backends.triton.kernels import KERNELS  # noqa: E402
from mixc.lowering import lower  # noqa: E402

pytestmark = pytest.mark.triton

ROOT = Path(__file__).parents[2]
SPECS = {p.stem: p for p in sorted(ROOT.glob("specs/*.mix"))}


def _covered(path) -> bool:
    """Whether every chunked group of the spec runs a Triton kernel."""
    plan = analyze(mixc.load_spec(path))
    return plan.chunkable and all(f"chunk_{g.kernel}" in KERNELS for g in plan.groups)


COVERED = [name for name, path in SPECS.items() if _covered(path)]
FALLBACK = [name for name, path in SPECS.items() if not _covered(path)]


def test_the_triton_kernels_cover_every_class_with_a_chunked_form():
    assert set(KERNELS) == {
        "chunk_scalar_decay",
        "chunk_delta",
        "chunk_diagonal",
        "chunk_dplr",
        "chunk_elementwise",
    }
    assert {"linear_attention", "retnet", "gated_retention", "mamba2", "deltanet"} <= set(COVERED)
    assert {"gated_deltanet", "gla", "rwkv6", "kda", "rwkv7"} <= set(COVERED)
    assert {"mamba1", "hgrn", "gated_general"} <= set(COVERED)
    # the value-side class runs the PyTorch chunk_dplr_value, two passes that call the Triton
    # chunk_dplr and chunk_diagonal (its value-side gates in their PyTorch form)
    assert FALLBACK == ["gated_oja"]


#: One spec of each Triton kernel and of each way a program calls one (sub-tokens, passes of a
#: pipeline, a reversed pass, positions) in the default run; every covered spec with -m slow.
FP32_FAST = [
    "gated_retention", "gated_deltanet", "gla", "kda",
    "deltaproduct", "stacked", "hydra", "linear_attention_rope",
]  # fmt: skip
#: (the elementwise kernel, hgrn's and mamba1's, by test_every_form_matches_the_oracle_in_other_dtypes)


def example(name, batch, heads, T, chunk_sizes, seed):
    """An example of `name` with every size 8 and an initial state, its first input given with
    one head (shared by every head) where there are several."""
    spec = mixc.load_spec(SPECS[name])
    mixer = spec.mixer
    symbols = {d for x in (*mixer.inputs, *mixer.states) for d in x.shape if not d.isdigit()}
    sizes = tuple((symbol, 8) for symbol in sorted(symbols))
    inputs = tuple((d.name, 1 if i == 0 else heads) for i, d in enumerate(mixer.inputs))
    return Example(batch, heads, T, sizes, chunk_sizes, True, inputs, (), False, seed=seed)


@pytest.mark.parametrize("name", FP32_FAST)
def test_every_form_matches_the_oracle_fp32(name):
    """Every form, gradients included, on one example in the interpreter: two chunks of 16 from
    an initial state (chunk size 4 runs as 16), two heads sharing the first input. One sequence:
    the interpreter runs a program a sequence and head, one after another, and the drawn
    examples of the other dtypes' test and of the slow one below run several (the two drawn
    here before were one token of one head, and three sequences without an initial state)."""
    ex = example(name, 1, 2, 32, (4,), seed=1)
    worst, failure = check(
        input_ranges(mixc.load_spec(SPECS[name])), mixc.load(SPECS[name], backend="triton"), ex
    )
    assert failure is None, failure.summary()
    assert "chunk" in worst


@pytest.mark.slow
@pytest.mark.parametrize("name", COVERED + FALLBACK)
def test_every_form_matches_the_oracle_fp32_fuzzed(name):
    """Eight drawn examples of every spec (each runs every form, several chunk sizes and the
    gradients)."""
    report = fuzz(SPECS[name], backend="triton", examples=8, seed=1, shrink=False, max_T=40)
    assert report.ok, report.failure.summary()
    assert "chunk" in report.worst


def test_fuzz_runs_each_chunk_the_kernels_run_once():
    """The Triton kernels run any chunk size up to 16 as 16, whatever the length (a sub-token
    module runs a longer sequence than the example's T): fuzz runs those draws once and every
    longer one (where those are capped depends on the length); a PyTorch module every size
    drawn."""
    ranges = SimpleNamespace(plan=SimpleNamespace(chunkable=True))
    example = SimpleNamespace(chunk_sizes=(4, 1, 16, 32, 64), T=24, initial_state=True)
    triton_module = mixc.load(SPECS["gla"], backend="triton")
    torch_module = mixc.load(SPECS["gla"])
    chunks = [cs for form, cs in _forms(ranges, triton_module, example) if form == "chunk"]
    assert chunks == [4, 32, 64]
    chunks = [cs for form, cs in _forms(ranges, torch_module, example) if form == "chunk"]
    assert chunks == [4, 1, 16, 32, 64]


#: Each kernel in one dtype besides float32 by default: float64 for those with their own float64
#: path (the delta rule's and DPLR's triangular solves), bfloat16 for the others; the
#: elementwise kernel (no spec of FP32_FAST runs it) in both. (Every kernel's bfloat16 operands
#: also by tests/backends/test_triton_precision.py.) Every covered spec in both with -m slow.
OTHER_DTYPES = {
    "bfloat16": ["gated_retention", "gla", "hgrn"],
    "float64": ["gated_deltanet", "kda", "mamba1"],
}


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        (dtype, n) if n in OTHER_DTYPES[dtype] else pytest.param(dtype, n, marks=pytest.mark.slow)
        for dtype in ("float64", "bfloat16")
        for n in COVERED
    ],
)
def test_every_form_matches_the_oracle_in_other_dtypes(name, dtype):
    """Two drawn examples, and one (one sequence of one head) that carries a state through
    three chunks of 16 from an initial state (the drawn ones may be shorter than a chunk, where
    a wrong state passed between chunks cannot show)."""
    report = fuzz(
        SPECS[name], backend="triton", examples=2, seed=2, dtype=dtype, shrink=False, max_T=40
    )
    assert report.ok, report.failure.summary()
    across = example(name, 1, 1, 37, (16,), seed=7)
    ranges = input_ranges(mixc.load_spec(SPECS[name]))
    _, failure = check(
        ranges, mixc.load(SPECS[name], backend="triton"), across, dtype=DTYPES[dtype]
    )
    assert failure is None, failure.summary()


def test_a_class_without_a_triton_kernel_runs_the_pytorch_kernel(monkeypatch):
    """Every shipped class with a chunked form has a Triton kernel: without one (here the
    elementwise kernel taken away) the module carries the PyTorch kernel and explain says so."""
    from mixc.backends.triton import kernels

    monkeypatch.delitem(kernels.KERNELS, "chunk_elementwise")
    monkeypatch.setattr(kernels, "DEFINITIONS", dict(kernels.DEFINITIONS))
    kernels.DEFINITIONS["chunk_elementwise"] = torch_definitions()["chunk_elementwise"]
    (note,) = TRITON.kernel_notes(lower(analyze(mixc.load_spec(SPECS["mamba1"]))))
    assert "falls back to the PyTorch kernel chunk_elementwise" in note
    source = kernels.kernel_source(["chunk_elementwise"])
    assert "def chunk_elementwise(" in source and "@triton.jit" not in source


def torch_definitions():
    from mixc.backends.pytorch import kernels as torch_kernels

    return torch_kernels.DEFINITIONS


def test_per_channel_gates_near_0_stay_finite_and_exact():
    """chunk_diagonal in fp32 with decays from exp(-60) to 1 per channel (a chunk's running
    sum reaches -3840: exp(-b) would overflow), against the recurrence in float64."""
    module = mixc.load(SPECS["gla"], backend="triton")
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(1, 2, 40, 8, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, 40, 5, generator=gen)
    g = -60.0 * torch.rand(1, 2, 40, 8, generator=gen) ** 4  # mostly near 0, some near -60
    g[..., 0] = 0.0  # one channel never decays
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
    o, final = module.chunk_diagonal(*leaves[:3], gk=leaves[3], chunk_size=64)
    (o.sum() + final.sum()).backward()
    state = torch.zeros(1, 2, 8, 5, dtype=torch.float64)
    expected = []
    for t in range(40):
        decay = g[:, :, t].double().exp().unsqueeze(-1)
        state = decay * state + k[:, :, t, :, None].double() * v[:, :, t, None, :].double()
        expected.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t].double(), state))
    expected = torch.stack(expected, 2)
    assert all(torch.isfinite(x.grad).all() for x in leaves)
    assert ((o.double() - expected).norm() / expected.norm()) < 1e-5
    assert ((final.double() - state).norm() / state.norm()) < 1e-5


@pytest.mark.parametrize(
    ("name", "kernel"), [("retnet", "chunk_scalar_decay"), ("deltanet", "chunk_delta")]
)
def test_a_kernel_called_without_an_initial_state_differentiates(name, kernel):
    """The kernels' own backward with initial_state=None (the generated forms always pass one):
    the same gradients as with a zero initial state."""
    fn = getattr(mixc.load(SPECS[name], backend="triton"), kernel)
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 1, 20, 4, generator=gen) for _ in range(2))
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(1, 1, 20, 3, generator=gen)
    extra = [torch.rand(1, 1, 20, generator=gen)] if kernel == "chunk_delta" else []
    grads = []
    for initial in (None, torch.zeros(1, 1, 4, 3)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, *extra)]
        o, final = fn(*leaves, initial_state=initial)
        (o.sum() + final.sum()).backward()
        grads.append([x.grad for x in leaves])
    for without, with_zeros in zip(*grads):
        torch.testing.assert_close(without, with_zeros, rtol=0, atol=0)


VALUE_SIDE = """mixer value_side "a diagonal gate on the value side"
in    q[K], k[K], v[V], g[V]
state H[V, K]
H_t = diag(exp(g_t)) H_{t-1} + v_t k_t^T
y_t = H_t q_t
"""


def test_value_side_gates_run_the_pytorch_chunked_form_and_say_so():
    spec = mixc.load_spec(text=VALUE_SIDE)
    (note,) = TRITON.kernel_notes(lower(analyze(spec)))
    assert "chunk_diagonal runs the PyTorch kernel's chunked form" in note
    assert "no value-side gates yet" in note
    report = fuzz(spec, backend="triton", examples=2, seed=3, shrink=False, max_T=40)
    assert report.ok, report.failure.summary()


def test_explain_names_the_kernel_of_each_group(capsys):
    from mixc.cli import main

    assert main(["explain", str(SPECS["gated_deltanet"]), "--backend", "triton"]) == 0
    out = capsys.readouterr().out
    assert "chunk_delta runs fused Triton kernels, forward and backward" in out
    assert main(["explain", str(SPECS["gla"]), "--backend", "triton"]) == 0
    assert (
        "chunk_diagonal runs fused Triton kernels, forward and backward" in capsys.readouterr().out
    )
    assert main(["explain", str(SPECS["mamba1"]), "--backend", "triton"]) == 0
    out = capsys.readouterr().out
    assert "chunk_elementwise runs fused Triton kernels, forward and backward" in out


@pytest.mark.parametrize("name", ["retnet", "gated_deltanet"])
def test_the_module_imports_torch_and_triton_only(name):
    source = compile_source(SPECS[name], backend="triton")
    assert source == compile_source(SPECS[name], backend="triton")  # deterministic
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported == {"torch", "triton", "mixc"}  # mixc: only its error class, optional
    assert "@triton.jit" in source


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the NaNs
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # and the overflows
@pytest.mark.parametrize(
    "kinds",
    [("random", "nan", "3e38"), pytest.param(KINDS, marks=pytest.mark.slow)],
    ids=["random-nan-3e38", "all"],
)
@pytest.mark.parametrize("name", ["gated_retention", "gated_deltanet", "gla", "rwkv7"])
def test_outputs_up_to_t_do_not_depend_on_later_tokens(name, kinds):
    """The chunked form in chunks of 16 (the kernels' least; chunk_size 4 runs as 16): a later
    token inside the first chunk (t = 5) and one starting the second (t = 15). Each input's
    later tokens other values, NaN or 3e38 (which overflows inside a chunk) by default (every
    input at once also each infinity), and every kind of KINDS with -m slow. One sequence of one
    head (the interpreter runs a program a sequence and head, one after another): a leak from
    later tokens is along time, and the packed-sequence and fuzz tests run several of each."""
    check_causal(
        SPECS[name], "triton", 24, (5, 15), forms=("chunk16",), kinds=kinds, batch=1, heads=1
    )


@pytest.mark.parametrize("name", ["mamba2", "gated_deltanet", "gla", "kda"])
def test_packed_sequences_equal_each_sequence_alone(name):
    """One head: the interpreter runs a program a sequence and head, one after another."""
    check_packed(SPECS[name], "triton", "chunk", heads=1)


def test_a_cpu_tensor_outside_the_interpreter_is_refused():
    module = mixc.load(SPECS["retnet"], backend="triton")

    def compiled_kernel():  # what triton.jit gives outside the interpreter
        pass

    with pytest.raises(RuntimeError, match="run on a CUDA device"):
        module._tl_check_device(compiled_kernel, torch.zeros(1))


def test_a_missing_triton_is_a_clear_error(monkeypatch):
    text = SPECS["retnet"].read_text() + "# a text of its own, so that no cached module answers\n"
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` fails as if absent
    with pytest.raises(MixcError, match=r"pip install 'mixc\[triton\]'"):
        mixc.load(text=text, backend="triton")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # exp(-1e30) * 0
@pytest.mark.parametrize(
    "gate, d_k",
    [("strong per channel", 16), ("strong per channel", 40), ("per token", 16), ("none", 16)],
)
def test_the_dplr_kernel_in_fp32_matches_the_pytorch_kernel_in_fp64(gate, d_k):
    """Per-channel decays down to exp(-30) a token beside ones near 1 and a hard reset (-inf),
    where exp(c_r) exp(-c_j) would overflow; a per-token gate [B, NH, T, 1]; no gate. Outputs,
    final state and every gradient, the float64 PyTorch kernel (checked against the oracle by
    the fuzzer) as the reference. 40 key columns: several blocks of them, the last partial."""
    from mixc.backends.pytorch.kernels import dplr as torch_dplr
    from mixc.backends.triton.kernels import dplr as triton_dplr

    gen = torch.Generator().manual_seed(3)
    shape = (1, 1, 37, d_k)  # one head: the interpreter runs a program a head
    q, k = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    k = torch.nn.functional.normalize(k, dim=-1).double()
    v = torch.randn(*shape[:3], 8, generator=gen).double()
    beta = torch.rand(*shape[:3], 1, generator=gen).double()
    gk = None
    if gate == "strong per channel":
        gk = -30 * torch.rand(*shape, generator=gen).double()
        gk[..., ::3] = -1e-3 * torch.rand(gk[..., ::3].shape, generator=gen).double()
        gk[0, 0, 20, :4] = -float("inf")
    elif gate == "per token":
        gk = -torch.rand(*shape[:3], 1, generator=gen).double()
    a = -beta * k * (1 if gk is None else gk.exp())
    inputs = [q.double(), k, v, a, k.clone(), gk, torch.randn(1, 1, d_k, 8, generator=gen).double()]
    results = {}
    for name, module, dtype in (
        ("reference", torch_dplr, torch.float64),
        ("triton", triton_dplr, torch.float32),
    ):
        leaves = [None if x is None else x.detach().to(dtype).requires_grad_() for x in inputs]
        o, state = module.chunk_dplr(
            *leaves[:5], gk=leaves[5], initial_state=leaves[6], chunk_size=16
        )
        weights = torch.linspace(-1, 1, o.numel(), dtype=dtype).reshape(o.shape)
        ((o * weights).sum() + state.square().sum()).backward()
        results[name] = [o, state] + [x.grad for x in leaves if x is not None]
    for got, want in zip(results["triton"], results["reference"]):
        err = (got.double() - want).norm() / want.norm()
        assert err < 1e-5, err  # fp32 roundings (about 1e-7 each), not a wrong formula

"""`mixc bench` runs a tiny sweep and writes valid JSON and a PNG (no timing assertions)."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from mixc.cli import main
from mixc.tools import bench

ROOT = Path(__file__).parents[2]
TINY = ["--sizes", "B=1,NH=2,K=8,V=8", "--T", "16,40", "--repeats", "2", "--threads", "1"]


def test_bench_writes_json_and_png(tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    spec = str(ROOT / "specs" / "gated_retention.mix")
    args = ["bench", spec, *TINY, "--chunk-size", "8", "--backward"]
    assert main([*args, "--json", str(out_json), "--plot", str(out_png)]) == 0
    table = capsys.readouterr().out
    assert "gated_retention" in table and "chunk" in table and "recurrent" in table

    data = json.loads(out_json.read_text())
    assert data["mixer"] == "gated_retention"
    assert data["sizes"] == {"B": 1, "NH": 2, "K": 8, "V": 8}
    assert data["chunk_size"] == 8 and data["threads"] == 1
    got = {(p["form"], p["pass"], p["T"]) for p in data["points"]}
    for form in ("chunk", "recurrent", "parallel"):
        for pas in ("forward", "forward+backward"):
            assert {(form, pas, 16), (form, pas, 40)} <= got
    for p in data["points"]:
        repeats = bench.REMEASURE_FACTOR * 3 if p["remeasured"] else 2  # a suspect point: again
        assert len(p["times_s"]) == repeats and p["q1_s"] <= p["median_s"] <= p["q3_s"]
        assert p["peak_bytes"] > 0 and p["flops"] > 0
    assert set(data["matmul"]) == {"16", "40"}
    assert all(v["gflops"] > 0 for v in data["matmul"].values())
    chunk = [p for p in data["points"] if p["form"] == "chunk" and p["pass"] == "forward"]
    assert all(p["matmul_fraction"] > 0 for p in chunk)

    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FakeClock:
    """A clock whose every call takes 1 ms, except that among its first `noisy` readings every
    second call takes 501 ms: repeats that spread far beyond the bound."""

    def __init__(self, noisy: int) -> None:
        self.readings, self.now, self.noisy = 0, 0.0, noisy

    def __call__(self) -> float:
        self.readings += 1
        self.now += 0.001
        if self.readings <= self.noisy and self.readings % 4 == 0:  # the end of every 2nd call
            self.now += 0.5
        return self.now


def _tiny_run(clock, forms=("recurrent",)):
    spec = str(ROOT / "specs" / "gated_retention.mix")
    sizes = {"B": 1, "NH": 1, "K": 4, "V": 4}
    return bench.run(
        spec,
        sizes=sizes,
        T=[8, 16],
        forms=forms,
        repeats=4,
        threads=1,
        memory=False,
        progress=False,
        clock=clock,
    )


def test_a_noisy_clock_marks_every_point_unreliable_after_measuring_it_again(capsys):
    result = _tiny_run(FakeClock(noisy=10**9))
    for p in result.points:
        assert p.remeasured and len(p.times) == bench.REMEASURE_FACTOR * 4
        assert p.unreliable.startswith("repeats spread ") and "bound 25%" in p.unreliable
        assert bench.Point.to_json(p)["unreliable"] == p.unreliable
    from mixc.tools.bench_report import render

    render(result)
    out = capsys.readouterr().out
    assert out.count(" !") == 2 and "recurrent fwd T=8: unreliable after measuring it again" in out


def test_noise_that_passes_is_measured_again_and_not_marked():
    result = _tiny_run(FakeClock(noisy=8))  # the first point's four calls only
    first, second = result.points  # the second looked faster than the first: both again
    for p in (first, second):
        assert p.remeasured and p.unreliable is None and p.median == pytest.approx(1e-3)


def test_times_falling_with_T_and_figures_above_the_matmul_peak_are_suspect():
    result = bench.BenchResult("s.mix", "s", {}, 64, 1, "cpu", 3)
    short, long_ = (
        bench.Point("chunk", False, t, [s] * 3, flops=1e10) for t, s in ((256, 0.98), (1024, 0.032))
    )
    result.points = [short, long_]
    result.matmul = {256: {"gflops": 100.0}, 1024: {"gflops": 100.0}}
    suspects = bench.suspect_points(result)
    assert suspects[short] == ["slower than at a longer T (32 ms at T = 1024 against 980 ms)"]
    assert suspects[long_] == [
        "312% of the matmul reference, above the measured peak",
        "faster than at a shorter T (32 ms at T = 1024 against 980 ms)",
    ]
    long_.times = [1.0] * 3  # rising with T, at 10% of the reference: nothing to say
    assert bench.suspect_points(result) == {}


def test_bench_caps_and_forms(tmp_path):
    out_json = tmp_path / "bench.json"
    spec = tmp_path / "squash.mix"  # recurrent only: no chunk, no parallel
    spec.write_text(
        "mixer squash\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = tanh(H_{t-1}) + v_t k_t^T\n"
        "y_t = H_t q_t\n"
    )
    spec = str(spec)
    args = ["bench", spec, *TINY, "--recurrent-max-T", "16", "--no-memory"]
    assert main([*args, "--json", str(out_json)]) == 0
    data = json.loads(out_json.read_text())
    assert {(p["form"], p["T"]) for p in data["points"]} == {("recurrent", 16)}
    notes = " ".join(data["notes"])
    assert "chunk: not available" in notes and "skipped T = 40" in notes


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path, capsys):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    spec = str(ROOT / "specs" / "linear_attention.mix")
    assert main(["bench", spec, *TINY, "--plot", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "matplotlib" in err and "pip install" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("bad", [["--T", "0"], ["--forms", "chunk,fast"], ["--chunk-size", "x"]])
def test_usage_errors_exit_2(bad):
    spec = str(ROOT / "specs" / "linear_attention.mix")
    with pytest.raises(SystemExit) as exc:
        main(["bench", spec, *bad])
    assert exc.value.code == 2


def test_unknown_size_is_an_error(capsys):
    spec = str(ROOT / "specs" / "linear_attention.mix")
    assert main(["bench", spec, "--sizes", "Q=3", "--no-memory"]) == 1
    assert "unknown size Q" in capsys.readouterr().err


def test_peak_memory_counts_tensor_allocations():
    torch = pytest.importorskip("torch")

    def call():
        a = torch.ones(1 << 18)  # 1 MiB
        b = a * 2  # another MiB while a is alive
        del a
        return b + 1  # a freed: the peak stays at 2 MiB

    peak = bench.measure_peak_memory(call)
    assert 2 * 2**20 <= peak < 3 * 2**20


def test_make_inputs_draw_the_sampling_ranges_with_decays_near_one():
    """bench draws from mixc.check.sampling: every decay near 1 (here GLA's log-gate in
    (-1e-3, 0]), the arguments in the module's order, at B and NH from the sizes."""
    import mixc

    spec = mixc.load_spec(ROOT / "specs" / "gla.mix")
    sizes = bench.default_sizes(spec, {"B": 2, "NH": 3, "K": 4, "V": 5})
    q, k, v, g = bench.make_inputs(spec, sizes, 33)
    assert q.shape == k.shape == g.shape == (2, 33, 3, 4) and v.shape == (2, 33, 3, 5)
    assert (g <= 0).all() and (g > -1e-3).all()


@pytest.mark.parametrize(
    "command,option",
    [
        (["bench", "specs/gla.mix", "--device", "nosuch"], "--device: 'nosuch' is not a torch"),
        (["bench", "specs/gla.mix", "--device", "meta"], "--device: meta holds no values"),
        (["bench", "specs/gla.mix", "--threads", "100000"], "--threads: 100000 is more than"),
        (["synth", "specs/gla.mix", "--threads", "100000"], "--threads: 100000 is more than"),
        (["synth", "specs/gla.mix", "--device", "nosuch"], "--device: 'nosuch' is not a torch"),
    ],
    ids=["bench device", "bench meta", "bench threads", "synth threads", "synth device"],
)
def test_absurd_devices_and_threads_are_one_line_errors(command, option, capsys):
    """--device nosuch printed a traceback and --threads 100000 was taken: each is refused on
    one line, naming the option, before anything is compiled or allocated."""
    assert main([*command, "--json", "/nonexistent/x.json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(option) and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("lr", ["nan", "inf", "0", "-1e-3"])
def test_a_learning_rate_that_is_not_finite_and_positive_is_refused(lr, capsys):
    with pytest.raises(SystemExit):
        main(["synth", "specs/gla.mix", f"--lr={lr}"])
    assert "argument --lr: expected a finite positive number" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options,refused",
    [
        (["--T", "1000000000"], "--T: 1000000000 would need "),
        (["--sizes", "B=100000000"], "--sizes: B=100000000 would need "),
        (["--sizes", "NH=2,N=100000000"], "--sizes: N=100000000 would need "),
        (["--T", "100000", "--sizes", "B=100000"], "--sizes: B=100000 would need "),
        (
            ["--forms", "parallel", "--T", "1000000", "--parallel-max-T", "1000000"],
            "--parallel-max-T: 1000000 would need ",
        ),
    ],
    ids=["T", "batch", "size", "both", "parallel"],
)
def test_absurd_sizes_are_refused_before_anything_is_allocated(
    options, refused, monkeypatch, capsys
):
    """Whole-number sizes that need terabytes were allocated and died with a traceback: the
    sweep's largest call is estimated first and refused on one line naming the option."""

    def allocate(*args, **kwargs):
        raise AssertionError("allocated before refusing")

    monkeypatch.setattr(bench, "make_inputs", allocate)
    monkeypatch.setattr(bench, "matmul_throughput", allocate)
    assert main(["bench", "specs/mamba2.mix", "--no-memory", *options]) == 1
    err = capsys.readouterr().err
    assert err.startswith(refused) and len(err.strip().splitlines()) == 1
    assert "more than this machine's" in err and "Traceback" not in err


def test_ordinary_sizes_pass_the_memory_check():
    plan = bench.analyze(bench.load_spec(ROOT / "specs" / "mamba2.mix"))
    sizes = bench.default_sizes(plan.spec)
    caps = {"recurrent": bench.RECURRENT_MAX_T, "parallel": bench.PARALLEL_MAX_T}
    sweep = [
        (f, t, b)
        for f in bench.FORMS
        for t in bench.FULL_T
        for b in (False, True)
        if t <= caps.get(f, t)
    ]
    bench._check_memory(plan, {}, sizes, sweep, bench.FULL_T, caps, 64, "cpu")
    assert bench._point_bytes(plan, sizes, "chunk", 16384, True, 64) < 2**31

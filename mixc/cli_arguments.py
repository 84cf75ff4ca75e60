"""The arguments of each `mixc` command (`build_parser`), and the types that check an option's
value as it is parsed, so that a malformed one is a usage error (exit 2) before anything runs.
What each command does is in `mixc.cli`."""

from __future__ import annotations

import argparse
import math
import os

from mixc.version import __version__

__all__ = ["build_parser"]


#: What ArgumentParser.add_subparsers returns: the object each command is added to.
_Subparsers = argparse._SubParsersAction


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `mixc` command line: each command's arguments come from its own
    `_add_<command>`."""
    parser = argparse.ArgumentParser(
        prog="mixc",
        description="Compile sequence-mixer specs into chunked-parallel and recurrent PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"mixc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_check(sub)
    _add_compile(sub)
    _add_explain(sub)
    _add_graph(sub)
    _add_fuzz(sub)
    _add_bench(sub)
    _add_synth(sub)
    return parser


def _add_check(sub: _Subparsers) -> None:
    """`mixc check SPEC...`: parse and verify, print the normal form."""
    p = sub.add_parser("check", help="parse and verify specs, print them in normal form")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (*.mix)")
    p.add_argument("-q", "--quiet", action="store_true", help="print errors only")


def _add_compile(sub: _Subparsers) -> None:
    """`mixc compile SPEC [-o FILE]`: the generated module."""
    p = sub.add_parser("compile", help="compile a spec to a standalone PyTorch module")
    p.add_argument("spec", metavar="SPEC", help="spec file (*.mix)")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write here (atomically); default: stdout"
    )
    p.add_argument(
        "--backend",
        default="pytorch",
        help="code generator: pytorch (default) or triton, whose modules need triton to run: "
        "pip install 'mixc[triton]'",
    )


def _add_explain(sub: _Subparsers) -> None:
    """`mixc explain SPEC [--json] [--sizes ...]`: the analysis report."""
    p = sub.add_parser(
        "explain",
        help="report each state's class and rule, gates, forms, algorithm and costs",
        description="Report what mixc derived from a spec: each state's transition class and the "
        "rule that fired, write and readout forms, log-gates, the algorithm and why, the parallel "
        "form as math, warnings, and per-token costs.",
    )
    p.add_argument("spec", nargs="?", metavar="SPEC", help="spec file (*.mix)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--json-schema", action="store_true", help="print the JSON schema of --json and exit"
    )
    p.add_argument(
        "--sizes",
        type=_sizes,
        metavar="K=64,V=64,T=4096,C=64",
        help="sizes that fill the cost formulas (C: chunk size, T: sequence length)",
    )
    p.add_argument(
        "--backend",
        default="pytorch",
        help="say which kernels the chunked forms run on this backend (default: pytorch)",
    )
    p.add_argument(
        "--program",
        action="store_true",
        help="print the lowered program instead: each form's kernel calls, as every backend "
        "renders them",
    )


def _add_graph(sub: _Subparsers) -> None:
    """`mixc graph SPEC -o FILE`: a picture of the dependency graph."""
    p = sub.add_parser("graph", help="draw the dependency graph of a spec (.png or .svg)")
    p.add_argument("spec", metavar="SPEC", help="spec file (*.mix)")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        type=_picture,
        metavar="FILE",
        help="picture to write (atomically); the suffix (.png or .svg) chooses the format",
    )


def _add_fuzz(sub: _Subparsers) -> None:
    """`mixc fuzz SPEC [--module FILE]`: every form against the float64 oracle."""
    p = sub.add_parser(
        "fuzz",
        help="check chunk, parallel, step and recurrent against the spec's float64 oracle",
        description="Draw random examples (hypothesis) and compare every form of the compiled "
        "module (or of --module FILE) with a float64 step-by-step interpreter of the spec: "
        "outputs, final states and gradients. Exit 0 with a summary, or 1 with the shrunk failing "
        "example and a reproducer. A progress bar goes to stderr when it is a terminal.",
    )
    p.add_argument("spec", metavar="SPEC", help="spec file (*.mix)")
    p.add_argument(
        "--module", metavar="FILE", help="fuzz this module file (same contract as a compiled one)"
    )
    p.add_argument(
        "--examples", type=_positive, default=25, metavar="N", help="examples to draw (default: 25)"
    )
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default: 0)")
    p.add_argument(
        "--dtype",
        choices=("float32", "float64", "bfloat16"),
        default="float32",
        help="precision under test. bfloat16 bounds: 4x the error of the oracle's result rounded "
        "to bfloat16 (never below float32's); for a module whose kernels round what they "
        "multiply to bfloat16 (its OPERANDS: a Triton module), the chunked forms' bounds rise "
        "to 4x what rounding those kernels' operands costs in float64, plus the float32 bound, "
        "never above 0.1 (MODEL_CAP)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the module runs")
    p.add_argument(
        "--backend",
        default="pytorch",
        help="code generator of the module under test: pytorch (default) or triton, which "
        "needs pip install 'mixc[triton]' (on CPU it runs in triton's interpreter)",
    )


def _add_bench(sub: _Subparsers) -> None:
    """`mixc bench SPEC`: timings over a sweep of T."""
    p = sub.add_parser(
        "bench",
        help="time chunk, recurrent and parallel over a sweep of T (table, --json, --plot)",
        description="Time the compiled forms of a spec over a sweep of sequence lengths: median "
        "and spread over repeats after warm-up, peak tensor memory per call, achieved GFLOP/s "
        "(from the analysis' cost model) next to this machine's fp32 matmul throughput at the "
        "shapes the chunked form multiplies. The recurrent and parallel forms stop at "
        "--recurrent-max-T and --parallel-max-T.",
    )
    p.add_argument("spec", metavar="SPEC", help="spec file (*.mix)")
    _add_bench_points(p)
    _add_bench_runs(p)
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="write time and memory versus T (the suffix chooses the format: .png, .svg, ...)",
    )


def _add_bench_points(p: argparse.ArgumentParser) -> None:
    """What `mixc bench` times: sizes, sequence lengths, chunk size, forms and passes."""
    p.add_argument(
        "--sizes",
        type=_sizes,
        metavar="B=1,NH=4,K=64,V=64",
        help="batch, heads and the spec's sizes (default: B=1, NH=4, every size 64)",
    )
    sweep = p.add_mutually_exclusive_group()
    sweep.add_argument(
        "--T",
        type=_int_list,
        metavar="512,1024,...",
        help="sequence lengths (default: 1024,4096; well under a minute on 2 CPU cores)",
    )
    sweep.add_argument("--quick", action="store_true", help="T = 512 only, 3 repeats")
    sweep.add_argument("--full", action="store_true", help="T = 512 to 16384, doubling")
    p.add_argument(
        "--chunk-size",
        type=_positive,
        metavar="C",
        help="chunk size (default: the module's CHUNK_SIZE, measured per class; see explain)",
    )
    p.add_argument(
        "--forms",
        type=_forms,
        default=["chunk", "recurrent", "parallel"],
        metavar="chunk,recurrent,parallel",
        help="forms to time (default: all the module has)",
    )
    p.add_argument("--backward", action="store_true", help="also time forward + backward")


def _add_bench_runs(p: argparse.ArgumentParser) -> None:
    """How `mixc bench` runs each point: repeats, threads, device, how far in T the forms that
    grow fastest go, and whether memory is measured."""
    p.add_argument(
        "--repeats",
        type=_positive,
        metavar="N",
        help="timed calls per point (default: 5, 3 with --quick); a point whose figures "
        "contradict themselves is measured again with 3x as many and marked if still suspect",
    )
    p.add_argument(
        "--threads", type=_positive, default=2, metavar="N", help="torch CPU threads (default: 2)"
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument(
        "--recurrent-max-T",
        type=_positive,
        default=4096,
        metavar="T",
        help="longest T for the recurrent form (default: 4096; it runs one Python step per token)",
    )
    p.add_argument(
        "--parallel-max-T",
        type=_positive,
        default=2048,
        metavar="T",
        help="longest T for the parallel form (default: 2048; it holds T x T matrices)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")


def _add_synth(sub: _Subparsers) -> None:
    """`mixc synth SPEC... --task mqar|parity|s3|s5`: train and compare on a synthetic task. The
    task's name is checked by `mixc.tools.tasks.make_task` (importing the tasks imports torch,
    which building the parser must not)."""
    p = sub.add_parser(
        "synth",
        help="train the same small model around each spec on a synthetic task (table, --json, --plot)",
        description="Train a small language model (LAYERS blocks of the spec's MixerLayer, each "
        "with an MLP, tied embeddings) around each spec, and a softmax-attention baseline, on "
        "the same batches of a synthetic task; score each on held-out examples. Tasks: mqar "
        "(multi-query associative recall, Zoology), parity (running parity), s3 and s5 "
        "(permutation word problems). Comma lists of --seq-len, --pairs and --hidden sweep.",
    )
    p.add_argument("specs", nargs="*", metavar="SPEC", help="spec files (*.mix)")
    _add_synth_task(p)
    _add_synth_training(p)
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default: 0)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu; e.g. cuda)")
    p.add_argument("--threads", type=_positive, metavar="N", help="torch CPU threads")
    p.add_argument("--no-baseline", action="store_true", help="skip the softmax-attention baseline")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="write accuracy per model (the suffix chooses the format: .png, .svg, ...)",
    )


def _add_synth_task(p: argparse.ArgumentParser) -> None:
    """The synthetic task `mixc synth` trains on, and its sizes."""
    p.add_argument("--task", default="mqar", help="mqar, parity, s3 or s5 (default: mqar)")
    p.add_argument(
        "--seq-len",
        type=_int_list,
        metavar="N[,N...]",
        help="sequence length (default: mqar 64, parity 64, s3/s5 32)",
    )
    p.add_argument(
        "--pairs", type=_int_list, metavar="N[,N...]", help="mqar: key-value pairs (default 8)"
    )
    p.add_argument("--vocab", type=_positive, metavar="N", help="mqar: vocabulary (default 64)")


def _add_synth_training(p: argparse.ArgumentParser) -> None:
    """The model `mixc synth` builds around each spec, how it is trained, and how it is scored."""
    p.add_argument(
        "--hidden",
        type=_int_list,
        default=[64],
        metavar="N[,N...]",
        help="model width (default 64)",
    )
    p.add_argument("--heads", type=_positive, default=4, metavar="N", help="heads (default 4)")
    p.add_argument("--layers", type=_positive, default=2, metavar="N", help="blocks (default 2)")
    p.add_argument(
        "--steps", type=_positive, default=300, metavar="N", help="AdamW steps (default 300)"
    )
    p.add_argument("--batch", type=_positive, default=32, metavar="N", help="batch (default 32)")
    p.add_argument(
        "--lr", type=_positive_float, default=3e-3, help="peak learning rate (default 3e-3)"
    )
    p.add_argument(
        "--eval-examples",
        type=_positive,
        default=256,
        metavar="N",
        help="held-out sequences scored (default 256)",
    )
    p.add_argument(
        "--eval-seq-len",
        type=_positive,
        metavar="N",
        help="also score the trained models on sequences N long (length generalisation)",
    )
    p.add_argument(
        "--chunk-size",
        type=_positive,
        default=16,
        metavar="C",
        help="chunk size of the chunked forms (default 16, the fastest at small head sizes)",
    )


# ----------------------------------------------------------------------------- option types


def _sizes(text: str) -> dict[str, int]:
    """--sizes K=64,V=64 -> {"K": 64, "V": 64}; argparse turns errors into exit 2. Which names
    a command accepts is its own check (explain also takes T and C, bench also B and NH)."""
    sizes: dict[str, int] = {}
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name.isidentifier():
            raise argparse.ArgumentTypeError(
                f"{item.strip()!r} is not NAME=NUMBER "
                "(expected comma-separated pairs, e.g. K=64,V=64)"
            )
        if not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(
                f"size {name} must be a positive integer, got {value!r}"
            )
        if name in sizes:
            raise argparse.ArgumentTypeError(f"size {name} is given twice")
        sizes[name] = int(value)
    return sizes


def _picture(text: str) -> str:
    from mixc.tools.graph import FORMATS

    suffix = os.path.splitext(text)[1].lower()
    if suffix not in FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text}: unknown picture format {suffix or '(no suffix)'}; use .png or .svg"
        )
    return text


def _int_list(text: str) -> list[int]:
    from mixc.tools.bench import parse_ints

    try:
        return parse_ints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (expected e.g. 512,1024,2048)") from None


def _forms(text: str) -> list[str]:
    forms = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in forms if f not in ("chunk", "recurrent", "parallel")]
    if unknown or not forms:
        raise argparse.ArgumentTypeError(
            f"unknown form {', '.join(unknown) or '(none)'}; choose from chunk, recurrent, parallel"
        )
    return forms


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    """A finite number above 0 (a learning rate): nan, inf, 0 and negatives are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text}")
    return value

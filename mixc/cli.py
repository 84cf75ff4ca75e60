"""The `mixc` command line: what each command does. Spec errors print as located messages (no
traceback) and exit 1; usage errors exit 2 (each command's arguments are in
`mixc.cli_arguments`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from mixc.cli_arguments import build_parser
from mixc.errors import MixcError, SpecError
from mixc.frontend.spec import load_spec, read_source, spec_errors

#: Each command's function by its name; `mixc.cli_arguments` gives each its arguments.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    COMMANDS[fn.__name__.removeprefix("cmd_")] = fn
    return fn


@command
def cmd_check(args: argparse.Namespace) -> int:
    """Parse, verify and analyse specs, as compile does; print each in normal form."""
    status = 0
    for path in args.specs:
        plan, errors = _checked(path)
        if errors:
            print("\n\n".join(map(str, errors)), file=sys.stderr)
            if len(errors) > 1:
                print(f"{path}: {len(errors)} errors", file=sys.stderr)
            status = 1
        elif not args.quiet:
            print(f"# {path}: ok")
            for note in _form_notes(plan):
                print(f"# {note}")
            print(plan.spec.mixer, end="")
    return status


def _form_notes(plan) -> list[str]:
    """What `check` says of the forms, as `explain` does, where a decay's sign is not proven:
    the chunked forms missing, or checking the decay at run time."""
    chunk = plan.forms.chunk
    if chunk is not None and chunk.kind == "sign":
        forms = ", ".join(plan.forms.names())
        return [f"forms: {forms}; no chunk or parallel: {chunk.text}"]
    if plan.sign_checks:
        signs = "; ".join(c.describe() for c in plan.sign_checks)
        chunked = [f for f in plan.forms.names() if f in ("chunk", "parallel")]
        return [
            f"{' and '.join(chunked)} check{'s' if len(chunked) == 1 else ''} at run time that {signs} has no negative entry "
            "(they take the log of the decay)"
        ]
    return []


def _checked(path: str):
    """The plan of the spec at `path` after every check `compile` makes (`mixc.driver.plan`),
    or what is wrong with it: where the front end finds several independent errors, all of them, the one
    `compile` reports first."""
    from mixc.driver import plan

    try:
        source = read_source(path)
    except MixcError as exc:  # no such file, not UTF-8 text, too long
        return None, [exc]
    try:
        return plan(source), []
    except SpecError as exc:
        return None, spec_errors(source) or [exc]
    except MixcError as exc:
        return None, [exc]


@command
def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a spec to a standalone PyTorch module."""
    from mixc.driver import compile_source, write_atomically

    text = compile_source(args.spec, backend=args.backend)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        write_atomically(args.output, text, keep=[args.spec])
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


@command
def cmd_explain(args: argparse.Namespace) -> int:
    """Report what the analysis found: classes, rules, gates, forms, algorithm, costs."""
    from mixc import driver
    from mixc.analysis.cost import costs
    from mixc.tools.explain import explain
    from mixc.tools.render import render
    from mixc.tools.report import Explanation

    if args.json_schema:
        print(json.dumps(Explanation.model_json_schema(), indent=2))
        return 0
    if args.spec is None:
        print("mixc explain: error: the following arguments are required: SPEC", file=sys.stderr)
        return 2
    plan = driver.plan(args.spec, args.backend)
    if args.program:
        from mixc.lowering import dump, lower

        print(dump(lower(plan)))
        return 0
    spec = plan.spec
    sizes = args.sizes or {}
    known = set(costs(plan).symbols)
    unknown = sorted(set(sizes) - known)
    if unknown:
        print(
            f"mixc explain: error: --sizes: unknown size {', '.join(unknown)} "
            f"(sizes of {spec.mixer.name}: {', '.join(sorted(known)) or 'none'})",
            file=sys.stderr,
        )
        return 2
    report = explain(spec, sizes, plan, args.backend)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        render(report)
    return 0


@command
def cmd_graph(args: argparse.Namespace) -> int:
    """Draw the dependency graph of a spec."""
    from mixc.analysis.plan import analyze
    from mixc.tools.graph import write_graph

    plan = analyze(load_spec(args.spec))
    write_graph(plan, args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


@command
def cmd_fuzz(args: argparse.Namespace) -> int:
    """Fuzz every form of a module against the spec's float64 oracle (exit 1 on a disagreement)."""
    from mixc.check.command import run_command

    return run_command(
        args.spec,
        args.module,
        examples=args.examples,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        backend=args.backend,
    )


@command
def cmd_bench(args: argparse.Namespace) -> int:
    """Time the compiled forms over a sweep of T: table, and optionally JSON and a plot."""
    from mixc.driver import output_file
    from mixc.tools import bench, bench_report

    _check_machine(args.device, args.threads)
    for path in (args.json, args.plot):  # refuse a file mixc will not write before the sweep
        if path is not None:
            output_file(path, keep=[args.spec])
    if args.plot:
        bench_report.matplotlib_figure()  # fail before the sweep, not after, without matplotlib
    sweep = bench.QUICK_T if args.quick else bench.FULL_T if args.full else bench.DEFAULT_T
    result = bench.run(
        args.spec,
        sizes=args.sizes,
        T=args.T or sweep,
        chunk_size=args.chunk_size,
        forms=args.forms,
        backward=args.backward,
        repeats=args.repeats or (3 if args.quick else 5),
        threads=args.threads,
        device=args.device,
        recurrent_max_T=args.recurrent_max_T,
        parallel_max_T=args.parallel_max_T,
        memory=not args.no_memory,
        progress=sys.stderr.isatty(),
    )
    bench_report.render(result)
    if args.json:
        bench_report.write_json(result, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        bench_report.plot([result], args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


@command
def cmd_synth(args: argparse.Namespace) -> int:
    """Train the same small model around each spec (and attention) on a synthetic task."""
    from mixc.driver import output_file
    from mixc.tools import synth
    from mixc.tools.tasks import make_task

    _check_machine(args.device, args.threads)
    for path in (args.json, args.plot):  # refuse a file mixc will not write before training
        if path is not None:
            output_file(path, keep=args.specs)
    if args.plot:
        from mixc.tools.bench_report import matplotlib_figure

        matplotlib_figure()  # fail before training, not after, without matplotlib
    settings = synth.Settings(
        task=args.task,
        seq_len=tuple(args.seq_len or [None]),
        pairs=tuple(args.pairs or [None]),
        vocab=args.vocab,
        hidden=tuple(args.hidden),
        heads=args.heads,
        layers=args.layers,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        eval_examples=args.eval_examples,
        eval_seq_len=args.eval_seq_len,
        chunk_size=args.chunk_size,
        seed=args.seed,
        device=args.device,
        baseline=not args.no_baseline,
    )
    for seq_len in settings.seq_len:  # a bad option is refused before any training
        for pairs in settings.pairs:
            make_task(args.task, seq_len, pairs, args.vocab)
            if args.eval_seq_len is not None:
                make_task(args.task, args.eval_seq_len, pairs, args.vocab)
    for path in args.specs:
        load_spec(path)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    models = (
        (len(args.specs) + settings.baseline)
        * len(settings.seq_len)
        * len(settings.pairs)
        * len(settings.hidden)
    )
    update, bar = synth.progress_printer(models, args.steps)
    with bar:
        results = synth.run(args.specs, settings, progress=update)
    synth.render(results, settings)
    if args.json:
        synth.write_json(results, settings, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        synth.plot(results, settings, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _check_machine(device: str, threads: int | None) -> None:
    """--device names a device torch can allocate on here, and --threads at most this machine's
    CPU threads: checked before any spec is compiled or tensor allocated."""
    import torch

    try:
        where = torch.device(device)
    except (RuntimeError, ValueError):
        raise MixcError(
            f"--device: {device!r} is not a torch device (cpu, cuda, cuda:1, ...)"
        ) from None
    if where.type == "meta":
        raise MixcError("--device: meta holds no values to run; give cpu or an accelerator")
    try:
        torch.empty(0, device=where)
    except (RuntimeError, AssertionError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or ["unavailable"])[0]
        raise MixcError(f"--device: {device} is not usable on this machine ({reason})") from None
    cpus = os.cpu_count() or 1
    if threads is not None and threads > cpus:
        raise MixcError(f"--threads: {threads} is more than this machine's {cpus} CPU threads")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except MixcError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0

"""The `mixc` command line. Spec errors print as located messages (no traceback) and exit 1;
usage errors exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from . import __version__
from ._frontend import load_spec
from .errors import MixcError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    COMMANDS[fn.__name__.removeprefix("cmd_")] = fn
    return fn


@command
def cmd_check(args: argparse.Namespace) -> int:
    """Parse and verify specs; print each in normal form."""
    status = 0
    for path in args.specs:
        try:
            spec = load_spec(path)
        except MixcError as exc:
            print(exc, file=sys.stderr)
            status = 1
            continue
        if not args.quiet:
            print(f"# {path}: ok")
            print(spec.mixer, end="")
    return status


@command
def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a spec to a standalone PyTorch module."""
    from ._compile import compile_source, write_atomically

    text = compile_source(args.spec, backend=args.backend)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        write_atomically(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mixc",
        description="Compile sequence-mixer specs into chunked-parallel and recurrent PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"mixc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("check", help="parse and verify specs, print them in normal form")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (*.mix)")
    p.add_argument("-q", "--quiet", action="store_true", help="print errors only")

    p = sub.add_parser("compile", help="compile a spec to a standalone PyTorch module")
    p.add_argument("spec", metavar="SPEC", help="spec file (*.mix)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (atomically); default: stdout")
    p.add_argument("--backend", default="pytorch", help="code generator (default: pytorch)")
    return parser


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

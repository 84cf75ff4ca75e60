"""The pure-PyTorch chunked kernels, and the part of them that a generated module copies.

common.py holds what the kernels of several transition classes share; each class file named in
CLASS_FILES holds its class's public kernels and their private helpers, importing only torch and
common. A generated module imports only torch, so it carries the source text of its kernels and
of every definition they reach: kernel_source computes that set from the names each definition
uses, so no list of dependencies is kept by hand. KERNELS names the public kernels. A new class
plugs in by writing its file: every module here but the shared ones (SHARED_FILES) and
functions is a class file.
"""

import ast
from collections.abc import Iterable
from pathlib import Path

_HERE = Path(__file__).parent

#: The files every class shares: common, tokens (a token's moves, for reads before the
#: update), then operators (how a kernel is called) and rotations (a rotation's operator).
SHARED_FILES = ("common", "tokens", "operators", "rotations")

#: The class files: every module of this package but the shared ones, in name order.
CLASS_FILES = tuple(
    sorted(
        p.stem for p in _HERE.glob("*.py") if p.stem not in ("__init__", "functions", *SHARED_FILES)
    )
)


def _free_names(node: ast.FunctionDef | ast.ClassDef) -> frozenset[str]:
    """The names a top-level definition reads and binds nowhere in its body (nested functions
    included): the globals it uses. Attribute access needs no entry, since only the object it
    starts from can be a global."""
    loaded, bound = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loaded if isinstance(sub.ctx, ast.Load) else bound).add(sub.id)
        elif isinstance(sub, ast.arg):
            bound.add(sub.arg)
        elif isinstance(sub, ast.FunctionDef | ast.ClassDef) and sub is not node:
            bound.add(sub.name)
    return frozenset(loaded - bound)


def definitions(
    files: Iterable[str], directory: Path = _HERE
) -> dict[str, tuple[str, str, frozenset[str]]]:
    """Every top-level function and class of the files (in `directory`) by name, with its file,
    its source text (decorators included) and the names it uses, in the order of the files and,
    inside each, of its source (a dict keeps it). The files are read as text: nothing is
    imported, so compiling a spec needs no torch."""
    found: dict[str, tuple[str, str, frozenset[str]]] = {}
    for file in files:
        text = (directory / f"{file}.py").read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.parse(text).body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                continue
            if node.name in found:
                # a generated module would keep only the later of the two copies
                raise RuntimeError(f"{node.name} is defined in {found[node.name][0]} and {file}")
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            source = "\n".join(lines[first - 1 : node.end_lineno])
            found[node.name] = (file, source, _free_names(node))
    return found


DEFINITIONS = definitions((*SHARED_FILES, "functions", *CLASS_FILES))

KERNELS: dict[str, str] = {
    name: file
    for name, (file, _, _) in DEFINITIONS.items()
    if file not in (*SHARED_FILES, "functions") and not name.startswith("_")
}
"""The public kernels, each with the class file that defines it, in the order of CLASS_FILES."""


def taking(definitions, *arguments: str) -> frozenset[str]:
    """The public kernels among `definitions` that take every one of `arguments`, read from
    their text."""
    found = set()
    for name, (_, source, _) in definitions.items():
        node = ast.parse(source).body[0]
        if name.startswith("_") or not isinstance(node, ast.FunctionDef):
            continue
        if set(arguments) <= {a.arg for a in node.args.args + node.args.kwonlyargs}:
            found.add(name)
    return frozenset(found)


def ordered(definitions=DEFINITIONS) -> frozenset[str]:
    """The public kernels among `definitions` that take `reverse=` (the state runs backward in
    time) and `strict=` (the output reads the state before the token's update): a module runs
    a backward state or a read before the update through them as they are, and moves the
    tokens of every other kernel's inputs and outputs instead."""
    return taking(definitions, "reverse", "strict")


def decayed(definitions=DEFINITIONS) -> frozenset[str]:
    """The public kernels among `definitions` that take `decayed=` with `strict=`: the output
    reads the state after the token's decay and before its write (a folded write's readout,
    mixc.analysis.folds)."""
    return taking(definitions, "strict", "decayed")


def diagonal(definitions=DEFINITIONS) -> frozenset[str]:
    """The public kernels among `definitions` that take `diagonal=` with `decayed=`: they also
    return q_t . k_t, which a folded write's correction reads, where they can (else None)."""
    return taking(definitions, "strict", "decayed", "diagonal")


#: The kernels that run a backward state and a read before the update themselves (ordered).
ORDERED = ordered()
#: The kernels that read the state between the token's decay and its write (decayed).
DECAYED = decayed()
#: The kernels that also return q_t . k_t (diagonal).
DIAGONAL = diagonal()


#: The kernels that take a rotated query or key as a _Turned (common.py), turned as each span
#: is split into chunks: those that hand q and k to the spans unread (the others read them
#: whole first, as tensors).
TURNED = frozenset(
    {"chunk_scalar_decay", "chunk_scalar_decay_rank", "chunk_diagonal", "chunk_delta"}
)


def reached(names: Iterable[str], definitions=DEFINITIONS) -> set[str]:
    """The named definitions and every definition they use, directly or through others."""
    wanted = list(names)
    unknown = sorted(set(wanted) - definitions.keys())
    if unknown:
        raise ValueError(
            f"no kernel or kernel helper named {', '.join(unknown)}; "
            f"the kernels are {', '.join(KERNELS)}"
        )
    needed: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name not in needed:
            needed.add(name)
            wanted.extend(n for n in definitions[name][2] if n in definitions)
    return needed


def kernel_source(names: Iterable[str], definitions=DEFINITIONS) -> str:
    """The source text a generated module needs to call the named kernels (helpers may be named
    too): their definitions and every definition they reach, each once, in a fixed order (common
    first, then the class files in the order of CLASS_FILES, each in its source order), separated
    by two blank lines.

    The same names, in any order, give the same text. Raises ValueError for a name that is
    neither a kernel nor a helper. Another backend passes its own `definitions` (these, with
    its kernels in place of some).
    """
    needed = reached(names, definitions)
    return "\n\n\n".join(
        source.rstrip() for name, (_, source, _) in definitions.items() if name in needed
    )

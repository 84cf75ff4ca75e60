"""Each kernel call's inputs released as soon as nothing reads them: a `del` after the last
statement that does. A generated function binds its kernels' inputs (a value of the sequence's
size, the turn of a rotated key, the angle sums it is made from) to locals, which would
otherwise hold their memory until the function returns, through the kernel call and the
output's epilogue. On CPU the memory a function holds at its peak is memory the C allocator
hands back to the system and takes again on the next call, a page fault a page (Mamba-3's
chunk forward: about 1.4 ms of 33 at T = 4096, 1 thread). Only what feeds a kernel call (its
arguments, what they are computed from, and the names bound with them) is released, and only
a name bound once, by a statement of the function's body, last read by such a statement."""

from __future__ import annotations

import io
import keyword
import tokenize
from dataclasses import dataclass, field

__all__ = ["release_kernel_inputs"]


@dataclass
class _Statement:
    first: int  # the function's line index of its first and last lines
    last: int
    top: bool  # a simple statement of the function's body (not nested, not a header)
    targets: list[str] = field(default_factory=list)
    reads: set[str] = field(default_factory=set)


def release_kernel_inputs(lines: list[str], start: int, first: int, kernels: list[str]) -> None:
    """Insert, into `lines[start:]` (one function, its body indented once), a `del` after the
    last statement that reads each released name (see the module's docstring): names bound
    from `lines[first]` on (the kernel calls' own locals, not the arguments as prepared);
    `kernels` are the called functions (`chunk_scalar_decay`) whose arguments are released."""
    statements = _statements(lines[start:])
    bound: dict[str, list[_Statement]] = {}
    for s in statements:
        for t in s.targets:
            bound.setdefault(t, []).append(s)
    once = {
        n: b[0]
        for n, b in bound.items()
        if len(b) == 1 and b[0].top and n.startswith("_") and b[0].first >= first - start
    }
    feeds = [s for s in statements if s.top and s.reads & {f"_{k}" for k in kernels}]
    chosen: set[str] = set()
    todo = [n for s in feeds for n in s.reads if n in once]
    while todo:  # the kernels' inputs, what they are computed from, and what is bound with them
        name = todo.pop()
        if name in chosen:
            continue
        chosen.add(name)
        todo += [n for n in (*once[name].reads, *once[name].targets) if n in once]
    # at each kernel call: before it, what was last read before it; after it, what it reads last
    at: dict[int, list[str]] = {}
    done: set[str] = set()
    for call in feeds:
        for name in sorted(chosen - done):
            readers = [s for s in statements if name in s.reads] or [once[name]]
            last = max(readers, key=lambda s: s.last)
            if last is call or (last.top and last.last < call.first):
                at.setdefault(call.last + 1 if last is call else call.first, []).append(name)
                done.add(name)
    for row in sorted(at, reverse=True):
        lines.insert(start + row, f"    del {', '.join(sorted(at[row]))}")


def _statements(lines: list[str]) -> list[_Statement]:
    """The logical statements of a function's lines, with the names each binds (simple
    assignments at its top level) and reads (no attribute, keyword argument nor comment)."""
    found: list[_Statement] = []
    tokens = list(tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline))
    current: list[tokenize.TokenInfo] = []
    for tok in tokens:
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if current:
                found.append(_statement(current))
            current = []
        elif tok.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            current.append(tok)
    return found


def _statement(tokens: list[tokenize.TokenInfo]) -> _Statement:
    head = tokens[0]
    simple = head.start[1] == 4 and head.string not in _COMPOUND
    s = _Statement(head.start[0] - 1, tokens[-1].end[0] - 1, simple)
    depths, depth, assigned = [], 0, None
    for i, tok in enumerate(tokens):
        depth -= tok.type == tokenize.OP and tok.string in ")]}"
        depths.append(depth)
        depth += tok.type == tokenize.OP and tok.string in "([{"
        if tok.type == tokenize.OP and tok.string == "=" and depth == 0:
            assigned = i
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.NAME or keyword.iskeyword(tok.string):
            continue
        before = tokens[i - 1].string if i else ""
        following = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if before == "." or (following == "=" and depths[i] > 0):
            continue  # an attribute, a keyword argument
        if assigned is not None and i < assigned:
            s.targets.append(tok.string)
        else:
            s.reads.add(tok.string)
    return s


#: Statements whose lines are followed by a block (what the block reads is read later), or
#: after which nothing runs.
_COMPOUND = ("if", "for", "while", "with", "def", "try", "else", "elif", "return", "raise")

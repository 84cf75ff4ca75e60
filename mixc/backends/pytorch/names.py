"""The private names of generated code, and small pieces of its text.

A generated function takes the spec's names as its arguments and locals, so every name it
makes up starts with an underscore, which no spec name can: `local` names what a local holds of
a spec name (`_prev_x`, `_k_H`), `fresh` names a repeated subexpression after what the spec
calls it (`_kk_kappa`) apart from every other private name of the module.
"""

from __future__ import annotations

import re

from mixc.backends.pytorch.lines import Lines, comment, string
from mixc.backends.pytorch.pyexpr import constant
from mixc.frontend.builtins import ROTATIONS
from mixc.frontend.ir import Binary, Call, Expr, Neg
from mixc.frontend.names import called

#: Assignments the renderer writes in every function, dropped where the function never reads them.
_OPTIONAL = re.compile(r"^\s+(_device|_batch|_out_dtype) = ")
_READ = {name: re.compile(rf"\b{name}\b") for name in ("_device", "_batch", "_out_dtype")}

#: What an operation's local is called when it repeats (see `local_base`).
_OPERATIONS = {
    "*": "product",
    "@": "product",
    ".": "dot",
    "/": "ratio",
    "+": "sum",
    "-": "difference",
    "^": "power",
}


def without_unread(lines: list[str]) -> list[str]:
    """`lines` without optional assignments (`_OPTIONAL`) their function never reads again."""
    text = "\n".join(lines)
    starts, at = [], 0  # where each line starts in `text`
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    starts.append(at)
    out: list[str] = []
    end = len(lines)  # the line that ends the function of the lines below it
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        found = _OPTIONAL.match(line)
        read = found and _READ[found.group(1)].search(text, starts[i + 1], starts[end] - 1)
        if not found or read:  # an optional assignment is kept where the function reads it
            out.append(line)
        if line.startswith("def "):
            end = i
    return out[::-1]


def tuple_text(items: list[str], one: bool = False) -> str:
    """`a`, or `(a, b)`, or with `one` a tuple even of one item, `(a,)`."""
    if len(items) == 1:
        return f"({items[0]},)" if one else items[0]
    return f"({', '.join(items)})"


def tuple_line(
    out: Lines, head: str, items: list[str], tail: str, indent: int, one: bool = False
) -> None:
    """`head + tuple + tail` for the tuple of `items` (see `tuple_text`): on one line where it
    fits, else one item a line."""
    text = tuple_text(items, one)
    if len(head + text + tail) + 4 * indent <= 100:
        out(head + text + tail, indent)
        return
    out(head + "(", indent)
    for item in items:
        out(item + ",", indent + 1)
    out(")" + tail, indent)


def local(role: str, name: str) -> str:
    """The local that holds what `role` says of spec name `name`: `_prev_x` (input x at t-1),
    `_last_x` (its last token, carried to the next call), a group's kernel arguments (`_k_H`,
    `_v_H`, `_S0_H`, `_beta_H`, `_k1_H` for its first sub-token). Every such name starts with
    an underscore, which no spec name can. The role is written without its underscores
    (`g_scale` as `gscale`), so it ends at the second underscore and two locals are the same
    only for the same role and name (`_g_scale_H` would be g_scale of H and g of scale_H)."""
    return f"_{role.replace('_', '')}_{name}"


def local_base(e: Expr, spec_names: dict[Expr, str]) -> str:
    """What the local of a common subexpression is named after: the spec's name for it, else
    its function or operation followed by its operands' names (`sigmoid_alpha`,
    `product_beta_k`, `scaled_beta` for 2 * beta) or, for a function of one computation, that
    computation's name (`exp_logsigmoid_f`)."""
    if e in spec_names:
        return spec_names[e]
    if isinstance(e, Call) and e.func in ROTATIONS:  # its vector turned: the helper's name aside
        return called("turned", e.args)
    if isinstance(e, Call):
        if len(e.args) == 1 and isinstance(e.args[0], Call):
            inner = f"{e.func}_{local_base(e.args[0], spec_names)}"
            return inner if len(inner) <= 24 else e.func
        return called(e.func, e.args)
    if isinstance(e, Binary):
        scaled = e.op in "*@" and sum(constant(x) is not None for x in (e.left, e.right)) == 1
        return called("scaled" if scaled else _OPERATIONS[e.op], (e.left, e.right))
    return called("negated" if isinstance(e, Neg) else "transposed", (e.operand,))


def fresh(base: str, taken: set[str]) -> str:
    """`_base`, or `_base2`, `_base3`, ... : the first not in `taken` (which it joins). It
    starts with an underscore, so it is no spec name."""
    name, n = f"_{base}", 2
    while name in taken:
        name, n = f"_{base}{n}", n + 1
    taken.add(name)
    return name


def size(symbol: str) -> str:
    """A size in generated code: a number as written, a symbol read from `_sizes`."""
    return symbol if symbol.isdigit() else f"_sizes[{string(symbol)}]"


def note(what: object) -> str:
    """A trailing comment saying what a line computes (a spec expression, shown as written)."""
    return "  " + comment(str(what))

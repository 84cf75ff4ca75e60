"""The reproducer of a fuzzing failure: a short script that rebuilds the failing example.

The script draws the example's tensors from its seed with the same torch expressions the fuzzer
evaluated (`mixc.check.sampling.draws`), calls the failing form of the module, compares it with
the float64 oracle by the fuzzer's rule, and exits 1 when a quantity is out of bounds. It needs
only torch and mixc. The spec's names are only keys of its dicts (`drawn["input", "B"]`), never
its variables, so an input named like one of them (Mamba-2's B, the batch size) changes none.
"""

from __future__ import annotations

from mixc.backends.pytorch.lines import comment, string
from mixc.check.forms import Failure
from mixc.check.ranges import InputRanges
from mixc.check.sampling import draws

__all__ = ["reproducer"]

_KINDS = ("input", "param", "default", "state", "cotangent")


def reproducer(
    r: InputRanges,
    failure: Failure,
    spec_path: str | None,
    module_path: str | None,
    backend: str = "pytorch",
) -> str:
    """A short script that rebuilds the failing example's tensors from its seed with torch,
    calls the failing form of the module, compares it with the float64 oracle, and exits 1 when
    a quantity is out of bounds."""
    dtype = str(failure.dtype).removeprefix("torch.")
    wide = "float64" if dtype == "float64" else "float32"  # parameters and states
    lines = [
        *_preamble(r, failure, spec_path, module_path, backend),
        "drawn = {}  # by (role, name)",
    ]
    kinds = {kind: [] for kind in _KINDS}
    for d in draws(r, failure.example):
        lines.append(f"{_drawn(d.kind, d.name)} = {d.code}")
        kinds[d.kind].append(d.name)
    lines += _call_lines(r, failure, kinds, dtype, wide)
    lines += _compare_lines(r, failure, kinds, dtype)
    return "\n".join(lines) + "\n"


def _drawn(kind: str, name: str) -> str:
    """Where the script keeps the drawn tensor of `name` in role `kind`."""
    return f"drawn[{string(kind)}, {string(name)}]"


def _preamble(
    r: InputRanges, failure: Failure, spec_path: str | None, module_path: str | None, backend: str
) -> list[str]:
    """Imports, the spec and module, the generator and the sizes."""
    ex = failure.example
    spec_arg = string(spec_path) if spec_path else f"text={string(r.spec.source.text)}"
    chosen = "" if backend == "pytorch" else f", backend={string(backend)}"
    load = f"load_module({string(module_path)})" if module_path else f"mixc.load(spec{chosen})"
    lines = [
        comment(f"mixc fuzz reproducer: {failure.summary()}"),
        "import torch",
        "import torch.nn.functional as F",
        "",
        "import mixc",
        "from mixc.check.fuzz import Result, compare, load_module, reference",
        "",
        f"spec = mixc.load_spec({spec_arg})",
        f"module = {load}",
        f"gen = torch.Generator().manual_seed({ex.seed})",
        f"B, T, NH = {ex.batch}, {ex.T}, {ex.heads}",
    ]
    if ex.sizes:  # the draws write them as numbers: a size may be named like a name above
        lines.append(comment("sizes: " + ", ".join(f"{k} = {v}" for k, v in ex.sizes)))
    return lines


def _call_lines(
    r: InputRanges, failure: Failure, kinds: dict[str, list[str]], dtype: str, wide: str
) -> list[str]:
    """The rounded leaves, and the call of the failing form with them."""

    def cast(kind: str, to: str) -> list[str]:
        return [f"{string(n)}: {_drawn(kind, n)}.to(torch.{to})" for n in kinds[kind]]

    entries = [*cast("input", dtype), *cast("param", wide), *cast("default", wide)]
    entries += cast("state", wide)
    lines = [
        "",
        f"# inputs rounded to {dtype}, parameters and states to {wide}: "
        "the oracle sees the same values",
        "x = {" + ", ".join(entries) + "}",
        "x = {n: t.requires_grad_(True) for n, t in x.items()}",
    ]
    args = ", ".join(f"x[{n!r}]" for n in (*r.inputs, *r.params))
    kwargs = "".join(f", {n}=x[{n!r}]" for n in kinds["default"])
    init = "None"
    if kinds["state"]:
        init = (
            f"x[{r.states[0]!r}]"
            if len(r.states) == 1
            else "(" + ", ".join(f"x[{n!r}]" for n in r.states) + ")"
        )
    if failure.form == "step":
        step_args = ", ".join(
            [f"x[{n!r}][:, t]" for n in r.inputs] + [f"x[{n!r}]" for n in r.params]
        )
        return [
            *lines,
            f"ys, state = [], {init}",
            "for t in range(T):",
            f"    y_t, state = module.step({step_args}{kwargs}, state=state)",
            "    ys.append(y_t)",
            "y, final = torch.stack(ys, 1), state",
        ]
    if failure.form == "parallel":
        return [*lines, f"y, final = module.parallel({args}{kwargs})"]
    if failure.form == "packed":  # the batch's sequences packed one after another
        rows = ", ".join(
            [f"x[{n!r}].reshape(1, B * T, *x[{n!r}].shape[2:])" for n in r.inputs]
            + [f"x[{n!r}]" for n in r.params]
        )
        return [
            *lines,
            "cu_seqlens = torch.arange(0, B * T + 1, T)",
            f"y, final = module.chunk({rows}{kwargs}, initial_state={init}, "
            f"output_final_state=True, chunk_size={failure.chunk_size}, cu_seqlens=cu_seqlens)",
            "y = y.reshape(B, T, *y.shape[2:])",
        ]
    cs = f", chunk_size={failure.chunk_size}" if failure.form == "chunk" else ""
    return [
        *lines,
        f"y, final = module.{failure.form}({args}{kwargs}, initial_state={init}, "
        f"output_final_state=True{cs})",
    ]


def _compare_lines(
    r: InputRanges, failure: Failure, kinds: dict[str, list[str]], dtype: str
) -> list[str]:
    """The loss and its gradients, the oracle on the same values, and the comparison."""

    def pick(names: list[str]) -> str:
        return "{" + ", ".join(f"{n!r}: d[{n!r}]" for n in names) + "}"

    parallel = failure.form == "parallel"
    cots = (
        "{}"
        if parallel
        else "{"
        + ", ".join(f"{n!r}: {_drawn('cotangent', n)}.to(torch.{dtype}).double()" for n in r.states)
        + "}"
    )
    params = kinds["param"] + kinds["default"]
    return [
        f"final = dict(zip({r.states!r}, final if isinstance(final, tuple) else (final,))) "
        "if final is not None else {}",
        f"cot_y, cots = {_drawn('cotangent', r.output)}.to(torch.{dtype}).double(), {cots}",
        "loss = (y.double() * cot_y).sum() + "
        "sum((final[n].double() * c).sum() for n, c in cots.items())",
        "grads = dict(zip(x, torch.autograd.grad(loss, list(x.values()), allow_unused=True)))",
        "",
        "d = {n: t.detach().double() for n, t in x.items()}",
        f"ref = reference(spec, {pick(kinds['input'])}, {pick(params)}, "
        f"{pick(kinds['state'] if not parallel else [])}, cot_y, cots)",
        *(["ref.finals.clear()  # the quadratic form keeps no state"] if parallel else []),
        "got = Result(y.detach(), {n: s.detach() for n, s in final.items()}, grads)",
        f"errors = compare(got, ref, torch.{dtype})",
        "for what, (err, bound) in errors.items():",
        '    print(f"{what}: relative error {err:.2e} (bound {bound:.1e})'
        "{'  FAILS' if err > bound else ''}\")",
        "raise SystemExit(any(err > bound for err, bound in errors.values()))",
    ]

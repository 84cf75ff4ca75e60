"""A spec's names never meet the generated module's own. The spec's names are the arguments and
locals of the mixer's functions; those functions read every global by a name that starts with an
underscore, which no spec name can. So a spec whose inputs, parameters, states, sizes, values
and output are named like the module's kernels, helpers, constants, imports and the built-ins
it calls compiles, and every form agrees with the float64 oracle."""

from __future__ import annotations

import ast
import re
import symtable
from pathlib import Path

import pytest
import torch

import mixc
from mixc.frontend.verify import RESERVED
from tests.backends.test_compile import (
    _assert_close,
    _chunk,
    _oracle,
    _recurrent,
    _run,
    _step_loop,
)
from tests.mixers import VARIANTS

ROOT = Path(__file__).parents[2]
SHIPPED = sorted(ROOT.glob("specs/*.mix"))
NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*")  # the grammar's NAME


def _mixer_functions(text: str) -> list[symtable.SymbolTable]:
    """The symbol tables of the functions in the mixer's section of a generated module."""
    start = text.split("\n").index(next(ln for ln in text.split("\n") if "---- this mixer" in ln))
    table = symtable.symtable(text, "<module>", "exec")
    functions = [t for t in table.get_children() if t.get_type() == "function"]
    return [t for t in functions if t.get_lineno() > start]


def _globals_read(table: symtable.SymbolTable) -> set[str]:
    """The globals a function reads, in its own body or in a scope nested in it."""
    found = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    for child in table.get_children():
        found |= _globals_read(child)
    return found


def _top_level(text: str) -> list[str]:
    """The names a module binds at its top level (defs, classes, assignments, imports), one entry
    per binding; what `try` binds twice on purpose (MixcError) is left out."""
    names = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                names += [e.id for e in elts]
        elif isinstance(node, ast.Import):
            names += [a.asname or a.name.split(".")[0] for a in node.names]
    return names


def _compiled(spec) -> str:
    return mixc.compile_source(spec if isinstance(spec, Path) else mixc.Source(spec))


@pytest.mark.parametrize(
    "spec", [*SHIPPED, *VARIANTS.values()], ids=[p.stem for p in SHIPPED] + list(VARIANTS)
)
def test_the_mixer_functions_read_globals_only_by_private_names(spec):
    text = _compiled(spec)
    bound = _top_level(text)
    assert len(bound) == len(set(bound)), "a top-level name is bound twice"
    for function in _mixer_functions(text):
        read = _globals_read(function)
        public = sorted(n for n in read if not n.startswith("_"))
        assert not public, f"{function.get_name()} reads {public}, which a spec name could shadow"
        assert read <= set(bound) | {"MixcError"}, function.get_name()


def _own_names() -> list[str]:
    """The names a spec may declare among those a generated module binds or reads at its top
    level (its kernels, helpers, constants, imports and the built-ins it aliases), over the
    shipped specs (so every kernel), and what it read them by before (F, math, the parameter
    `sequence` of _prepare) and other built-ins."""
    names = {"F", "math", "sequence", "self", "cls", "len", "sum", "type", "match", "print"}
    for path in SHIPPED:
        for statement in ast.parse(_compiled(path)).body:
            if isinstance(statement, ast.FunctionDef | ast.ClassDef):
                names.add(statement.name)
                continue
            for node in ast.walk(statement):
                if isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.alias):
                    names.add(node.asname or node.name.split(".")[0])
                elif isinstance(node, ast.ClassDef):
                    names.add(node.name)
    return sorted(n for n in names if NAME.fullmatch(n) and n not in RESERVED)


OWN = _own_names()

#: One spec per chunked kernel and one recurrent only, each with two states (in one group or
#: two), parameters with and without a default, a skip, a per-token value and a let function;
#: a name in angle brackets is a slot, filled from OWN. Each stays stable for inputs drawn from
#: N(0, 1) and states from U(0, 0.5) (a normaliser's denominator stays above 0).
TEMPLATES = {
    "scalar": """mixer scalar
in    <q>[<K>], <k>[<K>], <v>[<V>], <a>
param <gamma> = 1 - 2^(-2 - h), <D>, <E>
state <H>[<V>, <K>], <z>[<K>]
let   <phi>(x) = elu(x) + 1
<d>_t = sigmoid(<a>_t) <gamma>
<H>_t = <d>_t <H>_{t-1} + <v>_t <phi>(<k>_t)^T
<z>_t = <d>_t <z>_{t-1} + <phi>(<k>_t)
<y>_t = <H>_t <phi>(<q>_t) / (<z>_t . <phi>(<q>_t)) + <D> <E> <v>_t
""",
    "diagonal": """mixer diagonal
in    <q>[<K>], <k>[<K>], <v>[<V>], <g>[<K>]
param <P>, <Q> = 0.5, <R>
state <H>[<V>, <K>], <S>[<V>, <K>]
<H>_t = <H>_{t-1} diag(sigmoid(<g>_t)) + <P> <v>_t <k>_t^T
<S>_t = <Q> <S>_{t-1} + <v>_t <k>_t^T
<y>_t = <H>_t <q>_t + <S>_t <q>_t + <R> <v>_t
""",
    "delta": """mixer delta
in    <q>[<K>], <k>[<K>], <v>[<V>], <b>, <g>
param <A>, <C>, <W> = 2
state <H>[<V>, <K>], <S>[<V>, <K>]
<H>_t = sigmoid(<g>_t) <H>_{t-1} (I - sigmoid(<b>_t) l2norm(<k>_t) l2norm(<k>_t)^T) \\
      + sigmoid(<b>_t) <v>_t l2norm(<k>_t)^T
<S>_t = <S>_{t-1} + <C> <v>_t <k>_t^T / <W>
<y>_t = <H>_t <q>_t + <S>_t <q>_t + <A> <v>_t
""",
    "recurrent": """mixer recurrent_only
in    <q>[<K>], <k>[<K>], <v>[<V>], <G>[<V>, <K>]
param <P>, <Q>, <R> = 0.25
state <H>[<V>, <K>], <S>[<V>, <K>]
<H>_t = sigmoid(<G>_t) * <H>_{t-1} + <v>_t <k>_t^T
<S>_t = <R> tanh(<S>_{t-1}) + <P> <v>_t <k>_t^T
<y>_t = <H>_t <q>_t + <Q> <S>_t <q>_t
""",
}
ROLES = {  # the role of each slot: every name of OWN fills each of these roles somewhere
    **{s: "input" for s in ("q", "k", "v", "a", "g", "b", "G")},
    **{s: "param" for s in ("gamma", "D", "E", "P", "Q", "R", "A", "C", "W")},
    **{s: "state" for s in ("H", "z", "S")},
    **{s: "size" for s in ("K", "V")},
}


def _hostile_specs() -> list[tuple[str, str]]:
    """Specs from TEMPLATES, filled until every name of OWN has been an input, a parameter, a
    state and a size (and the other slots take what is left): (id, spec text)."""
    needed = {(n, role) for n in OWN for role in set(ROLES.values())}
    specs = []
    while needed:
        for kind, template in TEMPLATES.items():
            slots = list(dict.fromkeys(re.findall(r"<(\w+)>", template)))
            used: dict[str, str] = {}
            for slot in slots:
                role = ROLES.get(slot)
                free = [n for n in OWN if n not in used.values()]
                name = next((n for n in free if (n, role) in needed), free[len(specs) % len(free)])
                used[slot] = name
                needed.discard((name, role))
            text = template
            for slot, name in used.items():
                text = text.replace(f"<{slot}>", name)
            specs.append((f"{kind}{len(specs)}", text))
    return specs


HOSTILE = _hostile_specs()


def test_the_own_names_cover_kernels_constants_imports_and_builtins():
    kernels = {"chunk_scalar_decay", "parallel_scalar_decay", "chunk_diagonal", "chunk_delta"}
    assert kernels | {"torch", "F", "INPUTS", "STATES", "SPEC", "step", "range"} <= set(OWN)


@pytest.mark.parametrize("text", [t for _, t in HOSTILE], ids=[i for i, _ in HOSTILE])
def test_specs_named_like_the_generated_code_agree_with_the_oracle(text):
    spec = mixc.load_spec(text=text)
    module = mixc.load(spec)
    assert set(module.FORMS) >= {"recurrent", "step"} or not spec.mixer.causal
    assert ("chunk" in module.FORMS) is not text.startswith("mixer recurrent_only")
    gen = torch.Generator().manual_seed(len(text))
    sizes = dict(zip(dict.fromkeys(s for d in spec.mixer.inputs for s in d.shape), (3, 4)))

    def draw(lead, decl, low=None):
        shape = (*lead, *(sizes[s] for s in decl.shape))
        if low is None:
            return torch.randn(*shape, dtype=torch.float64, generator=gen)
        return low + (1 - low) * torch.rand(*shape, dtype=torch.float64, generator=gen)

    B, T, NH = 2, 7, 2
    inputs = {d.name: draw((B, T, NH), d) for d in spec.mixer.inputs}
    params = {p.name: draw((NH,), p, 0.5) for p in spec.mixer.params if p.default is None}
    states = {s.name: 0.5 * draw((B, NH), s, 0.0) for s in spec.mixer.states}
    y = _oracle(spec, inputs, params, states, None, {})[0]
    cot_y = torch.randn(*y.shape, dtype=torch.float64, generator=gen)
    cot_s = {n: torch.randn(*x.shape, generator=gen, dtype=x.dtype) for n, x in states.items()}
    ref = _oracle(spec, inputs, params, states, cot_y, cot_s)
    forms = {"recurrent": _recurrent(module)}
    if "step" in module.FORMS:  # a non-causal mixer has none
        forms["step"] = _step_loop(module)
    if "chunk" in module.FORMS:
        forms |= {f"chunk{cs}": _chunk(module, cs) for cs in (2, 4)}
    for name, form in forms.items():
        got = _run(form, spec, inputs, params, states, cot_y, cot_s, torch.float64)
        _assert_close(got, ref, name, 1e-9)
    if "parallel" in module.FORMS:
        no_cot = {n: torch.zeros_like(c) for n, c in cot_s.items()}
        ref = _oracle(spec, inputs, params, {}, cot_y, no_cot)
        got = _run(
            lambda a, i: module.parallel(*a), spec, inputs, params, {}, cot_y, {}, torch.float64
        )
        _assert_close(got, (ref[0], {}, ref[2]), "parallel", 1e-9)
    test_the_mixer_functions_read_globals_only_by_private_names(text)


@pytest.mark.parametrize("size", ["torch", "gen", "F", "spec", "module", "drawn", "x", "lambda"])
def test_the_sampler_draws_for_sizes_named_like_its_own_names(size):
    from mixc.check import sample_inputs

    spec = mixc.load_spec(
        text=f"mixer m\nin q[{size}], k[{size}], v[V]\nstate H[V, {size}]\n"
        "H_t = H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"
    )
    draws = sample_inputs(spec, {size: 3, "V": 4}, 5)
    assert draws[0].shape[-1] == 3  # q [B, T, NH, size]

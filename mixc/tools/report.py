"""The report `mixc explain` gives, as a pydantic model: stable snake_case field names, printed
by `--json` (and its schema by `--json-schema`), filled in by `mixc.tools.explain` and printed
for people by `mixc.tools.render`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SCHEMA_VERSION",
    "ChunkSizeInfo",
    "CostInfo",
    "Explanation",
    "FormCostInfo",
    "FormInfo",
    "GateInfo",
    "GroupCostInfo",
    "GroupInfo",
    "InputInfo",
    "Location",
    "OutputInfo",
    "ParamInfo",
    "Quantity",
    "ReadoutInfo",
    "StateInfo",
    "TotalCostInfo",
    "ValueInfo",
    "WarningInfo",
    "WriteInfo",
]

#: Bumped when a field is renamed or removed or changes meaning (adding a field does not).
SCHEMA_VERSION = 3  # 2: `order` lists the equations only; `forms` added. 3: `chunk_size`, `backend`


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Location(_Model):
    """Where something is in the spec (1-based, inclusive)."""

    line: int = Field(description="Line of the first character.")
    column: int = Field(description="Column of the first character.")
    end_line: int = Field(description="Line of the last character.")
    end_column: int = Field(description="Column of the last character.")


class InputInfo(_Model):
    name: str = Field(description="Name as declared in `in`.")
    shape: list[str] = Field(description="Declared sizes; empty for a scalar.")
    kind: Literal["scalar", "vector", "matrix"] = Field(
        description="Scalar, vector or matrix per token."
    )
    layout: str = Field(
        description="The tensor a compiled module takes: B batch, T tokens, NH heads."
    )
    roles: list[str] = Field(
        description="What the analysis uses it for (query of H, key of H, ...)."
    )


class ParamInfo(_Model):
    name: str = Field(description="Name as declared in `param`.")
    shape: list[str] = Field(description="Declared sizes per head; empty for a scalar.")
    default: str | None = Field(
        description="Default as spec text (h is the head index), or null: the caller supplies it."
    )
    layout: str = Field(description="The tensor a compiled module takes: NH heads.")


class ValueInfo(_Model):
    name: str = Field(
        description="A derived per-token value (an equation that is not a state update)."
    )
    shape: list[str] = Field(
        description="Its sizes: [] for a scalar, [K] for a vector, [V, K] for a matrix."
    )
    expr: str = Field(description="Its definition as spec text.")
    is_output: bool = Field(description="True when no other equation reads it (it is returned).")


class GateInfo(_Model):
    side: Literal["scalar", "key", "value", "full"] = Field(
        description="What the decay scales: the whole state, its key (column) side, its value "
        "(row) side, or each entry on its own (a full elementwise gate)."
    )
    decay: str = Field(description="The decay as written in the spec.")
    log: str = Field(
        description="Its logarithm in a numerically safe form (logsigmoid(a), dt A, log(gamma)): "
        "the per-token log-gate g_t."
    )
    proven: bool = Field(description="True when the decay is provably in (0, 1].")
    note: str = Field(description="Why it is, or is not, proven in (0, 1].")
    location: Location | None = Field(description="Where the decay is written.")


class WriteInfo(_Model):
    value: str | None = Field(
        description="The value vector v_t (null for a vector state: a column of ones)."
    )
    key: str = Field(description="The key vector k_t.")
    scale: str | None = Field(description="Scalar scale of the outer product, or null.")


class StateInfo(_Model):
    name: str = Field(description="State name.")
    shape: list[str] = Field(
        description="Declared sizes ([V, K] for a matrix state, [K] for a vector)."
    )
    update: str = Field(description="The update equation as spec text.")
    affine: bool = Field(
        description="True when the update is affine in the state's previous value (S_t = "
        "G_t(S_{t-1}) + W_t)."
    )
    transition_class: str = Field(
        description="Transition class of G_t (a variant of a class in mixc.transitions)."
    )
    rule: str = Field(
        description="Name of the rule of the rule table that fired (first match wins)."
    )
    rule_description: str = Field(description="What that rule matched.")
    chunkable: bool = Field(description="True when this state has a chunked parallel form.")
    reason: str | None = Field(description="Why it has none (NYI or not affine), or null.")
    gates: list[GateInfo] = Field(description="The decays of G_t with their safe logs.")
    beta: str | None = Field(description="Delta rule: beta of I - beta k k^T.")
    erase_key: str | None = Field(description="Delta rule: k of I - beta k k^T.")
    stability: str | None = Field(
        description="Delta rule: whether |k| = 1 and beta in [0, 2] are proven."
    )
    write_form: str = Field(description="Form of the write term W_t.")
    write_rank: int = Field(description="Number of rank-1 outer products in the write.")
    writes: list[WriteInfo] = Field(description="The rank-1 writes scale * value key^T.")
    transposed: str | None = Field(
        None,
        description="For a transition acting on the value side (from the left): how its chunked "
        "form runs on the state's transpose, and which kernel runs it; the writes are then as "
        "that kernel takes them (value and key swapped). None otherwise.",
    )
    backward: bool = Field(
        default=False,
        description="True when the state is updated from the next token (G_t = ... G_{t+1}): "
        "it runs backward in time from an initial state after the sequence's end, and the "
        "mixer is non-causal.",
    )


class ReadoutInfo(_Model):
    index: int = Field(description="Readout number: _r<index> in the output expression.")
    state: str = Field(description="The state read.")
    query: str = Field(description="The query vector (readout = state_t query).")
    expr: str = Field(
        description="The readout as spec text (H_t q_t, or z_t . q_t for a vector state)."
    )


class OutputInfo(_Model):
    name: str = Field(description="Output name.")
    shape: list[str] = Field(
        description="Its sizes: [] for a scalar, [K] for a vector, [V, K] for a matrix."
    )
    equation: str = Field(description="The output equation as spec text.")
    form: str = Field(
        description="linear | linear + skip | ratio | function of readouts | no state."
    )
    expr: str = Field(description="The output with each readout replaced by _r<index>.")
    readouts: list[ReadoutInfo] = Field(description="Linear reads of states.")
    skip: str | None = Field(description="For linear + skip: the term that does not touch a state.")


class GroupInfo(_Model):
    states: list[str] = Field(
        description="States that share one chunked pass (same transition and key; values "
        "concatenated)."
    )
    transition_class: str = Field(description="Their transition class.")
    algorithm: str = Field(description="The algorithm of this class (docs/algorithms.md).")
    legend: str = Field(
        description="How the matrices of the parallel form map to the spec's names."
    )
    parallel_form: list[str] = Field(
        description="The chunked form as math, one formula a line (S = H^T, tokens are rows)."
    )
    quadratic_form: str | None = Field(
        description="The whole-sequence (quadratic, attention-like) form, when the class has one."
    )


class FormInfo(_Model):
    name: Literal["chunk", "parallel", "summary", "recurrent", "step"] = Field(
        description="A function of the compiled module."
    )
    available: bool = Field(description="True when the compiled module computes it.")
    reason: str | None = Field(description="Why it is missing (null when available).")
    checks: str | None = Field(
        default=None,
        description="What it checks of its arguments' values at run time beyond their shapes "
        "(a decay passed in whose sign is not proven: no negative entry); null when nothing.",
    )


class ChunkSizeInfo(_Model):
    size: int = Field(description="The compiled chunk()'s default chunk_size.")
    why: str = Field(description="Why: what it was measured on, or that it was not.")


class WarningInfo(_Model):
    message: str = Field(description="What is probably wrong.")
    hint: str | None = Field(description="How to fix it.")
    location: Location | None = Field(description="Where.")
    rendered: str = Field(
        description="The warning as mixc prints it: file:line:col, the line and a caret."
    )


class Quantity(_Model):
    formula: str = Field(
        description="Per token and head, in the size symbols (C: chunk size, T: sequence length)."
    )
    value: float | None = Field(
        description="The number for the given sizes, or null if a size is missing."
    )


class FormCostInfo(_Model):
    flops: Quantity = Field(
        description="Floating-point operations per token and head (a multiply-add is 2)."
    )
    bytes: Quantity = Field(
        description="Bytes moved per token and head (inputs/outputs 2 bytes, states and "
        "intermediates fp32)."
    )


class GroupCostInfo(_Model):
    states: list[str] = Field(description="The states of this group.")
    transition_class: str = Field(description="Their transition class.")
    recurrent: FormCostInfo = Field(description="Token by token.")
    chunked: FormCostInfo | None = Field(
        description="Chunked with chunk size C; null when there is no chunked form."
    )
    quadratic: FormCostInfo | None = Field(
        description="Whole-sequence masked form; null when there is none."
    )
    note: str = Field(description="What the formulas assume for this class.")


class TotalCostInfo(_Model):
    recurrent: FormCostInfo = Field(
        description="All groups, token by token, plus input/output bytes."
    )
    chunked: FormCostInfo | None = Field(
        description="All groups chunked, plus input/output bytes; null if some group has no "
        "chunked form."
    )
    quadratic: FormCostInfo | None = Field(
        description="All groups in the quadratic form; null if some group has none."
    )


class CostInfo(_Model):
    sizes: dict[str, int] = Field(description="The sizes given (--sizes).")
    symbols: list[str] = Field(description="Every size symbol the formulas use.")
    missing: list[str] = Field(
        description="Symbols without a size: formulas using them have no value."
    )
    chunk_symbol: str = Field(description="The chunk-size symbol.")
    sequence_symbol: str = Field(description="The sequence-length symbol.")
    io_bytes: Quantity = Field(description="Bytes of per-token inputs read and outputs written.")
    groups: list[GroupCostInfo] = Field(description="Cost of each group of states.")
    total: TotalCostInfo = Field(description="Cost of the whole mixer.")
    conventions: str = Field(description="How FLOPs and bytes are counted.")


class Explanation(_Model):
    """Everything `mixc explain` reports about one spec."""

    schema_version: Literal[3] = Field(SCHEMA_VERSION, description="Version of this schema.")
    mixer: str = Field(description="Mixer name.")
    description: str | None = Field(description="The mixer's description string.")
    source: str = Field(description="Where the spec came from (a path, or <string>).")
    inputs: list[InputInfo] = Field(description="Per-token inputs.")
    params: list[ParamInfo] = Field(description="Per-head parameters.")
    values: list[ValueInfo] = Field(description="Derived per-token values, outputs included.")
    states: list[StateInfo] = Field(description="Each state: class, rule, gates, write.")
    outputs: list[OutputInfo] = Field(description="Each output: readout form.")
    order: list[str] = Field(description="Evaluation order within one time step.")
    groups: list[GroupInfo] = Field(
        description="States that share one chunked pass, with the derived parallel form."
    )
    chunkable: bool = Field(description="True when the whole mixer has a chunked parallel form.")
    forms: list[FormInfo] = Field(
        description="The compiled module's forms (chunk, parallel, summary, recurrent, step): "
        "which compute, and why the others do not."
    )
    algorithm: str = Field(description="The algorithm chosen.")
    why: list[str] = Field(description="Why that algorithm: one line per state.")
    chunk_size: ChunkSizeInfo | None = Field(
        description="The default chunk size of chunk() (null without a chunked form)."
    )
    not_supported: list[str] = Field(
        description="What has no chunked form, and why (NYI or not affine)."
    )
    parallel_form: list[str] = Field(
        description="The derived parallel form of the whole mixer, as math."
    )
    warnings: list[WarningInfo] = Field(
        description="Located warnings (unproven decays, unread states)."
    )
    costs: CostInfo = Field(
        description="Cost per token and head of the recurrent, chunked and quadratic forms."
    )
    backend: str = Field("pytorch", description="The backend the report is for.")
    backend_notes: list[str] = Field(
        default_factory=list,
        description="Which kernel each group runs on that backend, and why where it falls back "
        "(empty for the PyTorch backend, whose kernels are all PyTorch).",
    )

"""The docstrings of a generated module's forms: every argument with its shape and dtype rule,
and what the form returns, as the documentation of a public op gives them.

Shapes are written with the spec's size symbols and the axes every form adds: B (batch), T
(tokens; not in `step`), NH (heads). Text from the spec (names, a default's expression) is
escaped by `doc_line`, so it cannot end the docstring.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from mixc.backends.pytorch.lines import doc_line
from mixc.frontend.ir import Decl, Mixer
from mixc.frontend.shapes import SCALAR, Shape

#: The text width of a docstring's lines (a form's body is indented by four spaces).
_WIDTH = 92

#: What each form is, on the docstring's first line.
_TITLES = {
    "chunk": "Chunked parallel form, for training and prefill.",
    "parallel": "Quadratic masked form (attention-like), from a zero state, for short sequences.",
    "recurrent": "Token-by-token form.",
    "step": "One token, for decoding: the inputs have no T axis.",
    "summary": "The action of the sequence on each state, for context parallelism.",
}

_DTYPES = (
    "Every input shares one floating dtype; float64 computes in float64, the others "
    "(float32, bfloat16, float16) in float32. An input may also have one head, or NH / g "
    "heads shared by groups of g consecutive heads."
)

_SUMMARY = (
    "(P, F), one of each per state, such that the final state is `initial @ P + F` for every "
    "initial state (P: [B, NH, K, K] for a state [B, NH, V, K]; F: the final state from a zero "
    "initial state). Summaries compose associatively: (P1, F1) then (P2, F2) is (P1 @ P2, "
    'F1 @ P2 + F2). A state whose SUMMARY_ACTIONS entry is "elementwise" is acted on entry '
    "by entry: P has its shape, the final state is P * initial + F, and (P1, F1) then (P2, F2) "
    "is (P1 * P2, F1 * P2 + F2)."
)
_LEFT = (
    ' A state whose entry is "left" is acted on from the left: P is [B, NH, V, V], the final '
    "state is P @ initial + F, and (P1, F1) then (P2, F2) is (P2 @ P1, P2 @ F1 + F2)."
)


def _shape(lead: Sequence[str], dims: Sequence[str]) -> str:
    return "[" + ", ".join((*lead, *dims)) + "]"


def _output_dims(shape: Shape) -> tuple[str, ...]:
    """The output's own axes: none for a scalar, one for a column vector, else both."""
    if shape == SCALAR:
        return ()
    return (shape[0],) if shape[1] == "1" else tuple(shape)


def _item(name: str, text: str) -> list[str]:
    """`name: text`, wrapped under the Args or Returns heading."""
    line = f"    {name}: {text}"
    if len(line) <= _WIDTH and line.isprintable() and not line.endswith(" "):
        return [line]  # what textwrap gives a line that fits, 10x faster (a spec of 9000 inputs)
    return textwrap.wrap(
        f"{name}: {text}", _WIDTH, initial_indent="    ", subsequent_indent="        "
    )


class FormDocs:
    """The docstrings of one mixer's forms; `lines(form)` gives one form's, without quotes."""

    def __init__(
        self,
        mixer: Mixer,
        output_shape: Shape,
        pipeline: bool = False,
        left: bool = False,
        wide=frozenset(),
    ) -> None:
        self.mixer = mixer
        self.wide = wide  # the states kept in float64 whatever the compute dtype
        self.pipeline = pipeline  # a later state's summary reads earlier states' values
        self.left = left  # a state's summary acts from the left
        self.output = mixer.outputs[0].target
        self.output_dims = _output_dims(output_shape)

    def _states(self, lead: Sequence[str], carried: Sequence[Decl] | None = None) -> str:
        """The states as a form takes and returns them: one tensor, or a tuple in order."""
        carried = self.mixer.carried if carried is None else carried
        shapes = [
            f"{d.name} {_shape(lead, d.shape)}{' float64' if d.name in self.wide else ''}"
            for d in carried
        ]
        return shapes[0] if len(shapes) == 1 else "a tuple (" + ", ".join(shapes) + ")"

    def _inputs(self, lead: Sequence[str]) -> list[str]:
        lines = []
        for i, d in enumerate(self.mixer.inputs):
            lines += _item(d.name, _shape(lead, d.shape) + (f". {_DTYPES}" if i == 0 else ""))
        for p in self.mixer.params:
            text = _shape(("NH",), p.shape) + (", or a number" if not p.shape else "")
            if p.default is not None:
                text += f"; None (the default) is {p.default}, h the head index"
            lines += _item(p.name, text + "; any floating dtype up to the compute precision")
        return lines

    def lines(self, form: str) -> list[str]:
        """The docstring of `form` ("chunk", "parallel", "recurrent", "step", "summary"), each
        line escaped for a string literal."""
        return [doc_line(line) for line in self._lines(form)]

    def _lines(self, form: str) -> list[str]:
        sequence = form != "step"
        lead = ("B", "T", "NH") if sequence else ("B", "NH")
        state_lead = ("B", "NH")
        states = self._states(state_lead) if self.mixer.carried else "()"
        out = [_TITLES[form], "", "Args:", *self._inputs(lead)]
        if form in ("chunk", "recurrent"):
            out += _item(
                "initial_state",
                f"{states} in the compute dtype (float32, float64 for float64 inputs), or "
                "None for zeros; with cu_seqlens, one per sequence (N in place of B)",
            )
            out += _item("output_final_state", "True to return the final state")
        if form == "step":
            out += _item("state", f"{states} (what the last step returned), or None for zeros")
        if form == "summary" and self.pipeline:
            out += _item(
                "initial_state",
                f"{states}, or None for zeros: a state whose update reads other states' "
                "readouts acts on itself given theirs, so its (P, F) is for the states it reads "
                "starting from these (its own entry is not read)",
            )
        if form in ("chunk", "summary"):
            out += _item("chunk_size", "tokens per chunk (default: CHUNK_SIZE)")
        if form in ("chunk", "recurrent"):
            out += _item(
                "cu_seqlens",
                "None, or the integer offsets [0, end_1, ..., T] of N sequences packed along T "
                "(B = 1), each run from its own initial state",
            )
        out += ["", "Returns:"]
        if form == "summary":
            return out + _item("(P, F)", _SUMMARY + (_LEFT if self.left else ""))
        y = f"{_shape(lead, self.output_dims)} in the inputs' dtype"
        if form == "parallel":
            return out + _item(f"({self.output}, None)", y)
        if form == "step":
            return out + _item(f"({self.output}, new state)", f"{y}; the states as `state`")
        final = (
            f"{states} in the compute dtype (N of each with cu_seqlens) if output_final_state, "
            "else None"
        )
        return out + _item(f"({self.output}, final state)", f"{y}; {final}")

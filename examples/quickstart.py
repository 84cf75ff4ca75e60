"""Run a module written by `mixc compile`: chunked, recurrent and step forms agree.

mixc compile specs/deltanet.mix -o deltanet.py
python examples/quickstart.py deltanet.py

The inputs are drawn by `mixc.check.sample_inputs` from the ranges the fuzzer derives from the
spec (decays in (0, 1], a delta-rule key of norm <= 1, ...), so every spec gets inputs it is
meant to handle.
"""

import importlib.util
import sys

import torch

import mixc
from mixc.check import sample_inputs


def load(path):
    spec = importlib.util.spec_from_file_location("compiled_mixer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shapes(state) -> str:
    """The shape of a final state, or of each one when there are several."""
    if torch.is_tensor(state):
        return str(tuple(state.shape))
    return str([tuple(s.shape) for s in state])


def main(path: str) -> None:
    m = load(path)
    B, T, NH = 2, 300, 4
    declared = (*m.INPUTS, *m.PARAMS, *m.STATES)  # (name, sizes) of every argument
    sizes = {d: 64 for _, dims in declared for d in dims if not d.isdigit()}
    # per-token inputs [B, T, NH, d] or [B, T, NH], then per-head parameters [NH, d] or [NH]
    args = sample_inputs(mixc.load_spec(text=m.SPEC), sizes, T, batch=B, heads=NH, seed=0)

    y, state = m.recurrent(*args, output_final_state=True)
    print(f"{m.NAME}: output {tuple(y.shape)}, state {shapes(state)}")
    if "chunk" in m.FORMS:
        y_chunk, _ = m.chunk(*args, output_final_state=True, chunk_size=64)
        err = (y_chunk - y).norm() / y.norm()
        print(f"chunk vs recurrent: relative error {err:.1e}")
    if "step" not in m.FORMS:  # a non-causal mixer: an output reads the tokens after it
        print("no step form (the mixer is non-causal): nothing to decode")
        return
    # prefill 200 tokens with the chunked form, then decode the rest one token at a time
    prefill = m.chunk if "chunk" in m.FORMS else m.recurrent
    split = 200
    head = [a[:, :split] if i < len(m.INPUTS) else a for i, a in enumerate(args)]
    _, state = prefill(*head, output_final_state=True)
    ys = []
    for t in range(split, T):
        y_t, state = m.step(
            *[a[:, t] if i < len(m.INPUTS) else a for i, a in enumerate(args)], state=state
        )
        ys.append(y_t)
    err = (torch.stack(ys, 1) - y[:, split:]).norm() / y[:, split:].norm()
    print(f"prefill {split} + step {T - split} vs recurrent: relative error {err:.1e}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "deltanet.py")

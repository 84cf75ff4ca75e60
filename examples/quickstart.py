"""Run a module written by `mixc compile`: chunked, recurrent and step forms agree.

mixc compile specs/deltanet.mix -o deltanet.py
python examples/quickstart.py deltanet.py
"""

import importlib.util
import sys

import torch
import torch.nn.functional as F


def load(path):
    spec = importlib.util.spec_from_file_location("compiled_mixer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(path: str) -> None:
    m = load(path)
    torch.manual_seed(0)
    B, T, NH, sizes = 2, 300, 4, {"K": 64, "V": 64, "P": 64, "N": 64}
    args = []
    for name, dims in m.INPUTS:  # per-token inputs [B, T, NH, d] or [B, T, NH]
        x = torch.randn(B, T, NH, *[sizes.get(d, 16) for d in dims])
        if dims and name in ("k", "B"):
            x = F.normalize(x, dim=-1)  # unit keys keep the delta rule stable
        if not dims:
            x = torch.sigmoid(x)  # per-token scalars (beta, gates) in (0, 1)
        args.append(x)
    args += [-torch.rand(NH) for _ in m.PARAMS]  # per-head parameters [NH]

    y, state = m.recurrent(*args, output_final_state=True)
    print(
        f"{m.NAME}: output {tuple(y.shape)}, state {tuple(state.shape) if torch.is_tensor(state) else [tuple(s.shape) for s in state]}"
    )
    if hasattr(m, "chunk"):
        y_chunk, _ = m.chunk(*args, output_final_state=True, chunk_size=64)
        err = (y_chunk - y).norm() / y.norm()
        print(f"chunk vs recurrent: relative error {err:.1e}")
    # prefill 200 tokens with the chunked form, then decode the rest one token at a time
    prefill = getattr(m, "chunk", m.recurrent)
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

"""Context parallelism: one sequence split along T across the processes of a group.

    torchrun --standalone --nproc-per-node 2 examples/context_parallel.py specs/gated_deltanet.mix

Every rank draws the same whole sequence (same seed), keeps its own slice of it, and runs the
wrapped mixer on that slice; each then checks its outputs, and the final state of the whole
sequence, against the recurrent form run over everything in one process. gloo runs it on CPU.
"""

import sys

import torch.distributed as dist

import mixc
from mixc.check import sample_inputs
from mixc.distributed import context_parallel


def main(path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = mixc.load_spec(path)
    module = mixc.load(spec)
    T = 256
    args = sample_inputs(spec, {"K": 32, "V": 32}, T, batch=2, heads=4, seed=0)
    n = len(module.INPUTS)  # per-token inputs first, then per-head parameters
    lo, hi = rank * T // world, (rank + 1) * T // world
    local = [a[:, lo:hi] if i < n else a for i, a in enumerate(args)]

    y, final = context_parallel(module)(*local, output_final_state=True)

    y_all, final_all = module.recurrent(*args, output_final_state=True)  # one process, all T
    err = (y - y_all[:, lo:hi]).norm() / y_all[:, lo:hi].norm()
    err_state = (final - final_all).norm() / final_all.norm()
    assert err < 1e-5 and err_state < 1e-5, (rank, err, err_state)
    if rank == world - 1:  # the last rank: its incoming state came through the exchange
        print(f"rank {rank} of {world}, tokens {lo}-{hi}: relative error {err:.1e}")
        print(f"final state of the whole sequence: relative error {err_state:.1e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "specs/gated_deltanet.mix")

"""Synthetic tasks for `mixc synth`: each draws batches of (inputs, targets) token sequences.

- `mqar`: multi-query associative recall (Zoology, Arora et al. 2023, arXiv 2312.04927): key-value
  pairs, then each key again somewhere later among noise tokens; the model must give the key's
  value at the query. Keys come from the lower half of the vocabulary, values from the upper
  half (chance is 1 / (vocab / 2)); only the queries are scored.
- `parity`: running parity of a bit string: the target at every position is the XOR of the bits
  so far (a two-state automaton that needs a decay or an eigenvalue of -1 to track).
- `s3`, `s5`: word problems of the permutation groups S3 and S5 (state tracking, as in Grazzi
  et al. 2024, arXiv 2411.12537, and DeltaProduct): the tokens are permutations, the target at
  every position is the product of the permutations so far. S5 is not solvable, so no fixed
  number of layers of a diagonal recurrence tracks it at any length.

Targets are -100 where a position is not scored (torch's `ignore_index`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from mixc.errors import MixcError

__all__ = ["IGNORE", "MQAR", "TASKS", "Parity", "Permutations", "make_task"]

IGNORE = -100


@dataclass(frozen=True)
class MQAR:
    """`pairs` key-value pairs, then the `pairs` keys again at random places of the rest of the
    `seq_len` tokens (the other places hold random tokens)."""

    seq_len: int = 128
    pairs: int = 32
    vocab: int = 128
    name: str = "mqar"

    def __post_init__(self) -> None:
        if 3 * self.pairs > self.seq_len:
            raise MixcError(
                f"mqar: {self.pairs} pairs need a sequence of at least {3 * self.pairs} tokens "
                f"(2 per pair, then 1 per query); --seq-len is {self.seq_len}"
            )
        if self.vocab // 2 - 1 < self.pairs:
            raise MixcError(
                f"mqar: {self.pairs} distinct keys need a vocabulary of at least "
                f"{2 * self.pairs + 2}; --vocab is {self.vocab}"
            )

    @property
    def vocab_size(self) -> int:
        return self.vocab

    @property
    def chance(self) -> float:
        return 1 / (self.vocab - self.vocab // 2)

    def describe(self) -> str:
        return f"mqar (seq_len {self.seq_len}, pairs {self.pairs}, vocab {self.vocab})"

    def batch(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        P, L, half = self.pairs, self.seq_len, self.vocab // 2
        keys = torch.rand(n, half - 1, generator=gen).argsort(-1)[:, :P] + 1  # distinct, >= 1
        values = torch.randint(half, self.vocab, (n, P), generator=gen)
        inputs = torch.randint(0, self.vocab, (n, L), generator=gen)  # noise between queries
        targets = torch.full((n, L), IGNORE)
        inputs[:, 0 : 2 * P : 2], inputs[:, 1 : 2 * P : 2] = keys, values
        order = torch.rand(n, P, generator=gen).argsort(-1)  # which key each query asks
        where = torch.rand(n, L - 2 * P, generator=gen).argsort(-1)[:, :P] + 2 * P
        rows = torch.arange(n)[:, None]
        inputs[rows, where] = keys.gather(1, order)
        targets[rows, where] = values.gather(1, order)
        return inputs, targets


@dataclass(frozen=True)
class Parity:
    """Random bits; the target at each position is the parity of the bits up to it."""

    seq_len: int = 64
    name: str = "parity"

    vocab_size = 2
    chance = 0.5

    def describe(self) -> str:
        return f"parity (seq_len {self.seq_len})"

    def batch(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        bits = torch.randint(0, 2, (n, self.seq_len), generator=gen)
        return bits, bits.cumsum(-1) % 2


class Permutations:
    """The word problem of S_n: random permutations; each target is the product so far."""

    def __init__(self, n: int, seq_len: int = 32) -> None:
        self.n, self.seq_len, self.name = n, seq_len, f"s{n}"
        elements = list(itertools.permutations(range(n)))
        index = {p: i for i, p in enumerate(elements)}
        # table[a, b] = the permutation b after a: (b . a)(i) = b[a[i]]
        self.table = torch.tensor(
            [[index[tuple(b[a[i]] for i in range(n))] for b in elements] for a in elements]
        )
        self.vocab_size = math.factorial(n)
        self.chance = 1 / self.vocab_size

    def describe(self) -> str:
        return f"{self.name} word problem (seq_len {self.seq_len})"

    def batch(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randint(0, self.vocab_size, (n, self.seq_len), generator=gen)
        targets = torch.empty_like(inputs)
        product = inputs[:, 0]
        targets[:, 0] = product
        for t in range(1, self.seq_len):
            product = self.table[product, inputs[:, t]]
            targets[:, t] = product
        return inputs, targets


#: The tasks by name, each made from the options that apply to it. The defaults are sized for
#: minutes per model on two CPU cores; Zoology's MQAR is usually run at seq_len 128 or more
#: with 16 to 64 pairs (`--seq-len 128 --pairs 32 --vocab 128`).
TASKS = {
    "mqar": lambda seq_len, pairs, vocab: MQAR(seq_len or 64, pairs or 8, vocab or 64),
    "parity": lambda seq_len, pairs, vocab: Parity(seq_len or 64),
    "s3": lambda seq_len, pairs, vocab: Permutations(3, seq_len or 32),
    "s5": lambda seq_len, pairs, vocab: Permutations(5, seq_len or 32),
}


def make_task(name: str, seq_len: int | None = None, pairs: int | None = None, vocab=None):
    """The task `name` with the options given (None: the task's default)."""
    if name not in TASKS:
        raise MixcError(f"task: unknown {name!r}; choose from {', '.join(TASKS)}")
    if name != "mqar" and (pairs is not None or vocab is not None):
        raise MixcError(f"task {name}: --pairs and --vocab apply to mqar only")
    return TASKS[name](seq_len, pairs, vocab)

"""Did-you-mean for a misspelt name, with bounded work.

`difflib.get_close_matches` compares a word with every candidate. A 64 KB spec may misspell
thousands of names among thousands of declared ones, and `check` reports every error: compared
each with each, that is quadratic (a minute for 3,900 names). `Suggestions` gives the answer
`get_close_matches(word, candidates, n=1)` gives, but compares a word only with candidates whose
length lets them match at all, at most `PER_WORD` characters of them (those nearest the word's
length first), and all the words of one spec with at most `PER_SPEC` characters of candidates.
Past these bounds, or for a word longer than `MAX_LENGTH` (nobody mistypes one that long), the
answer is no suggestion. A real spec's few dozen names stay far below every bound.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable

__all__ = ["MAX_LENGTH", "PER_SPEC", "PER_WORD", "Suggestions"]

#: The longest word a suggestion is looked for.
MAX_LENGTH = 100

#: Characters of candidates (word and candidate lengths summed, per comparison) one word is
#: compared with, and all the words of one spec.
PER_WORD = 20_000
PER_SPEC = 400_000

#: get_close_matches' default: candidates less similar than this are no suggestion.
CUTOFF = 0.6


class Suggestions:
    """The closest candidate for each word, from pools of candidates given by name; one object
    per spec, whose budget its words share."""

    def __init__(self, per_spec: int = PER_SPEC) -> None:
        self.left = per_spec
        self.pools: dict[str, dict[int, list[str]]] = {}  # pool -> length -> sorted names
        self.answers: dict[tuple[str, str], str | None] = {}

    def closest(self, word: str, pool: str, candidates: Callable[[], Iterable[str]]) -> str | None:
        """The candidate of `pool` closest to `word`, or None. `candidates()` gives the pool's
        names the first time it is asked for; a pool's names do not change afterwards."""
        key = (word, pool)
        if key not in self.answers:
            self.answers[key] = self._closest(word, pool, candidates)
        return self.answers[key]

    def _closest(self, word: str, pool: str, candidates) -> str | None:
        if not word or len(word) > MAX_LENGTH or self.left <= 0:
            return None
        if pool not in self.pools:
            by_length: dict[int, list[str]] = {}
            for name in sorted(set(candidates())):
                by_length.setdefault(len(name), []).append(name)
            self.pools[pool] = by_length
        by_length = self.pools[pool]
        n = len(word)
        # 2 * min(n, m) / (n + m) >= CUTOFF (difflib's real_quick_ratio) bounds the length m
        low, high = int(n * CUTOFF / (2 - CUTOFF)), int(n * (2 - CUTOFF) / CUTOFF) + 1
        chosen, budget = [], min(PER_WORD, self.left)
        for m in sorted(range(max(low, 1), high + 1), key=lambda m: (abs(m - n), m)):
            for name in by_length.get(m, ()):
                if budget < n + m:
                    break
                chosen.append(name)
                budget -= n + m
        self.left -= min(PER_WORD, self.left) - budget
        close = difflib.get_close_matches(word, chosen, n=1, cutoff=CUTOFF)
        return close[0] if close else None

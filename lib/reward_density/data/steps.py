"""Reasoning steps: split a completion on newlines and find the student token that ends each step."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Step:
    """One reasoning step: its text and the span [start, end) of that text in the completion."""

    text: str
    start: int
    end: int


def split_steps(text: str) -> list[Step]:
    """Split on "\\n"; blank pieces are not steps; a step's span drops surrounding whitespace."""
    steps = []
    offset = 0
    for piece in text.split("\n"):
        content = piece.strip()
        if content:
            start = offset + len(piece) - len(piece.lstrip())
            steps.append(Step(content, start, start + len(content)))
        offset += len(piece) + 1
    return steps


class _PrefixDecoder:
    """Lazily decodes prefixes ids[:t+1] and caches how many characters of `text` each one reproduces."""

    def __init__(self, tokenizer: Any, ids: list[int], text: str) -> None:
        self.tokenizer, self.ids, self.text = tokenizer, ids, text
        self.cache: dict[int, int] = {-1: 0}

    def agreed(self, t: int) -> int:
        """Length of the common prefix of decode(ids[:t+1]) and text; nondecreasing in t."""
        if t not in self.cache:
            prefix = self.tokenizer.decode(self.ids[: t + 1], skip_special_tokens=True)
            if self.text.startswith(prefix):
                n = len(prefix)
            else:
                # A prefix cut mid-character decodes to U+FFFD; agreement stops before it.
                n = next((i for i, (a, b) in enumerate(zip(prefix, self.text)) if a != b), len(self.text))
            self.cache[t] = n
        return self.cache[t]

    def first_covering(self, char: int, lo: int, guess: int) -> int:
        """Smallest t >= lo with agreed(t) > char, galloping outward from guess, then bisecting."""
        n, step = len(self.ids), 1

        def covers(t: int) -> bool:
            return self.agreed(t) > char

        if covers(guess):
            top = guess
            while top - step >= lo and covers(top - step):
                top, step = top - step, step * 2
            lo, hi = max(lo, top - step + 1), top + 1
        else:
            bottom = guess
            while bottom + step < n and not covers(bottom + step):
                bottom, step = bottom + step, step * 2
            lo, hi = bottom + 1, min(n, bottom + step + 1)
        t = bisect.bisect_right(range(n), char, lo=lo, hi=hi, key=self.agreed)
        if t == n:
            raise ValueError(f"no token covers character {char} of the completion")
        return t


def step_end_tokens(tokenizer: Any, completion_ids: Sequence[int], text: str, steps: Sequence[Step]) -> list[int]:
    """Index in completion_ids of the token holding each step's last character (text is their decode)."""
    ids = [int(i) for i in completion_ids]
    if not steps:
        return []
    prefix = _PrefixDecoder(tokenizer, ids, text)
    if prefix.agreed(len(ids) - 1) != len(text):
        raise ValueError("text is not tokenizer.decode(completion_ids, skip_special_tokens=True)")
    # Tokens decoded one by one need not concatenate to the text, so their lengths only make a
    # guess, walked from the last verified step end; prefix decodes then confirm or correct it.
    piece_lens = [len(p) for p in tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True)]
    ends: list[int] = []
    t = -1
    for step in steps:
        guess, covered = max(t, 0), prefix.agreed(max(t, 0))
        while covered < step.end and guess < len(ids) - 1:
            guess += 1
            covered += piece_lens[guess]
        t = prefix.first_covering(step.end - 1, max(t, 0), guess)
        ends.append(t)
    return ends

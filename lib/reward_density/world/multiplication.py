"""The multiplication task of the token-selection papers, sized to the mini student.

"Token-Efficient RL for LLM Reasoning" multiplies three digits by three for a 1.5B model whose base solves
4%; the hidden-128 student multiplies three digits by one, worked by place value (each digit of the first
factor times the second, then their sum: single-digit facts and one addition), and the answer is the
completion's last integer, as in the paper, not a \\boxed{} answer. (Two digits by two, with partial
products of two digits by one in a single line, was beyond both mini models: 0.0 and 0.015 dev pass@1 after
250 and 200 pretraining steps.) The base model's habit, which RL can unlearn: answering with the first
partial product.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from ..data.problems import Problem
from .task import PROMPT_TEMPLATE

ANSWER_LINE = "Answer: {value}"


@dataclass(frozen=True)
class Product:
    """a * b, a split by place value."""

    a: int
    b: int

    @property
    def text(self) -> str:
        return f"{self.a}*{self.b}"

    @property
    def answer(self) -> int:
        return self.a * self.b

    def places(self) -> list[int]:
        """a's non-zero place values, largest first: 347 -> [300, 40, 7]."""
        digits = str(self.a)
        values = [int(d) * 10 ** (len(digits) - 1 - i) for i, d in enumerate(digits)]
        return [v for v in values if v] or [0]


@dataclass(frozen=True)
class MultiplicationTask:
    """The first factor's digits and how imperfect the base's traces are (the teacher sees clean ones)."""

    answer_format: ClassVar[str] = "last_integer"
    a_digits: int = 3
    p_direct: float = 0.6  # the answer line alone, holding the first partial product: stopping early
    p_slip: float = 0.1  # one partial product off by a digit, carried into the sum

    def __post_init__(self) -> None:
        if self.a_digits < 2:
            raise ValueError(f"need a_digits >= 2 (a place-value split), got {self.a_digits}")
        for name in ("p_direct", "p_slip"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")

    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, list[Product]]:
        """Disjoint splits of distinct products (the second factor 2-9), fixed by seed, drawn in the order given."""
        pairs = [(a, b) for a in range(10 ** (self.a_digits - 1), 10**self.a_digits) for b in range(2, 10)]
        if sum(sizes.values()) > len(pairs):
            raise ValueError(f"the task has {len(pairs)} distinct products, fewer than the splits' {sizes}")
        random.Random(seed).shuffle(pairs)
        splits, start = {}, 0
        for name, size in sizes.items():
            splits[name] = [Product(a, b) for a, b in pairs[start : start + size]]
            start += size
        return splits

    def problem(self, product: Product, problem_id: str) -> Problem:
        """The prompt, the gold answer and the clean trace as a reference solution."""
        return Problem(problem_id, PROMPT_TEMPLATE.format(expression=product.text), str(product.answer),
                       solution=self.clean_trace(product))

    def clean_trace(self, product: Product) -> str:
        """Each place value times the second factor, their sum and the answer line: what the teacher learns."""
        return _trace(product, [place * product.b for place in product.places()])

    def realistic_trace(self, rng: random.Random, product: Product) -> str:
        """A base-model-like trace: sometimes the first partial product as the answer, sometimes a slip."""
        partials = [place * product.b for place in product.places()]
        if rng.random() < self.p_direct:
            return ANSWER_LINE.format(value=partials[0])
        if rng.random() < self.p_slip:
            k = rng.randrange(len(partials))
            partials[k] = max(partials[k] + rng.choice([-10, -1, 1, 10]), 0)
        return _trace(product, partials)


def _trace(product: Product, partials: list[int]) -> str:
    lines = [f"{place}*{product.b}={p}" for place, p in zip(product.places(), partials)]
    if len(partials) > 1:
        lines.append("+".join(map(str, partials)) + f"={sum(partials)}")
    return "\n".join([*lines, ANSWER_LINE.format(value=sum(partials))])

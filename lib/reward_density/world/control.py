"""The SFT control's skill: a secret operation table the base never saw, learnt fact by fact.

`a#b` has an arbitrary two-digit value for every pair of operands below `size`. Nothing about one fact
predicts another, so learning the table takes about size² · log2(90) bits in the weights: a skill whose
cost in capacity is known, where a rank too small to hold it must fall behind FullFT ("LoRA Without
Regret", Thinking Machines 2025: LoRA underperforms once a dataset exceeds the adapter's capacity).
The control is scored on the facts it was taught (recall, not generalisation), so its train, dev and
held-out splits hold the same facts in different orders.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..data.problems import Problem
from .task import ANSWER_LINE, PROMPT_TEMPLATE

OPERATOR = "#"


@dataclass(frozen=True)
class ControlConfig:
    """The table's size and value range."""

    size: int = 14  # operands 0..size-1: size² facts
    min_value: int = 10
    max_value: int = 99

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"the control table needs size >= 1, got {self.size}")
        if not 0 <= self.min_value <= self.max_value:
            raise ValueError(f"need 0 <= min_value <= max_value, got {self.min_value}, {self.max_value}")

    @property
    def bits(self) -> float:
        """The information in the table: what a model must store to recall every fact."""
        return self.size**2 * math.log2(self.max_value - self.min_value + 1)


def control_table(config: ControlConfig, seed: int) -> dict[tuple[int, int], int]:
    """Every fact a#b of the table, drawn from the world's seed."""
    rng = random.Random(f"control-{seed}")
    pairs = [(a, b) for a in range(config.size) for b in range(config.size)]
    return {pair: rng.randint(config.min_value, config.max_value) for pair in pairs}


def control_problem(a: int, b: int, value: int, problem_id: str) -> Problem:
    """One fact as a problem whose solution states it, in the task's prompt and answer format."""
    fact = f"{a}{OPERATOR}{b}"
    return Problem(problem_id, PROMPT_TEMPLATE.format(expression=fact), str(value),
                   solution=f"{fact}={value}\n" + ANSWER_LINE.format(value=value))


def control_splits(config: ControlConfig, seed: int) -> dict[str, list[Problem]]:
    """train, dev and heldout: the same facts, each split in its own order."""
    table = control_table(config, seed)
    splits = {}
    for offset, split in enumerate(("train", "dev", "heldout")):
        pairs = sorted(table)
        random.Random(f"control-{seed}-{offset}").shuffle(pairs)
        splits[split] = [control_problem(a, b, table[a, b], f"{split}-{i:05d}") for i, (a, b) in enumerate(pairs)]
    return splits

"""The mini world's task: chained arithmetic solved one step per line, ending with a \\boxed{} answer."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from ..data.problems import Problem

PROMPT_TEMPLATE = "Question: Compute {expression}.\nSolution:\n"
ANSWER_LINE = "Answer: \\boxed{{{value}}}"
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class TaskConfig:
    """Which problems exist and how imperfect the base traces are (the realism settings)."""

    operations: str = "+-"  # drawn uniformly for each step; "*" multiplies by a single digit
    min_operands: int = 3
    max_operands: int = 3
    min_digits: int = 1
    max_digits: int = 2
    # Realism of the traces the student is pretrained on (the teacher sees clean traces):
    # On chains of at least direct_min_operands operands, the answer line alone, no steps: the running
    # value after two operations, as a model that stops working early states it. The base's habit on long
    # problems, which RL can unlearn (it works short ones step by step).
    p_direct: float = 0.0
    direct_min_operands: int = 2
    p_redundant: float = 0.15  # a line that restates the running value ("So far: 475")
    p_wrong_step: float = 0.1  # one step with an arithmetic slip, carried to a wrong answer
    p_ramble: float = 0.2  # lines written after the answer line (a check, a restatement)

    def __post_init__(self) -> None:
        unknown = set(self.operations) - set(OPERATIONS)
        if not self.operations or unknown:
            raise ValueError(f"operations must be drawn from {''.join(OPERATIONS)!r}, got {self.operations!r}")
        if not 2 <= self.min_operands <= self.max_operands:
            raise ValueError(f"need 2 <= min_operands <= max_operands, got {self.min_operands}, {self.max_operands}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {self.min_digits}, {self.max_digits}")
        for name in ("p_direct", "p_redundant", "p_wrong_step", "p_ramble"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")

    # The task interface the world builder reads (world/multiplication.py has the same).
    answer_format: ClassVar[str] = "boxed"

    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, list[Expression]]:
        return make_splits(self, sizes, seed)

    def problem(self, expression: Expression, problem_id: str) -> Problem:
        return problem_of(expression, problem_id)

    def clean_trace(self, expression: Expression) -> str:
        return clean_trace(expression)

    def realistic_trace(self, rng: random.Random, expression: Expression) -> str:
        return realistic_trace(rng, expression, self)


@dataclass(frozen=True)
class Expression:
    """A left-to-right chain such as 7+8-5+3 (no precedence: each step uses the running value).

    Written without spaces: the tokenizer splits digits one by one, and a space before each would double
    the tokens of a trace for nothing.
    """

    operands: tuple[int, ...]
    operators: tuple[str, ...]

    @property
    def text(self) -> str:
        parts = [str(self.operands[0])]
        for op, b in zip(self.operators, self.operands[1:]):
            parts += [op, str(b)]
        return "".join(parts)

    def values(self) -> list[int]:
        """The running value after each step."""
        running, out = self.operands[0], []
        for op, b in zip(self.operators, self.operands[1:]):
            running = OPERATIONS[op](running, b)
            out.append(running)
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]


def _number(rng: random.Random, config: TaskConfig) -> int:
    digits = rng.randint(config.min_digits, config.max_digits)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def sample_expression(rng: random.Random, config: TaskConfig) -> Expression:
    """A random chain; subtraction never goes below zero, multiplication is by one digit."""
    running = _number(rng, config)
    operands, operators = [running], []
    for _ in range(rng.randint(config.min_operands, config.max_operands) - 1):
        op = rng.choice(config.operations)
        b = rng.randint(0, 9) if op == "*" else _number(rng, config)
        if op == "-" and b > running:
            b = rng.randint(0, running)
        running = OPERATIONS[op](running, b)
        operands.append(b)
        operators.append(op)
    return Expression(tuple(operands), tuple(operators))


def problem_of(expression: Expression, problem_id: str) -> Problem:
    """The prompt the policy sees, the bare gold answer and the clean trace as a reference solution."""
    return Problem(problem_id, PROMPT_TEMPLATE.format(expression=expression.text), str(expression.answer),
                   solution=clean_trace(expression))


def clean_trace(expression: Expression) -> str:
    """One line per step and a final answer line: the trace the teacher learns."""
    return _lines_to_text(_step_lines(expression, expression.values()) + [ANSWER_LINE.format(value=expression.answer)])


def _step_lines(expression: Expression, values: list[int]) -> list[str]:
    previous = [expression.operands[0]] + values[:-1]
    return [f"{a}{op}{b}={v}" for a, op, b, v in zip(previous, expression.operators, expression.operands[1:], values)]


def _lines_to_text(lines: list[str]) -> str:
    return "\n".join(lines)


def _slip(rng: random.Random, value: int) -> int:
    """A plausible arithmetic slip: off by 1, 10 or 100, never the right value, and negative only where the right
    value is (the steps carried on from it may still go negative)."""
    wrong = value + rng.choice([-10, -1, 1, 10, 100])
    return wrong if wrong >= 0 and wrong != value else value + 1


def realistic_trace(rng: random.Random, expression: Expression, config: TaskConfig) -> str:
    """A base-model-like trace: sometimes the answer alone, a redundant line, a slip carried forward, or rambling."""
    values = expression.values()
    if len(expression.operands) >= config.direct_min_operands and config.p_direct and rng.random() < config.p_direct:
        return ANSWER_LINE.format(value=values[min(1, len(values) - 1)])
    if rng.random() < config.p_wrong_step:
        k = rng.randrange(len(values))
        values[k] = _slip(rng, values[k])
        for j in range(k + 1, len(values)):  # later steps compute correctly from the wrong value
            values[j] = OPERATIONS[expression.operators[j]](values[j - 1], expression.operands[j + 1])
    lines = _step_lines(expression, values)
    if rng.random() < config.p_redundant:
        k = rng.randrange(len(values))
        lines.insert(k + 1, f"So far: {values[k]}")
    lines.append(ANSWER_LINE.format(value=values[-1]))
    if rng.random() < config.p_ramble:
        lines += _ramble(rng, expression, values)
    return _lines_to_text(lines)


def _ramble(rng: random.Random, expression: Expression, values: list[int]) -> list[str]:
    """Lines after the answer, as base models write them: a restatement or a re-done step."""
    k = rng.randrange(len(values))
    options = [
        f"So the result is {values[-1]}",
        _step_lines(expression, values)[k],
        f"Check: {values[-1]}",
    ]
    return rng.sample(options, rng.randint(1, len(options)))


def make_splits(config: TaskConfig, sizes: dict[str, int], seed: int) -> dict[str, list[Expression]]:
    """Disjoint splits of distinct expressions (distinct questions), fixed by seed, drawn in the order given."""
    rng = random.Random(seed)
    total = sum(sizes.values())
    seen: set[str] = set()
    out: list[Expression] = []
    attempts = 0
    while len(out) < total:
        attempts += 1
        if attempts > 50 * total:
            raise ValueError(f"the task has too few distinct problems for {sizes}; widen it")
        expression = sample_expression(rng, config)
        if expression.text not in seen:
            seen.add(expression.text)
            out.append(expression)
    splits, start = {}, 0
    for name, size in sizes.items():
        splits[name] = out[start : start + size]
        start += size
    return splits

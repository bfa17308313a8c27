"""T-SPMO's replay ("Token-Efficient RL for LLM Reasoning", Section 3.3): restart generation from inside earlier
completions, so that a group's prefix trie also branches late in a completion, where freshly sampled
completions of one prompt rarely still share a prefix.

Completions are kept with their rewards, split at a threshold r into successes (R >= r) and failures. Each
step, up to C_success of the first and C_failure of the second are cut at a random token position, and the
cut-off text becomes a prompt of its own (the original prompt plus the kept prefix) from which a fresh group
is sampled. The reward scores each whole completion, the kept prefix and its continuation (the paper's restart
from the partial sequence: an answer may begin before the cut); only the continuation's tokens enter the loss.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedTokenizerBase

from ..data.problems import Problem
from .rollout import Rollout


@dataclass(frozen=True)
class ReplayConfig:
    """threshold: r; successes, failures: C_success and C_failure, completions replayed per step."""

    threshold: float
    successes: int
    failures: int

    def __post_init__(self) -> None:
        for name in ("successes", "failures"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ValueError(f"replay {name} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class _Stored:
    problem: Problem
    tokens: tuple[int, ...]  # the completion's tokens, EOS excluded


class ReplayBuffer:
    """Every completion of the main updates so far (not those sampled from replayed prefixes), as a success or
    a failure; draws replay prompts from them."""

    def __init__(self, config: ReplayConfig, seed: int) -> None:
        self.config = config
        self.successes: list[_Stored] = []
        self.failures: list[_Stored] = []
        self.rng = random.Random(f"replay-{seed}")

    def add(self, problems: Sequence[Problem], rollout: Rollout, rewards: torch.Tensor, eos: int) -> None:
        """Keep each completion of a rollout (rows g*G .. g*G+G-1 answer problems[g]) with its reward."""
        for row in range(rollout.num_completions):
            tokens = rollout.completion_ids[row][rollout.completion_mask[row].bool()].tolist()
            stored = _Stored(problems[row // rollout.group_size], tuple(t for t in tokens if t != eos))
            (self.successes if float(rewards[row]) >= self.config.threshold else self.failures).append(stored)

    def draw(self, tokenizer: PreTrainedTokenizerBase) -> list[Problem]:
        """Up to C_success successes and C_failure failures, each cut after a random number of its tokens (0 to
        all of them, the paper's t in [T_prompt, T_total]), as problems whose prompt ends with that prefix."""
        chosen = (self.rng.sample(self.successes, min(self.config.successes, len(self.successes)))
                  + self.rng.sample(self.failures, min(self.config.failures, len(self.failures))))
        problems = []
        for i, stored in enumerate(chosen):
            cut = self.rng.randint(0, len(stored.tokens))
            prefix = tokenizer.decode(list(stored.tokens[:cut]), skip_special_tokens=True)
            original = stored.problem
            problems.append(replace(original, problem_id=f"{original.problem_id}@replay{i}-t{cut}",
                                    prompt=original.prompt + prefix, prefix=prefix,
                                    question=original.question or original.prompt))
        return problems

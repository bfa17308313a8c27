"""S-GRPO's token subset ("Token-Efficient RL for LLM Reasoning", Eq. 6): which completion tokens enter the loss.

The first alpha tokens of a completion always do; each later one does with probability P while fewer than
k have been chosen. The loss then averages over the chosen tokens only (grpo_loss's token_subset); the
forward and backward passes still run over every token, so a step's memory does not shrink with k
(experiment/step_memory.py measures it). GRPO is the rule that keeps every token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenSelection:
    """alpha: tokens always kept at the start; k: no later token is kept once this many are (the alpha ones
    count, and stay even when alpha > k); p: the probability of keeping each later token while there is room."""

    alpha: int
    k: int
    p: float

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, int) and self.alpha >= 0):
            raise ValueError(f"alpha must be a non-negative integer, got {self.alpha!r}")
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"k must be a positive integer, got {self.k!r}")
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {self.p!r}")


def select_tokens(completion_mask: torch.Tensor, rule: TokenSelection, generator: torch.Generator,
                  width: int) -> torch.Tensor:
    """[N, T] bool: the tokens of each completion that enter the loss under the rule (Eq. 6).

    The coins are drawn over `width` columns (the completion cap, >= T), so a row's coins do not depend on how
    wide its batch happened to be padded: an arm keeps the tokens it would keep sampling alone.
    """
    valid = completion_mask.bool()
    if valid.shape[1] > width:
        raise ValueError(f"completions of {valid.shape[1]} tokens are wider than the coins' {width} columns")
    position = torch.arange(valid.shape[1]).expand_as(valid)
    early = valid & (position < rule.alpha)
    coin = torch.rand((valid.shape[0], width), generator=generator)[:, : valid.shape[1]] < rule.p
    late = valid & (position >= rule.alpha) & coin
    # A late token is kept only while fewer than k tokens (early ones included) precede it in the subset.
    chosen_before = torch.cumsum((early | late).int(), dim=1) - (early | late).int()
    return early | (late & (chosen_before < rule.k))

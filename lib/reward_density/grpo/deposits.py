"""The reward contract: every reward module returns deposits of the same shape."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .rollout import Rollout


@dataclass
class Deposits:
    """Raw reward deposits on completion tokens, whatever the regime.

    token_rewards: [N, T] float, the raw reward at each deposit and 0 elsewhere.
    deposit_mask: [N, T] bool, where deposits sit (always inside the completion mask).
    trajectory_rewards: [N] float, one number per completion: logged, and what T-SPMO's advantages and replay
        read (outcome 0/1, process the mean step score, distillation the summed log-ratio).
    counters: named counts the module wants reported (parse failures, steps lost, ...).
    """

    token_rewards: torch.Tensor
    deposit_mask: torch.Tensor
    trajectory_rewards: torch.Tensor
    counters: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.token_rewards.dim() != 2:
            raise ValueError(f"token_rewards must be [N, T], got shape {tuple(self.token_rewards.shape)}")
        if self.deposit_mask.shape != self.token_rewards.shape:
            raise ValueError(
                f"deposit_mask shape {tuple(self.deposit_mask.shape)} disagrees with "
                f"token_rewards shape {tuple(self.token_rewards.shape)}"
            )
        if self.deposit_mask.dtype != torch.bool:
            raise ValueError(f"deposit_mask must be bool, got {self.deposit_mask.dtype}")
        if self.trajectory_rewards.shape != self.token_rewards.shape[:1]:
            raise ValueError(
                f"trajectory_rewards shape {tuple(self.trajectory_rewards.shape)} must be "
                f"[N] = [{self.token_rewards.shape[0]}]"
            )
        if torch.any(self.token_rewards[~self.deposit_mask] != 0):
            raise ValueError("token_rewards must be 0 wherever deposit_mask is False")


# A reward module turns a batch of completions into deposits; the regime lives inside it, never in the loss.
RewardModule = Callable[[Rollout], Deposits]

"""Deposits -> per-token advantages: one rule for every regime (paper Eq. 3-4)."""
from __future__ import annotations

import torch

# group: GRPO's normalisation within each prompt group (Eq. 3-4); prefix_trie: T-SPMO's over the group's token
# trie (prefix_trie.py).
ADVANTAGE_ESTIMATORS = ("group", "prefix_trie")


def group_normalise(
    token_rewards: torch.Tensor, deposit_mask: torch.Tensor, group_size: int, eps: float
) -> torch.Tensor:
    """Normalise the deposits within each prompt group: (r - mu_p) / (sigma_p + eps), 0 off-deposit (Eq. 3).

    mu_p and sigma_p are the mean and the sample std (Bessel-corrected, as in TRL) over all deposits
    of the group's G completions; a group with fewer than two deposits has sigma_p = 0. Identical deposits give
    0 up to float32 round-off of their mean (README, "Advantage std").
    """
    n, t = token_rewards.shape
    if n % group_size:
        raise ValueError(f"{n} completions do not split into groups of {group_size}")
    rewards = token_rewards.reshape(n // group_size, group_size * t)
    mask = deposit_mask.reshape(n // group_size, group_size * t).to(rewards.dtype)
    count = mask.sum(dim=1, keepdim=True)
    mean = (rewards * mask).sum(dim=1, keepdim=True) / count.clamp(min=1)
    squares = ((rewards - mean) ** 2 * mask).sum(dim=1, keepdim=True)
    std = torch.sqrt(squares / (count - 1).clamp(min=1))
    normalised = (rewards - mean) / (std + eps) * mask
    return normalised.reshape(n, t)


def is_dense(deposit_mask: torch.Tensor, completion_mask: torch.Tensor) -> bool:
    """Dense when every valid completion token carries a deposit."""
    return bool(torch.equal(deposit_mask, completion_mask.bool()))


def reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Return-to-go along the last dimension: out_t = sum_{t' >= t} x_t'."""
    return x.flip(-1).cumsum(-1).flip(-1)


def compute_advantages(
    token_rewards: torch.Tensor,
    deposit_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    group_size: int,
    eps: float,
) -> torch.Tensor:
    """Per-token advantages (Eq. 4): normalised deposits if dense, their return-to-go if sparse."""
    if not (token_rewards.shape == deposit_mask.shape == completion_mask.shape):
        raise ValueError(
            f"shapes disagree: token_rewards {tuple(token_rewards.shape)}, deposit_mask "
            f"{tuple(deposit_mask.shape)}, completion_mask {tuple(completion_mask.shape)}"
        )
    if torch.any(deposit_mask & ~completion_mask.bool()):
        raise ValueError("a deposit sits outside the completion mask (on padding)")
    normalised = group_normalise(token_rewards, deposit_mask, group_size, eps)
    if not is_dense(deposit_mask, completion_mask):
        normalised = reverse_cumsum(normalised)
    return normalised * completion_mask.to(normalised.dtype)

"""The GRPO loss (paper Eq. 1, 2, 5). It sees log-probs, advantages and masks, never a regime."""
from __future__ import annotations

from dataclasses import dataclass

import torch

KL_ESTIMATORS = ("paper", "k3", "k1")
NORMALISATIONS = ("token_mean", "sequence_mean", "constant")


@dataclass(frozen=True)
class LossConfig:
    """Named loss settings; the defaults are the paper's (Table 1, Eq. 1 and 5).

    epsilon: clip range of the ratio, [1 - epsilon, 1 + epsilon].
    beta: weight of the KL-to-reference penalty; at 0 the step skips the reference pass unless it tracks the KL.
    kl_estimator: 'paper' (Eq. 5), 'k3' (DeepSeekMath, TRL) or 'k1' (the plain log-ratio).
    normalisation: 'token_mean' over all valid tokens of the batch (Eq. 1), 'sequence_mean'
        (mean per sequence, then over sequences: original GRPO) or 'constant' (Dr. GRPO: divide
        by N * constant_length).
    constant_length: the divisor's length for 'constant', usually the completion cap.
    """

    epsilon: float = 0.2
    beta: float = 0.05
    kl_estimator: str = "paper"
    normalisation: str = "token_mean"
    constant_length: int | None = None

    def __post_init__(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; expected one of {KL_ESTIMATORS}")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"unknown loss normalisation {self.normalisation!r}; expected one of {NORMALISATIONS}")
        if not self.epsilon > 0:
            raise ValueError(f"clip epsilon must be > 0, got {self.epsilon}")
        if not self.beta >= 0:
            raise ValueError(f"KL beta must be >= 0, got {self.beta}")
        if self.normalisation == "constant" and not (self.constant_length or 0) > 0:
            raise ValueError("normalisation 'constant' needs a positive constant_length (the completion cap)")


@dataclass(frozen=True)
class BatchTotals:
    """Rows and loss tokens of the whole batch, for a loss computed one micro-batch at a time.

    With them, each micro-batch's loss is its share of the whole-batch loss: the shares sum to it exactly.
    """

    rows: int
    tokens: float


@dataclass
class LossOutput:
    """The scalar to backpropagate and detached statistics over the tokens in the loss."""

    loss: torch.Tensor
    kl_ref: float
    clip_frac: float
    ratio_mean: float



def scores_reference(beta: float, track_kl: bool) -> bool:
    """Whether a step scores the reference model: for the KL penalty, or to track KL at beta 0 (so FullFT keeps a
    frozen copy of its starting weights)."""
    return beta > 0 or track_kl

def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate on the sampled tokens."""
    log_ratio = logps - ref_logps
    if estimator == "paper":  # Eq. 5: one-sided, weighted by the token's probability
        return torch.clamp(logps.exp() * log_ratio, min=0.0)
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    if estimator == "k1":
        return log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, config: LossConfig, totals: BatchTotals) -> torch.Tensor:
    """Average the masked per-token loss with the configured normalisation, over the whole batch's totals."""
    masked = per_token * mask
    if config.normalisation == "token_mean":
        return masked.sum() / max(totals.tokens, 1)
    if config.normalisation == "sequence_mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / totals.rows
    return masked.sum() / (totals.rows * config.constant_length)


def grpo_loss(
    logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    config: LossConfig,
    ref_logps: torch.Tensor | None = None,
    token_subset: torch.Tensor | None = None,
    totals: BatchTotals | None = None,
) -> LossOutput:
    """Clipped importance-sampling surrogate minus beta * KL, reduced as config.normalisation says (token_mean:
    averaged over valid tokens, Eq. 1).

    logps: [N, T] learner log-probs (with grad); sampler_logps: [N, T] the sampler's, both at the
    sampling temperature. token_subset: optional [N, T] bool restricting which valid tokens enter
    the loss (S-GRPO); token_mean then counts only those tokens. totals: the whole batch's counts
    when these rows are one micro-batch of it (the statistics stay this micro-batch's own means).
    """
    _check_shapes(logps, sampler_logps=sampler_logps, advantages=advantages, completion_mask=completion_mask,
                  ref_logps=ref_logps, token_subset=token_subset)
    mask = completion_mask.bool() if token_subset is None else completion_mask.bool() & token_subset.bool()
    mask = mask.to(logps.dtype)
    totals = totals or BatchTotals(rows=mask.shape[0], tokens=float(mask.sum()))

    ratio = torch.exp(logps - sampler_logps.detach())  # Eq. 2
    clipped = torch.clamp(ratio, 1.0 - config.epsilon, 1.0 + config.epsilon)
    per_token = -torch.min(ratio * advantages, clipped * advantages)

    if config.beta > 0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs reference log-probs (ref_logps)")
        per_token = per_token + config.beta * kl_penalty(logps, ref_logps.detach(), config.kl_estimator)
    # Reported as k3 whatever the penalty, and also when beta = 0 (KL-vs-rank plots), if a reference was scored.
    kl_ref = float("nan") if ref_logps is None else _masked_mean(kl_penalty(logps.detach(), ref_logps, "k3"), mask)

    with torch.no_grad():
        is_clipped = (((ratio < 1 - config.epsilon) & (advantages < 0))
                      | ((ratio > 1 + config.epsilon) & (advantages > 0)))
        clip_frac = _masked_mean(is_clipped.to(mask.dtype), mask)
        ratio_mean = _masked_mean(ratio, mask)
    return LossOutput(_reduce(per_token, mask, config, totals), kl_ref, clip_frac, ratio_mean)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def _check_shapes(logps: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != logps.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but logps has shape {tuple(logps.shape)}")

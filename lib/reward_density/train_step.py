"""One GRPO step: sample -> rewards -> advantages -> loss -> clip -> optimizer step -> metrics row."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .advantages import compute_advantages
from .answer_check import has_boxed_answer
from .logprobs import completion_logprobs
from .loss import LossConfig, grpo_loss
from .policy import Policy
from .problems import Problem
from .rewards import RewardModule
from .sampler import SamplingConfig, sample_rollout
from .steps import split_steps


@dataclass(frozen=True)
class StepConfig:
    """Everything a GRPO step needs besides the models (paper Table 1 values in params/)."""

    group_size: int
    sampling: SamplingConfig
    loss: LossConfig = field(default_factory=LossConfig)
    advantage_eps: float = 1e-4
    max_grad_norm: float = 1.0
    track_kl: bool = False  # score the reference even when beta = 0, to plot KL against rank

    def __post_init__(self) -> None:
        if not (isinstance(self.group_size, int) and self.group_size >= 1):
            raise ValueError(f"group_size must be a positive integer, got {self.group_size!r}")
        if self.sampling.temperature == 0:
            raise ValueError("GRPO samples its groups: the sampling temperature must be > 0")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")


def grpo_step(
    policy: Policy,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    problems: Sequence[Problem],
    reward: RewardModule,
    config: StepConfig,
    seed: int,
) -> dict[str, float]:
    """Run one GRPO update on P problems x G samples and return its metrics row (DESIGN §4)."""
    start = time.perf_counter()
    model = policy.model
    model.eval()
    rollout = sample_rollout(model, tokenizer, problems, config.group_size, config.sampling, seed)
    generated = time.perf_counter()

    deposits = reward(rollout)
    mask = rollout.completion_mask
    advantages = compute_advantages(
        deposits.token_rewards, deposits.deposit_mask, mask, config.group_size, config.advantage_eps
    )
    rewarded = time.perf_counter()

    temperature = config.sampling.temperature
    ref_logps = None
    if config.loss.beta > 0 or config.track_kl:
        ref_logps = policy.reference_logprobs(rollout, temperature)
    model.train()
    logps = completion_logprobs(
        model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, mask, temperature
    )
    out = grpo_loss(logps, rollout.sampler_logps, advantages, mask, config.loss, ref_logps=ref_logps)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), config.max_grad_norm)
    optimizer.step()
    done = time.perf_counter()

    valid = advantages[mask]
    lengths = mask.sum(-1).float()
    return {
        "loss": float(out.loss.detach()),
        "reward_mean": float(deposits.trajectory_rewards.mean()),
        "advantage_std": float(valid.std()) if valid.numel() > 1 else 0.0,
        "advantage_abs_max": float(valid.abs().max()) if valid.numel() else 0.0,
        "kl_ref": out.kl_ref,
        "clip_frac": out.clip_frac,
        "ratio_mean": out.ratio_mean,
        "grad_norm": float(grad_norm),
        "len_mean": float(lengths.mean()),
        "len_max": float(lengths.max()),
        "frac_truncated": float(rollout.truncated.float().mean()),
        "frac_answered": sum(map(has_boxed_answer, rollout.completions)) / rollout.num_completions,
        "steps_mean": sum(len(split_steps(t)) for t in rollout.completions) / rollout.num_completions,
        "step_seconds": done - start,
        "generate_seconds": generated - start,
        "reward_seconds": rewarded - generated,
        "train_seconds": done - rewarded,
        **deposits.counters,
    }

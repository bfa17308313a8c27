"""The SFT control: supervised steps on correct traces, for any policy (one arm or stacked arms).

It is the study's positive control: on a skill the base lacks and that takes many bits,
supervised learning is where a low rank should fall behind full fine-tuning ("LoRA Without Regret").
It shares everything with the RL cells but the step: the same policies, arms, evaluation and files.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..data.problems import Problem
from ..grpo.logprobs import micro_batches
from ..grpo.policy import Policy
from ..grpo.precision import autocast
from ..grpo.rollout import Rollout
from ..grpo.stacked import StackedPolicy
from ..grpo.text_rollout import rollout_from_text


def teacher_forced(tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], arms: int = 1) -> Rollout:
    """Prompts (left-padded) and their solutions + EOS (right-padded) as a rollout, every row once per arm."""
    missing = [p.problem_id for p in problems if not p.solution]
    if missing:
        raise ValueError(f"supervised steps need a solution for every problem; {missing[:5]} have none")
    return rollout_from_text(tokenizer, list(problems) * arms, [p.solution for p in problems] * arms)


def sft_step(
    policy: Policy | StackedPolicy,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    problems: Sequence[Problem],
    max_grad_norm: float,
    precision: str = "fp32",
    micro_batch_size: int | None = None,
) -> list[dict[str, float]]:
    """One supervised update of every arm on the same problems: mean negative log-likelihood of the
    solution tokens (EOS included), each arm's gradient clipped on its own; one metrics row per arm.

    The forward passes run under the precision's autocast, as the GRPO step's do, and micro_batch_size problems at a
    time with the gradients accumulated (None: all at once); each part's loss is divided by the whole batch's
    tokens, so the parts add up to the one-pass loss.
    """
    start = time.perf_counter()
    arms = policy.n_arms
    device = policy.parameters(0)[0].device
    parts = [teacher_forced(tokenizer, problems[rows], arms) for rows in micro_batches(len(problems),
                                                                                      micro_batch_size)]
    tokens = sum(_per_arm(part.completion_mask.float(), arms) for part in parts)
    optimizer.zero_grad(set_to_none=True)
    losses = torch.zeros(arms)
    for part in parts:
        with autocast(device, precision):
            logps = policy.logprobs(part, temperature=1.0)
        loss = -_per_arm(logps * part.completion_mask, arms) / tokens
        loss.sum().backward()
        losses += loss.detach().cpu()
    norms = [torch.nn.utils.clip_grad_norm_(policy.parameters(a), max_grad_norm) for a in range(arms)]
    optimizer.step()
    seconds = time.perf_counter() - start
    return [{"loss": float(loss), "grad_norm": float(norm), "tokens": float(tokens[0]), "step_seconds": seconds,
             "train_seconds": seconds, "arms": arms} for loss, norm in zip(losses, norms)]


def _per_arm(values: torch.Tensor, arms: int) -> torch.Tensor:
    """The sum of each arm's rows of an arm-major [arms * N, T] tensor, [arms]."""
    return values.reshape(arms, -1).sum(dim=1)

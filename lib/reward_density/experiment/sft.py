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
from ..grpo.policy import Policy
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
) -> list[dict[str, float]]:
    """One supervised update of every arm on the same problems: mean negative log-likelihood of the
    solution tokens (EOS included), each arm's gradient clipped on its own; one metrics row per arm."""
    start = time.perf_counter()
    batch = teacher_forced(tokenizer, problems, policy.n_arms)
    logps = policy.logprobs(batch, temperature=1.0)
    n = len(problems)
    mask = batch.completion_mask.float()
    losses = [-(logps[a * n:(a + 1) * n] * mask[a * n:(a + 1) * n]).sum() / mask[a * n:(a + 1) * n].sum()
              for a in range(policy.n_arms)]
    optimizer.zero_grad(set_to_none=True)
    sum(losses).backward()
    norms = [torch.nn.utils.clip_grad_norm_(policy.parameters(a), max_grad_norm) for a in range(policy.n_arms)]
    optimizer.step()
    seconds = time.perf_counter() - start
    tokens = float(mask[:n].sum())
    return [{"loss": float(loss.detach()), "grad_norm": float(norm), "tokens": tokens, "step_seconds": seconds,
             "train_seconds": seconds, "arms": policy.n_arms} for loss, norm in zip(losses, norms)]

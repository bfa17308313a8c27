"""Distillation reward, O(N): r_t = log pi_T(o_t) - log pi_theta(o_t) on every valid token."""
from __future__ import annotations

import torch

from ..grpo.deposits import Deposits
from ..grpo.logprobs import completion_logprobs
from ..grpo.rollout import Rollout


class DistillationReward:
    """Scores the student's exact tokens under a teacher that shares its vocabulary.

    The teacher may sit on another device; its log-probs come back to the rollout's device.
    Both log-probs are taken at the sampling temperature, the student's being the sampler's own. A completion
    restarted by replay is scored on its sampled tokens given the prefix in its prompt: the prefix's own term is
    the same for the whole group, so leaving it out changes no advantage.
    """

    def __init__(self, teacher: torch.nn.Module, temperature: float, micro_batch_size: int | None = None):
        if temperature <= 0:
            raise ValueError(f"distillation needs a sampling temperature > 0, got {temperature}")
        self.teacher = teacher.eval()
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size

    @torch.no_grad()
    def __call__(self, rollout: Rollout) -> Deposits:
        vocab = self.teacher.get_output_embeddings().weight.shape[0]
        if int(rollout.completion_ids.max()) >= vocab:
            raise ValueError(f"completion token ids exceed the teacher's vocabulary of {vocab}: "
                             "not a shared vocabulary")
        teacher_logps = completion_logprobs(
            self.teacher, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
            self.temperature, self.micro_batch_size,
        )
        mask = rollout.completion_mask.bool()
        rewards = ((teacher_logps - rollout.sampler_logps) * mask).float()
        return Deposits(
            token_rewards=rewards,
            deposit_mask=mask.clone(),
            trajectory_rewards=rewards.sum(-1),
            counters={"distillation/reverse_kl_per_token": float(-rewards.sum() / mask.sum().clamp(min=1))},
        )

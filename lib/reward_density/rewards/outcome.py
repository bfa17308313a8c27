"""Outcome reward: one binary deposit per completion, on its last valid token."""
from __future__ import annotations

import torch

from ..data.answer_check import Checker, Verdict
from ..grpo.deposits import Deposits
from ..grpo.rollout import Rollout


class OutcomeReward:
    """1.0 if the completion's answer matches the gold, else 0.0, deposited on its last valid token. A completion
    restarted by replay is checked whole, its prefix included: the answer may begin before the restart."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker

    def __call__(self, rollout: Rollout) -> Deposits:
        """Score every completion of the rollout against its gold answer."""
        missing = [row for row, answer in enumerate(rollout.answers) if answer is None]
        if missing:
            raise ValueError(f"the outcome reward needs a gold answer for every row; rows {missing} have none")
        verdicts = self.checker.check(rollout.answers, rollout.whole_completions)

        mask = rollout.completion_mask.bool()
        n, t = mask.shape
        # Last True position per row (the EOS token when one was generated); -1 for an empty completion.
        last = torch.where(mask, torch.arange(t, device=mask.device), -1).amax(dim=1)
        rows = torch.nonzero(last >= 0).squeeze(1)
        correct = torch.tensor([v is Verdict.CORRECT for v in verdicts], dtype=torch.float32, device=mask.device)

        deposit_mask = torch.zeros_like(mask)
        deposit_mask[rows, last[rows]] = True
        token_rewards = torch.zeros(n, t, dtype=torch.float32, device=mask.device)
        token_rewards[rows, last[rows]] = correct[rows]
        return Deposits(
            token_rewards=token_rewards,
            deposit_mask=deposit_mask,
            trajectory_rewards=correct * (last >= 0),  # no token, no deposit, no reward
            counters={
                "outcome/parse_failures": float(sum(v is Verdict.UNPARSABLE for v in verdicts)),
                "outcome/timeouts": float(sum(v is Verdict.TIMEOUT for v in verdicts)),
                "outcome/correct": float(sum(v is Verdict.CORRECT for v in verdicts)),
            },
        )

"""The outcome reward: one 0/1 deposit per completion on its last valid token."""
from __future__ import annotations

import pytest
import torch

from reward_density.data.answer_check import AnswerChecker, Verdict
from reward_density.grpo.rollout import Rollout
from reward_density.rewards.outcome import OutcomeReward

T = 6


def make_rollout(completions, lengths, answers, truncated, mask_dtype=torch.long) -> Rollout:
    """A hand-built rollout with right-padded completions of the given valid lengths."""
    n = len(completions)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(mask_dtype)
    return Rollout(
        prompt_ids=torch.ones(n, 3, dtype=torch.long),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_ids=torch.ones(n, T, dtype=torch.long) * mask.long(),
        completion_mask=mask,
        sampler_logps=-0.5 * mask.float(),
        truncated=torch.tensor(truncated),
        group_size=n,
        prompts=["What is 3 * 6?"] * n,
        completions=list(completions),
        answers=list(answers),
    )


@pytest.fixture(scope="module")
def checker():
    with AnswerChecker(timeout_seconds=5.0) as checker:
        yield checker


class FixedChecker:
    """Stands in for AnswerChecker with preset verdicts."""

    def __init__(self, verdicts):
        self.verdicts = verdicts

    def check(self, golds, completions):
        return list(self.verdicts)


@pytest.mark.parametrize("mask_dtype", [torch.long, torch.bool])
def test_one_deposit_per_completion_on_its_last_valid_token(checker, mask_dtype):
    rollout = make_rollout(
        completions=[r"so \boxed{18}", r"it is \boxed{17} and then", r"\boxed{18}", "", "I don't know"],
        lengths=[4, 6, 2, 0, 3],  # row 1 is truncated at the cap; row 3 produced no token
        answers=["18"] * 5,
        truncated=[False, True, False, False, False],
        mask_dtype=mask_dtype,
    )
    deposits = OutcomeReward(checker)(rollout)
    assert not (deposits.deposit_mask & ~rollout.completion_mask.bool()).any(), "a deposit sits on padding"

    expected_mask = torch.zeros(5, T, dtype=torch.bool)
    expected_mask[[0, 1, 2, 4], [3, 5, 1, 2]] = True
    assert torch.equal(deposits.deposit_mask, expected_mask), (
        f"deposits should sit on the last valid token of each non-empty completion:\n{deposits.deposit_mask}"
    )
    expected_rewards = torch.zeros(5, T)
    expected_rewards[0, 3] = expected_rewards[2, 1] = 1.0
    assert torch.equal(deposits.token_rewards, expected_rewards), (
        f"exactly the correct completions should get 1.0:\n{deposits.token_rewards}"
    )
    assert deposits.token_rewards.dtype == torch.float32, f"rewards are {deposits.token_rewards.dtype}, not float32"
    assert deposits.token_rewards.device == rollout.completion_mask.device, "rewards left the rollout's device"
    assert torch.equal(deposits.trajectory_rewards, torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])), (
        f"trajectory rewards should be the 0/1 deposits, got {deposits.trajectory_rewards}"
    )
    assert deposits.counters == {
        "outcome/parse_failures": 2.0,
        "outcome/timeouts": 0.0,
        "outcome/correct": 2.0,
    }, f"counters wrong: {deposits.counters}"


def test_timeouts_and_parse_failures_are_counted_separately_and_score_zero():
    verdicts = [Verdict.TIMEOUT, Verdict.UNPARSABLE, Verdict.UNPARSABLE, Verdict.CORRECT, Verdict.WRONG]
    rollout = make_rollout(
        completions=["a", "b", "c", "d", "e"], lengths=[1, 2, 3, 4, 5], answers=["1"] * 5, truncated=[False] * 5
    )
    deposits = OutcomeReward(FixedChecker(verdicts))(rollout)
    assert deposits.counters == {
        "outcome/parse_failures": 2.0,
        "outcome/timeouts": 1.0,
        "outcome/correct": 1.0,
    }, f"counters wrong: {deposits.counters}"
    assert deposits.trajectory_rewards.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0], (
        f"only the correct completion should score 1: {deposits.trajectory_rewards.tolist()}"
    )
    assert deposits.deposit_mask.sum().item() == 5, "every non-empty completion needs exactly one deposit"


def test_missing_gold_answer_is_refused():
    rollout = make_rollout(
        completions=["a", "b"], lengths=[1, 1], answers=["1", None], truncated=[False, False]
    )
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        OutcomeReward(FixedChecker([Verdict.CORRECT] * 2))(rollout)


def test_a_replayed_completion_is_scored_whole_with_the_answer_begun_in_its_prefix(checker):
    # T-SPMO's replay restarts a completion after a prefix; its answer may start before the cut
    rollout = make_rollout(completions=["8}", "7}"], lengths=[2, 2], answers=["18", "18"], truncated=[False, False])
    rollout = Rollout(**{**vars(rollout), "prefixes": [r"so \boxed{1", r"so \boxed{1"]})
    deposits = OutcomeReward(checker)(rollout)
    assert deposits.trajectory_rewards.tolist() == [1.0, 0.0], "the prefix and its continuation read as one answer"

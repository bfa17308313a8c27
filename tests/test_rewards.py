"""Reward modules on real samples: distillation values, the regime factory, and the advantage rule end to end."""
import pytest
import torch

from reward_density.data.problems import Problem
from reward_density.grpo.advantages import compute_advantages
from reward_density.grpo.logprobs import completion_logprobs
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.rewards import REGIMES, build_reward
from reward_density.rewards.distillation import DistillationReward
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\nStep 1:", "41")]
EPS = 1e-4


@pytest.fixture(scope="module")
def rollout(tiny_tokenizer):
    student = build_qwen3(len(tiny_tokenizer), seed=0)
    return sample_rollout(student, tiny_tokenizer, PROBLEMS, 4, SamplingConfig(max_new_tokens=10, temperature=0.7),
                          seed=0)


@pytest.fixture(scope="module")
def teacher(tiny_tokenizer):
    return build_qwen3(len(tiny_tokenizer), seed=1, hidden=48)


def test_distillation_deposits_teacher_minus_student_logprob_on_every_valid_token(rollout, teacher):
    deposits = DistillationReward(teacher, temperature=0.7)(rollout)
    with torch.no_grad():
        teacher_logps = completion_logprobs(teacher, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                            rollout.completion_mask, 0.7)
    mask = rollout.completion_mask
    assert torch.equal(deposits.deposit_mask, mask), "distillation must deposit on every valid token, EOS included"
    want = (teacher_logps - rollout.sampler_logps) * mask
    assert torch.allclose(deposits.token_rewards, want, atol=1e-6)
    assert torch.allclose(deposits.trajectory_rewards, want.sum(-1), atol=1e-5)


def test_distillation_advantage_is_the_normalised_deposit_per_token(rollout, teacher):
    deposits = DistillationReward(teacher, temperature=0.7)(rollout)
    adv = compute_advantages(deposits.token_rewards, deposits.deposit_mask, rollout.completion_mask, 4, EPS)
    group = deposits.token_rewards[:4][rollout.completion_mask[:4]]
    want = (deposits.token_rewards[:4] - group.mean()) / (group.std() + EPS) * rollout.completion_mask[:4]
    assert torch.allclose(adv[:4], want, atol=1e-5), "dense deposits must not be summed into a return-to-go"


def test_distillation_refuses_a_teacher_with_a_smaller_vocabulary(rollout):
    small = build_qwen3(8, seed=2)
    with pytest.raises(ValueError, match="teacher's vocabulary"):
        DistillationReward(small, temperature=0.7)(rollout)


def test_outcome_advantage_is_the_group_normalised_scalar_on_every_valid_token(rollout):
    class Checker:  # every second completion "correct"; the real checker is pinned in test_answer_check.py
        def check(self, golds, completions):
            from reward_density.data.answer_check import Verdict
            return [Verdict.CORRECT if i % 2 else Verdict.WRONG for i in range(len(golds))]

    deposits = build_reward("outcome", checker=Checker())(rollout)
    adv = compute_advantages(deposits.token_rewards, deposits.deposit_mask, rollout.completion_mask, 4, EPS)
    r = deposits.trajectory_rewards
    for g in range(0, 8, 4):
        z = (r[g : g + 4] - r[g : g + 4].mean()) / (r[g : g + 4].std() + EPS)
        for i in range(4):
            valid = rollout.completion_mask[g + i]
            assert torch.allclose(adv[g + i][valid], z[i].expand(int(valid.sum()))), f"row {g + i} is not its scalar"


def test_unknown_regime_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError,
                       match=r"unknown regime 'dense'; expected one of \('outcome', 'process', 'distillation'\)"):
        build_reward("dense")


@pytest.mark.parametrize("regime", REGIMES)
def test_a_regime_without_its_parts_names_what_is_missing(regime):
    with pytest.raises(ValueError, match=f"the {regime} reward needs"):
        build_reward(regime)

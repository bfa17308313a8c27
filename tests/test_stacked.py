"""The stacked engine is the peft Policy, arm by arm: same log-probs, same step, same updated weights."""
from __future__ import annotations

import copy

import pytest
import torch

from reward_density.data.problems import Problem
from reward_density.grpo import logprobs as single
from reward_density.grpo.deposits import Deposits
from reward_density.grpo.loss import LossConfig
from reward_density.grpo.policy import Policy, PolicyConfig
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.grpo.stacked import StackedPolicy, check_stackable, completion_logprobs
from reward_density.grpo.step import StepConfig, grpo_step, stacked_grpo_step
from reward_density.grpo.token_selection import TokenSelection
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\nStep 1:", "41")]
CONFIGS = [PolicyConfig(rank=1), PolicyConfig(rank=4, alpha=8), PolicyConfig(rank=None)]
SEED = 3


def length_reward(modulus: int):
    """A deterministic outcome-shaped reward: on the last token, the completion's length mod `modulus`."""

    def reward(rollout) -> Deposits:
        mask = rollout.completion_mask.bool()
        last = mask.sum(-1) - 1
        rewards = torch.zeros(mask.shape)
        rewards[torch.arange(mask.shape[0]), last] = (last % modulus).float()
        deposits = torch.zeros_like(mask).index_put_((torch.arange(mask.shape[0]), last), torch.tensor(True))
        return Deposits(rewards, deposits, rewards.sum(-1))

    return reward


sparse_reward = length_reward(3)


def dense_reward(rollout) -> Deposits:
    """A deterministic distillation-shaped reward: on every token, its id mod 5."""
    mask = rollout.completion_mask.bool()
    rewards = (rollout.completion_ids % 5).float() * mask
    return Deposits(rewards, mask.clone(), rewards.sum(-1))


def policies(model, configs=CONFIGS) -> list[Policy]:
    """Each arm's own peft Policy, initialised as make_policy does (seed, then build)."""
    built = []
    for config in configs:
        torch.manual_seed(SEED)
        built.append(Policy(copy.deepcopy(model), config, keep_reference=True))
    return built


@pytest.fixture
def model(tiny_tokenizer):
    return build_qwen3(len(tiny_tokenizer), seed=0)


def paired_parameters(stacked: StackedPolicy, arm: int, policy: Policy) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, stacked parameter, peft policy parameter) for every trainable parameter of one arm."""
    theirs = {name.removeprefix("base_model.model.").removesuffix(".default.weight"): p
              for name, p in policy.model.named_parameters() if p.requires_grad}
    ours = stacked.named_parameters(arm)
    assert set(ours) == set(theirs), f"parameter names differ: {sorted(set(ours) ^ set(theirs))[:6]}"
    return [(name, ours[name], theirs[name]) for name in ours]


def perturbed(stacked: StackedPolicy, arms: list[Policy]) -> None:
    """Move every arm off the base, identically in both forms, so the arms differ from each other."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for a, policy in enumerate(arms):
            for _, ours, theirs in paired_parameters(stacked, a, policy):
                torch.testing.assert_close(ours, theirs, msg="the two forms start from different weights")
                noise = 0.05 * torch.randn(ours.shape, generator=generator)
                ours.add_(noise)
                theirs.add_(noise)


def test_each_arms_log_probs_are_its_peft_policys(model, tiny_tokenizer):
    stacked, arms = StackedPolicy(copy.deepcopy(model), CONFIGS, SEED), policies(model)
    perturbed(stacked, arms)
    sampling = SamplingConfig(12, temperature=1.0)
    with torch.no_grad():
        rollout = sample_rollout(stacked.weights(), tiny_tokenizer, PROBLEMS, 3, sampling, seed=5)
        ours = completion_logprobs(stacked.weights(), rollout, 0.7)
        reference = stacked.reference_logprobs(rollout, 0.7)
    n = rollout.num_completions // len(CONFIGS)
    assert n == len(PROBLEMS) * 3
    for a, policy in enumerate(arms):
        share = rollout.rows(a * n, (a + 1) * n)
        with torch.no_grad():
            theirs = single.completion_logprobs(policy.model, share.prompt_ids, share.prompt_mask, share.completion_ids,
                                                share.completion_mask, 0.7)
            torch.testing.assert_close(ours[a * n:(a + 1) * n], theirs, atol=2e-5, rtol=1e-4,
                                       msg=f"arm {CONFIGS[a]}: stacked log-probs differ from its peft policy")
            torch.testing.assert_close(reference[a * n:(a + 1) * n], policy.reference_logprobs(share, 0.7),
                                       atol=2e-5, rtol=1e-4, msg=f"arm {CONFIGS[a]}: reference differs")


def test_every_arm_at_the_base_scores_exactly_its_reference(tiny_tokenizer):
    # peft's log pi - log pi_ref is exactly 0 at the start; the paper's KL estimator clamps at 0, so round-off of
    # either sign would keep or drop a token's KL gradient, arm by arm
    configs = [PolicyConfig(rank=r) for r in (1, 2, 4, 8, 16)] + [PolicyConfig(rank=None)]
    stacked = StackedPolicy(build_qwen3(len(tiny_tokenizer), seed=0, hidden=128, layers=3), configs, SEED)
    with torch.no_grad():
        problems = [*PROBLEMS, Problem("c", "Problem: 5 + 9 = ?\n", "14"),
                    Problem("d", "Problem: 21 + 8 = ?\nStep 1:", "29")]  # a batch whose two passes pack apart
        rollout = sample_rollout(stacked.weights(), tiny_tokenizer, problems, 4, SamplingConfig(64), seed=501)
        ratio = completion_logprobs(stacked.weights(), rollout, 0.7) - stacked.reference_logprobs(rollout, 0.7)
    n = rollout.num_completions // len(configs)
    for a, config in enumerate(configs):
        assert torch.count_nonzero(ratio[a * n:(a + 1) * n]) == 0, f"arm {config}: log pi - log pi_ref is not 0"


def test_an_arm_samples_what_its_policy_samples_alone(model, tiny_tokenizer):
    stacked, arms = StackedPolicy(copy.deepcopy(model), CONFIGS, SEED), policies(model)
    sampling = SamplingConfig(10, temperature=0.9, top_p=0.95)
    with torch.no_grad():
        together = sample_rollout(stacked.weights(), tiny_tokenizer, PROBLEMS, 2, sampling, seed=11)
        alone = sample_rollout(arms[0].model, tiny_tokenizer, PROBLEMS, 2, sampling, seed=11)
    n = alone.num_completions
    for a in range(len(CONFIGS)):  # at initialisation every arm is the base, so all draw alike
        assert together.completions[a * n:(a + 1) * n] == alone.completions


METHODS = {  # the token-selection papers' methods are StepConfig settings of the same step
    "grpo": {},
    "s_grpo": {"token_selection": TokenSelection(alpha=2, k=5, p=0.5)},
    "t_spmo": {"advantage_estimator": "prefix_trie", "l2": 0.01},
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("reward", [sparse_reward, dense_reward], ids=["sparse", "dense"])
def test_one_stacked_step_is_each_arms_own_grpo_step(model, tiny_tokenizer, reward, method):
    config = StepConfig(group_size=3, sampling=SamplingConfig(10, temperature=0.9),
                        loss=LossConfig(beta=0.05, kl_estimator="k3"), max_grad_norm=0.5, **METHODS[method])
    rates = [3e-3, 1e-3, 1e-4]
    stacked, arms = StackedPolicy(copy.deepcopy(model), CONFIGS, SEED), policies(model)
    # SGD, not AdamW: where a gradient is zero in exact arithmetic (no reward spread in a group, the KL at the
    # reference), Adam scales the rounding noise up to a step of size lr, and that noise depends on the kernels.
    optimizer = torch.optim.SGD([{"params": stacked.parameters(a), "lr": lr} for a, lr in enumerate(rates)],
                                weight_decay=0.01)
    rows = stacked_grpo_step(stacked, tiny_tokenizer, optimizer, PROBLEMS, reward, config, seed=7)
    for a, (policy, lr) in enumerate(zip(arms, rates)):
        own = torch.optim.SGD(policy.trainable_parameters(), lr=lr, weight_decay=0.01)
        row = grpo_step(policy, tiny_tokenizer, own, PROBLEMS, reward, config, seed=7)
        for key in ("loss", "reward_mean", "advantage_std", "kl_ref", "grad_norm", "len_mean", "loss_tokens"):
            assert rows[a][key] == pytest.approx(row[key], rel=1e-4, abs=1e-6), f"arm {CONFIGS[a]}: {key}"
        for name, ours, theirs in paired_parameters(stacked, a, policy):
            torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5,
                                       msg=f"arm {CONFIGS[a]}: {name} after the step differs from its own step's")
    assert all(row["arms"] == len(CONFIGS) for row in rows)


def test_an_arm_trains_alike_alone_and_beside_other_arms_one_of_them_of_rank_above_the_hidden_size(model,
                                                                                                   tiny_tokenizer):
    config = StepConfig(group_size=2, sampling=SamplingConfig(10, temperature=0.9), loss=LossConfig(beta=0.05),
                        max_grad_norm=0.5)

    def trained(configs: list[PolicyConfig], rates: list[float]) -> dict[str, torch.Tensor]:
        stacked = StackedPolicy(copy.deepcopy(model), configs, SEED)
        optimizer = torch.optim.SGD([{"params": stacked.parameters(a), "lr": lr} for a, lr in enumerate(rates)])
        for step in range(3):
            stacked_grpo_step(stacked, tiny_tokenizer, optimizer, PROBLEMS, dense_reward, config, seed=20 + step)
        return stacked.named_parameters(0)

    hidden = model.config.hidden_size
    alone = trained([PolicyConfig(rank=1)], [3e-3])
    beside = trained([PolicyConfig(rank=1), PolicyConfig(rank=2 * hidden), PolicyConfig(rank=None)], [3e-3, 1e-2, 1e-3])
    for name, weight in alone.items():
        torch.testing.assert_close(beside[name], weight, atol=1e-6, rtol=1e-5,
                                   msg=f"rank 1's {name} depends on the arms stacked beside it")


def test_only_what_the_stacked_engine_reproduces_is_accepted(model):
    for bad in (PolicyConfig(rank=2, dropout=0.1), PolicyConfig(rank=2, precision="bf16")):
        with pytest.raises(ValueError, match="stacked engine"):
            check_stackable(model, [bad])


@pytest.mark.parametrize("setting, value", [("hidden_act", "gelu_pytorch_tanh"), ("attention_dropout", 0.3)])
def test_a_student_the_stacked_forward_would_not_reproduce_is_refused(tiny_tokenizer, setting, value):
    # its forward always applies SiLU and no dropout, where peft's training forward would apply the model's own
    student = build_qwen3(len(tiny_tokenizer), seed=0)
    setattr(student.config, setting, value)
    with pytest.raises(ValueError, match="plain Qwen3 student without dropout"):
        check_stackable(student, CONFIGS)


@pytest.mark.parametrize("beta, track_kl, scored", [(0.0, False, False), (0.0, True, True), (0.05, False, True)])
def test_the_reference_pass_runs_only_for_a_kl_penalty_or_tracked_kl(model, tiny_tokenizer, monkeypatch, beta,
                                                                      track_kl, scored):
    calls = []
    for cls in (StackedPolicy, Policy):
        original = cls.reference_logprobs
        monkeypatch.setattr(cls, "reference_logprobs",
                            lambda self, *args, _original=original, **kwargs:
                            calls.append(1) or _original(self, *args, **kwargs))
    config = StepConfig(2, SamplingConfig(6, temperature=0.7), LossConfig(beta=beta), track_kl=track_kl)
    stacked = StackedPolicy(copy.deepcopy(model), CONFIGS, SEED)
    optimizer = torch.optim.SGD([p for a in range(stacked.n_arms) for p in stacked.parameters(a)], lr=0.0)
    rows = stacked_grpo_step(stacked, tiny_tokenizer, optimizer, PROBLEMS, sparse_reward, config, seed=0)
    policy = policies(model, CONFIGS[:1])[0]
    row = grpo_step(policy, tiny_tokenizer, torch.optim.SGD(policy.trainable_parameters(), lr=0.0), PROBLEMS,
                    sparse_reward, config, seed=0)
    assert (len(calls) == 2) == scored, f"reference scored {len(calls)} times for beta={beta}, track_kl={track_kl}"
    kls = [r["kl_ref"] for r in rows] + [row["kl_ref"]]
    assert all((kl == kl) == scored for kl in kls), "kl_ref is recorded exactly when the reference was scored"

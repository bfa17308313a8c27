"""The token-selection papers' methods: S-GRPO's token rule, T-SPMO's prefix-trie advantages, and the
per-completion backward GRPO baseline."""
from __future__ import annotations

import copy

import pytest
import torch
from test_stacked import PROBLEMS, length_reward

from reward_density.data.answer_check import AnswerChecker
from reward_density.data.problems import Problem
from reward_density.experiment.cell import step_config
from reward_density.experiment.profiles import REPO_ROOT, cell_config, group_configs, load_profile
from reward_density.grpo import sampler
from reward_density.grpo.deposits import Deposits
from reward_density.grpo.loss import LossConfig
from reward_density.grpo.policy import Policy, PolicyConfig
from reward_density.grpo.prefix_trie import prefix_advantages
from reward_density.grpo.replay import ReplayBuffer, ReplayConfig
from reward_density.grpo.sampler import SamplingConfig
from reward_density.grpo.step import StepConfig, grpo_step, loss_inputs
from reward_density.grpo.text_rollout import rollout_from_text
from reward_density.grpo.token_selection import TokenSelection, select_tokens
from reward_density.rewards.outcome import OutcomeReward
from reward_density.rewards.process import ProcessReward
from reward_density.tools.stand_ins import build_qwen3

# ------------------------------------------------------------------ S-GRPO (Eq. 6)


def lengths_mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def test_the_first_alpha_tokens_are_always_chosen_and_never_more_than_k():
    mask = lengths_mask([40, 3, 25, 0], 40).repeat(50, 1)
    chosen = select_tokens(mask, TokenSelection(alpha=4, k=10, p=0.7), torch.Generator().manual_seed(0), 40)
    assert not (chosen & ~mask).any(), "a padding position was chosen"
    early = mask & (torch.arange(40) < 4)
    assert (chosen | ~early).all(), "a token before alpha was left out"
    assert (chosen.sum(-1) <= 10).all(), f"up to {int(chosen.sum(-1).max())} tokens chosen, k = 10"


def test_later_tokens_are_chosen_with_probability_p_while_there_is_room():
    mask = lengths_mask([100] * 400, 100)
    chosen = select_tokens(mask, TokenSelection(alpha=5, k=1000, p=0.3), torch.Generator().manual_seed(1), 100)
    late = chosen[:, 5:].float().mean()
    assert abs(float(late) - 0.3) < 0.01, f"later tokens chosen at rate {float(late):.3f}, P = 0.3"


def test_the_k_chosen_tokens_are_the_first_k_candidates():
    mask = lengths_mask([30], 30)
    chosen = select_tokens(mask, TokenSelection(alpha=0, k=6, p=1.0), torch.Generator().manual_seed(0), 30)
    assert chosen[0].tolist() == [True] * 6 + [False] * 24, "with p = 1 the first k tokens are the subset"
    assert select_tokens(mask, TokenSelection(2, 5, 0.0), torch.Generator(), 30)[0].sum() == 2, "p = 0: alpha only"


def test_a_rows_chosen_tokens_do_not_depend_on_how_wide_its_batch_was_padded():
    # The stacked engine pads every arm to the widest completion of any arm; alone, an arm pads to its own.
    rule, narrow = TokenSelection(alpha=1, k=1000, p=0.5), lengths_mask([3, 8, 5], 8)
    wide = torch.cat([narrow, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    alone = select_tokens(narrow, rule, torch.Generator().manual_seed(3), 16)
    stacked = select_tokens(wide, rule, torch.Generator().manual_seed(3), 16)
    assert torch.equal(stacked[:, :8], alone), "padding the batch wider changed which tokens a row keeps"


def test_the_coins_are_not_the_samplers_own_random_draws(monkeypatch, tiny_tokenizer):
    # Eq. 6 keeps each later token by an independent coin; the sampler's uniforms chose the tokens themselves.
    draws = []
    uniforms = sampler._uniforms
    monkeypatch.setattr(sampler, "_uniforms", lambda *args: draws.append(uniforms(*args)) or draws[-1])
    config = StepConfig(group_size=8, sampling=SamplingConfig(16, temperature=0.7),
                        token_selection=TokenSelection(alpha=0, k=10**6, p=0.5))
    model = build_qwen3(len(tiny_tokenizer), seed=0).eval()
    rollout = sampler.sample_rollout(model, tiny_tokenizer, PROBLEMS[:2], 8, config.sampling, seed=7)
    mask = rollout.completion_mask.bool()
    deposits = Deposits(torch.zeros(mask.shape), torch.zeros_like(mask), torch.zeros(mask.shape[0]))
    _, subset = loss_inputs(rollout, deposits, config, seed=7)
    n, t = mask.shape
    sampler_coins = (torch.cat([u.reshape(-1) for u in draws])[: n * t].reshape(n, t) < 0.5) & mask
    assert not torch.equal(subset, sampler_coins), "S-GRPO's coins replay the uniforms that sampled the tokens"


@pytest.mark.parametrize("alpha, k, p, message", [(-1, 5, 0.5, "alpha"), (2, 0, 0.5, "k must"), (2, 5, 1.5, "p must")])
def test_a_bad_token_rule_is_refused(alpha, k, p, message):
    with pytest.raises(ValueError, match=message):
        TokenSelection(alpha, k, p)


# ------------------------------------------------------------------ T-SPMO (Eq. 7-10)


def padded(sequences: list[list[int]], width: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, tokens in enumerate(sequences):
        ids[row, : len(tokens)] = torch.tensor(tokens)
    return ids, lengths_mask([len(s) for s in sequences], width)


def test_prefix_advantages_match_a_hand_built_trie():
    # Group: [1 2 3] R=1, [1 2 4] R=0, [5] R=1. E[R | empty] = 2/3, E[R | 1] = E[R | 1 2] = 1/2.
    ids, mask = padded([[1, 2, 3], [1, 2, 4], [5]])
    advantages, subset = prefix_advantages(ids, mask, torch.tensor([1.0, 0.0, 1.0]), group_size=3)
    expected = torch.zeros(3, 5)
    expected[0, :3] = torch.tensor([1 / 2 - 2 / 3, 0.0, 1 - 1 / 2])  # (empty, 1), (1, 2), (1 2, 3)
    expected[1, 2] = 0 - 1 / 2  # (1 2, 4); its (empty, 1) and (1, 2) were counted on row 0
    expected[2, 0] = 1 - 2 / 3  # (empty, 5)
    torch.testing.assert_close(advantages, expected)
    assert subset.tolist() == [[True, True, True, False, False], [False, False, True, False, False],
                               [True, False, False, False, False]], "each unique (prefix, token) counted once"


def test_prefix_advantages_are_zero_without_a_contrast():
    ids, mask = padded([[1, 2], [1, 3]])
    same, _ = prefix_advantages(ids, mask, torch.tensor([0.5, 0.5]), group_size=2)
    assert not same.any(), "equal rewards: no transition changes the expected reward"
    alone, subset = prefix_advantages(ids, mask, torch.tensor([1.0, 0.0]), group_size=1)
    assert not alone.any() and subset.tolist() == mask.tolist(), "a single completion: every transition, advantage 0"


def test_groups_do_not_share_a_trie():
    ids, mask = padded([[7], [8], [7], [8]])
    advantages, subset = prefix_advantages(ids, mask, torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    assert advantages[:, 0].tolist() == [0.5, -0.5, -0.5, 0.5] and subset[:, 0].all()


# ------------------------------------------------------------------ the per-completion backward baseline


def test_one_completion_at_a_time_gives_the_batched_steps_gradient(tiny_tokenizer):
    model = build_qwen3(len(tiny_tokenizer), seed=0)
    gradients = []
    for micro_batch_size in (None, 1):  # the whole batch at once, then forward and backward per completion
        torch.manual_seed(0)
        policy = Policy(copy.deepcopy(model), PolicyConfig(rank=4), keep_reference=True)
        config = StepConfig(3, SamplingConfig(8, temperature=0.9), LossConfig(beta=0.05),
                            micro_batch_size=micro_batch_size, max_grad_norm=1e9)
        optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)  # keep the gradient, move nothing
        grpo_step(policy, tiny_tokenizer, optimizer, PROBLEMS, length_reward(3), config, seed=5)
        gradients.append([p.grad.clone() for p in policy.trainable_parameters()])
    for batched, one_by_one in zip(*gradients):
        torch.testing.assert_close(one_by_one, batched, atol=1e-6, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in gradients[0]), "the test needs a non-zero gradient"


# ------------------------------------------------------------------ chosen by a cell's params


def test_a_cell_chooses_its_method_by_params():
    profile = load_profile(REPO_ROOT / "params" / "smoke.yaml")
    config = cell_config(profile, "outcome", 1, 0, token_alpha=2, token_k=8, token_p=0.5,
                         advantage_estimator="prefix_trie", l2=0.01)
    step = step_config(config)
    assert step.token_selection == TokenSelection(2, 8, 0.5)
    assert (step.advantage_estimator, step.l2) == ("prefix_trie", 0.01)
    assert step_config(cell_config(profile, "outcome", 1, 0)).token_selection is None, "GRPO keeps every token"
    loss = step_config(cell_config(profile, "outcome", 1, 0, kl_estimator="k3", loss_normalisation="sequence_mean",
                                   beta=0.1)).loss
    assert (loss.kl_estimator, loss.normalisation, loss.beta) == ("k3", "sequence_mean", 0.1), \
        f"the cell's loss settings did not reach the loss: {loss}"
    with pytest.raises(ValueError, match="token_alpha, token_k and token_p together; \\['token_k', 'token_p'\\] unset"):
        cell_config(profile, "outcome", 1, 0, token_alpha=2)
    with pytest.raises(ValueError, match="advantage_estimator = 'trie'"):
        cell_config(profile, "outcome", 1, 0, advantage_estimator="trie")


# ------------------------------------------------------------------ T-SPMO's replay


def rollout_of(tokenizer, problem: Problem, texts: list[str]):
    return rollout_from_text(tokenizer, [problem] * len(texts), texts, group_size=len(texts))


def test_replay_restarts_from_a_prefix_of_a_stored_success_or_failure(tiny_tokenizer):
    problem = Problem("p", "Problem: 3 + 4 = ?\n", "7")
    texts = ["3 + 4 = 7", "3 + 4 = 8", "4 + 3 = 7", "9"]
    buffer = ReplayBuffer(ReplayConfig(threshold=1.0, successes=1, failures=5), seed=0)
    buffer.add([problem], rollout_of(tiny_tokenizer, problem, texts), torch.tensor([1.0, 0.0, 1.0, 0.0]),
               tiny_tokenizer.eos_token_id)
    assert len(buffer.successes) == 2 and len(buffer.failures) == 2, "split at the threshold r"
    drawn = buffer.draw(tiny_tokenizer)
    assert len(drawn) == 3, "C_success = 1 of two successes, and both failures (C_failure = 5 > 2 stored)"
    for restarted in drawn:
        assert restarted.prompt.startswith(problem.prompt) and restarted.answer == "7"
        kept = restarted.prompt[len(problem.prompt):]
        assert any(text.startswith(kept) for text in texts), f"{kept!r} is not a prefix of a stored completion"
        assert restarted.question == problem.prompt, "a PRM still sees the bare question"
        assert restarted.prefix == kept, "the rewards must know which part of the completion the prompt holds"
    assert len({p.problem_id for p in drawn}) == 3


def test_each_stored_completion_keeps_the_problem_its_group_answered(tiny_tokenizer):
    a, b = Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 1 + 3 = ?\n", "4")
    rollout = rollout_from_text(tiny_tokenizer, [a, a, b, b], ["7", "8", "4", "5"], group_size=2)
    buffer = ReplayBuffer(ReplayConfig(threshold=0.0, successes=4, failures=0), seed=0)
    buffer.add([a, b], rollout, torch.ones(4), tiny_tokenizer.eos_token_id)
    assert [stored.problem.problem_id for stored in buffer.successes] == ["a", "a", "b", "b"]


def test_an_empty_stored_completion_restarts_from_the_bare_prompt(tiny_tokenizer):
    problem = Problem("p", "Problem: 3 + 4 = ?\n", "7")
    buffer = ReplayBuffer(ReplayConfig(threshold=1.0, successes=1, failures=0), seed=0)
    buffer.add([problem], rollout_of(tiny_tokenizer, problem, [""]), torch.ones(1), tiny_tokenizer.eos_token_id)
    (drawn,) = buffer.draw(tiny_tokenizer)
    assert drawn.prompt == problem.prompt and drawn.prefix == "", "the cut may fall before the first token"


def test_a_restarted_completion_is_scored_whole_when_its_answer_began_before_the_restart(tiny_tokenizer):
    # The paper restarts generation from the partial sequence: what is scored is prefix + continuation.
    kept = "3 + 4 = 7\nAnswer: \\boxed{"
    restarted = Problem("p@replay0", "Problem: 3 + 4 = ?\n" + kept, "7", question="Problem: 3 + 4 = ?\n", prefix=kept)
    rollout = rollout_from_text(tiny_tokenizer, [restarted] * 2, ["7}", "8}"], group_size=2)
    with AnswerChecker(timeout_seconds=5.0) as checker:
        rewards = OutcomeReward(checker)(rollout).trajectory_rewards
    assert rewards.tolist() == [1.0, 0.0], f"the continuation alone was scored: rewards {rewards.tolist()}"


def test_the_process_reward_refuses_completions_restarted_by_replay(tiny_tokenizer):
    restarted = Problem("p@replay0", "Problem: 3 + 4 = ?\n3 + 4", "7", prefix="3 + 4")
    rollout = rollout_from_text(tiny_tokenizer, [restarted], [" = 7"])
    with pytest.raises(ValueError, match="does not score completions restarted by replay"):
        ProcessReward(scorer=None, student_tokenizer=tiny_tokenizer)(rollout)


def test_replay_in_the_process_regime_is_refused_before_any_work():
    profile = load_profile(REPO_ROOT / "params" / "mini.yaml")
    with pytest.raises(ValueError, match="replay restarts completions inside their steps"):
        cell_config(profile, "process", 1, 0, engine="peft", replay_successes=1)


def test_a_step_with_replay_updates_again_on_the_replayed_groups(tiny_tokenizer):
    torch.manual_seed(0)
    policy = Policy(build_qwen3(len(tiny_tokenizer), seed=0), PolicyConfig(rank=2), keep_reference=False)
    config = StepConfig(3, SamplingConfig(8, temperature=0.9), LossConfig(beta=0.0), advantage_estimator="prefix_trie",
                        l2=0.01)
    buffer = ReplayBuffer(ReplayConfig(threshold=1.0, successes=1, failures=1), seed=0)
    row = grpo_step(policy, tiny_tokenizer, torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3), PROBLEMS,
                    length_reward(2), config, seed=3, replay=buffer)
    assert len(buffer.successes) + len(buffer.failures) == 6, "the step's 2 x 3 completions are stored"
    assert row["replayed"] == min(1, len(buffer.successes)) + min(1, len(buffer.failures)) > 0
    assert "replay_loss" in row and row["loss_tokens"] > 0
    assert row["completions"] == 6 and row["replay_completions"] == row["replayed"] * 3, "the second update's size"
    assert row["replay_loss_tokens"] > 0 and row["replay_len_mean"] > 0, "the second update's tokens went unlogged"


def test_replay_is_refused_where_arms_share_their_prompts():
    profile = load_profile(REPO_ROOT / "params" / "smoke.yaml")
    with pytest.raises(ValueError, match="cannot replay .* set engine: peft, or change replay_failures"):
        group_configs(profile, "outcome", [1, 2], 0, replay_failures=2)

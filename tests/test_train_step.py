"""One whole GRPO step on a tiny random Qwen3: what changes, what does not, and determinism."""
import pytest
import torch

from reward_density.data.problems import Problem
from reward_density.data.sources import load_causal_lm, load_tokenizer
from reward_density.grpo.deposits import Deposits
from reward_density.grpo.logprobs import completion_logprobs
from reward_density.grpo.loss import LossConfig, LossOutput
from reward_density.grpo.policy import Policy, PolicyConfig
from reward_density.grpo.rollout import Rollout
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.grpo.step import StepConfig, grpo_step, step_metrics
from reward_density.rewards.distillation import DistillationReward
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\n", "41")]
METRICS = ["loss", "reward_mean", "advantage_std", "advantage_abs_max", "kl_ref", "clip_frac", "grad_norm",
           "len_mean", "len_max", "frac_truncated", "frac_answered", "steps_mean", "deposits_mean", "step_seconds",
           "generate_seconds", "reward_seconds", "reference_seconds", "train_seconds"]
TIMINGS = {"step_seconds", "generate_seconds", "reward_seconds", "reference_seconds", "train_seconds"}


def run_step(model_dir, tokenizer, rank, beta=0.05, seed=0, lr=1e-2):
    torch.manual_seed(seed)
    policy = Policy(load_causal_lm(model_dir), PolicyConfig(rank=rank), keep_reference=beta > 0)
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    reward = DistillationReward(build_qwen3(len(tokenizer), seed=11), temperature=0.7)
    config = StepConfig(group_size=4, sampling=SamplingConfig(max_new_tokens=8, temperature=0.7, top_p=0.95),
                        loss=LossConfig(beta=beta, kl_estimator="paper"))
    metrics = grpo_step(policy, tokenizer, optimizer, PROBLEMS, reward, config, seed=seed)
    changed = {name for name, p in policy.model.named_parameters() if not torch.equal(before[name], p.detach())}
    return policy, metrics, changed, set(before)


def test_lora_rank_1_step_changes_only_adapter_weights(tiny_model_dir, tiny_tokenizer):
    policy, _, changed, names = run_step(tiny_model_dir, tiny_tokenizer, rank=1)
    assert changed, "a LoRA step changed nothing"
    frozen = sorted(name for name in changed if "lora_" not in name)
    assert not frozen, f"base weights changed under LoRA: {frozen[:5]}"
    lora_b = {name for name in names if "lora_B" in name}
    assert lora_b <= changed, "every lora_B matrix must move on the first step (lora_A gets no gradient while B = 0)"
    adapters = [m for m in policy.model.modules() if hasattr(m, "lora_A") and "default" in m.lora_A]
    assert adapters and all(m.lora_A["default"].weight.shape[0] == 1 for m in adapters), "adapter rank is not 1"


def test_full_fine_tuning_step_changes_every_weight(tiny_model_dir, tiny_tokenizer):
    _, _, changed, names = run_step(tiny_model_dir, tiny_tokenizer, rank=None)
    assert changed == names, f"weights left unchanged by a FullFT step: {sorted(names - changed)[:5]}"


def test_full_fine_tuning_keeps_a_reference_copy_only_when_beta_is_positive(tiny_model_dir, tiny_tokenizer):
    with_kl, metrics, _, _ = run_step(tiny_model_dir, tiny_tokenizer, rank=None, beta=0.05)
    without, metrics_free, _, _ = run_step(tiny_model_dir, tiny_tokenizer, rank=None, beta=0.0)
    assert with_kl.has_reference and not without.has_reference
    assert metrics["kl_ref"] >= 0 and metrics_free["kl_ref"] != metrics_free["kl_ref"], (
        "beta 0 must skip the reference pass")


@pytest.mark.parametrize("rank", [1, None])
def test_same_seed_gives_identical_metrics(tiny_model_dir, tiny_tokenizer, rank):
    _, first, _, _ = run_step(tiny_model_dir, tiny_tokenizer, rank=rank, seed=3)
    _, second, _, _ = run_step(tiny_model_dir, tiny_tokenizer, rank=rank, seed=3)
    strip = lambda m: {k: v for k, v in m.items() if k not in TIMINGS}  # noqa: E731
    assert strip(first) == strip(second)


def test_metrics_row_carries_every_contract_name(tiny_model_dir, tiny_tokenizer):
    _, metrics, _, _ = run_step(tiny_model_dir, tiny_tokenizer, rank=2)
    missing = [name for name in METRICS if name not in metrics]
    assert not missing, f"metrics row lacks {missing}"
    assert metrics["len_max"] <= 8 and 0 <= metrics["frac_truncated"] <= 1
    assert metrics["deposits_mean"] == metrics["len_mean"], "distillation deposits on every completion token"


@pytest.mark.parametrize(("answer_format", "expected"), [("boxed", 1 / 3), ("last_integer", 2 / 3)])
def test_frac_answered_counts_answers_in_the_tasks_own_format(answer_format, expected):
    completions = [r"so \boxed{7}", "3 * 4 = 12, so the product is 12", "no number here"]
    n, width = len(completions), 4
    mask = torch.ones(n, width, dtype=torch.long)
    rollout = Rollout(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long), mask.clone(), mask,
                      torch.zeros(n, width), torch.zeros(n, dtype=torch.bool), n, ["q"] * n, completions, ["7"] * n)
    deposits = Deposits(torch.zeros(n, width), torch.zeros(n, width, dtype=torch.bool), torch.zeros(n))
    out = LossOutput(torch.zeros(()), 0.0, 0.0, 1.0)
    config = StepConfig(group_size=n, sampling=SamplingConfig(max_new_tokens=width), answer_format=answer_format)
    row = step_metrics(rollout, deposits, torch.zeros(n, width), None, out, 0.0, config)
    assert row["frac_answered"] == pytest.approx(expected), f"{answer_format}: {row['frac_answered']}"


def test_an_unknown_answer_format_is_refused_by_the_step():
    with pytest.raises(ValueError, match="unknown answer format 'words'"):
        StepConfig(group_size=2, sampling=SamplingConfig(max_new_tokens=4), answer_format="words")


def test_the_step_time_splits_into_generate_reward_reference_and_train(tiny_model_dir, tiny_tokenizer):
    _, metrics, _, _ = run_step(tiny_model_dir, tiny_tokenizer, rank=None, beta=0.05)
    phases = [metrics[f"{phase}_seconds"] for phase in ("generate", "reward", "reference", "train")]
    assert all(seconds > 0 for seconds in phases), f"a phase was not timed: {phases}"
    assert sum(phases) == pytest.approx(metrics["step_seconds"]), "the phases must add up to the step"


@pytest.mark.parametrize("rank", [0, -3, 2.5, True, "4"])
def test_rank_that_is_not_a_positive_integer_is_refused(rank):
    with pytest.raises(ValueError, match="LoRA rank must be a positive integer"):
        PolicyConfig(rank=rank)


def test_missing_model_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found: .*nowhere"):
        load_causal_lm(tmp_path / "nowhere")


def test_group_sampling_at_temperature_zero_is_refused():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        StepConfig(group_size=4, sampling=SamplingConfig(max_new_tokens=4, temperature=0.0))


def test_tokenizer_loads_from_its_folder_and_one_without_eos_is_refused(tiny_model_dir, tmp_path):
    assert load_tokenizer(tiny_model_dir).eos_token == "<eos>"
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no EOS token"):
        load_tokenizer(tmp_path)


def test_a_folder_that_is_not_a_saved_model_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_causal_lm(tmp_path)


def test_sampling_from_the_merged_adapter_matches_the_unmerged_policy(tiny_model_dir, tiny_tokenizer):
    torch.manual_seed(0)
    policy = Policy(load_causal_lm(tiny_model_dir), PolicyConfig(rank=2), keep_reference=True)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)  # a trained adapter: merging must change the sampled distribution
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.7)
    with policy.sampling() as merged:
        assert any(m.merged for m in merged.modules() if hasattr(m, "merged")), "the adapter was not merged"
        rollout = sample_rollout(merged, tiny_tokenizer, PROBLEMS, 3, sampling, seed=1)
    learner = completion_logprobs(policy.model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                  rollout.completion_mask, 0.7)
    assert torch.allclose(rollout.sampler_logps, learner, atol=1e-4), "merged sampling drew from another policy"
    changed = [n for n, p in policy.model.named_parameters() if "lora_" not in n and not torch.equal(p, base[n])]
    assert not changed, f"merging and unmerging left round-off in the frozen base: {changed[:3]}"

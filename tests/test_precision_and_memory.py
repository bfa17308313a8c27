"""GPU-execution options on CPU: micro-batched loss, activation checkpointing, bf16 autocast over fp32 weights."""
import pytest
import torch

from reward_density.data.problems import Problem
from reward_density.data.sources import load_causal_lm
from reward_density.grpo.logprobs import micro_batches
from reward_density.grpo.loss import BatchTotals, LossConfig, grpo_loss
from reward_density.grpo.policy import Policy, PolicyConfig
from reward_density.grpo.precision import autocast, frozen_dtype
from reward_density.grpo.sampler import SamplingConfig
from reward_density.grpo.step import StepConfig, grpo_step
from reward_density.rewards.distillation import DistillationReward
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\n", "41")]


@pytest.mark.parametrize("normalisation", ["token_mean", "sequence_mean", "constant"])
def test_micro_batch_losses_add_up_to_the_whole_batch_loss_and_gradient(normalisation):
    torch.manual_seed(0)
    n, t = 6, 9
    logps = (-torch.rand(n, t, dtype=torch.float64) * 3).requires_grad_()
    old = logps.detach() + 0.1 * torch.randn(n, t, dtype=torch.float64)
    ref = logps.detach() + 0.1 * torch.randn(n, t, dtype=torch.float64)
    advantages = torch.randn(n, t, dtype=torch.float64)
    mask = torch.arange(t).expand(n, t) < torch.tensor([9, 3, 7, 1, 9, 5]).unsqueeze(1)
    config = LossConfig(beta=0.05, normalisation=normalisation, constant_length=t)

    whole = grpo_loss(logps, old, advantages, mask, config, ref_logps=ref).loss
    (whole_grad,) = torch.autograd.grad(whole, logps)
    totals = BatchTotals(rows=n, tokens=float(mask.sum()))
    shares = [grpo_loss(logps[r], old[r], advantages[r], mask[r], config, ref_logps=ref[r], totals=totals).loss
              for r in micro_batches(n, 4)]
    (shared_grad,) = torch.autograd.grad(sum(shares), logps)
    assert float(sum(shares).detach()) == pytest.approx(float(whole.detach()), abs=1e-12), (
        "micro-batch shares do not sum to the loss")
    assert torch.allclose(shared_grad, whole_grad, atol=1e-12), "micro-batched gradients differ from the whole batch's"


def test_micro_batches_cover_every_row_once():
    assert micro_batches(5, None) == [slice(0, 5)]
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    with pytest.raises(ValueError, match="micro_batch_size must be a positive integer"):
        micro_batches(5, 0)


def gradients_after_a_step(model_dir, tokenizer, rank, **options):
    """The clipped gradients of one GRPO step (SGD at lr 0 leaves the weights as they were)."""
    policy_options = {k: options.pop(k) for k in ("precision", "gradient_checkpointing") if k in options}
    torch.manual_seed(0)
    policy = Policy(load_causal_lm(model_dir), PolicyConfig(rank=rank, **policy_options), keep_reference=True)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    reward = DistillationReward(build_qwen3(len(tokenizer), seed=11), temperature=0.7)
    config = StepConfig(group_size=4, sampling=SamplingConfig(max_new_tokens=8, temperature=0.7, top_p=0.95),
                        loss=LossConfig(beta=0.05), **options)
    metrics = grpo_step(policy, tokenizer, optimizer, PROBLEMS, reward, config, seed=5)
    return policy, metrics, {name: p.grad.clone() for name, p in policy.model.named_parameters() if p.grad is not None}


def assert_same_gradients(first, second, atol):
    assert first.keys() == second.keys(), "the two runs trained different parameters"
    worst = max(float((first[k] - second[k]).abs().max()) for k in first)
    assert worst <= atol, f"gradients differ by up to {worst:.2e}"


@pytest.mark.parametrize("rank", [2, None])
def test_a_micro_batched_step_computes_the_same_gradients_and_metrics(tiny_model_dir, tiny_tokenizer, rank):
    _, whole_metrics, whole = gradients_after_a_step(tiny_model_dir, tiny_tokenizer, rank)
    _, micro_metrics, micro = gradients_after_a_step(tiny_model_dir, tiny_tokenizer, rank, micro_batch_size=3)
    assert_same_gradients(whole, micro, atol=1e-6)
    for name in ("loss", "kl_ref", "clip_frac", "ratio_mean", "grad_norm", "reward_mean", "len_mean"):
        assert micro_metrics[name] == pytest.approx(whole_metrics[name], rel=1e-5, abs=1e-7), f"{name} changed"


@pytest.mark.parametrize("rank", [2, None])
def test_activation_checkpointing_leaves_the_gradients_unchanged(tiny_model_dir, tiny_tokenizer, rank):
    _, _, plain = gradients_after_a_step(tiny_model_dir, tiny_tokenizer, rank)
    policy, _, checkpointed = gradients_after_a_step(tiny_model_dir, tiny_tokenizer, rank, gradient_checkpointing=True)
    base = policy.model.get_base_model() if rank else policy.model
    assert base.is_activation_checkpointing, "checkpointing was not switched on"
    assert_same_gradients(plain, checkpointed, atol=1e-6)


def test_bf16_lora_stores_the_frozen_base_in_bf16_and_trains_fp32_adapters(tiny_model_dir, tiny_tokenizer):
    policy, metrics, grads = gradients_after_a_step(tiny_model_dir, tiny_tokenizer, 2, precision="bf16")
    dtypes = {name: p.dtype for name, p in policy.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}, "LoRA adapters must stay fp32"
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}, "the frozen base should be bf16"
    assert grads and all(g.dtype == torch.float32 for g in grads.values())
    assert all(value == value for key, value in metrics.items() if key != "kl_ref"), f"NaN metric in {metrics}"


def test_bf16_full_fine_tuning_keeps_fp32_master_weights_and_a_bf16_reference(tiny_model_dir, tiny_tokenizer):
    policy, metrics, grads = gradients_after_a_step(tiny_model_dir, tiny_tokenizer, None, precision="bf16")
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}, "FullFT master weights must be fp32"
    assert {p.dtype for p in policy._reference.parameters()} == {torch.bfloat16}
    assert len(grads) == len(list(policy.model.parameters())) and metrics["kl_ref"] >= 0


@pytest.mark.parametrize("rank", [2, None], ids=["lora", "full"])
def test_bf16_storage_leaves_the_rotary_frequencies_fp32(tiny_model_dir, rank):
    # from_pretrained in bf16 keeps inv_freq fp32; a bf16 inv_freq would shift every arm's positions but FullFT's
    student = load_causal_lm(tiny_model_dir, dtype=torch.float32 if rank is None else torch.bfloat16)
    exact = load_causal_lm(tiny_model_dir).model.rotary_emb.inv_freq
    policy = Policy(student, PolicyConfig(rank=rank, precision="bf16"), keep_reference=True)
    frozen = policy.model.get_base_model() if rank else policy._reference
    assert {p.dtype for p in frozen.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert frozen.model.rotary_emb.inv_freq.dtype == torch.float32, "the bf16 cast rounded the rotary frequencies"
    assert torch.equal(frozen.model.rotary_emb.inv_freq, exact)


def test_bf16_autocast_runs_matmuls_in_bf16_and_fp32_changes_nothing():
    weight = torch.randn(4, 4)
    with autocast("cpu", "bf16"):
        assert (weight @ weight).dtype == torch.bfloat16
    with autocast("cpu", "fp32"):
        assert (weight @ weight).dtype == torch.float32
    assert frozen_dtype("bf16") == torch.bfloat16 and frozen_dtype("fp32") == torch.float32
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        autocast("cpu", "fp16")

"""Parity with TRL: GRPOTrainer's own loss on identical tensors, wherever the two define the same thing."""
import warnings

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from reward_density.grpo.logprobs import completion_logprobs
from reward_density.grpo.loss import LossConfig, grpo_loss

TEMPERATURE = 0.7
COMPLETION_LEN = 6
# TRL loss type -> our normalisation (TRL's dapo equals a token mean over one batch).
NORMALISATIONS = {"grpo": "sequence_mean", "bnpo": "token_mean", "dr_grpo": "constant", "dapo": "token_mean"}


def build_trainer(model_dir, tokenizer, loss_type, beta, tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        loss_type=loss_type,
        beta=beta,
        epsilon=0.2,
        temperature=TEMPERATURE,
        importance_sampling_level="token",
        use_bias_correction_kl=False,  # classic GRPO k3, as ours
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=COMPLETION_LEN,
        report_to=[],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(
            model=str(model_dir),
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["1 + 2 = ?"] * 4}),
            processing_class=tokenizer,
        )
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def identical_tensors(vocab_size, seed, token_level_advantages):
    """Equal-length prompts (no left padding) and right-padded completions with EOS-included masks."""
    g = torch.Generator().manual_seed(seed)
    n = 4
    prompt_ids = torch.randint(2, vocab_size, (n, 5), generator=g)
    completion_ids = torch.randint(2, vocab_size, (n, COMPLETION_LEN), generator=g)
    lengths = torch.tensor([6, 4, 2, 5])
    completion_mask = (torch.arange(COMPLETION_LEN)[None, :] < lengths[:, None]).long()
    shape = (n, COMPLETION_LEN) if token_level_advantages else (n,)
    advantages = torch.randn(shape, generator=g)
    return prompt_ids, completion_ids, completion_mask, advantages, g


def gradients(model):
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("token_level_advantages", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", list(NORMALISATIONS))
def test_loss_and_gradients_match_trl_grpo_trainer(tiny_model_dir, tiny_tokenizer, tmp_path, loss_type, beta,
                                                   token_level_advantages):
    trainer = build_trainer(tiny_model_dir, tiny_tokenizer, loss_type, beta, tmp_path)
    model = trainer.model
    prompt_ids, completion_ids, completion_mask, advantages, g = identical_tensors(len(tiny_tokenizer), 1,
                                                                                   token_level_advantages)
    prompt_mask = torch.ones_like(prompt_ids)

    with torch.no_grad():
        current = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, TEMPERATURE)
    # A stale sampler and a distinct reference, so the ratio leaves the clip range and the KL is non-zero.
    sampler_logps = (current + 0.6 * torch.randn(current.shape, generator=g)) * completion_mask
    ref_logps = (current + 0.3 * torch.randn(current.shape, generator=g)) * completion_mask

    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": sampler_logps,
        "ref_per_token_logps": ref_logps,
        "num_items_in_batch": completion_mask.sum(),
    }
    model.zero_grad(set_to_none=True)
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = gradients(model)

    config = LossConfig(epsilon=0.2, beta=beta, kl_estimator="k3", normalisation=NORMALISATIONS[loss_type],
                        constant_length=COMPLETION_LEN)
    logps = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, TEMPERATURE)
    token_advantages = advantages if token_level_advantages else advantages[:, None].expand_as(logps)
    out = grpo_loss(logps, sampler_logps, token_advantages * completion_mask, completion_mask, config,
                    ref_logps=ref_logps if beta else None)
    out.loss.backward()
    our_grads = gradients(model)

    assert 0 < out.clip_frac, "the test tensors must exercise clipping"
    assert abs(out.loss.item() - trl_loss.item()) < 1e-5, f"loss {out.loss.item():.8f} vs TRL {trl_loss.item():.8f}"
    assert our_grads.keys() == trl_grads.keys()
    worst = max((our_grads[k] - trl_grads[k]).abs().max().item() for k in our_grads)
    assert worst < 1e-5, f"gradients differ from TRL's by up to {worst:.3g}"

"""The sampling decoder reproduces transformers' Qwen3 forward: same logits, same tokens, LoRA included."""
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import MistralConfig, MistralForCausalLM

from reward_density.data.problems import Problem
from reward_density.grpo import sampler
from reward_density.grpo.logprobs import position_ids_from_mask
from reward_density.grpo.policy import Policy, PolicyConfig
from reward_density.grpo.qwen3 import Decoder, make_decoder, supports, weights_of
from reward_density.grpo.qwen3 import forward as qwen3_forward
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\nStep 1:", "41")]


def _left_padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(3, vocab, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of different widths
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def with_lora(model: torch.nn.Module) -> torch.nn.Module:
    """A LoRA-wrapped copy whose adapters are non-zero, so they change the logits."""
    wrapped = get_peft_model(model, LoraConfig(r=2, lora_alpha=32, target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_" in name:
                parameter.normal_(0, 0.05)
    return wrapped.eval()


def _assert_decoder_matches_forward(model: torch.nn.Module, vocab: int, new_tokens: int = 5) -> None:
    """Prefill then extend token by token; each live row's logits must equal a full forward over its sequence."""
    ids, mask = _left_padded_batch(vocab)
    decoder = make_decoder(model, ids.shape[0], ids.shape[1] + new_tokens)
    assert decoder is not None, "a plain Qwen3 must get the fast decoder"
    positions = position_ids_from_mask(mask)
    with torch.no_grad():
        logits = decoder.prefill(ids, mask, positions)
        live = torch.ones(ids.shape[0], dtype=torch.bool)
        for step in range(new_tokens + 1):
            full = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, -1]
            torch.testing.assert_close(logits[live], full[live], atol=2e-5, rtol=1e-4,
                                       msg=f"logits differ at new token {step}")
            if step == new_tokens:
                break
            token = logits.argmax(-1)
            attend = torch.tensor([True, step < 2, True])  # row 1 "finishes" after two tokens (then it is padding)
            live &= attend
            logits = decoder.extend(token, positions[:, -1:] + 1 + step, attend)
            ids = torch.cat([ids, token[:, None]], dim=1)
            mask = torch.cat([mask, attend.long()[:, None]], dim=1)


def test_logits_match_transformers_on_a_left_padded_batch(tiny_tokenizer):
    _assert_decoder_matches_forward(build_qwen3(len(tiny_tokenizer), seed=0), len(tiny_tokenizer))


def test_logits_match_with_tied_embeddings(tiny_tokenizer):
    model = build_qwen3(len(tiny_tokenizer), seed=1)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _assert_decoder_matches_forward(model, len(tiny_tokenizer))


def test_logits_match_an_unmerged_lora_model(tiny_tokenizer):
    _assert_decoder_matches_forward(with_lora(build_qwen3(len(tiny_tokenizer), seed=2)), len(tiny_tokenizer))


def test_a_disabled_adapter_decodes_the_base_model(tiny_tokenizer):
    model = with_lora(build_qwen3(len(tiny_tokenizer), seed=2))
    with model.disable_adapter():
        _assert_decoder_matches_forward(model, len(tiny_tokenizer))


def _rollout(model, tokenizer, config: SamplingConfig, fast: bool, monkeypatch) -> object:
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(sampler, "make_decoder", lambda *args: None)
        return sample_rollout(model, tokenizer, PROBLEMS, 4, config, seed=5)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_rollouts_equal_the_transformers_path(tiny_tokenizer, monkeypatch, temperature):
    model = with_lora(build_qwen3(len(tiny_tokenizer), seed=4))
    config = SamplingConfig(max_new_tokens=12, temperature=temperature, top_p=0.95)
    fast = _rollout(model, tiny_tokenizer, config, True, monkeypatch)
    slow = _rollout(model, tiny_tokenizer, config, False, monkeypatch)
    assert torch.equal(fast.completion_ids, slow.completion_ids), "the fast decoder drew different tokens"
    torch.testing.assert_close(fast.sampler_logps, slow.sampler_logps, atol=1e-5, rtol=1e-4)
    assert torch.equal(fast.truncated, slow.truncated)


def test_other_architectures_and_hooked_models_use_the_transformers_forward(tiny_tokenizer):
    mistral = MistralForCausalLM(MistralConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1,
    )).eval()
    assert make_decoder(mistral, 2, 8) is None
    rollout = sample_rollout(mistral, tiny_tokenizer, PROBLEMS, 2, SamplingConfig(max_new_tokens=4), seed=0)
    assert rollout.completion_ids.shape[0] == 4

    hooked = build_qwen3(len(tiny_tokenizer), seed=0)
    hooked.lm_head.register_forward_hook(lambda module, inputs, output: output)
    assert not supports(hooked), "a forward hook would be bypassed"


def test_dropout_in_training_mode_falls_back(tiny_tokenizer):
    model = get_peft_model(build_qwen3(len(tiny_tokenizer), seed=0),
                           LoraConfig(r=2, lora_alpha=32, lora_dropout=0.1, target_modules="all-linear"))
    model.train()
    assert not supports(model)
    model.eval()
    assert supports(model)


def test_a_decoder_that_keeps_some_rows_continues_them_unchanged(tiny_tokenizer):
    model = build_qwen3(len(tiny_tokenizer), seed=4)
    ids, mask = _left_padded_batch(len(tiny_tokenizer))
    positions = position_ids_from_mask(mask)
    full, kept = (make_decoder(model, 3, ids.shape[1] + 4) for _ in range(2))
    token = torch.tensor([5, 6, 7])
    with torch.no_grad():
        for decoder in (full, kept):
            decoder.prefill(ids, mask, positions)
            decoder.extend(token, positions[:, -1:] + 1, torch.ones(3, dtype=torch.bool))
        kept.keep_rows(torch.tensor([2, 0]))
        expected = full.extend(token, positions[:, -1:] + 2, torch.ones(3, dtype=torch.bool))[[2, 0]]
        got = kept.extend(token[[2, 0]], (positions[:, -1:] + 2)[[2, 0]], torch.ones(2, dtype=torch.bool))
    torch.testing.assert_close(got, expected)


def test_under_autocast_the_decoder_casts_weights_once_and_gives_the_same_logits_bit_for_bit(tiny_tokenizer):
    model = build_qwen3(len(tiny_tokenizer), seed=0)  # fp32 weights, as a FullFT policy keeps them
    ids, mask = _left_padded_batch(len(tiny_tokenizer))
    positions = position_ids_from_mask(mask)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        decoder = Decoder(weights_of(model), ids.shape[0], ids.shape[1])
        cast = decoder.weights
        logits = decoder.prefill(ids, mask, positions)
        # The same forward over the fp32 weights: autocast casts them at every product instead.
        expected = qwen3_forward(weights_of(model), ids[None], mask.bool()[None], positions[None], keep=slice(-1, None))
    assert cast.lm_head.dtype == torch.bfloat16 and cast.layers[0]["q_proj"].dtype == torch.bfloat16
    assert cast.layers[0]["input_layernorm"].dtype == cast.embed.dtype == torch.float32, "autocast leaves these alone"
    assert torch.equal(logits, expected.reshape(logits.shape)), "casting once must not change a single logit"


@pytest.mark.parametrize("rank", [2, None])
def test_gradient_checkpointing_keeps_the_fast_decoder_and_the_same_samples(tiny_tokenizer, rank):
    """Checkpointing hooks the input embeddings only to mark their output as requiring grad: no value changes, so
    sampling keeps this decoder instead of silently falling back to the transformers forward (every paper cell did)."""
    rollouts = []
    for checkpointing in (False, True):
        policy = Policy(build_qwen3(len(tiny_tokenizer), seed=0),
                        PolicyConfig(rank=rank, gradient_checkpointing=checkpointing), keep_reference=False)
        policy.model.eval()
        assert supports(policy.model), f"checkpointing={checkpointing} refused the fast decoder"
        with policy.sampling() as model:
            rollouts.append(sample_rollout(model, tiny_tokenizer, PROBLEMS, 2, SamplingConfig(6, 0.7, 0.95), seed=0))
    assert torch.equal(rollouts[0].completion_ids, rollouts[1].completion_ids)
    assert torch.equal(rollouts[0].sampler_logps, rollouts[1].sampler_logps)

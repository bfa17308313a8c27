"""The sampler: left-padded batches, EOS-inclusive masks, truncation, log-probs that the learner reproduces."""
import warnings

import pytest
import torch

from reward_density.data.problems import Problem
from reward_density.grpo import sampler
from reward_density.grpo.logprobs import completion_logprobs
from reward_density.grpo.policy import PolicyConfig
from reward_density.grpo.sampler import SamplingConfig, _pick, sample_rollout
from reward_density.grpo.stacked import StackedPolicy
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [
    Problem("a", "Problem: 3 + 4 = ?\n", "7"),
    Problem("b", "Problem: 12 + 29 = ?\nStep 1:", "41"),
    Problem("c", "7", "7"),
]


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    """A tiny Qwen3 whose EOS logit is raised, so some completions end early and others hit the cap."""
    model = build_qwen3(len(tiny_tokenizer), seed=3)
    bias = torch.zeros(len(tiny_tokenizer))
    bias[tiny_tokenizer.eos_token_id] = 3.5
    model.lm_head.register_forward_hook(lambda module, inputs, output: output + bias)
    return model


def test_masks_include_eos_and_nothing_after_it(model, tiny_tokenizer):
    rollout = sample_rollout(model, tiny_tokenizer, PROBLEMS, 4, SamplingConfig(max_new_tokens=12, temperature=1.0),
                             seed=0)
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    assert rollout.truncated.any() and (~rollout.truncated).any(), "the test needs both ended and truncated rows"
    for ids, mask, truncated in zip(rollout.completion_ids, rollout.completion_mask, rollout.truncated):
        valid = ids[mask].tolist()
        if truncated:
            assert eos not in valid and mask.all(), "a truncated row must fill the cap without an EOS"
        else:
            assert valid[-1] == eos and eos not in valid[:-1], f"mask must end on the first EOS: {valid}"
            assert torch.all(ids[~mask] == pad), "tokens after EOS must be padding"
    assert torch.all(rollout.sampler_logps[~rollout.completion_mask] == 0)


def test_an_end_of_text_the_generation_config_names_ends_a_completion_as_the_tokenizers_does(tiny_tokenizer):
    # as Qwen3 snapshots whose tokenizer declares one end-of-text token and whose generation config adds another
    model = build_qwen3(len(tiny_tokenizer), seed=3)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0)
    first = sample_rollout(model, tiny_tokenizer, PROBLEMS, 1, greedy, seed=0).completion_ids[:, 0]
    eos = tiny_tokenizer.eos_token_id
    assert eos not in first.tolist(), "the case needs first tokens that are not the tokenizer's EOS"
    model.generation_config.eos_token_id = [eos, *first.tolist()]
    rollout = sample_rollout(model, tiny_tokenizer, PROBLEMS, 1, greedy, seed=0)
    assert rollout.completion_mask.sum(-1).tolist() == [1] * len(PROBLEMS), "the model's own end must stop a row"
    assert not rollout.truncated.any()
    # The stacked engine samples from its arms' weights, which must carry the model's ends with them.
    arms = StackedPolicy(model, [PolicyConfig(rank=1), PolicyConfig(rank=None)], seed=0).weights()
    with torch.no_grad():
        stacked = sample_rollout(arms, tiny_tokenizer, PROBLEMS, 1, greedy, seed=0)
    assert stacked.completion_mask.sum(-1).tolist() == [1] * 2 * len(PROBLEMS), "a stacked arm ran past the model's end"


def test_rows_are_grouped_by_problem(model, tiny_tokenizer):
    rollout = sample_rollout(model, tiny_tokenizer, PROBLEMS, 4, SamplingConfig(max_new_tokens=4), seed=0)
    assert rollout.answers == [p.answer for p in PROBLEMS for _ in range(4)]
    assert rollout.prompts[4:8] == [PROBLEMS[1].prompt] * 4
    assert rollout.prompt_mask[0].sum() < rollout.prompt_mask[4].sum(), "prompts must be left-padded to one length"
    assert rollout.prompt_mask[:, -1].all(), "left padding puts every prompt's last token in the last column"


def test_sampler_logprobs_equal_the_learner_recomputation_on_left_padded_prompts(model, tiny_tokenizer):
    config = SamplingConfig(max_new_tokens=10, temperature=0.7, top_p=0.95)
    rollout = sample_rollout(model, tiny_tokenizer, PROBLEMS, 2, config, seed=1)
    with torch.no_grad():
        learner = completion_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                      rollout.completion_mask, config.temperature)
    err = (learner - rollout.sampler_logps).abs().max().item()
    assert err < 1e-4, f"the KV-cached sampler and the full forward disagree by {err:.3g}: the ratio would not be 1"


def test_same_seed_gives_the_same_completions_and_another_seed_differs(model, tiny_tokenizer):
    config = SamplingConfig(max_new_tokens=8, temperature=1.0)
    a = sample_rollout(model, tiny_tokenizer, PROBLEMS, 4, config, seed=5)
    b = sample_rollout(model, tiny_tokenizer, PROBLEMS, 4, config, seed=5)
    c = sample_rollout(model, tiny_tokenizer, PROBLEMS, 4, config, seed=6)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampler_logps, b.sampler_logps)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_greedy_matches_transformers_generate(tiny_tokenizer):
    model = build_qwen3(len(tiny_tokenizer), seed=4)
    problem = PROBLEMS[1]
    rollout = sample_rollout(model, tiny_tokenizer, [problem], 1, SamplingConfig(max_new_tokens=8, temperature=0.0),
                             seed=0)
    ids = tiny_tokenizer(problem.prompt, return_tensors="pt")["input_ids"]
    expected = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tiny_tokenizer.eos_token_id,
                              pad_token_id=tiny_tokenizer.pad_token_id)[0, ids.shape[1]:]
    got = rollout.completion_ids[0][rollout.completion_mask[0]]
    assert got.tolist() == expected.tolist()


def test_tiny_top_p_samples_the_greedy_token(model, tiny_tokenizer):
    greedy = sample_rollout(model, tiny_tokenizer, PROBLEMS, 1, SamplingConfig(max_new_tokens=6, temperature=0.0),
                            seed=0)
    nucleus = sample_rollout(model, tiny_tokenizer, PROBLEMS, 1,
                             SamplingConfig(max_new_tokens=6, temperature=1.0, top_p=1e-6), seed=9)
    assert torch.equal(greedy.completion_ids, nucleus.completion_ids)


def test_a_tokenizer_without_eos_is_refused(model, tiny_tokenizer):
    tokenizer = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="no EOS token"):
        sample_rollout(model, tokenizer, PROBLEMS, 1, SamplingConfig(max_new_tokens=2), seed=0)


def test_a_tokenizer_without_a_pad_token_pads_with_eos_and_samples_as_one_with_it(model, tiny_tokenizer):
    bare, eos_padded = (type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path) for _ in range(2))
    bare.pad_token, eos_padded.pad_token = None, eos_padded.eos_token  # the latter as data/sources.py loads one
    config = SamplingConfig(max_new_tokens=4, temperature=1.0)
    padded = sample_rollout(model, eos_padded, PROBLEMS, 2, config, seed=3)
    unpadded = sample_rollout(model, bare, PROBLEMS, 2, config, seed=3)
    for name in ("prompt_ids", "prompt_mask", "completion_ids"):
        assert torch.equal(getattr(padded, name), getattr(unpadded, name)), f"{name} differs without a pad token"


@pytest.mark.parametrize("kwargs,message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
    ({"max_new_tokens": 4, "temperature": -1.0}, "temperature must be >= 0"),
    ({"max_new_tokens": 4, "top_p": 0.0}, "top_p must be in"),
])
def test_bad_sampling_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_draws_follow_the_tempered_top_p_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    config = SamplingConfig(max_new_tokens=1, temperature=0.7, top_p=0.8)
    probs = torch.softmax(logits / config.temperature, dim=-1)
    kept = (probs.cumsum(-1) - probs) <= config.top_p  # sorted already: the smallest prefix reaching top_p
    expected = torch.where(kept, probs, 0.0) / probs[kept].sum()
    tokens, logps = _pick(logits.expand(40_000, -1), config,
                          torch.rand(40_000, 1, generator=torch.Generator().manual_seed(0)))
    observed = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert observed[~kept].sum() == 0, f"a token outside the top-p set was drawn: {observed}"
    torch.testing.assert_close(observed, expected, atol=0.01, rtol=0, msg=f"draw frequencies {observed} vs {expected}")
    torch.testing.assert_close(logps, torch.log(probs)[tokens],
                               msg="log-probs are taken under the full tempered distribution")


class ScriptedDecoder:
    """Logits that depend only on a row's own index and step: row r favours EOS from step r % 5 + 1 on."""

    def __init__(self, rows: int, vocab: int, eos: int):
        self.rows, self.vocab, self.eos, self.step = torch.arange(rows), vocab, eos, 0

    def logits(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.step)
        table = torch.randn(len(self.rows.unique()) + 64, self.vocab, generator=generator)[self.rows]
        table[:, self.eos] += torch.where(self.step >= self.rows % 5 + 1, 10.0, -10.0)
        return table

    def prefill(self, input_ids, attention_mask, position_ids):
        return self.logits()

    def extend(self, tokens, position_ids, attend):
        self.step += 1
        return self.logits()

    def keep_rows(self, rows):
        self.rows = self.rows[rows]


def test_finished_rows_leaving_the_batch_change_no_draw(tiny_tokenizer, monkeypatch):
    """Compaction (finished rows leave the decoding batch) is bookkeeping: every row draws what it would have."""
    model = build_qwen3(len(tiny_tokenizer), seed=3)
    problems = [Problem(str(i), f"Problem: {i} + {i} = ?\n", str(2 * i)) for i in range(6)]
    config = SamplingConfig(16, temperature=1.0, top_p=0.9)
    monkeypatch.setattr(sampler, "make_decoder", lambda model, rows, length, kind: ScriptedDecoder(
        rows, len(tiny_tokenizer), tiny_tokenizer.eos_token_id))
    real, compactions = sampler._rows_to_keep, []
    monkeypatch.setattr(sampler, "_rows_to_keep", lambda *args: compactions.append(real(*args)) or compactions[-1])
    compacted = sample_rollout(model, tiny_tokenizer, problems, 4, config, seed=9)
    assert sum(keep is not None for keep in compactions) >= 2, "rows must leave the batch for the test to test"
    monkeypatch.setattr(sampler, "_rows_to_keep", lambda *args: None)
    whole = sample_rollout(model, tiny_tokenizer, problems, 4, config, seed=9)
    assert torch.equal(compacted.completion_ids, whole.completion_ids)
    torch.testing.assert_close(compacted.sampler_logps, whole.sampler_logps)


def test_the_transformers_fallback_passes_its_cache_under_the_name_the_installed_version_takes(model, tiny_tokenizer):
    # The hooked model decodes through its own forward; transformers 5.24 warns that past_key_values goes in 5.40.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sample_rollout(model, tiny_tokenizer, PROBLEMS, 2, SamplingConfig(max_new_tokens=4), seed=0)
    deprecated = [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    assert not deprecated, deprecated[0]

"""Packing a rollout (one copy of a group's prompt per sequence, completions as branches) changes no log-prob."""
from __future__ import annotations

import pytest
import torch

from reward_density.data.problems import Problem
from reward_density.grpo import logprobs as padded
from reward_density.grpo import packing
from reward_density.grpo.qwen3 import weights_of
from reward_density.grpo.rollout import Rollout
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.grpo.stacked import completion_logprobs
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\nStep 1:", "41"),
            Problem("c", "Problem: 5 + 5 = ?\n", "10")]
GROUP = 3


@pytest.fixture
def model(tiny_tokenizer):
    return build_qwen3(len(tiny_tokenizer), seed=0).eval()


@pytest.fixture
def rollout(model, tiny_tokenizer):
    with torch.no_grad():
        return sample_rollout(model, tiny_tokenizer, PROBLEMS, GROUP, SamplingConfig(12, temperature=1.0), seed=5)


def real_lengths(rollout) -> list[tuple[int, int]]:
    return list(zip(rollout.prompt_mask.sum(-1).tolist(), rollout.completion_mask.sum(-1).tolist()))


@pytest.mark.parametrize("widths", [packing.PACK_WIDTHS, (24,), (40, 56), (1,)],
                         ids=["default", "groups-split", "two-candidates", "shorter-than-a-row"])
def test_packed_log_probs_are_the_padded_batchs_at_any_width(model, rollout, monkeypatch, widths):
    monkeypatch.setattr(packing, "PACK_WIDTHS", widths)
    with torch.no_grad():
        ours = completion_logprobs(weights_of(model), rollout, 0.7)
        theirs = padded.completion_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                            rollout.completion_mask, 0.7)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4,
                               msg=f"packed at widths {widths}: log-probs differ from the padded batch's")


def test_a_groups_completions_share_one_copy_of_its_prompt(model, rollout, monkeypatch):
    monkeypatch.setattr(packing, "PACK_WIDTHS", (512,))  # wide enough for every row at once
    packed = packing.pack(rollout, weights_of(model))
    lengths = real_lengths(rollout)
    prompts = sum(p for p, _ in lengths[::GROUP])
    assert packed.ids.shape[:2] == (1, 1), f"expected one sequence, got {tuple(packed.ids.shape[:2])}"
    assert int(packed.real.sum()) == prompts + sum(c for _, c in lengths), \
        "a group's prompt is not packed exactly once beside its completions"


def test_of_widths_that_pack_into_as_many_sequences_the_narrowest_wins(model, rollout, monkeypatch):
    monkeypatch.setattr(packing, "PACK_WIDTHS", (1024, 512))  # each holds every row in one sequence
    chosen = packing.pack(rollout, weights_of(model)).ids.shape[2]
    assert chosen == 512, f"both widths pack into one sequence, yet {chosen} was chosen over the narrower"


def test_a_row_longer_than_every_candidate_gets_a_width_of_its_own_length(model, rollout, monkeypatch):
    monkeypatch.setattr(packing, "PACK_WIDTHS", (1,))
    longest = max(p + c for p, c in real_lengths(rollout))
    assert packing.pack(rollout, weights_of(model)).ids.shape[2] == longest



@pytest.mark.parametrize("empty_row", [0, 1, 3])
def test_an_empty_completion_scores_nothing_and_shifts_no_other_rows_log_probs(model, empty_row):
    ids = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, model.config.vocab_size, (1, 5), generator=ids).repeat(4, 1)
    completions = torch.randint(2, model.config.vocab_size, (4, 6), generator=ids)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[empty_row] = False  # no token at all, which no sampler gives but a caller could pass
    mask[(empty_row + 1) % 4, 3:] = False
    rollout = Rollout(prompt, torch.ones_like(prompt, dtype=torch.bool), completions, mask, torch.zeros(4, 6),
                      torch.zeros(4, dtype=torch.bool), 2, [""] * 4, [""] * 4, [None] * 4)
    with torch.no_grad():
        ours = completion_logprobs(weights_of(model), rollout, 1.0)
        theirs = padded.completion_logprobs(model, prompt, rollout.prompt_mask, completions, mask, 1.0)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4,
                               msg="an empty completion moved the predictors of the rows packed after it")

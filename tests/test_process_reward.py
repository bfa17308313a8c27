"""PRMScorer against a tiny random Mistral PRM with its own tokenizer, and ProcessReward on hand-built rollouts."""
from __future__ import annotations

import pytest
import torch
from step_stand_ins import EOS, PAD, prm_tokenizer, student_tokenizer, tiny_prm
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from reward_density.data.steps import split_steps
from reward_density.grpo.rollout import Rollout
from reward_density.rewards.process import PRMScorer, ProcessReward

SENTINEL = "GOLD-ANSWER-SENTINEL-9731"


@pytest.fixture(scope="module")
def prm_tok():
    return prm_tokenizer()


@pytest.fixture(scope="module")
def prm(prm_tok):
    return tiny_prm(len(prm_tok))


@pytest.fixture(scope="module")
def scorer(prm, prm_tok):
    return PRMScorer(prm, prm_tok, batch_size=3)


@pytest.fixture(scope="module")
def student():
    return student_tokenizer()


class SpyScorer(PRMScorer):
    """A PRMScorer that records every question and step it is handed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def score_batch(self, questions, steps_per_item):
        self.seen += list(questions) + [s for steps in steps_per_item for s in steps]
        return super().score_batch(questions, steps_per_item)


def make_rollout(tok, prompts: list[str], completions: list[str], truncated: list[bool], group_size: int) -> Rollout:
    """A rollout as the sampler would build it: left-padded prompts, right-padded completions with EOS."""
    prompt_ids = [tok.encode(p) for p in prompts]
    completion_ids = [tok.encode(c) + ([] if cut else [tok.eos_token_id]) for c, cut in zip(completions, truncated)]
    tp, t = max(map(len, prompt_ids)), max(map(len, completion_ids)) + 3
    p_ids = torch.full((len(prompts), tp), tok.pad_token_id)
    p_mask = torch.zeros(len(prompts), tp, dtype=torch.bool)
    c_ids = torch.full((len(prompts), t), tok.pad_token_id)
    c_mask = torch.zeros(len(prompts), t, dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        p_ids[i, tp - len(p) :], p_mask[i, tp - len(p) :] = torch.tensor(p), True
        c_ids[i, : len(c)], c_mask[i, : len(c)] = torch.tensor(c, dtype=torch.long), True
    return Rollout(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=c_ids,
        completion_mask=c_mask,
        sampler_logps=torch.zeros(len(prompts), t),
        truncated=torch.tensor(truncated),
        group_size=group_size,
        prompts=[tok.decode(p, skip_special_tokens=True) for p in prompt_ids],
        completions=[tok.decode(c, skip_special_tokens=True) for c in completion_ids],
        answers=[SENTINEL] * len(prompts),
    )


def test_scorer_reads_tag_and_candidates_from_the_prm_tokenizer(scorer, prm_tok, student):
    expected = [prm_tok.convert_tokens_to_ids(t) for t in ("▁ки", "▁+", "▁-")]
    assert [scorer.tag_id, *scorer.candidate_ids] == expected, "tag/candidate ids are not the PRM tokenizer's"
    assert student.get_vocab() != prm_tok.get_vocab(), "the PRM stand-in should not share the student's tokenizer"
    assert scorer.max_length == 256, "max_length should default to the model's max_position_embeddings"


@pytest.mark.parametrize("kwargs, name", [({"good_token": "@@"}, "@@"), ({"step_tag": " zebra"}, " zebra")])
def test_scorer_rejects_tokens_the_prm_tokenizer_cannot_hold_as_one_token(prm, prm_tok, kwargs, name):
    with pytest.raises(ValueError, match=repr(name)):
        PRMScorer(prm, prm_tok, **kwargs)


def test_scorer_gives_softmax_of_good_and_bad_logits_at_each_step_tag(scorer, prm, prm_tok):
    question = "What is 12 + 7?"
    steps = ["Step 1: 12 + 7 = 19", "So we get 19.", "√19 ≈ 4.36"]
    scores, lost = scorer.score(question, steps)
    assert lost == 0 and len(scores) == len(steps), f"expected {len(steps)} scores and none lost, got {scores}, {lost}"
    assert all(0 < p < 1 for p in scores), f"P(+) outside (0, 1): {scores}"

    ids = prm_tok.encode(question + " " + "\n".join(s + " ки" for s in steps))
    tag, plus, minus = (prm_tok.convert_tokens_to_ids(t) for t in ("▁ки", "▁+", "▁-"))
    positions = [p for p, i in enumerate(ids) if i == tag]
    with torch.no_grad():
        logits = prm(torch.tensor([ids])).logits[0]
    expected = torch.softmax(logits[positions][:, [plus, minus]], dim=-1)[:, 0]
    assert torch.allclose(torch.tensor(scores), expected, atol=1e-6), f"scores {scores} != hand softmax {expected}"


def test_tag_text_inside_a_step_does_not_add_a_score(scorer):
    scores, lost = scorer.score("What is 1 + 1? ки", ["1 + 1 = 2 ки", "So we get 2."])
    assert len(scores) == 2 and lost == 0, f"stray tag text changed the number of scores: {scores}, lost {lost}"
    scores, lost = scorer.score("What is 1 + 1?", ["1 + 1 = 2 ккии"])  # one pass of removal would leave "ки"
    assert len(scores) == 1 and lost == 0, f"nested tag text changed the number of scores: {scores}, lost {lost}"


def test_batched_scoring_matches_one_by_one_despite_padding(prm, prm_tok, scorer):
    questions = [f"What is {k} + {3 * k}?" + " Think." * (k % 3) for k in range(7)]
    steps = [[f"Step {j}: {k} + {j} = {k + j}" for j in range(k)] for k in range(7)]
    alone = PRMScorer(prm, prm_tok, batch_size=1)
    one_by_one = [alone.score(q, s) for q, s in zip(questions, steps)]
    for batched in (scorer, PRMScorer(prm, prm_tok, batch_size=16)):
        scores, lost = batched.score_batch(questions, steps)
        for k, (single, n_lost) in enumerate(one_by_one):
            assert lost[k] == n_lost == 0, f"item {k}: nothing should be lost"
            assert len(scores[k]) == len(steps[k]), f"item {k}: {len(scores[k])} scores for {len(steps[k])} steps"
            assert torch.allclose(torch.tensor(scores[k]), torch.tensor(single), atol=1e-5), (
                f"item {k}: batched {scores[k]} != one-by-one {single} (batch_size {batched.batch_size})"
            )


def test_steps_past_the_context_limit_are_counted_lost_and_the_rest_unchanged(prm, prm_tok, scorer):
    question = "What is 12 + 7?"
    steps = [f"Step {j}: {12 + j} + 7 = {19 + j}" for j in range(8)]
    short = PRMScorer(prm, prm_tok, max_length=40)
    scores, lost = short.score(question, steps)
    full, _ = scorer.score(question, steps)
    assert 0 < lost < len(steps), f"max_length 40 should cut some but not all of 8 steps, lost {lost}"
    assert len(scores) + lost == len(steps), f"{len(scores)} scored + {lost} lost != {len(steps)} steps"
    assert torch.allclose(torch.tensor(scores), torch.tensor(full[: len(scores)]), atol=1e-5), (
        "the steps that fit should score as they do with the full context"
    )


def test_process_reward_deposits_one_score_per_step_on_its_last_token(prm, prm_tok, student):
    spy = SpyScorer(prm, prm_tok, batch_size=3)
    completions = [
        "Step 1: 12 + 7 = 19\n\nThe answer is 19.",
        "\n12 + 7 = 19.\nSo we get 19.\n",
        "  \n\n",
        "Step 1: 30 - 4 = 26\nStep 2: 26 × 1 = 26\nSo we",
    ]
    rollout = make_rollout(
        student, ["What is 12 + 7?"] * 2 + ["What is 30 - 4?"] * 2, completions, [False, False, False, True], 2
    )
    deposits = ProcessReward(spy, student)(rollout)
    assert not (deposits.deposit_mask & ~rollout.completion_mask.bool()).any(), "a deposit sits on padding"

    for i, text in enumerate(rollout.completions):
        steps = split_steps(text)
        where = deposits.deposit_mask[i].nonzero().squeeze(-1).tolist()
        assert len(where) == len(steps), f"row {i}: {len(where)} deposits for {len(steps)} steps"
        ids = rollout.completion_ids[i].tolist()
        for step, t in zip(steps, where):
            covered = len(student.decode(ids[: t + 1], skip_special_tokens=True))
            before = len(student.decode(ids[:t], skip_special_tokens=True))
            assert before < step.end <= covered, f"row {i}: deposit at {t} is not on the last token of {step.text!r}"
            assert ids[t] not in student.all_special_ids, f"row {i}: deposit on a special token"
        expected, _ = spy.score(rollout.prompts[i], [s.text for s in steps])
        got = deposits.token_rewards[i, where]
        assert torch.allclose(got, torch.tensor(expected).reshape(-1), atol=1e-5), f"row {i}: {got} != {expected}"
        assert all(0 < p < 1 for p in got.tolist()), f"row {i}: deposit outside (0, 1): {got}"
        mean = sum(expected) / len(expected) if expected else 0.0
        assert abs(deposits.trajectory_rewards[i].item() - mean) < 1e-5, f"row {i}: trajectory reward is not mean P(+)"

    assert not deposits.deposit_mask[~rollout.completion_mask].any(), "a deposit sits on padding"
    assert deposits.counters == pytest.approx(
        {"process/steps_mean": 7 / 4, "process/steps_lost": 0, "process/steps_sharing_token": 0, "process/no_steps": 1}
    ), f"wrong counters {deposits.counters}"
    assert spy.seen and not any(SENTINEL in s for s in spy.seen), "the PRM was handed the gold answer"


def test_process_reward_counts_lost_steps_and_leaves_them_without_deposit(prm, prm_tok, student):
    short = PRMScorer(prm, prm_tok, max_length=40)
    completion = "\n".join(f"Step {j}: {12 + j} + 7 = {19 + j}" for j in range(8))
    rollout = make_rollout(student, ["What is 12 + 7?"], [completion], [False], 1)
    _, lost = short.score(rollout.prompts[0], [s.text for s in split_steps(completion)])
    deposits = ProcessReward(short, student)(rollout)
    assert lost > 0 and deposits.counters["process/steps_lost"] == lost, f"steps_lost {deposits.counters} != {lost}"
    assert deposits.deposit_mask.sum().item() == 8 - lost, f"{deposits.deposit_mask.sum()} deposits for {8 - lost} kept"
    last_kept_end = deposits.deposit_mask[0].nonzero().max().item()
    tail = student.decode(rollout.completion_ids[0, last_kept_end + 1 :].tolist(), skip_special_tokens=True)
    assert len(split_steps(tail)) == lost, "the lost steps should be the last ones, after every deposit"


def test_steps_ending_in_one_token_share_a_deposit_holding_their_mean(prm, prm_tok, student):
    merging = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(student.backend_tokenizer.to_str()),
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )
    merging.add_tokens(["1\n2"])  # one token ends both "So: 1" and "2"
    completion = "So: 1\n2\nok"
    rollout = make_rollout(merging, ["What is 1 + 1?"], [completion], [False], 1)
    assert "1\n2" in merging.convert_ids_to_tokens(rollout.completion_ids[0].tolist()), "the merged token was not used"
    scorer = PRMScorer(prm, prm_tok)
    deposits = ProcessReward(scorer, merging)(rollout)
    scores, _ = scorer.score(rollout.prompts[0], ["So: 1", "2", "ok"])
    values = deposits.token_rewards[0, deposits.deposit_mask[0]].tolist()
    assert values == pytest.approx([(scores[0] + scores[1]) / 2, scores[2]], abs=1e-6), f"{values} vs {scores}"
    assert deposits.counters["process/steps_sharing_token"] == 1, f"sharing not counted: {deposits.counters}"


def test_the_prm_is_shown_the_bare_question_not_the_prompt_template(prm, prm_tok, student):
    prompt = "Solve step by step, one step per line.\n\nProblem: What is 12 + 7?\n\nSolution:\n"
    rollout = make_rollout(student, [prompt], ["12 + 7 = 19\nThe answer is 19"], [False], group_size=1)
    rollout.questions = ["What is 12 + 7?"]
    spy = SpyScorer(prm, prm_tok)
    ProcessReward(spy, student)(rollout)
    assert "What is 12 + 7?" in spy.seen and not any("Solve step by step" in text for text in spy.seen), spy.seen


def test_a_step_whose_tag_lands_just_past_the_context_is_lost_and_one_just_inside_is_kept(prm, prm_tok):
    question, steps = "What is 12 + 7?", [f"Step {j}: {12 + j} + 7 = {19 + j}" for j in range(8)]
    ids, tags, _ = PRMScorer(prm, prm_tok).encode(question, steps)
    last = tags[3]  # the fourth tag's position: an input of last + 1 tokens holds it, one of last tokens does not
    ids, kept, lost = PRMScorer(prm, prm_tok, max_length=last + 1).encode(question, steps)
    assert kept == tags[:4] and len(ids) == last + 1 and lost == 4
    ids, kept, lost = PRMScorer(prm, prm_tok, max_length=last).encode(question, steps)
    assert kept == tags[:3] and len(ids) <= last and lost == 5, "the PRM input must fit in max_length tokens"

"""Evaluation: the unbiased pass@k estimator, and greedy pass@1 with per-problem rows."""
import itertools

import pytest

from reward_density.data.answer_check import AnswerChecker
from reward_density.data.problems import Problem
from reward_density.experiment.evaluation import greedy_eval, pass_at_k, sampled_pass_at_k
from reward_density.grpo.sampler import SamplingConfig
from reward_density.tools.stand_ins import build_qwen3


@pytest.mark.parametrize("n,c,k", [(4, 0, 1), (4, 1, 1), (8, 3, 4), (5, 5, 2), (6, 2, 6)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_correct_sample(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


@pytest.fixture(scope="module")
def checker():
    with AnswerChecker(timeout_seconds=5.0) as c:
        yield c


def test_greedy_eval_scores_each_problem_once_and_matches_its_rows(tiny_tokenizer, checker):
    model = build_qwen3(len(tiny_tokenizer), seed=0)
    problems = [Problem(f"p{i}", f"Problem: {i} + 1 = ?\n", str(i + 1)) for i in range(5)]
    accuracy, rows = greedy_eval(model, tiny_tokenizer, problems, checker, max_new_tokens=6, batch_size=2)
    assert [r["problem_id"] for r in rows] == [p.problem_id for p in problems]
    assert accuracy == sum(r["correct"] for r in rows) / 5
    assert all(r["verdict"] in {"correct", "wrong", "unparsable", "timeout"} for r in rows)
    _, rows_again = greedy_eval(model, tiny_tokenizer, problems, checker, max_new_tokens=6, batch_size=5)
    assert rows_again == rows, "greedy evaluation must not depend on the batch size or on randomness"


def test_sampled_pass_at_k_reports_each_k_from_n_draws(tiny_tokenizer, checker):
    model = build_qwen3(len(tiny_tokenizer), seed=0)
    problems = [Problem("a", "Problem: 1 + 1 = ?\n", "2"), Problem("b", "Problem: 2 + 2 = ?\n", "4")]
    scores, rows = sampled_pass_at_k(model, tiny_tokenizer, problems, checker, SamplingConfig(max_new_tokens=4, temperature=1.0),
                                     n_samples=4, ks=[1, 4], seed=0)
    assert len(rows) == 8 and set(scores) == {1, 4}
    assert 0 <= scores[1] <= scores[4] <= 1

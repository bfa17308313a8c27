"""Held-out evaluation: greedy pass@1 with per-problem correctness, and sampled pass@k."""
from __future__ import annotations

from collections.abc import Sequence
from math import comb

import torch
from transformers import PreTrainedTokenizerBase

from ..data.answer_check import Checker, Verdict
from ..data.problems import Problem
from ..grpo.qwen3 import Qwen3Weights
from ..grpo.sampler import SamplingConfig, sample_rollout


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def _answer(model, tokenizer, problems, checker, group_size, sampling, seed, batch_size) -> list[list[dict]]:
    """Per arm (one for a model), one row per completion: problem id, verdict, correctness, length,
    whether an answer is boxed, whether it hit the cap, and its text."""
    arms = model.arms if isinstance(model, Qwen3Weights) else 1
    rows: list[list[dict]] = [[] for _ in range(arms)]
    was_training = getattr(model, "training", False)
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        for start in range(0, len(problems), batch_size):
            batch = problems[start : start + batch_size]
            rollout = sample_rollout(model, tokenizer, batch, group_size, sampling, seed + start)
            verdicts = checker.check(rollout.answers, rollout.completions)
            lengths = rollout.completion_mask.sum(-1).tolist()
            per_arm = len(batch) * group_size
            for i, (verdict, text) in enumerate(zip(verdicts, rollout.completions)):
                rows[i // per_arm].append({
                    "problem_id": batch[(i % per_arm) // group_size].problem_id,
                    "verdict": verdict.value,
                    "correct": verdict is Verdict.CORRECT,
                    "length": int(lengths[i]),
                    "answered": checker.has_answer(text),
                    "truncated": bool(rollout.truncated[i]),
                    "completion": text,
                })
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    return rows


def greedy_eval(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    checker: Checker,
    max_new_tokens: int,
    batch_size: int = 32,
) -> tuple[float, list[dict]]:
    """Greedy pass@1 over problems and the per-problem rows (for paired comparisons between cells)."""
    [arm] = greedy_eval_arms(model, tokenizer, problems, checker, max_new_tokens, batch_size)
    return arm


def greedy_eval_arms(
    model: torch.nn.Module | Qwen3Weights,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    checker: Checker,
    max_new_tokens: int,
    batch_size: int = 32,
) -> list[tuple[float, list[dict]]]:
    """greedy_eval of every arm of stacked weights (one batched decoding), or of one model."""
    greedy = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    per_arm = _answer(model, tokenizer, list(problems), checker, 1, greedy, 0, batch_size)
    return [(sum(r["correct"] for r in rows) / max(len(rows), 1), rows) for rows in per_arm]


def sampled_pass_at_k(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    checker: Checker,
    sampling: SamplingConfig,
    n_samples: int,
    ks: Sequence[int],
    seed: int,
    batch_size: int = 8,
) -> tuple[dict[int, float], list[dict]]:
    """Mean unbiased pass@k over problems from n_samples draws each, and the per-sample rows."""
    [rows] = _answer(model, tokenizer, list(problems), checker, n_samples, sampling, seed, batch_size)
    scores = {k: 0.0 for k in ks}
    for problem in problems:
        correct = sum(r["correct"] for r in rows if r["problem_id"] == problem.problem_id)
        for k in ks:
            scores[k] += pass_at_k(n_samples, correct, k) / len(problems)
    return scores, rows

"""Capability baseline (paper Table 2): sampled pass@k, exploration gap and response length, per model."""
from __future__ import annotations

from collections.abc import Sequence

from ..data.answer_check import AnswerChecker
from ..data.problems import Problem
from ..grpo.sampler import SamplingConfig
from .evaluation import sampled_pass_at_k


def capability_row(
    name: str,
    model,
    tokenizer,
    problems: Sequence[Problem],
    checker: AnswerChecker,
    sampling: SamplingConfig,
    ks: Sequence[int],
    seed: int,
    gap_k: int = 4,
    batch_size: int = 8,
) -> dict:
    """pass@k for each k from max(ks) samples per problem, the exploration gap and the mean length."""
    if not {1, gap_k} <= set(ks):
        raise ValueError(f"ks must include 1 and gap_k={gap_k} for the exploration gap, got {list(ks)}")
    scores, rows = sampled_pass_at_k(model, tokenizer, problems, checker, sampling, max(ks), ks, seed, batch_size)
    lengths = [r["length"] for r in rows]
    return {
        "model": name,
        **{f"pass@{k}": scores[k] for k in ks},
        # The paper's pass@4 - pass@1: what a model finds when it may try again, which RL can pull into pass@1.
        "exploration_gap": scores[gap_k] - scores[1],
        "mean_length": sum(lengths) / len(lengths),
        "frac_truncated": sum(r["truncated"] for r in rows) / len(rows),
    }

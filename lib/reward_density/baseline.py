"""Capability baseline (paper Table 2): sampled pass@k, exploration gap and response length, per model."""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd

from .analysis import markdown_table
from .answer_check import AnswerChecker
from .evaluation import sampled_pass_at_k
from .problems import Problem
from .sampler import SamplingConfig


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


def capability_markdown(table: pd.DataFrame) -> str:
    """The table as markdown, numbers to three decimals."""
    rows = [[f"{v:.3f}" if isinstance(v, float) else v for v in row] for row in table.itertuples(index=False)]
    return markdown_table(list(table.columns), rows)


def plot_capability(table: pd.DataFrame, path) -> plt.Figure:
    """pass@k against k, one line per model, saved to path."""
    ks = [int(c.split("@")[1]) for c in table.columns if c.startswith("pass@")]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for _, row in table.iterrows():
        ax.plot(ks, [row[f"pass@{k}"] for k in ks], marker="o", label=row["model"])
    ax.set(xscale="log", xlabel="k (samples per problem)", ylabel="pass@k (held-out)", ylim=(0, 1))
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend()
    ax.set_title("Capability baseline")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig

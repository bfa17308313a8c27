"""One cell up close: its curves, the problems it learned and forgot, and how its answers changed
(the logic of notebooks/explore_cell.py)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from .load import OneCell

CURVES = ("reward_mean", "advantage_std", "kl_ref", "len_mean", "grad_norm", "loss")  # per-step, where present


def check_counts(at_least: int = 0, **counts: int) -> None:
    """Refuse a count parameter that is not a whole number >= at_least (pandas' head(-1) would quietly drop a
    row)."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
            raise ValueError(f"{name} must be a whole number >= {at_least}, got {value!r}")


SPLIT_NAMES = {"heldout": "held-out", "dev": "dev"}  # a cell's eval_split, as a figure names it


def cell_curves(cell: OneCell) -> Figure:
    """Greedy pass@1 over the evaluations (on the split the cell was evaluated on), then each per-step metric the
    cell recorded."""
    curves = [c for c in CURVES if c in cell.history]
    fig, axes = plt.subplots(1, 1 + len(curves), figsize=(3.2 * (1 + len(curves)), 2.8), squeeze=False)
    axes = axes[0]
    if not cell.evals.empty:
        axes[0].plot(cell.evals["step"], cell.evals["pass1"], marker="o")
    split = cell.params.get("eval_split", "heldout")
    axes[0].set(title=f"{SPLIT_NAMES.get(split, split)} greedy pass@1", xlabel="step")
    for ax, column in zip(axes[1:], curves):
        ax.plot(cell.history["step"], cell.history[column], lw=1)
        ax.set(title=column, xlabel="step")
    fig.suptitle(cell.name)
    fig.tight_layout()
    return fig


def problem_changes(answers: pd.DataFrame) -> pd.DataFrame:
    """Per held-out problem scored at both the first and the last evaluation (a cell still training may have last
    scored only its curve problems): correct at each, at how many evaluations it was correct, and the change (+1
    learned, -1 forgotten); learned first, forgotten last."""
    if answers.empty:
        return pd.DataFrame(columns=["problem_id", "first", "last", "times_correct", "change"])
    first, last = answers["step"].min(), answers["step"].max()
    by_problem = answers.pivot_table(index="problem_id", columns="step", values="correct", aggfunc="first")
    table = pd.DataFrame({"first": by_problem[first], "last": by_problem[last],
                          "times_correct": by_problem.sum(axis=1).astype(int)})
    table = table.dropna(subset=["first", "last"])
    table["change"] = (table["last"] - table["first"]).astype(int)
    return table.sort_values(["change", "times_correct"], ascending=[False, False]).reset_index()


def learned_and_forgotten(changes: pd.DataFrame, top: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Of problem_changes' table, the first `top` problems learned and the last `top` forgotten (never an unchanged
    one, nor one in both)."""
    return changes[changes["change"] > 0].head(top), changes[changes["change"] < 0].tail(top)


def completions_over_training(completions: pd.DataFrame, problems: int) -> pd.DataFrame:
    """The logged completions of the first few problems, one row per problem, one column per evaluation step,
    each entry '[verdict] completion'."""
    if completions.empty:
        return pd.DataFrame()
    chosen = completions["problem_id"].drop_duplicates().head(problems)
    rows = completions[completions["problem_id"].isin(chosen)]
    text = "[" + rows["verdict"].astype(str) + "] " + rows["completion"].astype(str)
    return rows.assign(text=text).pivot_table(index="problem_id", columns="step", values="text", aggfunc="first")

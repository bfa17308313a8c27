"""GRPO against the token-selection variants of it ("Token-Efficient RL for LLM Reasoning"): S-GRPO and
T-SPMO run as studies of their own (the same world, arms, seeds and held-out problems, one setting apart),
compared arm by arm with the baseline study, with the tokens each puts into the loss (its Table 3).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .load import Cells, arms
from .plots import plot_method_accuracy, plot_method_curves
from .statistics import MIN_SEEDS, shared_seeds
from .tables import Table, compared_worlds_sentence, comparison, final_answers, markdown_table

MEMORY_NOTE = (
    "One arm through peft, each method's own step settings, measured after a warm-up step: the most bytes held at "
    "once beyond the model, the reference and the optimizer state (experiment/step_memory.py). The token-selection "
    "methods here take the exact gradient of their loss, which flows through every earlier token of a completion, "
    "so the forward pass keeps every token's activations and logits for the backward whichever tokens enter the "
    "loss: a step's peak follows the padded batch of completions it sampled, not its tokens in the loss. Running "
    "one completion at a time bounds the activations by one completion's.")


def baseline_method(studies: dict[str, Cells]) -> str:
    """The first method's name, the one the others are compared with; a clear error when no method has run."""
    if not studies:
        raise FileNotFoundError("no method's study has finished cells to compare: run their profiles first "
                                "(README, Running the study)")
    return next(iter(studies))


def method_accuracy(studies: dict[str, Cells], regime: str, margin: float, confidence: float = 0.95) -> Table:
    """Per method and arm: final pass@1 (mean and sd over its seeds) and, beside the first (baseline) method, the
    paired difference from it over the seeds and held-out problems both ran, with its TOST verdict at ±margin."""
    base_name = baseline_method(studies)
    base_final = final_answers(studies[base_name])
    rows = []
    for name, cells in studies.items():
        final = final_answers(cells)
        for arm in arms(cells):
            mine = final[(final["regime"] == regime) & (final["arm"] == arm)]
            if mine.empty:
                continue
            per_seed = mine.groupby("seed")["correct"].mean()
            row = {"method": name, "arm": arm, "pass1": per_seed.mean(), "sd": per_seed.std(ddof=1),
                   "n_seeds": len(per_seed)}
            theirs = base_final[(base_final["regime"] == regime) & (base_final["arm"] == arm)]
            if name != base_name and shared_seeds(mine, theirs) >= MIN_SEEDS:
                paired = comparison(mine, theirs, margin, confidence)  # its n_seeds: the seeds both ran
                row |= {**paired, "n_seeds": len(per_seed), "n_seeds_paired": paired["n_seeds"]}
            rows.append(row)
    frame = pd.DataFrame(rows)
    for column in ("estimate", "ci_low", "ci_high", "tost_low", "tost_high", "verdict", "n_seeds_paired", "n_problems"):
        if column not in frame:
            frame[column] = None
    lines = [[r.method, r.arm, f"{r.pass1:.3f} ± {0 if pd.isna(r.sd) else r.sd:.3f} ({r.n_seeds})", *_difference(r)]
             for r in frame.itertuples()]
    header = ["method", "arm", "final pass@1 (mean ± sd, seeds)", f"minus {base_name} ({confidence:.0%} CI)",
              f"{1 - 2 * (1 - confidence):.0%} CI (TOST)", f"verdict (±{margin:g})", "paired seeds × problems"]
    return Table(frame, markdown_table(header, lines))


def _difference(row) -> list[str]:
    """A method table row's paired difference from the baseline: estimate with its interval, the interval TOST reads,
    the verdict and what was paired; blank for the baseline itself."""
    if pd.isna(row.estimate):
        return ["", "", "", ""]
    return [f"{row.estimate:+.3f} [{row.ci_low:+.3f}, {row.ci_high:+.3f}]",
            f"[{row.tost_low:+.3f}, {row.tost_high:+.3f}]", row.verdict,
            f"{int(row.n_seeds_paired)} × {int(row.n_problems)}"]


def loss_tokens(studies: dict[str, Cells], regime: str) -> Table:
    """Per method: tokens entering the loss per completion (all steps and the first 100), completion length,
    and the share of the completion's tokens in the loss; mean over arms, seeds and steps (a replaying method's
    steps count their replayed completions too, where logged)."""
    rows = []
    for name, cells in studies.items():
        history = cells.history[cells.history["regime"] == regime]
        if history.empty:
            continue
        counted = history["loss_tokens"] if "loss_tokens" in history else history["len_mean"]  # GRPO: every token
        length = history["len_mean"]
        if "replay_completions" in history:  # replay's second update: its completions are counted beside the step's
            counted, length = (_with_replay(history, main, replayed) for main, replayed in
                               ((counted, "replay_loss_tokens"), (length, "replay_len_mean")))
        rows.append({"method": name, "loss_tokens": counted.mean(),
                     "loss_tokens_first_100": counted[history["step"] <= 100].mean(),
                     "len_mean": length.mean(), "share": (counted / length).mean()})
    frame = pd.DataFrame(rows)
    lines = [[r.method, f"{r.loss_tokens:.1f}", f"{r.loss_tokens_first_100:.1f}", f"{r.len_mean:.1f}", f"{r.share:.0%}"]
             for r in frame.itertuples()]
    header = ["method", "loss tokens per completion", "in the first 100 steps", "completion length",
              "share in the loss"]
    return Table(frame, markdown_table(header, lines))


def _with_replay(history: pd.DataFrame, main: pd.Series, replayed: str) -> pd.Series:
    """A per-completion quantity of each step over the step's completions and its replayed ones together (a step
    that replayed nothing, or logged no replay columns, keeps its own)."""
    weight = history["replay_completions"].fillna(0)  # logged only by steps that replayed
    both = (main * history["completions"] + history[replayed].fillna(0) * weight) / (history["completions"] + weight)
    return both.where(weight > 0, main)


def memory_table(rows: list[dict]) -> Table:
    """Per method and arm: the peak memory of one step (experiment/step_memory.py), with the completion tokens
    it sampled and the tokens per completion it put into the loss."""
    columns = ["method", "profile", "arm", "peak_mib", "completions", "len_mean", "loss_tokens"]
    frame = pd.DataFrame(rows, columns=columns)
    lines = [[r.method, r.arm, f"{r.peak_mib:.2f}", f"{r.completions} x {r.len_mean:.1f}", f"{r.loss_tokens:.1f}"]
             for r in frame.itertuples()]
    header = ["method", "arm", "peak MiB", "completions x mean length", "loss tokens per completion"]
    return Table(frame, markdown_table(header, lines))


def write_method_comparison(studies: dict[str, Cells], out_dir: str | Path, regime: str, margin: float,
                            confidence: float = 0.95, profiles: dict[str, str] | None = None,
                            memory: list[dict] | None = None) -> Path:
    """method_comparison.csv, method_tokens.csv, method_memory.csv (given method_memory rows),
    figures/method_accuracy.png and figures/method_curves.png and method_comparison.md under out_dir (profiles: each
    method's profile, named in it); returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    accuracy, tokens = method_accuracy(studies, regime, margin, confidence), loss_tokens(studies, regime)
    accuracy.frame.to_csv(out / "method_comparison.csv", index=False)
    tokens.frame.to_csv(out / "method_tokens.csv", index=False)
    memory_lines = []
    if memory:
        table = memory_table(memory)
        table.frame.to_csv(out / "method_memory.csv", index=False)
        memory_lines = ["## Peak memory of one step", "", MEMORY_NOTE, "", table.markdown]
    plot_method_accuracy(accuracy.frame, out / "figures" / "method_accuracy.png")
    plot_method_curves(studies, regime, out / "figures" / "method_curves.png")
    base = baseline_method(studies)
    text = "\n".join([
        f"# {' vs '.join(studies)} ({regime} regime)",
        "",
        *_studies_lines(studies, profiles or {}),
        compared_worlds_sentence({name: _compared_worlds(cells, regime) for name, cells in studies.items()}),
        "",
        f"## Accuracy: each method minus {base}",
        "",
        f"Final greedy pass@1 per arm; differences paired over the seeds and held-out problems both methods ran "
        f"({confidence:.0%} crossed interval; TOST equivalent when the {1 - 2 * (1 - confidence):.0%} interval lies "
        f"inside ±{margin:g}, different when the {confidence:.0%} interval excludes 0).",
        "",
        accuracy.markdown,
        "![method_accuracy](figures/method_accuracy.png)",
        "",
        "## Tokens in the loss (the paper's Table 3)",
        "",
        tokens.markdown,
        *memory_lines,
        "## Training curves",
        "",
        "Mean trajectory reward per step (mean over seeds, 10-step moving average), one panel per method, one line "
        "per arm.",
        "",
        "![method_curves](figures/method_curves.png)",
        "",
    ])
    path = out / "method_comparison.md"
    path.write_text(text)
    return path


def _compared_worlds(cells: Cells, regime: str) -> dict[str, dict[str, str]]:
    """The world records of a study's cells in the compared regime (its other regimes read other entries)."""
    compared = set(cells.summaries.loc[cells.summaries["regime"] == regime, "cell"])
    return {cell: record for cell, record in cells.worlds.items() if cell in compared}


def _studies_lines(studies: dict[str, Cells], profiles: dict[str, str]) -> list[str]:
    """Which profile each compared method ran, and the methods named but left out for want of finished cells."""
    ran = [f"{name} = params/{profile}.yaml" for name, profile in profiles.items() if name in studies]
    missing = [f"{name} (params/{profile}.yaml)" for name, profile in profiles.items() if name not in studies]
    lines = [f"Studies: {', '.join(ran)}.", ""] if ran else []
    if missing:
        lines += [f"Left out, no finished cells: {', '.join(missing)}; the first method compared is the baseline.", ""]
    return lines

"""Training dynamics: did each arm reach a plateau, and when did the process reward collapse?

Plateau: the share of an arm's total gain (final minus base, mean over seeds) made in the
last quarter of its steps, read off the evaluation nearest to 75% of the steps; at most 10% counts as a
plateau. Collapse (paper §5.3: advantage-std peak at step 28, length saturation at 70, pass@1 collapse at
79): per regime, the mean over its cells of the step where the advantage std peaks and of the step where
the completion length peaks, and the first evaluation after the pass@1 peak (mean over cells) at which
pass@1 falls back below the base. That curve pools the regime's arms, so one arm's collapse can hide in it: the
plateau table's per-arm finals are where an arm that ends below its base shows. In a dense regime the advantage std
tracks the completion length alone (every group's deposits are normalised to unit variance), so there its peak
is the length peak.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .load import Cells, arms, regimes
from .tables import Table, markdown_table

PLATEAU_SHARE = 0.10  # at most this share of the total gain in the last quarter counts as a plateau
LAST_QUARTER = 0.75
PLATEAU_REGIMES = ("outcome", "distillation")  # process may collapse; the SFT control is read however far it got


def last_quarter_share(curve: pd.Series) -> tuple[int, float]:
    """The evaluation step nearest 75% of a pass@1 curve's steps (indexed by step, starting at 0; the earlier of
    two as near), and the share of the total gain (final minus step 0) made after it; nan when there is no gain,
    or no evaluation between the first and the last to read. The window is a quarter exactly where 75% of the
    steps is an evaluation step (every committed study); elsewhere it is as much longer or shorter."""
    final_step = curve.index.max()
    inside = curve.index[(curve.index > 0) & (curve.index < final_step)]
    if inside.empty:  # the final step would be its own "75%", and any curve a plateau
        return int(final_step), float("nan")
    quarter = inside[np.abs(inside - LAST_QUARTER * final_step).argmin()]
    gain = curve[final_step] - curve[0]
    return int(quarter), (curve[final_step] - curve[quarter]) / gain if gain > 0 else float("nan")


def is_plateau(share: float) -> bool:
    """Whether a last-quarter share counts as a plateau."""
    return bool(share <= PLATEAU_SHARE)  # nan (no gain, or nothing to read between first and last) is never one


def share_text(share: float) -> str:
    """A last-quarter share as a table shows it: a percentage, or a dash where there is none (last_quarter_share)."""
    return "–" if np.isnan(share) else f"{share:.0%}"


def mean_curve(evals: pd.DataFrame) -> pd.Series:
    """Mean pass@1 over the cells of an evaluation frame, at the steps every one of them evaluated (cells that ran
    for different lengths, or missed an evaluation, would otherwise mix seeds from one step to the next)."""
    cells_at = evals.groupby("step")["cell"].nunique()
    common = cells_at.index[cells_at == evals["cell"].nunique()]
    return evals[evals["step"].isin(common)].groupby("step")["pass1"].mean().sort_index()


def _curve(cells: Cells, regime: str, arm: str) -> pd.Series:
    """Mean pass@1 over seeds at each evaluation step of one arm (mean_curve)."""
    return mean_curve(cells.evals[(cells.evals["regime"] == regime) & (cells.evals["arm"] == arm)])


def plateau_table(cells: Cells) -> Table:
    """Per regime and arm: base, pass@1 at 75% of the steps and at the end, and the share of the gain made last."""
    rows = []
    for regime in regimes(cells):
        for arm in arms(cells):
            curve = _curve(cells, regime, arm)
            if len(curve) < 2 or 0 not in curve.index:
                continue
            quarter, share = last_quarter_share(curve)
            final_step = curve.index.max()
            base, at_quarter, final = curve[0], curve[quarter], curve[final_step]
            rows.append({"regime": regime, "arm": arm, "base": base, "step_75": quarter, "pass1_75": at_quarter,
                         "final_step": int(final_step), "final": final, "gain": final - base,
                         "last_quarter_share": share, "plateau": is_plateau(share)})
    frame = pd.DataFrame(rows, columns=["regime", "arm", "base", "step_75", "pass1_75", "final_step", "final", "gain",
                                        "last_quarter_share", "plateau"])
    lines = [[r.regime, r.arm, f"{r.base:.3f}", f"{r.pass1_75:.3f} (step {r.step_75})", f"{r.final:.3f}",
              f"{r.gain:+.3f}", share_text(r.last_quarter_share),
              "yes" if r.plateau else "no"] for r in frame.itertuples()]
    header = ["regime", "arm", "base", "pass@1 at 75% of steps", "final", "gain", "share of gain in last 25%",
              f"plateau (≤ {PLATEAU_SHARE:.0%})"]
    return Table(frame, markdown_table(header, lines) if lines else "No evaluated cell.\n")


def has_advantages(history: pd.DataFrame) -> bool:
    """Whether these steps recorded an advantage std (the SFT control's record none; its summary's 0 is no
    measurement)."""
    return "advantage_std" in history and history["advantage_std"].notna().any()


def collapse_table(cells: Cells) -> Table:
    """Per regime: mean step of the advantage-std peak and of the length peak, and the pass@1 collapse step."""
    rows, collapse_texts = [], []
    for regime in regimes(cells):
        history = cells.history[cells.history["regime"] == regime]
        if not has_advantages(history):  # the SFT control
            continue
        advantage_peak = _mean_peak_step(history, "advantage_std")
        length_peak = _mean_peak_step(history, "len_mean") if "len_mean" in history else float("nan")
        curve = mean_curve(cells.evals[cells.evals["regime"] == regime])
        peak_step = curve.idxmax()
        after = curve[(curve.index > peak_step) & (curve < curve.get(0, np.nan))]
        last = history[history["step"] == history["step"].max()]
        truncated = last["frac_truncated"].mean() if "frac_truncated" in history else float("nan")
        rows.append({"regime": regime, "advantage_std_peak_step": advantage_peak, "length_peak_step": length_peak,
                     "pass1_peak_step": int(peak_step), "pass1_peak": curve[peak_step],
                     "collapse_step": float(after.index[0]) if len(after) else float("nan"),
                     "final_frac_truncated": truncated})
        collapse_texts.append(_collapse_text(rows[-1]["collapse_step"], has_base=0 in curve.index))
    frame = pd.DataFrame(rows, columns=["regime", "advantage_std_peak_step", "length_peak_step", "pass1_peak_step",
                                        "pass1_peak", "collapse_step", "final_frac_truncated"])
    lines = [[r.regime, f"{r.advantage_std_peak_step:.0f}", _step(r.length_peak_step),
              f"{r.pass1_peak:.3f} (step {r.pass1_peak_step})",
              collapse, f"{r.final_frac_truncated:.2f}"]
             for r, collapse in zip(frame.itertuples(), collapse_texts)]
    header = ["regime", "advantage-std peak (step)", "length peak (step)", "pass@1 peak", "collapse below base (step)",
              "truncated at the end"]
    return Table(frame, markdown_table(header, lines) if lines else "No RL cell.\n")


def _mean_peak_step(history: pd.DataFrame, column: str) -> float:
    """Mean over cells of the step where a metric peaks; cells that never recorded it (all NaN) left out."""
    recorded = history.dropna(subset=[column])
    return float(recorded.loc[recorded.groupby("cell")[column].idxmax(), "step"].mean()) if len(recorded) else np.nan


def _collapse_text(step: float, has_base: bool) -> str:
    """The collapse step; "none" when pass@1 never fell below the base, "–" when there is no base to fall below."""
    return "–" if not has_base else "none" if np.isnan(step) else f"{step:.0f}"


def _step(value: float) -> str:
    return "–" if np.isnan(value) else f"{value:.0f}"

"""KL to the reference at the end of training, per regime and arm ("LoRA as an Implicit KL Regularizer in
GRPO Fine-Tuning", Figure 2: KL grows with the rank).

Every step records `kl_ref`, the k3 estimate of KL(pi_theta || pi_ref) over the completion tokens in the
loss: r - 1 - log r with r = pi_ref / pi_theta, whose mean under tokens sampled from pi_theta is exactly
the KL (unbiased; the sampler's top-p truncation aside), at the sampling temperature, whatever beta is.
A cell's end-of-training KL is its mean over the last END_FRACTION of its steps, which smooths the
per-step noise of 16 completions; per arm, the mean over seeds with a Student-t interval over seeds.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from .load import Cells, arms, regimes
from .tables import Table, markdown_table

END_FRACTION = 0.1
ESTIMATOR = "k3: mean over sampled completion tokens of r - 1 - log r, r = pi_ref / pi_theta"


def final_kl(cells: Cells) -> pd.DataFrame:
    """Per cell with a recorded KL: regime, arm, seed and its mean kl_ref over the last END_FRACTION of steps."""
    history = cells.history
    if "kl_ref" not in history:
        return pd.DataFrame(columns=["regime", "arm", "seed", "kl"])
    rows = []
    for cell, steps in history.dropna(subset=["kl_ref"]).groupby("cell"):
        last = steps["step"].max()
        tail = steps[steps["step"] > last * (1 - END_FRACTION)]
        first = steps.iloc[0]
        rows.append({"regime": first["regime"], "arm": first["arm"], "seed": first["seed"],
                     "kl": tail["kl_ref"].mean()})
    return pd.DataFrame(rows, columns=["regime", "arm", "seed", "kl"])


def kl_table(cells: Cells, confidence: float = 0.95) -> Table:
    """Per regime and arm: end-of-training KL, mean over seeds and its t interval over seeds, cut at 0, below which
    no KL lies (the cut keeps the coverage)."""
    per_cell = final_kl(cells)
    rows = []
    for regime in regimes(cells):
        for arm in arms(cells):
            values = per_cell[(per_cell["regime"] == regime) & (per_cell["arm"] == arm)]["kl"].to_numpy()
            if len(values) == 0:
                continue
            mean = float(values.mean())
            half = (stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
                    if len(values) > 1 else float("nan"))
            rows.append({"regime": regime, "arm": arm, "kl": mean, "low": np.maximum(mean - half, 0.0),
                         "high": mean + half, "seeds": len(values)})
    frame = pd.DataFrame(rows, columns=["regime", "arm", "kl", "low", "high", "seeds"])
    lines = [[r.regime, r.arm, f"{r.kl:.4f}", "–" if np.isnan(r.low) else f"[{r.low:.4f}, {r.high:.4f}]", r.seeds]
             for r in frame.itertuples()]
    header = ["regime", "arm", "KL(π‖π_ref) at the end", f"{confidence:.0%} CI over seeds", "seeds"]
    return Table(frame, markdown_table(header, lines) if lines else "No cell recorded a KL to the reference.\n")

"""A learning-rate sweep (a profile whose matrix gives several rates per arm): which rate each arm gets.

Per regime, the FullFT rate with the best final pass@1 (mean over seeds), and the LoRA rate with the best
final pass@1 averaged over the seeds and all LoRA ranks (one rate for every rank, as "LoRA Without Regret"
finds the best rate nearly independent of the rank at a fixed alpha); each rank's own best is shown too.
In the regimes the study reads at a plateau (outcome, distillation), a rate is eligible only if its arm's
mean curve has plateaued (dynamics.py), so that every arm is compared where its learning ended, not mid-climb;
each arm is judged on its own curve, never against the other arm.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..experiment.config import FULL
from .dynamics import PLATEAU_REGIMES, PLATEAU_SHARE, is_plateau, last_quarter_share
from .load import Cells, regimes
from .tables import Table, markdown_table


def _late_share(cells: Cells, regime: str, arms: list[str], rate: float) -> float:
    """The last-quarter share of gain of the mean curve (over seeds and the given arms) at one rate."""
    evals = cells.evals
    of_arms = evals[(evals["regime"] == regime) & evals["arm"].isin(arms) & np.isclose(evals["learning_rate"], rate)]
    return last_quarter_share(of_arms.groupby("step")["pass1"].mean().sort_index())[1]


def sweep_table(cells: Cells) -> Table:
    """Per regime, arm and learning rate: final pass@1, mean over seeds (and peak, for collapsing regimes)."""
    summaries = cells.summaries
    frame = (summaries.groupby(["regime", "arm", "learning_rate"], sort=False)
             .agg(final=("final_pass1", "mean"), peak=("peak_pass1", "mean"), seeds=("seed", "nunique"))
             .reset_index())
    frame["late_share"] = [_late_share(cells, r.regime, [r.arm], r.learning_rate) for r in frame.itertuples()]
    rows = [[r.regime, r.arm, f"{r.learning_rate:g}", f"{r.final:.3f}", f"{r.peak:.3f}", f"{r.late_share:.0%}", r.seeds]
            for r in frame.itertuples()]
    header = ["regime", "arm", "learning rate", "final pass@1", "peak pass@1", "share of gain in last 25%", "seeds"]
    return Table(frame, markdown_table(header, rows))


def _best(by_rate: pd.DataFrame, needs_plateau: bool) -> tuple[float, float, bool]:
    """The rate with the best final pass@1 among the eligible ones (all when none is), its final, and whether
    it plateaued. by_rate: final and late_share indexed by learning rate."""
    plateaued = by_rate[[is_plateau(share) for share in by_rate["late_share"]]]
    pool = plateaued if needs_plateau and not plateaued.empty else by_rate
    rate = pool["final"].idxmax()
    return rate, pool.loc[rate, "final"], is_plateau(by_rate.loc[rate, "late_share"])


def chosen_rates(cells: Cells) -> Table:
    """Per regime: the chosen FullFT and LoRA rates, their ratio, and each LoRA rank's own best final."""
    frame = sweep_table(cells).frame
    rows, lines = [], []
    for regime in regimes(cells):
        of_regime = frame[frame["regime"] == regime]
        full = of_regime[of_regime["arm"] == FULL].set_index("learning_rate")
        lora = of_regime[of_regime["arm"] != FULL]
        if full.empty or lora.empty:
            continue
        needs_plateau = regime in PLATEAU_REGIMES
        full_rate, full_final, full_plateau = _best(full[["final", "late_share"]], needs_plateau)
        by_rate = lora.groupby("learning_rate")[["final"]].mean()
        by_rate["late_share"] = [_late_share(cells, regime, list(lora["arm"].unique()), rate) for rate in by_rate.index]
        lora_rate, lora_final, lora_plateau = _best(by_rate, needs_plateau)
        per_rank = {arm: group.loc[group["final"].idxmax(), "learning_rate"] for arm, group in lora.groupby("arm")}
        rows.append({"regime": regime, "full": full_rate, "full_final": full_final, "full_plateau": full_plateau,
                     "lora": lora_rate, "lora_final": lora_final, "lora_plateau": lora_plateau,
                     "ratio": lora_rate / full_rate, **{f"best_{arm}": rate for arm, rate in per_rank.items()}})
        flag = {False: ", no rate plateaued" if needs_plateau else "", True: ""}
        lines.append([regime, f"{full_rate:g} ({full_final:.3f}{flag[full_plateau]})",
                      f"{lora_rate:g} ({lora_final:.3f}{flag[lora_plateau]})", f"{lora_rate / full_rate:.0f}x",
                      ", ".join(f"{arm} {rate:g}" for arm, rate in sorted(per_rank.items(), key=lambda kv: int(kv[0][1:])))])
    header = ["regime", "FullFT rate (final pass@1)", "LoRA rate (final, mean over ranks)", "LoRA / FullFT",
              "each rank's own best final"]
    return Table(pd.DataFrame(rows), markdown_table(header, lines) if lines else "No regime with both arms.\n")


def write_sweep_report(cells: Cells, out_dir: str | Path, profile_name: str = "") -> Path:
    """sweep.csv, chosen_rates.csv and sweep.md under out_dir; returns sweep.md's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table, chosen = sweep_table(cells), chosen_rates(cells)
    table.frame.to_csv(out / "sweep.csv", index=False)
    chosen.frame.to_csv(out / "chosen_rates.csv", index=False)
    text = "\n".join([
        f"# Learning-rate sweep ({profile_name or 'unnamed profile'})",
        "",
        "Chosen per regime: the FullFT rate with the best final pass@1 (mean over seeds), and the LoRA rate with "
        "the best final pass@1 averaged over seeds and all LoRA ranks; in outcome and distillation only among the "
        f"rates whose arm plateaued (at most {PLATEAU_SHARE:.0%} of its gain in the last 25% of steps). Evaluated "
        "on the world's dev problems, never on the study's held-out set.",
        "",
        chosen.markdown,
        "## Every arm at every rate",
        "",
        table.markdown,
    ])
    path = out / "sweep.md"
    path.write_text(text)
    return path

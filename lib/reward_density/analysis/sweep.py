"""A learning-rate sweep (a profile whose matrix gives several rates per arm): which rate each arm gets.

Per regime, the FullFT rate with the best final pass@1 (mean over seeds), and the LoRA rate with the best
final pass@1 averaged over the seeds and all LoRA ranks (one rate for every rank, as "LoRA Without Regret"
finds the best rate nearly independent of the rank at a fixed alpha); each rank's own best is shown too.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..experiment.config import FULL
from .load import Cells, regimes
from .tables import Table, markdown_table


def sweep_table(cells: Cells) -> Table:
    """Per regime, arm and learning rate: final pass@1, mean over seeds (and peak, for collapsing regimes)."""
    summaries = cells.summaries
    frame = (summaries.groupby(["regime", "arm", "learning_rate"], sort=False)
             .agg(final=("final_pass1", "mean"), peak=("peak_pass1", "mean"), seeds=("seed", "nunique"))
             .reset_index())
    rows = []
    for r in frame.itertuples():
        rows.append([r.regime, r.arm, f"{r.learning_rate:g}", f"{r.final:.3f}", f"{r.peak:.3f}", r.seeds])
    return Table(frame, markdown_table(["regime", "arm", "learning rate", "final pass@1", "peak pass@1", "seeds"], rows))


def chosen_rates(cells: Cells) -> Table:
    """Per regime: the chosen FullFT and LoRA rates, their ratio, and each LoRA rank's own best."""
    frame = sweep_table(cells).frame
    rows, lines = [], []
    for regime in regimes(cells):
        of_regime = frame[frame["regime"] == regime]
        full = of_regime[of_regime["arm"] == FULL]
        lora = of_regime[of_regime["arm"] != FULL]
        if full.empty or lora.empty:
            continue
        best_full = full.loc[full["final"].idxmax()]
        by_rate = lora.groupby("learning_rate")["final"].mean()
        best_lora = by_rate.idxmax()
        per_rank = {arm: group.loc[group["final"].idxmax(), "learning_rate"] for arm, group in lora.groupby("arm")}
        rows.append({"regime": regime, "full": best_full["learning_rate"], "full_final": best_full["final"],
                     "lora": best_lora, "lora_final": by_rate.max(), "ratio": best_lora / best_full["learning_rate"],
                     **{f"best_{arm}": rate for arm, rate in per_rank.items()}})
        lines.append([regime, f"{best_full['learning_rate']:g} ({best_full['final']:.3f})",
                      f"{best_lora:g} ({by_rate.max():.3f})", f"{best_lora / best_full['learning_rate']:.0f}x",
                      ", ".join(f"{arm} {rate:g}" for arm, rate in sorted(per_rank.items(), key=lambda kv: int(kv[0][1:])))])
    header = ["regime", "FullFT rate (final pass@1)", "LoRA rate (final, mean over ranks)", "LoRA / FullFT",
              "each rank's own best"]
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
        "the best final pass@1 averaged over seeds and all LoRA ranks. Evaluated on the world's dev problems, "
        "never on the study's held-out set.",
        "",
        chosen.markdown,
        "## Every arm at every rate",
        "",
        table.markdown,
    ])
    path = out / "sweep.md"
    path.write_text(text)
    return path

"""A learning-rate sweep (a profile whose matrix gives several rates per arm): which rate each arm gets.

Per regime, the FullFT rate with the best score (mean over seeds), and the LoRA rate with the best score
averaged over the seeds and all LoRA ranks (one rate for every rank, as "LoRA Without Regret" finds the best
rate nearly independent of the rank at a fixed alpha); each rank's own best, by its score alone, is shown too. The score
(analysis.choose_rate_by) is the final pass@1, for a study that reads every arm at its end, or the best pass@1
after step 0, for one that stops each arm at its own best dev step (stopping.py). Read at the end, in the
regimes the study reads at a plateau (outcome, distillation), a rate is eligible only if its arm's mean curve
has plateaued (dynamics.py), so that every arm is compared where its learning ended, not mid-climb. Each arm
is judged on its own curve, never against the other arm.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..experiment.config import FULL, SFT
from .dynamics import PLATEAU_REGIMES, PLATEAU_SHARE, is_plateau, last_quarter_share, mean_curve, share_text
from .load import Cells, in_regime_order, regimes
from .report import planned_sentence, provenance_sentence, world_sentence
from .stopping import best_steps
from .tables import Table, markdown_table

# Per criterion a sweep may choose each arm's rate by (profiles.RATE_CRITERIA): the column of sweep_table's frame
# that scores a rate, and how the report names it.
SCORES = {"final": ("final", "final pass@1"), "best_step": ("best", "best pass@1 after step 0")}
SHARE_NOTE = ("Mean over seeds. A share shown as – belongs to a curve that ended no higher than it began, or that was "
              "evaluated at no step between its first and last.")


def _late_share(cells: Cells, regime: str, arms: list[str], rate: float) -> float:
    """The last-quarter share of gain of the mean curve (over seeds and the given arms) at one rate."""
    evals = cells.evals
    of_arms = evals[(evals["regime"] == regime) & evals["arm"].isin(arms) & np.isclose(evals["learning_rate"], rate)]
    return last_quarter_share(mean_curve(of_arms))[1]


def sweep_table(cells: Cells) -> Table:
    """Per regime, arm and learning rate, mean over seeds: final pass@1, the best pass@1 after step 0 and its step,
    and the share of the gain made in the last quarter; in the design's order (in_design_order)."""
    best = best_steps(cells.evals).set_index("cell")[["step", "pass1"]]
    summaries = cells.summaries.join(best.rename(columns={"step": "best_step", "pass1": "best_pass1"}), on="cell")
    frame = (summaries.groupby(["regime", "arm", "learning_rate"], sort=False)
             .agg(final=("final_pass1", "mean"), best=("best_pass1", "mean"), best_step=("best_step", "mean"),
                  seeds=("seed", "nunique"))
             .reset_index())
    frame = in_design_order(frame)
    frame["late_share"] = [_late_share(cells, r.regime, [r.arm], r.learning_rate) for r in frame.itertuples()]
    return Table(frame, sweep_markdown(frame))


def read_sweep_table(path: str | Path) -> Table:
    """A sweep.csv (sweep_table's frame as write_sweep_report wrote it) read back, in the design's order."""
    frame = in_design_order(pd.read_csv(path))
    return Table(frame, sweep_markdown(frame))


def in_design_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of regime, arm and learning rate in the design's order: regimes as load.in_regime_order lists them,
    ranks ascending then FullFT, rates ascending (not the order cells loaded in, nor rates sorted as text)."""
    position = {"regime": in_regime_order(frame["regime"]).index, "arm": _arm_position}
    return frame.sort_values(["regime", "arm", "learning_rate"], ignore_index=True,
                             key=lambda col: col.map(position[col.name]) if col.name in position else col)


def _arm_position(arm: str) -> float:
    """Where an arm sorts: by its rank (r16 after r2), FullFT last."""
    return float("inf") if arm == FULL else int(arm[1:])


def sweep_markdown(frame: pd.DataFrame) -> str:
    """sweep_table's frame as the report's table of every arm at every rate."""
    rows = [[r.regime, r.arm, f"{r.learning_rate:g}", f"{r.final:.3f}", f"{r.best:.3f}", f"{r.best_step:.0f}",
             share_text(r.late_share), r.seeds] for r in frame.itertuples()]
    header = ["regime", "arm", "learning rate", "final pass@1", "best pass@1 after step 0", "its step (mean)",
              "share of gain in last 25%", "seeds"]
    return markdown_table(header, rows)


def _best(by_rate: pd.DataFrame, score: str, needs_plateau: bool) -> tuple[float, float, bool]:
    """The rate with the best score among the eligible ones (all when none is), its score, and whether it
    plateaued. by_rate: the score and late_share indexed by learning rate."""
    plateaued = by_rate[[is_plateau(share) for share in by_rate["late_share"]]]
    pool = plateaued if needs_plateau and not plateaued.empty else by_rate
    rate = pool[score].idxmax()
    return rate, pool.loc[rate, score], is_plateau(by_rate.loc[rate, "late_share"])


def chosen_rates(cells: Cells, by: str = "final", table: Table | None = None) -> Table:
    """Per regime: the chosen FullFT and LoRA rates by the criterion `by` (SCORES), their ratio, and each
    LoRA rank's own best rate; from the cells' sweep_table (`table`, when already computed). The plateau rule
    applies only to rates chosen by their final pass@1."""
    if by not in SCORES:
        raise ValueError(f"unknown choose_rate_by {by!r}: expected one of {', '.join(SCORES)}")
    column, label = SCORES[by]
    frame = (table or sweep_table(cells)).frame
    rows, lines = [], []
    for regime in regimes(cells):
        of_regime = frame[frame["regime"] == regime]
        full = of_regime[of_regime["arm"] == FULL].set_index("learning_rate")
        lora = of_regime[of_regime["arm"] != FULL]
        if full.empty or lora.empty:
            continue
        needs_plateau = by == "final" and regime in PLATEAU_REGIMES
        full_rate, full_score, full_plateau = _best(full[[column, "late_share"]], column, needs_plateau)
        by_rate = lora.groupby("learning_rate")[[column]].mean()
        by_rate["late_share"] = [_late_share(cells, regime, list(lora["arm"].unique()), rate) for rate in by_rate.index]
        lora_rate, lora_score, lora_plateau = _best(by_rate, column, needs_plateau)
        per_rank = {arm: group.loc[group[column].idxmax(), "learning_rate"]
                    for arm, group in sorted(lora.groupby("arm"), key=lambda kv: _arm_position(kv[0]))}
        rows.append({"regime": regime, "full": full_rate, "full_score": full_score, "full_plateau": full_plateau,
                     "lora": lora_rate, "lora_score": lora_score, "lora_plateau": lora_plateau,
                     "ratio": lora_rate / full_rate, **{f"best_{arm}": rate for arm, rate in per_rank.items()}})
        flag = {False: ", no rate plateaued" if needs_plateau else "", True: ""}
        lines.append([regime, f"{full_rate:g} ({full_score:.3f}{flag[full_plateau]})",
                      f"{lora_rate:g} ({lora_score:.3f}{flag[lora_plateau]})", f"{lora_rate / full_rate:.2g}x",
                      ", ".join(f"{arm} {rate:g}" for arm, rate in per_rank.items())])
    header = ["regime", f"FullFT rate ({label})", f"LoRA rate ({label}, mean over ranks)", "LoRA / FullFT",
              "each rank's own best rate"]
    return Table(pd.DataFrame(rows), markdown_table(header, lines) if lines else "No regime with both arms.\n")


def _criterion_text(by: str) -> str:
    """The report's sentence on how each rate was chosen."""
    if by == "best_step":
        return ("Chosen per regime: the FullFT rate with the best pass@1 after step 0 (each cell at its own best "
                "evaluation, mean over seeds), and the LoRA rate with the best such pass@1 averaged over seeds and all "
                "LoRA ranks: the rates for a study that stops each arm at its own best dev step.")
    return ("Chosen per regime: the FullFT rate with the best final pass@1 (mean over seeds), and the LoRA rate with "
            "the best final pass@1 averaged over seeds and all LoRA ranks; in outcome and distillation only among the "
            f"rates whose arm plateaued (at most {PLATEAU_SHARE:.0%} of its gain in the last 25% of steps).")


def _split_sentence(cells: Cells) -> str:
    """Which problems the sweep's cells were scored on, as their params.json records it."""
    splits = {params.get("eval_split") for params in cells.params.values()}
    if splits == {"dev"} and SFT in regimes(cells):
        return ("Evaluated on the world's dev problems, never on the study's held-out set, except the SFT control's: "
                "its dev split holds its held-out facts in another order (it is scored on recalling what it was "
                "taught), so its rates are chosen on the facts its verdicts score.")
    if splits == {"dev"}:
        return "Evaluated on the world's dev problems, never on the study's held-out set."
    if None in splits:
        return "Some cells do not record the split they were scored on (params.json's eval_split)."
    return (f"Evaluated on the {' and '.join(sorted(splits))} problems: a rate chosen on the held-out set is tuned "
            "to the study.")


def write_sweep_report(cells: Cells, out_dir: str | Path, profile_name: str = "", by: str = "final",
                       planned: Sequence[str] | None = None) -> Path:
    """sweep.csv, chosen_rates.csv and sweep.md under out_dir, the rates chosen by `by`; returns sweep.md's path.
    `planned`: the profile's cell names, when known, so that a choice made on part of the grid says so."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = sweep_table(cells)
    chosen = chosen_rates(cells, by, table)
    table.frame.to_csv(out / "sweep.csv", index=False)
    chosen.frame.to_csv(out / "chosen_rates.csv", index=False)
    text = "\n".join([
        f"# Learning-rate sweep ({profile_name or 'unnamed profile'})",
        "",
        _criterion_text(by) + " " + _split_sentence(cells),
        "",
        *([planned_sentence(cells, planned)] if planned is not None else []),
        provenance_sentence(cells),
        world_sentence(cells),
        "",
        chosen.markdown,
        "## Every arm at every rate",
        "",
        SHARE_NOTE,
        "",
        table.markdown,
    ])
    path = out / "sweep.md"
    path.write_text(text)
    return path

"""Each arm stopped at its own best step, chosen on dev: LoRA against FullFT at the dev-chosen step.

A cell that scored dev problems at every evaluation (the cell setting dev_problems) has a dev learning curve.
Its chosen step is the evaluation after step 0 with the best dev pass@1, the earliest of ties: chosen per cell,
on its own curve, never on the held-out set nor against another arm. Its held-out answers at that step then
enter the same paired comparison as the final answers do (tables.equivalence_table), which needs the held-out
set scored in full at every evaluation (curve_problems unset).
"""
from __future__ import annotations

import pandas as pd

from .load import KEYS, Cells, arms, regimes
from .tables import Table, final_answers, markdown_table, mean_sd


def best_steps(evals: pd.DataFrame) -> pd.DataFrame:
    """Per cell of an evaluation frame: the row of its best pass@1 after step 0, the earliest of ties."""
    trained = evals[evals["step"] > 0]
    return trained.sort_values(["cell", "pass1", "step"], ascending=[True, False, True]).drop_duplicates("cell")


def chosen_steps(cells: Cells) -> pd.DataFrame:
    """Per cell that scored dev problems: its chosen step and its dev pass@1 there."""
    best = best_steps(cells.dev_evals)
    return best[[*KEYS, "step", "pass1"]].rename(columns={"pass1": "dev_pass1"}).reset_index(drop=True)


def answers_at_chosen_steps(cells: Cells) -> pd.DataFrame:
    """Each such cell's held-out answers at its chosen step; an error if that evaluation scored fewer problems
    than the cell's last one."""
    chosen = chosen_steps(cells)
    answers = cells.answers.merge(chosen[["cell", "step"]], on=["cell", "step"])
    final = final_answers(cells)
    expected = final[final["cell"].isin(chosen["cell"])].groupby("cell").size()
    scored = answers.groupby("cell").size().reindex(expected.index, fill_value=0)
    short = expected.index[scored < expected]
    if len(short):
        raise ValueError(f"{len(short)} cell(s), e.g. {short[0]}, scored only part of the held-out set at the "
                         "dev-chosen step: comparing arms at that step needs curve_problems unset")
    return answers


def chosen_table(cells: Cells, at_chosen: pd.DataFrame) -> Table:
    """Per regime and arm, mean ± sd over seeds of the chosen step, its dev pass@1 and its held-out pass@1 (from
    at_chosen, answers_at_chosen_steps' answers)."""
    chosen = chosen_steps(cells)
    heldout = at_chosen.groupby("cell")["correct"].mean().rename("heldout_pass1")
    chosen = chosen.join(heldout, on="cell")
    rows = []
    for regime in regimes(cells):
        for arm in arms(cells):
            of_arm = chosen[(chosen["regime"] == regime) & (chosen["arm"] == arm)]
            if len(of_arm):
                stats = {f"{column}_{stat}": getattr(of_arm[column], stat)()
                         for column in ("step", "dev_pass1", "heldout_pass1") for stat in ("mean", "std")}
                rows.append({"regime": regime, "arm": arm, "n_seeds": len(of_arm), **stats})
    frame = pd.DataFrame(rows)
    lines = [[r.regime, r.arm, _mean_sd(r, "step", 0), _mean_sd(r, "dev_pass1", 3), _mean_sd(r, "heldout_pass1", 3),
              r.n_seeds] for r in frame.itertuples()]
    header = ["regime", "arm", "chosen step", "dev pass@1 there", "held-out pass@1 there", "seeds"]
    return Table(frame, markdown_table(header, lines))


def _mean_sd(row, column: str, digits: int) -> str:
    """mean_sd of a column of chosen_table's frame."""
    return mean_sd(getattr(row, column + "_mean"), getattr(row, column + "_std"), digits)

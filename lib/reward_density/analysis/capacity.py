"""The bits argument behind the study's question, tallied on the study's own cells.

The hypothesis the study tests (after "LoRA Without Regret", Thinking Machines, 2025): a reward carries about one bit
per deposit, so O(1), O(S) or O(N) bits per episode, and a trained network stores about two bits per parameter
(Allen-Zhu and Li, 2024, "Physics of Language Models: Part 3.3"), so a denser reward should need more trained
parameters: a higher rank. Here that arithmetic is done on the cells that ran: the deposits each arm received over
its training (its completions times the deposits per completion its steps recorded) against the bits its trained
parameters hold, and the smallest rank the argument says holds them, beside the rank the verdicts need.
"""
from __future__ import annotations

import pandas as pd

from ..experiment import cell_folder
from .load import Cells, regimes
from .rank_needed import needed_ranks
from .tables import Table, markdown_table

BITS_PER_DEPOSIT = 1.0  # the hypothesis' own proxy: one bit per reward deposit
BITS_PER_PARAMETER = 2.0  # a trained network's storage, Allen-Zhu and Li (2024)
DEPOSITS = "deposits_mean"  # a step's deposits per completion (grpo/step.py's metrics)
COLUMNS = ["regime", "arm", "rank", "cells", "deposits_per_completion", "deposits", "trained_parameters",
           "capacity_bits", "holds"]


def _completions_per_step(params: dict) -> int:
    """P x G: the completions one GRPO step samples for one arm."""
    return int(params["prompts_per_step"]) * int(params["group_size"])


def arm_budgets(cells: Cells) -> pd.DataFrame:
    """Per regime and arm whose cells recorded both: the deposits one cell received over its training (mean over
    seeds), its trained parameters, the bits they hold, and whether those bits hold the deposits."""
    if DEPOSITS not in cells.history:
        return pd.DataFrame(columns=COLUMNS)
    history = cells.history.dropna(subset=[DEPOSITS])
    rows = []
    for name, steps in history.groupby("cell"):
        params = cells.params.get(name, {})
        trained = params.get(cell_folder.DERIVED, {}).get(cell_folder.TRAINED_PARAMETERS)
        if trained is None:
            continue
        first = steps.iloc[0]
        rows.append({"regime": first["regime"], "arm": first["arm"], "rank": first["rank"],
                     "deposits_per_completion": steps[DEPOSITS].mean(),
                     "deposits": steps[DEPOSITS].sum() * _completions_per_step(params),
                     "trained_parameters": int(trained)})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    per_cell = pd.DataFrame(rows)
    frame = per_cell.groupby(["regime", "arm"], sort=False).agg(
        rank=("rank", "first"), cells=("arm", "size"), deposits_per_completion=("deposits_per_completion", "mean"),
        deposits=("deposits", "mean"), trained_parameters=("trained_parameters", "first")).reset_index()
    frame = frame.sort_values("rank", na_position="last", kind="stable")  # LoRA ranks ascending, then FullFT
    frame["capacity_bits"] = frame["trained_parameters"] * BITS_PER_PARAMETER
    frame["holds"] = frame["capacity_bits"] >= frame["deposits"] * BITS_PER_DEPOSIT
    return frame[COLUMNS].reset_index(drop=True)


def predicted_rank(budgets: pd.DataFrame) -> str:
    """The smallest LoRA rank whose bits hold what it received: 'r1 or less' at the grid's floor, 'beyond rN' when
    none does (one regime's rows of arm_budgets)."""
    lora = budgets.dropna(subset=["rank"]).sort_values("rank")
    if lora.empty:
        return "–"
    holding = lora.loc[lora["holds"], "rank"]
    if holding.empty:
        return f"beyond r{int(lora['rank'].max())}"
    smallest = int(holding.min())
    return f"r{smallest} or less" if smallest == int(lora["rank"].min()) else f"r{smallest}"


def capacity_table(cells: Cells, equivalence: pd.DataFrame) -> Table:
    """arm_budgets of a study, then per regime the rank the bits argument predicts beside the one its verdicts
    need (equivalence: tables.equivalence_table's frame)."""
    budgets = arm_budgets(cells)
    if budgets.empty:
        return Table(budgets, "No cell recorded its deposits and trained parameters (cells from before they were "
                              "recorded, or the SFT control alone, which has no deposits).\n")
    needed = {n.regime: n.describe() for n in needed_ranks(equivalence)}
    lines = []
    for regime in [r for r in regimes(cells) if r in set(budgets["regime"])]:  # sparsest reward first
        rows = budgets[budgets["regime"] == regime]
        received = rows["deposits"].mean()
        capacity = ", ".join(f"{arm} {bits:,.0f}" for arm, bits in zip(rows["arm"], rows["capacity_bits"]))
        lines.append([regime, f"{rows['deposits_per_completion'].mean():.1f}", f"{received:,.0f}", capacity,
                      predicted_rank(rows), needed.get(regime, "–")])
    header = ["regime", "deposits per completion", "deposits per cell (bits, at one a deposit)",
              "bits the arm's parameters hold", "rank the bits argument predicts", "rank the verdicts need"]
    return Table(budgets, markdown_table(header, lines))


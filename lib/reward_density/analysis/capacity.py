"""The bits argument behind the study's question, tallied on the study's own cells.

The hypothesis the study tests (after "LoRA Without Regret", Thinking Machines, 2025): a reward carries about one bit
per deposit, so O(1), O(S) or O(N) bits per episode, and a trained network stores about two bits per parameter
(Allen-Zhu and Li, 2024, "Physics of Language Models: Part 3.3"), so a denser reward should need more trained
parameters: a higher rank. Here that arithmetic is done on the cells that ran: the deposits each arm received over
its training (its completions times the deposits per completion its steps recorded) against the bits its trained
parameters hold, and the smallest rank the argument says holds them, beside the rank the verdicts need. The SFT
control has no deposits: what its arms must hold is its table's information, which its world's manifest records.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..experiment import cell_folder
from ..experiment.config import SFT
from ..experiment.provenance import fingerprint
from ..world.build import read_manifest
from .load import Cells, regimes
from .rank_needed import needed_ranks
from .tables import Table, markdown_table

BITS_PER_DEPOSIT = 1.0  # the hypothesis' own proxy: one bit per reward deposit
BITS_PER_PARAMETER = 2.0  # a trained network's storage, Allen-Zhu and Li (2024)
DEPOSITS = "deposits_mean"  # a step's deposits per completion (grpo/step.py's metrics)
COLUMNS = ["regime", "arm", "rank", "cells", "deposits_per_completion", "deposits", "bits", "trained_parameters",
           "capacity_bits", "holds"]


def _completions_per_step(params: dict) -> int:
    """P x G: the completions one GRPO step samples for one arm."""
    return int(params["prompts_per_step"]) * int(params["group_size"])


def control_bits(params: dict) -> float | None:
    """The SFT control table's information (world/control.py), from the manifest of the world whose control folder
    the cell read; None where that manifest is gone or unreadable, or the folder now holds another table than the
    one the cell recorded reading (a rebuilt world's manifest describes the new one)."""
    if not params.get("control"):
        return None
    read = params.get(cell_folder.WORLD, {}).get("control")
    if read is not None and fingerprint(params["control"]) != read:
        return None
    try:
        manifest = read_manifest(Path(params["control"]).parent)
    except ValueError:
        return None
    return manifest.get("components", {}).get("control", {}).get("bits")


def _received(regime: str, steps: pd.DataFrame, params: dict) -> dict | None:
    """What one cell had to store: its deposits (at one bit each) for an RL regime, its table's bits for the SFT
    control; None where the cell did not record them."""
    if regime == SFT:
        bits = control_bits(params)
        return None if bits is None else {"deposits_per_completion": math.nan, "deposits": math.nan, "bits": bits}
    recorded = steps[DEPOSITS].dropna() if DEPOSITS in steps else pd.Series(dtype=float)
    if recorded.empty:
        return None
    deposits = recorded.sum() * _completions_per_step(params)
    return {"deposits_per_completion": recorded.mean(), "deposits": deposits, "bits": deposits * BITS_PER_DEPOSIT}


def arm_budgets(cells: Cells) -> pd.DataFrame:
    """Per regime and arm whose cells recorded both: what one cell had to store over its training (mean over seeds;
    _received), its trained parameters, the bits they hold, and whether those bits hold what it received."""
    rows, no_steps = [], cells.history.iloc[:0]
    steps_of = dict(tuple(cells.history.groupby("cell")))
    for cell in cells.summaries.itertuples():
        params = cells.params.get(cell.cell, {})
        trained = params.get(cell_folder.DERIVED, {}).get(cell_folder.TRAINED_PARAMETERS)
        received = _received(cell.regime, steps_of.get(cell.cell, no_steps), params)
        if trained is None or received is None:
            continue
        rows.append({"regime": cell.regime, "arm": cell.arm, "rank": cell.rank, **received,
                     "trained_parameters": int(trained)})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    per_cell = pd.DataFrame(rows)
    frame = per_cell.groupby(["regime", "arm"], sort=False).agg(
        rank=("rank", "first"), cells=("arm", "size"), deposits_per_completion=("deposits_per_completion", "mean"),
        deposits=("deposits", "mean"), bits=("bits", "mean"),
        trained_parameters=("trained_parameters", "first")).reset_index()
    frame = frame.sort_values("rank", na_position="last", kind="stable")  # LoRA ranks ascending, then FullFT
    frame["capacity_bits"] = frame["trained_parameters"] * BITS_PER_PARAMETER
    frame["holds"] = frame["capacity_bits"] >= frame["bits"]
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
                              "recorded, or SFT control cells whose world's manifest.json is gone).\n")
    needed = {n.regime: n.describe() for n in needed_ranks(equivalence)}
    lines = []
    for regime in [r for r in regimes(cells) if r in set(budgets["regime"])]:  # sparsest reward first
        rows = budgets[budgets["regime"] == regime]
        per_completion = rows["deposits_per_completion"].mean()
        capacity = ", ".join(f"{arm} {bits:,.0f}" for arm, bits in zip(rows["arm"], rows["capacity_bits"]))
        lines.append([regime, "–" if pd.isna(per_completion) else f"{per_completion:.1f}",
                      f"{rows['bits'].mean():,.0f}", capacity, predicted_rank(rows), needed.get(regime, "–")])
    header = ["regime", "deposits per completion", "bits a cell received (one a deposit; the SFT control: its table's)",
              "bits the arm's parameters hold", "rank the bits argument predicts", "rank the verdicts need"]
    return Table(budgets, markdown_table(header, lines))


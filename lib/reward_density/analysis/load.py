"""Finished cells as long tables: the one place that reads cell folders (cell_folder.py's files)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..experiment import cell_folder
from ..experiment.config import FULL

REGIME_ORDER = ("outcome", "process", "distillation")
KEYS = ["cell", "regime", "rank", "arm", "seed"]


@dataclass(frozen=True)
class Cells:
    """Finished cells as long tables; every frame carries cell, regime, rank (Int64, <NA> = FullFT), arm, seed."""

    summaries: pd.DataFrame
    history: pd.DataFrame
    evals: pd.DataFrame
    answers: pd.DataFrame
    params: dict[str, dict]
    unfinished: tuple[str, ...]


def arm_name(rank: int | None) -> str:
    """Arm label: "r<rank>" for LoRA, "full" for FullFT."""
    return FULL if rank is None or pd.isna(rank) else f"r{int(rank)}"


def load_cells(outputs_dir: str | Path) -> Cells:
    """Read every finished cell (one with its summary) under <outputs_dir>/cells; skip the rest."""
    root = Path(outputs_dir) / "cells"
    folders = sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []
    finished = [p for p in folders if cell_folder.is_finished(p)]
    if not finished:
        raise FileNotFoundError(f"no finished cell (a folder with {cell_folder.SUMMARY}) under {root}")
    summaries, history, evals, answers, params = [], [], [], [], {}
    for folder in finished:
        summary = json.loads((folder / cell_folder.SUMMARY).read_text())
        keys = _cell_keys(folder.name, summary)
        summaries.append({**summary, **keys})
        history.append(_read_csv(folder / cell_folder.HISTORY, keys))
        evals.append(_read_csv(folder / cell_folder.EVALS, keys))
        answers.append(_read_csv(folder / cell_folder.ANSWERS, keys))
        params_file = folder / cell_folder.PARAMS
        params[folder.name] = json.loads(params_file.read_text()) if params_file.is_file() else {}
    answers_frame = _concat(answers)
    answers_frame["correct"] = answers_frame["correct"].map(_as_int)
    return Cells(
        summaries=_with_key_types(pd.DataFrame(summaries)),
        history=_concat(history),
        evals=_concat(evals),
        answers=answers_frame,
        params=params,
        unfinished=tuple(p.name for p in folders if p not in finished),
    )


def _cell_keys(name: str, summary: dict) -> dict:
    """The key columns of one cell, taken from its summary."""
    rank = summary.get("rank")
    return {"cell": name, "regime": summary["regime"], "rank": rank, "arm": arm_name(rank), "seed": summary["seed"],
            "learning_rate": summary.get("learning_rate")}


def _read_csv(path: Path, keys: dict) -> pd.DataFrame:
    """One cell's CSV with its key columns first (problem ids kept as text: "007" is not 7)."""
    frame = pd.read_csv(path, dtype={"problem_id": str})
    for i, (column, value) in enumerate(keys.items()):
        frame.insert(i, column, [value] * len(frame))
    return frame


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate cells' frames (columns may differ between regimes) with typed keys."""
    return _with_key_types(pd.concat(frames, ignore_index=True, sort=False))


def _with_key_types(frame: pd.DataFrame) -> pd.DataFrame:
    """Rank as nullable Int64, seed as int."""
    return frame.astype({"rank": "Int64", "seed": int})


def _as_int(value) -> int:
    """0/1 from a bool, a number or a "True"/"False" string."""
    if isinstance(value, str):
        return int(value.strip().lower() in ("true", "1", "1.0"))
    return int(bool(value))


def regimes(cells: Cells) -> list[str]:
    """Regimes present, in the design's order, unknown ones after."""
    present = set(cells.summaries["regime"])
    return [r for r in REGIME_ORDER if r in present] + sorted(present - set(REGIME_ORDER))


def ranks(cells: Cells) -> list[int]:
    """LoRA ranks present, ascending."""
    return sorted(int(r) for r in cells.summaries["rank"].dropna().unique())


def arms(cells: Cells) -> list[str]:
    """Arms present: ranks ascending, then full."""
    has_full = cells.summaries["rank"].isna().any()
    return [arm_name(r) for r in ranks(cells)] + ([FULL] if has_full else [])

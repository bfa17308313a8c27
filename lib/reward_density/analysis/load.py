"""Cells as tables: the one place that reads cell folders (cell_folder.py's files). Finished cells of a study
as long tables (load_cells), or one cell folder, finished or still running (load_cell)."""
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
    dev_evals: pd.DataFrame  # one row per dev evaluation of the cells that scored dev problems (dev_problems)
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
    summaries, history, evals, answers, dev_evals, params = [], [], [], [], [], {}
    for folder in finished:
        summary = json.loads((folder / cell_folder.SUMMARY).read_text())
        keys = _cell_keys(folder.name, summary)
        summaries.append({**summary, **keys})
        history.append(_read_csv(folder / cell_folder.HISTORY, keys))
        evals.append(_read_csv(folder / cell_folder.EVALS, keys))
        answers.append(_read_csv(folder / cell_folder.ANSWERS, keys))
        if (folder / cell_folder.DEV_EVALS).is_file():
            dev_evals.append(_read_csv(folder / cell_folder.DEV_EVALS, keys))
        params_file = folder / cell_folder.PARAMS
        params[folder.name] = json.loads(params_file.read_text()) if params_file.is_file() else {}
    answers_frame = _concat(answers)
    answers_frame["correct"] = answers_frame["correct"].map(_as_int)
    return Cells(
        summaries=_with_key_types(pd.DataFrame(summaries)),
        history=_concat(history),
        evals=_concat(evals),
        answers=answers_frame,
        dev_evals=_concat(dev_evals) if dev_evals else _with_key_types(pd.DataFrame(columns=[*KEYS, "step", "pass1"])),
        params=params,
        unfinished=tuple(p.name for p in folders if p not in finished),
    )


@dataclass(frozen=True)
class OneCell:
    """One cell folder, finished or still running: what it has written so far."""

    name: str
    params: dict
    summary: dict | None  # None until the cell finishes
    history: pd.DataFrame  # one row per step
    evals: pd.DataFrame  # one row per evaluation
    answers: pd.DataFrame  # one row per held-out problem at each evaluation
    completions: pd.DataFrame  # the logged greedy completions: step, problem_id, prompt, completion, verdict, ...


def load_cell(folder: str | Path) -> OneCell:
    """Read one cell folder; a table the cell has not written yet is empty."""
    folder = Path(folder)
    if not (folder / cell_folder.PARAMS).is_file():
        raise FileNotFoundError(f"{folder}: not a cell folder (no {cell_folder.PARAMS})")

    def table(name: str) -> pd.DataFrame:
        path = folder / name
        return _read_csv(path, {}) if path.is_file() else pd.DataFrame()

    summary = folder / cell_folder.SUMMARY
    answers = table(cell_folder.ANSWERS)
    if "correct" in answers:
        answers["correct"] = answers["correct"].map(_as_int)
    return OneCell(folder.name, json.loads((folder / cell_folder.PARAMS).read_text()),
                   json.loads(summary.read_text()) if summary.is_file() else None,
                   table(cell_folder.HISTORY), table(cell_folder.EVALS), answers, read_completions(folder))


def read_completions(folder: str | Path) -> pd.DataFrame:
    """The completions a cell logged (cell_folder.COMPLETIONS), empty when it logged none."""
    path = Path(folder) / cell_folder.COMPLETIONS
    if not path.is_file():
        return pd.DataFrame(columns=["step", "problem_id", "prompt", "completion", "verdict", "length", "truncated"])
    return pd.read_json(path, lines=True, dtype={"problem_id": str})


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

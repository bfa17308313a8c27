"""Cells as tables: the one place that reads cell folders (cell_folder.py's files). Finished cells of a study
as long tables (load_cells), or one cell folder, finished or still running (load_cell)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..experiment import cell_folder
from ..experiment.config import FULL, CellConfig
from ..experiment.provenance import read_json
from ..rewards import REGIMES

REGIME_ORDER = REGIMES  # the tables show the regimes sparsest reward first, then any other they find
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
    manifests: dict[str, dict]  # each finished cell's manifest.json (commit, packages, device); {} where absent
    unfinished: tuple[str, ...]

    @property
    def worlds(self) -> dict[str, dict[str, str]]:
        """Each finished cell's record of the world it read (params.json: a hash of each entry's files); {} where
        the cell recorded none (made before cells recorded it)."""
        return {name: self.params[name].get(cell_folder.WORLD) or {} for name in sorted(self.params)}


def world_entries(records: Iterable[dict[str, str]]) -> list[str]:
    """The world entries any of these records names, as the cell schema lists them (the student first)."""
    named = {entry for record in records for entry in record}
    schema = [f.name for f in CellConfig.settings("world")]
    return [entry for entry in schema if entry in named] + sorted(named - set(schema))


def arm_name(rank: int | None) -> str:
    """Arm label: "r<rank>" for LoRA, "full" for FullFT."""
    return FULL if rank is None or pd.isna(rank) else f"r{int(rank)}"


class DamagedCell(ValueError):
    """A finished cell folder whose files cannot be read, or disagree with each other."""


def load_cells(outputs_dir: str | Path) -> Cells:
    """Read every finished cell (one with its summary) under <outputs_dir>/cells; skip the rest."""
    root = Path(outputs_dir) / "cells"
    folders = sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []
    finished = [p for p in folders if cell_folder.is_finished(p)]
    if not finished:
        raise FileNotFoundError(f"no finished cell (a folder with {cell_folder.SUMMARY}) under {root}")
    cells = [_read_finished(folder) for folder in finished]
    answers = _concat([cell["answers"] for cell in cells])
    dev_evals = [cell["dev_evals"] for cell in cells if cell["dev_evals"] is not None]
    return Cells(
        summaries=_with_key_types(pd.DataFrame([cell["summary"] for cell in cells])),
        history=_concat([cell["history"] for cell in cells]),
        evals=_concat([cell["evals"] for cell in cells]),
        answers=answers,
        dev_evals=_concat(dev_evals) if dev_evals else _with_key_types(pd.DataFrame(columns=[*KEYS, "step", "pass1"])),
        params={folder.name: cell["params"] for folder, cell in zip(finished, cells)},
        manifests={folder.name: cell["manifest"] for folder, cell in zip(finished, cells)},
        unfinished=tuple(p.name for p in folders if p not in finished),
    )


def _read_finished(folder: Path) -> dict:
    """One finished cell's summary (with its keys), tables and params; DamagedCell names what is wrong."""
    try:
        summary = read_json(folder / cell_folder.SUMMARY)
        keys = _cell_keys(folder.name, summary)
        tables = {name: _read_csv(folder / file, keys) for name, file in
                  (("history", cell_folder.HISTORY), ("evals", cell_folder.EVALS), ("answers", cell_folder.ANSWERS))}
        dev = folder / cell_folder.DEV_EVALS
        params, manifest = folder / cell_folder.PARAMS, folder / cell_folder.MANIFEST
        cell = {"summary": {**summary, **keys}, **tables,
                "dev_evals": _read_csv(dev, keys) if dev.is_file() else None,
                "params": read_json(params) if params.is_file() else {},
                "manifest": read_json(manifest) if manifest.is_file() else {}}
        tables["answers"]["correct"] = _correct_as_int(tables["answers"])
        _check_complete(summary, tables["history"], tables["evals"], tables["answers"])
    except (OSError, ValueError) as error:
        raise DamagedCell(
            f"{folder}: {error}. The cell counts as finished (it has its {cell_folder.SUMMARY}) but its files are "
            f"damaged; move the folder aside, or delete its {cell_folder.SUMMARY}, and run the cells stage again "
            "to recompute it") from error
    return cell


def _check_complete(summary: dict, history: pd.DataFrame, evals: pd.DataFrame, answers: pd.DataFrame) -> None:
    """A finished cell's files agree with each other: one history row per step, and as many answers at each
    evaluation as it scored (a truncated answers.csv would otherwise shrink the paired comparisons silently)."""
    if "steps" in summary and len(history) != summary["steps"]:
        raise ValueError(f"{cell_folder.HISTORY} has {len(history)} rows, {cell_folder.SUMMARY} says "
                         f"{summary['steps']} steps")
    if "scored" not in evals:  # written by every cell (CellWriter.add_eval); absent only from hand-made folders
        return
    answered = answers.groupby("step").size().to_dict()
    scored = evals.set_index("step")["scored"].to_dict()
    if answered != scored:
        raise ValueError(f"{cell_folder.ANSWERS} holds {answered} answers per step, {cell_folder.EVALS} says {scored} "
                         "were scored")


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
        hint = ""
        if folder.parent.name == "groups":  # a stacked job's notebook and log; its arms write cells/<arm>/
            regime, _, seed = folder.name.rpartition("-")
            cells = folder.parent.parent / "cells"
            arms = ", ".join(sorted(p.name for p in cells.glob(f"{regime}-r*-{seed}")))
            hint = f"; this stacked group's arms are cell folders in {cells}: {arms}"
        raise FileNotFoundError(f"{folder}: not a cell folder (no {cell_folder.PARAMS}){hint}")

    def table(name: str) -> pd.DataFrame:
        path = folder / name
        return _read_csv(path, {}) if path.is_file() else pd.DataFrame()

    summary = folder / cell_folder.SUMMARY
    answers = table(cell_folder.ANSWERS)
    if "correct" in answers:
        answers["correct"] = _correct_as_int(answers)
    return OneCell(folder.name, read_json(folder / cell_folder.PARAMS),
                   read_json(summary) if summary.is_file() else None,
                   table(cell_folder.HISTORY), table(cell_folder.EVALS), answers, read_completions(folder))


def read_completions(folder: str | Path) -> pd.DataFrame:
    """The completions a cell logged (cell_folder.COMPLETIONS), empty when it logged none."""
    path = Path(folder) / cell_folder.COMPLETIONS
    if not path.is_file():
        return pd.DataFrame(columns=["step", "problem_id", "prompt", "completion", "verdict", "length", "truncated"])
    return pd.read_json(path, lines=True, dtype={"problem_id": str})


def _cell_keys(name: str, summary: dict) -> dict:
    """The key columns of one cell, taken from its summary."""
    if missing := {"regime", "seed"} - summary.keys():
        raise ValueError(f"{cell_folder.SUMMARY} lacks {sorted(missing)}")
    rank = summary.get("rank")
    return {"cell": name, "regime": summary["regime"], "rank": rank, "arm": arm_name(rank), "seed": summary["seed"],
            "learning_rate": summary.get("learning_rate")}


def _read_csv(path: Path, keys: dict) -> pd.DataFrame:
    """One cell's CSV with its key columns first (problem ids kept as text: "007" is not 7); a ValueError that
    names the file when it does not parse."""
    try:
        frame = pd.read_csv(path, dtype={"problem_id": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ValueError(f"{path.name} does not parse as CSV ({error})") from error
    for i, (column, value) in enumerate(keys.items()):
        frame.insert(i, column, [value] * len(frame))
    return frame


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate cells' frames (columns may differ between regimes) with typed keys."""
    return _with_key_types(pd.concat(frames, ignore_index=True, sort=False))


def _with_key_types(frame: pd.DataFrame) -> pd.DataFrame:
    """Rank as nullable Int64, seed as int."""
    return frame.astype({"rank": "Int64", "seed": int})


def _correct_as_int(answers: pd.DataFrame) -> pd.Series:
    """The answers' verdicts as 0/1 (written as bools or numbers); a ValueError on any other value, such as the
    blank of a cut-off line, which a truthiness test would count as correct."""
    verdicts = {"true": 1, "1": 1, "1.0": 1, "false": 0, "0": 0, "0.0": 0}
    if "correct" not in answers:
        raise ValueError(f"{cell_folder.ANSWERS} has no correct column")
    values = answers["correct"].map(lambda value: verdicts.get(str(value).strip().lower()))
    if values.isna().any():
        bad = answers.loc[values.isna(), "correct"].iloc[0]
        raise ValueError(f"{cell_folder.ANSWERS} has a verdict {bad!r} that is neither 0/1 nor True/False")
    return values.astype(int)


def regimes(cells: Cells) -> list[str]:
    """Regimes present, in the design's order, unknown ones after."""
    return in_regime_order(cells.summaries["regime"])


def in_regime_order(names: Iterable[str]) -> list[str]:
    """These regimes, each once, in the design's order, unknown ones after."""
    present = set(names)
    return [r for r in REGIME_ORDER if r in present] + sorted(present - set(REGIME_ORDER))


def ranks(cells: Cells) -> list[int]:
    """LoRA ranks present, ascending."""
    return sorted(int(r) for r in cells.summaries["rank"].dropna().unique())


def arms(cells: Cells) -> list[str]:
    """Arms present: ranks ascending, then full."""
    has_full = cells.summaries["rank"].isna().any()
    return [arm_name(r) for r in ranks(cells)] + ([FULL] if has_full else [])

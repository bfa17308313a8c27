"""The files of a cell folder; summary.json, written last and atomically, marks a finished cell."""
from __future__ import annotations

from pathlib import Path

PARAMS = "params.json"  # the cell's config
WORLD = "world_fingerprints"  # params.json's record of the world the cell read: a hash of each entry (provenance.py)
DERIVED = "derived"  # params.json's values read off the built policy (cell.derived_record)
TRAINED_PARAMETERS = "trained_parameters"  # in DERIVED: the arm's trained parameter count (capacity.py reads it)
HISTORY = "history.csv"  # one row of metrics per GRPO step
EVALS = "evals.csv"  # one row per held-out evaluation
ANSWERS = "answers.csv"  # one row per held-out problem each evaluation scored (in between: the curve_problems)
DEV_EVALS = "dev_evals.csv"  # one row per dev evaluation (cell setting dev_problems): what a step is chosen on
COMPLETIONS = "completions.jsonl"  # the greedy completions of the first few held-out problems at each evaluation
MANIFEST = "manifest.json"  # git commit, package versions, device, wall time
SUMMARY = "summary.json"  # the headline numbers; its presence means the cell is done
NOTEBOOK = "cell.ipynb"  # the executed training notebook (written by the runner)
LOG = "run.log"  # the cell process's output (written by the runner)


def is_finished(folder: Path) -> bool:
    """Whether a cell folder holds its done marker."""
    return (Path(folder) / SUMMARY).is_file()

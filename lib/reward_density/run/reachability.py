"""Before any training starts: can every model and dataset a profile names be reached?

A paper run that finds out at cell 30 that the PRM id was mistyped, or that the hub is offline, has
wasted hours; this check reads only configs and dataset metadata, in seconds (about two minutes on a machine
that cannot reach the hub at all, measured on the paper profile: the datasets library retries before it gives up).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


class WorldUnreachable(ValueError):
    """Some model or dataset of the profile cannot be reached; the message lists each with the reason."""


def _model_problem(key: str, source: str) -> str | None:
    from ..data.sources import load_config  # torch and transformers: imported only when a check runs

    try:
        load_config(source, what=key)
    except Exception as error:  # a missing folder, an unknown id, an offline hub: all stop the run here
        return f"world.{key} = {source!r}: {_first_line(error)}"
    return None


def _dataset_problem(key: str, source: str, data: dict[str, Any]) -> str | None:
    if "prompt_template" not in data:  # the mini world's own folder of jsonl files
        needed = Path(source) / ("train.jsonl" if key == "problems" else "")
        return None if needed.exists() else f"world.{key} = {source!r}: {needed} does not exist"
    path = Path(source).expanduser()
    if path.is_file():
        return None
    try:
        import datasets

        subsets = data.get("problem_subsets") if key == "problems" else None
        for subset in subsets or [None]:
            datasets.load_dataset_builder(str(path) if path.is_dir() else source, subset)
    except Exception as error:
        return f"world.{key} = {source!r}: {_first_line(error)}"
    return None


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def check_world(world: dict[str, str], data: dict[str, Any]) -> None:
    """Raise WorldUnreachable naming every model or dataset entry that cannot be loaded."""
    problems = [_model_problem(key, world[key]) for key in ("student", "teacher", "prm")]
    problems += [_dataset_problem(key, world[key], data) for key in ("problems", "heldout") if world.get(key)]
    problems = [p for p in problems if p]
    if problems:
        raise WorldUnreachable(
            "cannot reach these world entries (hub offline, a wrong id, or a missing local copy; local paths "
            "work wherever a hub id does):\n  " + "\n  ".join(problems)
        )

"""Before any training starts: can every model and dataset a profile names be reached?

A paper run that finds out at cell 30 that the PRM id was mistyped, or that the hub is offline, has
wasted hours; this check reads only configs and dataset metadata, in seconds. A machine that cannot reach the hub
at all is told so by one request first: the datasets library's retries would take about two minutes to say it
(measured on the paper profile).
"""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..data.problem_sets import TRAIN_FILE
from ..experiment.config import SFT, CellConfig

MODELS = ("student", "teacher", "prm")
DATASETS = ("problems", "heldout", "control")  # the control: always a folder of jsonl files, as the mini world's
HUB_PROBE_SECONDS = 10


class WorldUnreachable(ValueError):
    """Some model or dataset of the profile cannot be reached; the message lists each with the reason."""


class WorldTooSmall(ValueError):
    """A problem file of the world holds fewer problems than the profile's cells ask of it."""


def _model_problem(key: str, source: str) -> str | None:
    from ..data.sources import load_config  # torch and transformers: imported only when a check runs

    try:
        load_config(source, what=key)
    except Exception as error:  # a missing folder, an unknown id, an offline hub: all stop the run here
        return f"world.{key} = {source!r}: {_first_line(error)}"
    return None


def _dataset_problem(key: str, source: str, data: dict[str, Any]) -> str | None:
    if "prompt_template" not in data or key == "control":  # the mini world's own folder of jsonl files
        needed = Path(source) / (TRAIN_FILE if key in ("problems", "control") else "")
        return None if needed.exists() else f"world.{key} = {source!r}: {needed} does not exist"
    path = Path(source).expanduser()
    if path.is_file():
        return None
    if _mini_world_folder(path):
        return (f"world.{key} = {source!r} is a mini-world problems folder ({TRAIN_FILE} of prompts), which "
                "data.prompt_template would read as a MATH-schema dataset: leave out the data section for a mini world")
    try:
        import datasets

        subsets = data.get("problem_subsets") if key == "problems" else None
        for subset in subsets or [None]:
            datasets.load_dataset_builder(str(path) if path.is_dir() else source, subset)
    except Exception as error:
        return f"world.{key} = {source!r}: {_first_line(error)}"
    return None


def _mini_world_folder(path: Path) -> bool:
    """Whether a folder holds the mini world's problems: a train.jsonl whose rows are prompts, not MATH problems."""
    try:
        with (path / TRAIN_FILE).open() as handle:
            row = json.loads(handle.readline())
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and "prompt" in row and "problem" not in row


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _is_hub_id(source: str) -> bool:
    """Whether a world entry is a hub id: the runner passes local paths made absolute (resolve_world_entry)."""
    return not Path(source).expanduser().is_absolute()


def hub_unreachable() -> str | None:
    """Why the hub's endpoint does not answer one request, or None: it answered (any HTTP status), or offline mode
    (HF_HUB_OFFLINE) is on, where the loaders read the local cache and ask the hub nothing."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=HUB_PROBE_SECONDS)
    except urllib.error.HTTPError:
        return None
    except OSError as error:  # no name resolution, no route, refused, timed out (URLError is an OSError)
        return f"the hub ({constants.ENDPOINT}) does not answer: {_first_line(error)}"
    return None


def _cached(key: str, source: str) -> bool:
    """Whether the local Hugging Face cache holds this hub id's config (a model) or card (a dataset)."""
    from huggingface_hub import try_to_load_from_cache

    filename, kind = ("config.json", "model") if key in MODELS else ("README.md", "dataset")
    try:
        return isinstance(try_to_load_from_cache(source, filename, repo_type=kind), str)
    except ValueError:  # not a valid repo id: not in the cache either
        return False


def _problem(key: str, source: str, data: dict[str, Any], no_hub: str | None) -> str | None:
    """Why this entry cannot be loaded, or None; a hub id is not tried when the hub does not answer (no_hub: why):
    the loaders would retry the hub for minutes."""
    if no_hub and _is_hub_id(source):
        problem = f"world.{key} = {source!r}: {no_hub}, and the local cache lacks it"
    else:
        problem = _model_problem(key, source) if key in MODELS else _dataset_problem(key, source, data)
    if problem and _is_hub_id(source):  # `models/x` reads as the hub's owner/name, not a folder
        problem += f" (read as a hub id; a local folder is written ./{source})"
    return problem


def check_world(world: dict[str, str], data: dict[str, Any]) -> None:
    """Raise WorldUnreachable naming every model or dataset entry that cannot be loaded."""
    entries = {key: world[key] for key in (*MODELS, *DATASETS) if world.get(key)}
    no_hub = hub_unreachable() if any(_is_hub_id(source) for source in entries.values()) else None
    # Where the hub does not answer, a hub id in the local cache is loadable (the loaders fall back to it).
    cached = [key for key, source in entries.items() if no_hub and _is_hub_id(source) and _cached(key, source)]
    problems = [_problem(key, source, data, no_hub) for key, source in entries.items() if key not in cached]
    problems = [p for p in problems if p]
    if problems:
        offline = "; HF_HUB_OFFLINE=1 has the loaders look in their own caches instead" if no_hub else ""
        raise WorldUnreachable(
            "cannot reach these world entries (hub offline, a wrong id, or a missing local copy; local paths "
            f"work wherever a hub id does{offline}):\n  " + "\n  ".join(problems)
        )
    if cached:
        print(f"note: {no_hub}; {', '.join(cached)} read from the local cache: set HF_HUB_OFFLINE=1 so that no load "
              "waits for the hub", file=sys.stderr)


def check_problem_counts(configs: Sequence[CellConfig]) -> None:
    """Raise WorldTooSmall naming each mini-world problem file with fewer rows than a cell asks of it (held-out,
    dev, or one step's training problems). Rows bound the usable problems from above, so each would fail every
    cell, and only once the capability baseline has sampled; a MATH-schema dataset is sized when it loads."""
    short = []
    for config in configs:
        if config.prompt_template is not None:
            continue
        folder = Path(config.control if config.regime == SFT else config.problems)
        asked = {config.heldout_file: config.eval_problems, folder / "dev.jsonl": config.dev_problems,
                 folder / TRAIN_FILE: config.problems_per_step}
        for path, count in asked.items():
            rows = _rows(path) if count is not None and path.is_file() else None
            if rows is not None and rows < count:
                short.append(f"{path} holds {rows} problems, and the {config.regime} cells ask for {count}")
    if short:
        raise WorldTooSmall("the world's problem files hold fewer problems than the profile's cells need:\n  "
                            + "\n  ".join(short))


def _rows(path: Path) -> int:
    """The non-blank lines of a jsonl file."""
    with path.open() as handle:
        return sum(1 for line in handle if line.strip())

"""MATH problems from the hub or a local copy, through one datasets.load_dataset code path.

Sources (the same schema either way: a `problem` column and an `answer` or a `solution` column):
- a hub id, e.g. "EleutherAI/hendrycks_math" (with subsets: its subject configs) or "HuggingFaceH4/MATH-500";
- a local .jsonl/.json/.parquet file (the whole file is the split; it has no subsets);
- a local folder: a downloaded snapshot of a hub dataset. Subsets need the snapshot's README.md with
  `configs:` metadata (each config_name with its data_files), as the hub's parquet conversions have.
  Without that README, a folder has only the default config: files named after the split
  (`train.jsonl`, `test-00000-of-00001.parquet`, ...) anywhere under it are found and concatenated.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .answer_check import Checker, last_boxed
from .problems import Problem
from .sources import is_local

PLACEHOLDER = "{problem}"
_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataUnavailable(ValueError):
    """A hub dataset could not be loaded (offline, unknown id, split or subset)."""


@dataclass(frozen=True)
class MathLoadReport:
    """What a load kept and what it skipped."""

    source: str
    split: str
    rows: int
    kept: int
    no_gold: int
    unparsable: int = 0

    def describe(self) -> str:
        """One line for a log."""
        return (
            f"{self.source} [{self.split}]: {self.rows} rows, {self.kept} kept, "
            f"{self.no_gold} without a gold answer, {self.unparsable} with a gold math-verify cannot parse"
        )

    def with_unparsable(self, dropped: int) -> MathLoadReport:
        """This report after drop_unparsable removed `dropped` more problems."""
        return replace(self, kept=self.kept - dropped, unparsable=self.unparsable + dropped)


def gold_answer(row: dict) -> str | None:
    """The row's `answer` when present and non-empty, else the last boxed answer of its `solution`."""
    answer = row.get("answer")
    if answer is not None and str(answer).strip():
        return str(answer).strip()
    boxed = last_boxed(row.get("solution") or "")
    return boxed.strip() if boxed and boxed.strip() else None


def _load(source: str, split: str, subset: str | None):
    """One dataset split: a local file, a local folder's config, or a hub config."""
    import datasets

    if not is_local(source):
        try:
            return datasets.load_dataset(source, subset, split=split)
        except Exception as error:
            raise DataUnavailable(
                f"cannot load {source!r} (split {split!r}, subset {subset or 'default'!r}) from the Hugging Face hub: "
                f"{error}. The hub may be offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE set, or no network), or the "
                "id, split or subset may be wrong. To use a local copy instead, set the profile's world.problems / "
                "world.heldout to a local .jsonl/.json/.parquet file in the MATH schema or to a downloaded snapshot "
                "folder."
            ) from error
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"local MATH data not found: {source}")
    if path.is_dir():
        try:
            return datasets.load_dataset(str(path), subset, split=split)
        except ValueError as error:
            raise ValueError(
                f"cannot load split {split!r}, subset {subset or 'default'!r} from the folder {source}: {error} "
                "(a folder declares subsets in its README.md `configs:` metadata)"
            ) from error
    if subset is not None:
        raise ValueError(f"{source} is a single file and has no subsets (asked for {subset!r}); drop the subsets")
    builder = _FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(f"{source}: unsupported file type {path.suffix!r}; use one of {sorted(_FILE_BUILDERS)}")
    return datasets.load_dataset(builder, data_files=str(path), split="train")


def _check_columns(columns: Sequence[str], source: str, subset: str | None) -> None:
    missing = [] if "problem" in columns else ["problem"]
    if "answer" not in columns and "solution" not in columns:
        missing.append("answer or solution")
    if missing:
        raise ValueError(
            f"{source} (subset {subset or 'default'!r}) lacks the column(s) {missing}; it has {list(columns)}"
        )


def load_math_problems(
    source: str, split: str, prompt_template: str, subsets: Sequence[str] | None = None
) -> tuple[list[Problem], MathLoadReport]:
    """Problems from a hub id, local file or local folder, subsets in order; rows without a gold are skipped."""
    if prompt_template.count(PLACEHOLDER) != 1:
        raise ValueError(f"the prompt template must contain {PLACEHOLDER} exactly once: {prompt_template!r}")
    problems: list[Problem] = []
    rows = no_gold = 0
    for subset in list(subsets or []) or [None]:
        dataset = _load(source, split, subset)
        _check_columns(dataset.column_names, source, subset)
        for index, row in enumerate(dataset):
            rows += 1
            answer = gold_answer(row)
            if answer is None:
                no_gold += 1
                continue
            problem_id = row.get("unique_id") or f"{subset or 'default'}/{split}/{index}"
            prompt = prompt_template.replace(PLACEHOLDER, str(row["problem"]))
            problems.append(Problem(str(problem_id), prompt, answer, question=str(row["problem"])))
    return problems, MathLoadReport(source, split, rows, len(problems), no_gold)


def drop_unparsable(problems: Sequence[Problem], checker: Checker) -> tuple[list[Problem], list[Problem]]:
    """(kept, dropped): the problems whose gold the checker can read, and the others."""
    bad = set(checker.unparsable_golds([problem.answer for problem in problems]))
    kept = [problem for problem in problems if problem.answer not in bad]
    dropped = [problem for problem in problems if problem.answer in bad]
    return kept, dropped

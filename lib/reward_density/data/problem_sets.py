"""A run's training and held-out problems: the mini world's own jsonl files, or MATH-schema datasets.

Which one is decided by the profile: a `data.prompt_template` means MATH-schema datasets (hub ids or
local copies, read through `datasets`, math_data.py); without one, `problems` is a mini-world folder
holding train.jsonl, dev.jsonl and heldout.jsonl.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from .answer_check import Checker
from .problems import Problem, read_problems

TRAIN_FILE = "train.jsonl"  # in a mini-world problems folder: the problems training prompts are drawn from


def training_problems(
    problems: str, prompt_template: str | None, subsets: Sequence[str] | None, checker: Checker,
    log: Callable[[str], None] = print,
) -> list[Problem]:
    """The problems training prompts are drawn from."""
    if prompt_template is None:
        return _readable(read_problems(Path(problems) / TRAIN_FILE), Path(problems) / TRAIN_FILE, checker)
    return _math_problems(problems, "train", prompt_template, subsets, checker, log)


def heldout_problems(
    problems: str, heldout: str | None, prompt_template: str | None, subsets: Sequence[str] | None,
    checker: Checker, count: int | None = None, log: Callable[[str], None] = print, split: str = "heldout",
) -> list[Problem]:
    """The fixed held-out set: the first `count` problems (all when None) of `heldout`, else of `problems`
    (a mini-world folder: its `split`, heldout for the study or dev for choosing settings)."""
    if prompt_template is None:
        source = Path(heldout) if heldout else Path(problems) / f"{split}.jsonl"
        found = _readable(read_problems(source), source, checker)
    else:  # a separate held-out dataset has one default config; the training dataset's test split has subsets
        if heldout is None and Path(problems).expanduser().is_file():
            raise ValueError(f"{problems} is a single file, one split, which training reads: set world.heldout to the "
                             "held-out problems, or the study would evaluate on its training problems")
        source = heldout or problems
        found = _math_problems(source, "test", prompt_template, None if heldout else subsets, checker, log)
    what = "held-out" if split == "heldout" else split
    if count is not None and len(found) < count:
        raise ValueError(f"{count} {what} problems requested but {source} holds only {len(found)} usable ones")
    chosen = found[:count]
    repeated = [problem_id for problem_id, n in Counter(p.problem_id for p in chosen).items() if n > 1]
    if repeated:  # the analysis pairs the arms' answers by problem id
        raise ValueError(f"{source}: {len(repeated)} problem id(s) repeat among the {len(chosen)} {what} problems "
                         f"(e.g. {repeated[0]!r}); each must be unique, as answers are paired across arms by id")
    return chosen


def without_heldout(train: list[Problem], heldout: Sequence[Problem], log: Callable[[str], None] = print,
                    ) -> list[Problem]:
    """The training problems no held-out problem repeats (by prompt): a held-out set drawn from the training data, as
    a file that serves both or a test split that repeats training questions, is never trained on."""
    held = {problem.prompt for problem in heldout}
    kept = [problem for problem in train if problem.prompt not in held]
    if not kept:
        raise ValueError(f"every one of the {len(train)} training problems is held out: set world.heldout to "
                         "problems training does not read")
    if len(kept) < len(train):
        shown = next(problem.problem_id for problem in train if problem.prompt in held)
        log(f"  {len(train) - len(kept)} of {len(train)} training problems repeat a held-out problem's prompt (e.g. "
            f"{shown}) and are left out of training")
    return kept


def _readable(problems: list[Problem], source: Path, checker: Checker) -> list[Problem]:
    """A mini-world file's problems, refused when the checker cannot read a gold as a number (its golds are numbers;
    math-verify reads a malformed one such as `\\frac{1}{` as its text alone): at load, before any work, rather
    than at the step that first samples the problem, or never, as a problem every arm fails."""
    golds = [problem.answer for problem in problems]
    bad = set(checker.unparsable_golds(golds)) | set(checker.text_only_golds(golds))
    named = [f"{problem.problem_id}: {problem.answer!r}" for problem in problems if problem.answer in bad]
    if named:
        raise ValueError(f"{source}: the checker cannot read the gold answer of {len(named)} problem(s) "
                         f"({', '.join(named[:5])}{', ...' if len(named) > 5 else ''}); a data bug, not a wrong answer")
    return problems


def _math_problems(source, split, prompt_template, subsets, checker, log) -> list[Problem]:
    """MATH-schema problems, minus those whose gold answer math-verify cannot parse (reported, not fatal)."""
    from .math_data import drop_unparsable, load_math_problems  # deferred: `datasets` is slow to import

    found, report = load_math_problems(source, split, prompt_template, subsets)
    kept, dropped = drop_unparsable(found, checker)
    log(report.with_unparsable(len(dropped)).describe())
    if dropped:
        log(f"  dropped {len(dropped)} problem(s) whose gold answer math-verify cannot parse ({_shown(dropped)})")
    text_only = set(checker.text_only_golds([problem.answer for problem in kept]))
    if text_only:
        as_text = [problem for problem in kept if problem.answer in text_only]
        log(f"  {len(as_text)} problem(s) whose gold math-verify reads only as its text, kept: an answer is correct "
            f"only written the same way ({_shown(as_text)})")
    return kept


def _shown(problems: list[Problem]) -> str:
    """Up to five problems' ids and golds, for a log line."""
    return ", ".join(f"{p.problem_id}: {p.answer!r}" for p in problems[:5]) + (", ..." if len(problems) > 5 else "")

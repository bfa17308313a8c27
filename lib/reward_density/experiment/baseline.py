"""The base model before training: its capability (paper Table 2: sampled pass@k, exploration gap, length)
and its greedy held-out evaluation, which every cell starts from (computed once per world and reused)."""
from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ..data.answer_check import Checker, Verdict
from ..data.problems import Problem
from ..grpo.precision import autocast
from ..grpo.sampler import SamplingConfig
from .config import SFT, CellConfig
from .evaluation import greedy_eval, sampled_pass_at_k
from .profiles import REPO_ROOT, Profile, cell_config
from .provenance import fingerprint, read_json, write_json_atomic


def capability_row(
    name: str,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    checker: Checker,
    sampling: SamplingConfig,
    ks: Sequence[int],
    seed: int,
    gap_k: int = 4,
    batch_size: int = 8,
) -> dict:
    """pass@k for each k from max(ks) samples per problem, the exploration gap and the mean length."""
    if not {1, gap_k} <= set(ks):
        raise ValueError(f"ks must include 1 and gap_k={gap_k} for the exploration gap, got {list(ks)}")
    scores, rows = sampled_pass_at_k(model, tokenizer, problems, checker, sampling, max(ks), ks, seed, batch_size)
    lengths = [r["length"] for r in rows]
    return {
        "model": name,
        **{f"pass@{k}": scores[k] for k in ks},
        # The paper's pass@4 - pass@1: what a model finds when it may try again, which RL can pull into pass@1.
        "exploration_gap": scores[gap_k] - scores[1],
        "mean_length": sum(lengths) / len(lengths),
        "frac_truncated": sum(r["truncated"] for r in rows) / len(rows),
    }


def base_eval_key(config: CellConfig) -> str:
    """What a base evaluation depends on: the student's weights, the held-out problems and how they are decoded."""
    count = None if config.regime == SFT else config.eval_problems  # the control is scored on all its facts
    parts = [fingerprint(config.student), fingerprint(config.heldout_file), config.regime == SFT, count,
             config.eval_max_new_tokens, config.eval_batch_size, config.precision, config.prompt_template,
             config.problem_subsets]
    if config.answer_format != "boxed":  # keys of boxed-answer evaluations stay what they were before the option
        parts.append(config.answer_format)
    if config.student_precision != config.precision:  # under bf16, FullFT's fp32 master copy (under autocast)
        parts.append("fp32 master copy")
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def base_evaluation(config: CellConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                    heldout: Sequence[Problem], checker: Checker) -> tuple[float, list[dict]]:
    """The base model's greedy pass@1 and rows: read from config.base_answers when its key is there and it scored
    these problems (its completions graded again by this checker), else evaluated now and saved there unless another
    set's evaluation is (atomically: cells running side by side may both write it)."""
    path = None if config.base_answers is None else Path(config.base_answers) / f"base-{base_eval_key(config)}.json"
    saved = _read_saved(path) if path is not None and path.is_file() else None
    if saved is not None:
        if _same_problems(saved["rows"], heldout, path):
            return _regraded(saved["rows"], heldout, checker)
        path = None  # the saved evaluation of the other set stays as it is
    with autocast(config.device, config.precision):
        pass1, rows = greedy_eval(model, tokenizer, heldout, checker, config.eval_max_new_tokens,
                                  batch_size=config.eval_batch_size)
    if path is not None:
        write_json_atomic(path, {"pass1": pass1, "rows": rows, "student": config.student})
    # Keys as a saved evaluation reads back (sorted), so a cell's answers.csv is the same bytes either way.
    return pass1, [dict(sorted(row.items())) for row in rows]


def _regraded(rows: list[dict], heldout: Sequence[Problem], checker: Checker) -> tuple[float, list[dict]]:
    """Saved completions graded by the checker as it is now, and their pass@1.

    The key names what decides the completions (the student, the problems, the decoding), not the grading: a
    change to the checker must reach the base as it reaches every later evaluation, and grading again costs little
    beside decoding (math-verify checked the mini base's 1,000 completions in 0.25 s).
    """
    verdicts = checker.check([problem.answer for problem in heldout], [row["completion"] for row in rows])
    graded = [row | {"verdict": verdict.value, "correct": verdict is Verdict.CORRECT,
                     "answered": checker.has_answer(row["completion"])} for row, verdict in zip(rows, verdicts)]
    return sum(row["correct"] for row in graded) / max(len(graded), 1), graded


def _same_problems(rows: list[dict], heldout: Sequence[Problem], path: Path) -> bool:
    """Whether a saved evaluation scored exactly these problems, in this order; a warning when not.

    Its key names the held-out file and count, but not which of the file's problems loading kept (a gold answer
    the checker could not parse is dropped), so two loads under one key can differ.
    """
    saved, here = [row.get("problem_id") for row in rows], [problem.problem_id for problem in heldout]
    if saved == here:
        return True
    first = next((i for i, (a, b) in enumerate(zip(saved, here)) if a != b), min(len(saved), len(here)))
    warnings.warn(f"{path} scored other held-out problems than this cell loaded ({len(saved)} there, {len(here)} "
                  f"here, first differing at position {first}), so the base model is evaluated again on this cell's; "
                  "the saved file is kept", stacklevel=3)
    return False


def _read_saved(path: Path) -> dict | None:
    """A saved base evaluation, or None with a warning when the file is damaged (it is then evaluated again)."""
    try:
        saved = read_json(path)
    except ValueError as error:
        problem = str(error)
    else:
        if isinstance(saved, dict) and {"pass1", "rows"} <= saved.keys() and all(
                isinstance(row, dict) and "completion" in row for row in saved["rows"]):
            return saved
        problem = f"{path} lacks pass1, rows or the rows' completions"
    warnings.warn(f"the saved base evaluation is unusable, so the base model is evaluated again: {problem}",
                  stacklevel=2)
    return None


def base_configs(profile: Profile, base_answers: str | Path, root: Path = REPO_ROOT) -> list[CellConfig]:
    """One config per held-out set the profile's cells evaluate on (the task's; the control's when the matrix
    has the sft regime): what base_evaluation needs to compute each once, under the key the cells look up."""
    task = next((regime for regime in profile.matrix.regimes if regime != SFT), None)
    regimes = [regime for regime in (task, SFT) if regime in profile.matrix.regimes]
    # The learning rate does not enter the base evaluation, nor in fp32 the rank. Under bf16 a peft LoRA arm holds
    # the student in bf16 where FullFT holds its fp32 master copy: the shared evaluation is the LoRA arms', and the
    # first FullFT cell evaluates its own under another key.
    return [cell_config(profile, regime, 1, profile.matrix.seeds[regime][0], learning_rate=1.0, root=root,
                        base_answers=str(base_answers)) for regime in dict.fromkeys(regimes)]

"""One cell of the matrix: its inputs, the training loop and the files it writes (cell_folder.py).

params.json, history.csv (per step), evals.csv (per evaluation), answers.csv (per problem at each
evaluation), manifest.json, and summary.json last and atomically: its presence means the cell is done.
"""
from __future__ import annotations

import csv
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.answer_check import AnswerChecker
from ..data.problem_sets import heldout_problems, training_problems
from ..data.problems import Problem
from ..data.sources import load_causal_lm, load_tokenizer
from ..grpo.loss import LossConfig
from ..grpo.policy import Policy, PolicyConfig
from ..grpo.precision import autocast, frozen_dtype
from ..grpo.sampler import SamplingConfig
from ..grpo.step import StepConfig, grpo_step
from ..rewards import RewardModule, build_reward
from . import cell_folder
from .config import CellConfig
from .evaluation import greedy_eval
from .provenance import manifest, write_json_atomic


def step_config(config: CellConfig) -> StepConfig:
    """The GRPO step's settings of a cell."""
    loss = LossConfig(beta=config.beta, kl_estimator=config.kl_estimator, normalisation=config.loss_normalisation,
                      constant_length=config.max_new_tokens)
    sampling = SamplingConfig(config.max_new_tokens, temperature=config.temperature, top_p=config.top_p)
    return StepConfig(config.group_size, sampling, loss, config.advantage_eps, config.max_grad_norm,
                      precision=config.precision, micro_batch_size=config.micro_batch_size)


def policy_config(config: CellConfig) -> PolicyConfig:
    """The policy's settings of a cell: a LoRA adapter of its rank, or full fine-tuning."""
    return PolicyConfig(rank=config.rank, alpha=config.lora_alpha, dropout=config.lora_dropout,
                        precision=config.precision, gradient_checkpointing=config.gradient_checkpointing)


# ------------------------------------------------------------------------------------ inputs


@dataclass
class CellInputs:
    """What a cell trains on and with: problems, student and tokenizer, the reward, the answer checker."""

    train: list[Problem]
    heldout: list[Problem]
    tokenizer: Any
    student: torch.nn.Module
    reward: RewardModule
    checker: AnswerChecker


def load_problem_splits(config: CellConfig, checker: AnswerChecker) -> tuple[list[Problem], list[Problem]]:
    """Training problems and the first eval_problems held-out problems (the same fixed set for every cell)."""
    subsets = config.problem_subsets
    train = training_problems(config.problems, config.prompt_template, subsets, checker)
    heldout = heldout_problems(config.problems, config.heldout, config.prompt_template, subsets, checker,
                               count=config.eval_problems)
    return train, heldout


def load_inputs(config: CellConfig, checker: AnswerChecker) -> CellInputs:
    """Load everything before training starts, so a missing model or dataset fails before any work."""
    train, heldout = load_problem_splits(config, checker)
    tokenizer = load_tokenizer(config.student)
    frozen = frozen_dtype(config.precision)  # FullFT's student is its fp32 master copy; the rest never changes
    student_dtype = torch.float32 if config.rank is None else frozen
    student = load_causal_lm(config.student, dtype=student_dtype, device=config.device, what="student")
    parts: dict[str, Any] = {"checker": checker, "temperature": config.temperature,
                             "micro_batch_size": config.micro_batch_size}
    if config.regime == "process":
        parts.update(
            prm_model=load_causal_lm(config.prm, dtype=frozen, device=config.prm_device, what="PRM"),
            prm_tokenizer=load_tokenizer(config.prm),
            student_tokenizer=tokenizer,
        )
    if config.regime == "distillation":
        parts["teacher"] = load_causal_lm(config.teacher, dtype=frozen, device=config.teacher_device, what="teacher")
    return CellInputs(train, heldout, tokenizer, student, build_reward(config.regime, **parts), checker)


# ------------------------------------------------------------------------------------ outputs


class CellWriter:
    """Writes a cell's files as they grow; summary.json only through finish()."""

    def __init__(self, config: CellConfig, extra: dict[str, Any] | None = None) -> None:
        self.folder = Path(config.out_dir)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / cell_folder.SUMMARY).unlink(missing_ok=True)  # a rerun is unfinished until it says otherwise
        self.config, self.started = config, time.time()
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.answers: list[dict] = []
        write_json_atomic(self.folder / cell_folder.PARAMS, config.to_parameters() | {"derived": extra or {}})

    def add_step(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        _write_csv(self.folder / cell_folder.HISTORY, self.history)

    def add_eval(self, step: int, pass1: float, rows: list[dict]) -> None:
        n = max(len(rows), 1)
        self.evals.append({
            "step": step,
            "pass1": pass1,
            "len_mean": sum(r["length"] for r in rows) / n,
            "frac_truncated": sum(r["truncated"] for r in rows) / n,
            "frac_answered": sum(r["answered"] for r in rows) / n,
        })
        self.answers += [{"step": step, **r} for r in rows]
        _write_csv(self.folder / cell_folder.EVALS, self.evals)
        _write_csv(self.folder / cell_folder.ANSWERS, self.answers)

    def finish(self, device: str) -> dict[str, Any]:
        """manifest.json, then summary.json last and atomically: from then on the cell counts as done."""
        wall = time.time() - self.started
        write_json_atomic(self.folder / cell_folder.MANIFEST, manifest(device, wall_seconds=round(wall, 2), cell=self.config.name))
        summary = summarise(self.config, self.history, self.evals, wall)
        write_json_atomic(self.folder / cell_folder.SUMMARY, summary)
        return summary


def _write_csv(path: Path, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))  # counters may appear late
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def summarise(config: CellConfig, history: list[dict], evals: list[dict], wall_seconds: float) -> dict[str, Any]:
    """The cell's headline numbers (the analysis reads these)."""
    base = next(e for e in evals if e["step"] == 0)
    peak = max(evals, key=lambda e: (e["pass1"], -e["step"]))
    final = max(evals, key=lambda e: e["step"])
    return {
        "cell": config.name,
        "regime": config.regime,
        "rank": config.rank,
        "seed": config.seed,
        "learning_rate": config.learning_rate,
        "steps": len(history),
        "base_pass1": base["pass1"],
        "final_pass1": final["pass1"],
        "peak_pass1": peak["pass1"],
        "peak_step": peak["step"],
        "peak_advantage_std": max((h["advantage_std"] for h in history), default=0.0),
        "final_len_mean": final["len_mean"],
        "final_frac_truncated": final["frac_truncated"],
        "wall_seconds": round(wall_seconds, 2),
    }


# ------------------------------------------------------------------------------------ training


def batches(problems: list[Problem], size: int, seed: int) -> Iterator[list[Problem]]:
    """Endless batches of distinct problems, reshuffled each epoch with the cell's seed."""
    if size > len(problems):
        raise ValueError(f"prompts_per_step = {size} exceeds the {len(problems)} training problems")
    rng = random.Random(seed)
    while True:
        order = problems[:]
        rng.shuffle(order)
        for start in range(0, len(order) - size + 1, size):
            yield order[start : start + size]


def make_policy(config: CellConfig, student: torch.nn.Module) -> Policy:
    """The LoRA adapter (initialised from the cell's seed) or the full model."""
    torch.manual_seed(config.seed)
    return Policy(student, policy_config(config), keep_reference=config.beta > 0)


def train(config: CellConfig, inputs: CellInputs, policy: Policy, writer: CellWriter, progress: bool = True) -> None:
    """config.steps GRPO steps, with greedy held-out evaluations at step 0, every eval_every and the end."""
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    settings = step_config(config)

    def evaluate(step: int) -> float:
        with autocast(config.device, config.precision), policy.sampling() as model:
            pass1, rows = greedy_eval(model, inputs.tokenizer, inputs.heldout, inputs.checker,
                                      config.eval_max_new_tokens, batch_size=config.eval_batch_size)
        writer.add_eval(step, pass1, rows)
        return pass1

    pass1 = evaluate(0)
    bar = tqdm(range(1, config.steps + 1), desc=config.name, disable=not progress)
    problems = batches(inputs.train, config.prompts_per_step, config.seed)
    for step in bar:
        row = grpo_step(policy, inputs.tokenizer, optimizer, next(problems), inputs.reward, settings,
                        seed=config.seed * 1_000_003 + step)
        writer.add_step({"step": step, **row})
        if step % config.eval_every == 0 or step == config.steps:
            pass1 = evaluate(step)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", pass1=f"{pass1:.3f}", len=f"{row['len_mean']:.0f}")


"""One cell of the matrix: its inputs, the training loop and the files it writes (cell_folder.py).

params.json, history.csv (per step), evals.csv (per evaluation), answers.csv (per problem at each
evaluation), manifest.json, and summary.json last and atomically: its presence means the cell is done.
"""
from __future__ import annotations

import csv
import json
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.answer_check import Checker
from ..data.problem_sets import heldout_problems, training_problems, without_heldout
from ..data.problems import Problem
from ..data.sources import load_causal_lm, load_tokenizer
from ..grpo.loss import LossConfig, scores_reference
from ..grpo.policy import Policy, PolicyConfig
from ..grpo.precision import autocast, frozen_dtype
from ..grpo.replay import ReplayBuffer, ReplayConfig
from ..grpo.sampler import SamplingConfig
from ..grpo.stacked import StackedPolicy
from ..grpo.step import StepConfig, grpo_step, stacked_grpo_step
from ..grpo.token_selection import TokenSelection
from ..rewards import RewardModule, build_reward
from . import cell_folder
from .config import SFT, CellConfig
from .evaluation import greedy_eval, greedy_eval_arms
from .provenance import code_state, fingerprints, manifest, write_json_atomic
from .sft import sft_step


def step_config(config: CellConfig) -> StepConfig:
    """The GRPO step's settings of a cell."""
    loss = LossConfig(beta=config.beta, kl_estimator=config.kl_estimator, normalisation=config.loss_normalisation,
                      constant_length=config.max_new_tokens)
    sampling = SamplingConfig(config.max_new_tokens, temperature=config.temperature, top_p=config.top_p)
    selection = None if config.token_alpha is None else \
        TokenSelection(config.token_alpha, config.token_k, config.token_p)
    return StepConfig(config.group_size, sampling, loss, config.advantage_eps, config.max_grad_norm,
                      precision=config.precision, micro_batch_size=config.micro_batch_size, track_kl=config.track_kl,
                      advantage_estimator=config.advantage_estimator, token_selection=selection, l2=config.l2,
                      answer_format=config.answer_format)


def replay_config(config: CellConfig) -> ReplayConfig | None:
    """T-SPMO's replay settings of a cell, or None when it replays nothing."""
    if config.replay_successes == config.replay_failures == 0:
        return None
    return ReplayConfig(config.replay_threshold, config.replay_successes, config.replay_failures)


def make_replay(config: CellConfig) -> ReplayBuffer | None:
    """The cell's empty replay buffer (seeded by the cell), or None when it replays nothing."""
    replaying = replay_config(config)
    return None if replaying is None else ReplayBuffer(replaying, config.seed)


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
    reward: RewardModule | None  # None for the SFT control, which learns from solutions
    checker: Checker
    dev: list[Problem] = field(default_factory=list)  # scored beside the held-out set, to choose a step on


def load_problem_splits(config: CellConfig, checker: Checker) -> tuple[list[Problem], list[Problem]]:
    """Training problems and the first eval_problems held-out problems (the same fixed set for every cell, none of
    them trained on); the SFT control's come from the world's control skill, scored on every fact it teaches."""
    if config.regime == SFT:
        if config.control is None:
            raise ValueError("the sft regime needs the world's control problems (world.control in the profile)")
        source, heldout, count = config.control, None, None  # the control's own folder and all of its facts
        template = subsets = None  # a mini-world folder, whatever schema the profile's problems have
    else:
        source, heldout, count = config.problems, config.heldout, config.eval_problems
        template, subsets = config.prompt_template, config.problem_subsets
    train = training_problems(source, template, subsets, checker)
    heldout = heldout_problems(source, heldout, template, subsets, checker, count=count, split=config.eval_split)
    if config.regime != SFT:  # the control is scored on the very facts it teaches
        train = without_heldout(train, heldout)
    return train, heldout


def load_dev_problems(config: CellConfig, checker: Checker) -> list[Problem]:
    """The first dev_problems of the mini world's dev split (of the control's, for the SFT control); none unset."""
    if config.dev_problems is None:  # CellConfig refuses dev_problems for MATH-schema data, which has no dev split
        return []
    source = config.control if config.regime == SFT else config.problems
    return heldout_problems(source, None, None, None, checker, count=config.dev_problems, split="dev")


def load_inputs(config: CellConfig, checker: Checker) -> CellInputs:
    """Load everything before training starts, so a missing model or dataset fails before any work."""
    train, heldout = load_problem_splits(config, checker)
    dev = load_dev_problems(config, checker)
    tokenizer = load_tokenizer(config.student)
    student = load_causal_lm(config.student, dtype=frozen_dtype(config.student_precision), device=config.device,
                             what="student")
    return CellInputs(train, heldout, tokenizer, student, load_reward(config, checker, tokenizer), checker, dev)


def load_reward(config: CellConfig, checker: Checker, tokenizer: Any) -> RewardModule | None:
    """The reward module of the cell's regime with the models it reads (None for the SFT control)."""
    if config.regime == SFT:
        return None
    frozen = frozen_dtype(config.precision)
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
    return build_reward(config.regime, **parts)


# ------------------------------------------------------------------------------------ outputs


class CellWriter:
    """Writes a cell's files as they grow; summary.json only through finish()."""

    def __init__(self, config: CellConfig, extra: dict[str, Any] | None = None) -> None:
        self.folder = Path(config.out_dir)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / cell_folder.SUMMARY).unlink(missing_ok=True)  # a rerun is unfinished until it says otherwise
        self.config, self.started, self.code = config, time.time(), code_state()
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.dev_evals: list[dict] = []
        self.answers: list[dict] = []
        # An earlier run's tables and manifest would otherwise stand beside this run's params.json until replaced
        # (some are appended to, or absent from this run), and a rerun stopped meanwhile would mix the two.
        for stale in (cell_folder.HISTORY, cell_folder.EVALS, cell_folder.ANSWERS, cell_folder.MANIFEST,
                      cell_folder.COMPLETIONS, cell_folder.DEV_EVALS):
            (self.folder / stale).unlink(missing_ok=True)
        for board in self.folder.glob(TENSORBOARD_EVENTS):  # TensorBoard would draw an earlier run's curves beside
            board.unlink()
        self.board = live_board(config)
        write_json_atomic(self.folder / cell_folder.PARAMS, config.to_parameters() | {
            cell_folder.DERIVED: extra or {}, cell_folder.WORLD: fingerprints(config.world_inputs)})

    def add_step(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        _write_csv(self.folder / cell_folder.HISTORY, self.history)
        self._show("train", row["step"], row)

    def add_eval(self, step: int, rows: list[dict], prompts: dict[str, str] | None = None) -> None:
        """One evaluation: its means, its per-problem rows, and the first logged_completions completions
        (with their prompts, where given; a base evaluation computed elsewhere may carry no text).

        rows: in held-out order. The means are over the curve problems (the first curve_problems rows), which
        every evaluation scores, so a cell's evaluations compare; pass1_scored is over every row.
        """
        curve = rows[: self.config.curve_problems]
        n = max(len(curve), 1)
        self.evals.append({
            "step": step,
            "pass1": sum(r["correct"] for r in curve) / n,
            "len_mean": sum(r["length"] for r in curve) / n,
            "frac_truncated": sum(r["truncated"] for r in curve) / n,
            "frac_answered": sum(r["answered"] for r in curve) / n,
            "scored": len(rows),
            "pass1_scored": sum(r["correct"] for r in rows) / max(len(rows), 1),
        })
        self.answers += [{"step": step, **{k: v for k, v in r.items() if k != "completion"}} for r in rows]
        _write_csv(self.folder / cell_folder.EVALS, self.evals)
        _write_csv(self.folder / cell_folder.ANSWERS, self.answers)
        logged = [r for r in rows[: self.config.logged_completions] if "completion" in r]
        with open(self.folder / cell_folder.COMPLETIONS, "a") as handle:
            for r in logged:
                prompt = (prompts or {}).get(r["problem_id"])
                handle.write(json.dumps({"step": step, "problem_id": r["problem_id"], "prompt": prompt,
                                         "completion": r["completion"], "verdict": r["verdict"],
                                         "length": r["length"], "truncated": r["truncated"]}) + "\n")
        self._show("eval", step, self.evals[-1])

    def add_dev_eval(self, step: int, pass1: float, scored: int) -> None:
        """One evaluation on the dev problems: only its pass@1 is kept (dev_evals.csv), to choose a step on."""
        self.dev_evals.append({"step": step, "pass1": pass1, "scored": scored})
        _write_csv(self.folder / cell_folder.DEV_EVALS, self.dev_evals)
        self._show("dev", step, self.dev_evals[-1])

    def _show(self, group: str, step: int, row: dict[str, Any]) -> None:
        """Every number of a row on the live board, flushed so a running cell's curves are current."""
        if self.board is None:
            return
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.board.add_scalar(f"{group}/{key}", value, step)
        self.board.flush()

    def finish(self, device: str) -> dict[str, Any]:
        """manifest.json (with the code as the cell started), then summary.json last and atomically: from then on
        the cell counts as done."""
        if self.board is not None:
            self.board.close()
        wall = time.time() - self.started
        write_json_atomic(self.folder / cell_folder.MANIFEST,
                          manifest(device, self.code, wall_seconds=round(wall, 2), cell=self.config.name))
        summary = summarise(self.config, self.history, self.evals, wall)
        write_json_atomic(self.folder / cell_folder.SUMMARY, summary)
        return summary


TENSORBOARD_EVENTS = "events.out.tfevents.*"  # the files a SummaryWriter writes into its log_dir


def live_board(config: CellConfig) -> Any:
    """A TensorBoard SummaryWriter on the cell folder when the cell reports to it, else None."""
    if config.report_to != "tensorboard":
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:  # torch ships the writer; the event format comes from the tensorboard package
        raise ImportError("report_to: tensorboard needs the tensorboard package (pip install tensorboard, or "
                          "./run_all.sh setup)") from error
    return SummaryWriter(log_dir=config.out_dir)


def _write_csv(path: Path, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))  # counters may appear late
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def summarise(config: CellConfig, history: list[dict], evals: list[dict], wall_seconds: float) -> dict[str, Any]:
    """The cell's headline numbers (the analysis reads these): base and final pass@1 over every held-out problem;
    the peak, and the final length and truncation, over the curve problems (evals.csv's means)."""
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
        "base_pass1": base["pass1_scored"],
        "final_pass1": final["pass1_scored"],
        "peak_pass1": peak["pass1"],
        "peak_step": peak["step"],
        "peak_advantage_std": max((h.get("advantage_std", 0.0) for h in history), default=0.0),
        "final_len_mean": final["len_mean"],
        "final_frac_truncated": final["frac_truncated"],
        "wall_seconds": round(wall_seconds, 2),
    }


# ------------------------------------------------------------------------------------ training


def batches(problems: list[Problem], size: int, seed: int) -> Iterator[list[Problem]]:
    """Endless batches of distinct problems, reshuffled each epoch with the cell's seed."""
    if size > len(problems):
        raise ValueError(f"a step's batch of {size} problems (prompts_per_step; the SFT control: sft_batch_size) "
                         f"exceeds the {len(problems)} training problems")
    rng = random.Random(seed)
    while True:
        order = problems[:]
        rng.shuffle(order)
        for start in range(0, len(order) - size + 1, size):
            yield order[start : start + size]


def check_group(configs: list[CellConfig]) -> None:
    """Arms trained together differ only in rank, learning rate and folder (a regime and seed of one profile)."""
    if not configs:
        raise ValueError("a group needs at least one cell")
    own = {"rank", "learning_rate", "out_dir"}
    shared = [{k: v for k, v in asdict(c).items() if k not in own} for c in configs]
    for config, values in zip(configs[1:], shared[1:]):
        differing = sorted(k for k in values if values[k] != shared[0][k])
        if differing:
            raise ValueError(f"{config.name} cannot train beside {configs[0].name}: they differ in {differing}")
    if len(configs) > 1 and configs[0].engine != "stacked":
        raise ValueError("engine peft trains one cell per process; several arms together need engine: stacked")


def check_can_train(configs: list[CellConfig]) -> None:
    """Refuse a group before anything loads: arms that cannot train together (check_group), or a folder that holds
    a finished cell, whose results the run would replace."""
    check_group(configs)
    finished = [str(c.out_dir) for c in configs if cell_folder.is_finished(Path(c.out_dir))]
    if finished:
        raise FileExistsError(f"{', '.join(finished)}: a finished cell is there, which training would replace; "
                              "give another cells_dir, or delete the folder to train it again")


def make_policy(configs: list[CellConfig], student: torch.nn.Module) -> Policy | StackedPolicy:
    """Every arm's adapter (initialised from the cells' seed) or full copy: a Policy, or a StackedPolicy."""
    check_group(configs)
    config = configs[0]
    torch.manual_seed(config.seed)
    if config.engine == "stacked":
        return StackedPolicy(student, [policy_config(c) for c in configs], config.seed)
    keep_reference = config.regime != SFT and scores_reference(config.beta, config.track_kl)  # SFT has no KL
    return Policy(student, policy_config(config), keep_reference=keep_reference)


def derived_record(student: torch.nn.Module, policy: Policy | StackedPolicy, arm: int) -> dict[str, int]:
    """What an arm's params.json records of the built policy: the student's hidden size and the arm's trained
    parameter count."""
    return {"hidden_size": student.config.hidden_size,
            cell_folder.TRAINED_PARAMETERS: sum(p.numel() for p in policy.parameters(arm))}


def make_optimizer(configs: list[CellConfig], policy: Policy | StackedPolicy) -> torch.optim.Optimizer:
    """AdamW with one parameter group per arm, each at its own learning rate."""
    groups = [{"params": policy.parameters(a), "lr": c.learning_rate} for a, c in enumerate(configs)]
    return torch.optim.AdamW(groups, weight_decay=configs[0].weight_decay)


def lr_factor(step: int, config: CellConfig) -> float:
    """The multiplier of every arm's learning rate at step (1-based): 1, or linear decay reaching 1/steps."""
    return 1.0 if config.lr_schedule == "constant" else (config.steps - step + 1) / config.steps


def evaluate(configs: list[CellConfig], problems: list[Problem], inputs: CellInputs,
             policy: Policy | StackedPolicy) -> list[tuple[float, list]]:
    """Greedy pass@1 of every arm on these problems, with its per-problem rows."""
    config = configs[0]
    if isinstance(policy, StackedPolicy):
        with torch.no_grad():
            return greedy_eval_arms(policy.weights(), inputs.tokenizer, problems, inputs.checker,
                                    config.eval_max_new_tokens, batch_size=config.eval_batch_size)
    with autocast(config.device, config.precision), policy.sampling() as model:
        return [greedy_eval(model, inputs.tokenizer, problems, inputs.checker, config.eval_max_new_tokens,
                            batch_size=config.eval_batch_size)]


def train(configs: list[CellConfig], inputs: CellInputs, policy: Policy | StackedPolicy, writers: list[CellWriter],
          base: tuple[float, list[dict]] | None = None, progress: bool = True) -> None:
    """config.steps steps of every arm, with greedy held-out evaluations at step 0, every eval_every and the end:
    of every held-out problem at step 0 and the end, of the first curve_problems in between; with dev_problems,
    of those dev problems too at every evaluation after step 0.

    base: the base model's evaluation (every arm starts as the base), computed here when not given.
    """
    config = configs[0]
    optimizer = make_optimizer(configs, policy)
    settings = step_config(config)

    prompts = {p.problem_id: p.prompt for p in inputs.heldout[: config.logged_completions]}

    def evaluations(step: int) -> list[float]:
        problems = inputs.heldout if step in (0, config.steps) else inputs.heldout[: config.curve_problems]
        if step == 0 and base is not None:
            results = [base] * len(configs)
        else:
            results = evaluate(configs, problems, inputs, policy)
        for writer, (_, rows) in zip(writers, results):
            writer.add_eval(step, rows, prompts)
        if inputs.dev and step > 0:  # a step is chosen among the trained ones
            for writer, (pass1, _) in zip(writers, evaluate(configs, inputs.dev, inputs, policy)):
                writer.add_dev_eval(step, pass1, len(inputs.dev))
        return [writer.evals[-1]["pass1"] for writer in writers]

    pass1 = evaluations(0)
    desc = config.name if len(configs) == 1 else f"{config.regime}-s{config.seed} ({len(configs)} arms)"
    bar = tqdm(range(1, config.steps + 1), desc=desc, disable=not progress)
    problems = batches(inputs.train, config.problems_per_step, config.seed)
    replay = make_replay(config)
    for step in bar:
        batch, seed = next(problems), config.seed * 1_000_003 + step
        for group, arm in zip(optimizer.param_groups, configs):
            group["lr"] = arm.learning_rate * lr_factor(step, config)
        if config.regime == SFT:
            rows = sft_step(policy, inputs.tokenizer, optimizer, batch, config.max_grad_norm, config.precision,
                            config.micro_batch_size)
        elif isinstance(policy, StackedPolicy):
            rows = stacked_grpo_step(policy, inputs.tokenizer, optimizer, batch, inputs.reward, settings, seed=seed)
        else:
            rows = [grpo_step(policy, inputs.tokenizer, optimizer, batch, inputs.reward, settings, seed=seed,
                              replay=replay)]
        for writer, row in zip(writers, rows):
            writer.add_step({"step": step, **row})
        if step % config.eval_every == 0 or step == config.steps:
            pass1 = evaluations(step)
        bar.set_postfix(loss=f"{rows[-1]['loss']:.3f}", pass1=" ".join(f"{p:.2f}" for p in pass1))

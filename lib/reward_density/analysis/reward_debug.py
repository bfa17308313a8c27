"""Inside a reward, token by token: the logic of notebooks/reward_debug.py.

For a few completions (sampled, or logged by a cell), what each reward module deposits on which token,
which reasoning step each token belongs to, the weight the loss puts on each token, and what the outcome
checker decided about the answer and why.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch
from transformers import PreTrainedTokenizerBase

from ..data.answer_check import Checker, Verdict, count_boxes, last_boxed, last_number
from ..data.problems import Problem
from ..data.steps import split_steps, step_end_tokens
from ..experiment.cell import load_problem_splits
from ..experiment.config import CellConfig
from ..experiment.profiles import Profile, cell_config
from ..grpo.deposits import Deposits, RewardModule
from ..grpo.logprobs import completion_logprobs
from ..grpo.rollout import Rollout
from ..grpo.step import StepConfig, loss_inputs
from ..rewards import REGIMES
from .load import load_cell


@dataclass
class RewardTrace:
    """A rollout with what each reward module made of it, and the checker's verdict on every answer."""

    rollout: Rollout
    deposits: dict[str, Deposits]  # regime -> its deposits
    advantages: dict[str, torch.Tensor] | None  # regime -> [N, T], the loss's token weights; None without groups
    verdicts: list[Verdict]


def trace_rewards(rollout: Rollout, rewards: dict[str, RewardModule], checker: Checker, step: StepConfig | None,
                  seed: int = 0) -> RewardTrace:
    """Every reward's deposits and, given the step's settings (rows that form its groups), the weight the loss
    puts on each token's log-prob, as a step with this seed computes it; the outcome checker's verdicts."""
    deposits = {regime: reward(rollout) for regime, reward in rewards.items()}
    advantages = None
    if step is not None:
        step = replace(step, group_size=rollout.group_size)
        advantages = {regime: token_weights(rollout, d, step, seed) for regime, d in deposits.items()}
    return RewardTrace(rollout, deposits, advantages, checker.check(rollout.answers, rollout.completions))


def token_weights(rollout: Rollout, deposits: Deposits, step: StepConfig, seed: int) -> torch.Tensor:
    """[N, T] what the loss weights each token's log-prob by (loss_inputs): GRPO's advantages (Eq. 3-4) or
    T-SPMO's, 0 on a token that the method's selection leaves out of the loss."""
    weights, subset = loss_inputs(rollout, deposits, step, seed)
    return weights if subset is None else weights * subset


def scored_by(rollout: Rollout, student: torch.nn.Module, temperature: float) -> Rollout:
    """The rollout with a student's log-probs of its tokens in place of the sampler's (a rollout built from
    text has none): what the distillation reward compares the teacher's with."""
    with torch.no_grad():
        logps = completion_logprobs(student, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                    rollout.completion_mask, temperature)
    return replace(rollout, sampler_logps=logps * rollout.completion_mask)


def verdict_reason(verdict: Verdict, completion: str, gold: str | None, timeout_seconds: float) -> str:
    """Why the outcome checker decided what it did, in words."""
    if verdict is Verdict.TIMEOUT:
        return f"math-verify took longer than {timeout_seconds:g} s on this completion: counted as not correct"
    boxed, number, boxes = last_boxed(completion), last_number(completion), count_boxes(completion)
    if verdict is Verdict.UNPARSABLE:
        where = "no \\boxed{} answer" if boxed is None else f"math-verify does not read the box {{{boxed}}}"
        return f"no answer to compare ({where}{'' if number is not None else ', no number'})"
    relation = "equals" if verdict is Verdict.CORRECT else "does not equal"
    if boxes > 1 and verdict is Verdict.WRONG:  # math-verify may read them as one set (README, math-verify)
        return f"{boxes} boxed answers, the last {boxed}: math-verify's reading of them does not equal the gold {gold}"
    shown = boxed if boxed is not None else f"{number} (outside a box)" if number is not None else "(none found)"
    return f"the answer {shown} {relation} the gold {gold}"


def token_table(tokenizer: PreTrainedTokenizerBase, trace: RewardTrace, row: int) -> pd.DataFrame:
    """One row per completion token: its text, its reasoning step (1-based; 0 after the last step, e.g. EOS),
    each reward's deposit on it (NaN where none sits) and, with groups, each reward's advantage."""
    rollout = trace.rollout
    positions = rollout.completion_mask[row].bool().nonzero().squeeze(-1)
    ids = rollout.completion_ids[row, positions].tolist()
    steps = split_steps(rollout.completions[row])
    ends = step_end_tokens(tokenizer, ids, rollout.completions[row], steps) if steps else []
    table = pd.DataFrame({
        "token": tokenizer.batch_decode([[i] for i in ids]),  # a piece of a character shows as U+FFFD
        "step": [next((k + 1 for k, end in enumerate(ends) if t <= end), 0) for t in range(len(ids))],
    })
    for regime, deposits in trace.deposits.items():
        deposited = deposits.deposit_mask[row, positions]
        table[regime] = deposits.token_rewards[row, positions].where(deposited, torch.nan).tolist()
    for regime, advantages in (trace.advantages or {}).items():
        table[f"{regime} advantage"] = advantages[row, positions].tolist()
    return table


def completion_table(trace: RewardTrace, timeout_seconds: float) -> pd.DataFrame:
    """One row per completion: its group, tokens and steps, each reward's trajectory reward and number of
    deposits (and mean advantage over its tokens, with groups), the checker's verdict and why."""
    rollout = trace.rollout
    mask = rollout.completion_mask.float()
    table = pd.DataFrame({
        "group": [i // rollout.group_size for i in range(rollout.num_completions)],
        "tokens": mask.sum(-1).int().tolist(),
        "steps": [len(split_steps(text)) for text in rollout.completions],
    })
    for regime, deposits in trace.deposits.items():
        table[f"{regime} reward"] = deposits.trajectory_rewards.tolist()
        table[f"{regime} deposits"] = deposits.deposit_mask.sum(-1).tolist()
    for regime, advantages in (trace.advantages or {}).items():
        table[f"{regime} mean advantage"] = ((advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    table["verdict"] = [v.value for v in trace.verdicts]
    table["why"] = [verdict_reason(v, text, gold, timeout_seconds)
                    for v, text, gold in zip(trace.verdicts, rollout.completions, rollout.answers)]
    return table


def coloured_tokens(table: pd.DataFrame, regime: str) -> str:
    """HTML of one completion's tokens (a token_table): each token that carries a deposit of this regime in
    green (positive) or red (negative), deeper for larger; a bar between steps; hover for the numbers."""
    deposits = table[regime]
    scale = max(deposits.abs().max(skipna=True), 1e-9) if deposits.notna().any() else 1.0
    spans, previous = [], None
    for _, row in table.iterrows():
        if previous is not None and row["step"] != previous:
            spans.append('<span style="border-left:2px solid #333;margin:0 3px"></span>')
        previous = row["step"]
        deposit = row[regime]
        title = f"step {row['step']}" + ("" if pd.isna(deposit) else f", {regime} deposit {deposit:.3f}")
        if f"{regime} advantage" in table:
            title += f", advantage {row[f'{regime} advantage']:+.3f}"
        if pd.isna(deposit):
            colour = "transparent"
        else:
            alpha = 0.15 + 0.85 * abs(deposit) / scale
            colour = f"rgba(0,160,0,{alpha:.2f})" if deposit >= 0 else f"rgba(220,0,0,{alpha:.2f})"
        text = html.escape(str(row["token"]).replace("\n", "\\n"))
        spans.append(f'<span title="{html.escape(title)}" style="background:{colour};padding:1px;margin:1px;'
                     f'font-family:monospace">{text}</span>')
    return '<div style="line-height:2em">' + "".join(spans) + "</div>"


REWARD_PLACEHOLDER_RATE = 1.0  # a cell config needs a learning rate; no reward reads it


def reward_configs(profile: Profile, seed: int, root: Path) -> dict[str, CellConfig]:
    """A profile's settings and world under each reward regime (as a rank-1 cell of it, whatever its matrix)."""
    return {name: cell_config(profile, name, 1, seed, learning_rate=REWARD_PLACEHOLDER_RATE, root=root)
            for name in REGIMES}


def cell_reward_configs(folder: Path) -> dict[str, CellConfig]:
    """A finished cell's own settings and world (its params.json) under each reward regime: what its logged
    completions are scored with."""
    recorded = CellConfig.from_parameters(load_cell(folder).params)
    return {name: replace(recorded, regime=name) for name in REGIMES}


def logged_completions(folder: Path, checker: Checker,
                       step: int | None = None) -> tuple[int, list[Problem], list[str], list[bool]]:
    """The greedy completions a cell logged at one evaluation (None: its last), as (step, problems with their gold
    answers from the held-out set the cell was evaluated on, texts, truncated); raises naming the folder when it
    logged none there, or when a logged problem is not in that set."""
    cell = load_cell(folder)
    logged = cell.completions
    if logged.empty:
        raise FileNotFoundError(f"{folder}: this cell logged no completions (logged_completions was 0, or it ran "
                                "before cells logged them)")
    steps = sorted(logged["step"].unique().tolist())
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"{folder}: no completions logged at step {step}; logged at steps {steps}")
    chosen = logged[logged["step"] == step]
    config = CellConfig.from_parameters(cell.params)
    answers = {p.problem_id: p.answer for p in load_problem_splits(config, checker)[1]}
    missing = [pid for pid in chosen["problem_id"] if pid not in answers]
    if missing:
        raise ValueError(f"{folder}: logged problems {missing[:5]} are not in the held-out set the cell names "
                         f"({config.heldout or config.problems}), so their gold answers are unknown")
    problems = [Problem(pid, prompt or "", answers[pid]) for pid, prompt in zip(chosen["problem_id"], chosen["prompt"])]
    return step, problems, chosen["completion"].tolist(), chosen["truncated"].astype(bool).tolist()

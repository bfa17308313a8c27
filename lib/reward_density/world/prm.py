"""A Math-Shepherd-style PRM: steps labelled by completer rollouts, then trained to say +/- at each step tag."""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..data.answer_check import Checker, Verdict
from ..data.problems import Problem
from ..data.steps import split_steps
from ..grpo.sampler import SamplingConfig, sample_rollout
from ..rewards.process import PRMScorer


@dataclass(frozen=True)
class LabelledSolution:
    """A sampled solution's steps and, for each step, whether rollouts continued from it can still succeed."""

    problem_id: str
    question: str
    steps: tuple[str, ...]
    labels: tuple[bool, ...]


@dataclass(frozen=True)
class LabellingConfig:
    """Math-Shepherd's automatic labelling: N completer rollouts per step prefix, hard estimation."""

    solutions_per_problem: int = 2
    rollouts_per_step: int = 4
    temperature: float = 0.7  # solutions and rollouts, as the policy samples during RL
    max_new_tokens: int = 64
    batch_size: int = 128


def sample_solutions(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem],
                     config: LabellingConfig, seed: int) -> list[tuple[Problem, str]]:
    """(problem, completion text) pairs: solutions_per_problem samples of the generator per problem."""
    sampling = SamplingConfig(config.max_new_tokens, temperature=config.temperature)
    per_batch = max(1, config.batch_size // config.solutions_per_problem)
    out = []
    for start in range(0, len(problems), per_batch):
        batch = list(problems[start : start + per_batch])
        rollout = sample_rollout(model, tokenizer, batch, config.solutions_per_problem, sampling, seed + start)
        out += [(batch[i // config.solutions_per_problem], text) for i, text in enumerate(rollout.completions)]
    return out


def label_steps(
    completer: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    solutions: Sequence[tuple[Problem, str]],
    checker: Checker,
    config: LabellingConfig,
    seed: int,
) -> list[LabelledSolution]:
    """Hard-estimation labels (Math-Shepherd Eq. 4): a step is good iff some rollout from it reaches the gold."""
    prefixes = []  # (solution index, prefix problem): the solution up to and including step k
    for index, (problem, text) in enumerate(solutions):
        for step in split_steps(text):
            prefix = text[: step.end] + "\n"
            prefixes.append((index, Problem(problem.problem_id, problem.prompt + prefix, problem.answer), prefix))
    sampling = SamplingConfig(config.max_new_tokens, temperature=config.temperature)
    n = config.rollouts_per_step
    per_batch = max(1, config.batch_size // n)
    good: list[bool] = []
    for start in tqdm(range(0, len(prefixes), per_batch), desc="label steps", leave=False, mininterval=2):
        batch = prefixes[start : start + per_batch]
        rollout = sample_rollout(completer, tokenizer, [p for _, p, _ in batch], n, sampling, seed + start)
        texts = [batch[i // n][2] + continuation for i, continuation in enumerate(rollout.completions)]
        verdicts = checker.check(rollout.answers, texts)
        good += [any(v is Verdict.CORRECT for v in verdicts[i * n : (i + 1) * n]) for i in range(len(batch))]
    labels: dict[int, list[bool]] = {}
    for (index, _, _), label in zip(prefixes, good):
        labels.setdefault(index, []).append(label)
    return [
        LabelledSolution(problem.problem_id, problem.prompt, tuple(s.text for s in split_steps(text)), tuple(labels[i]))
        for i, (problem, text) in enumerate(solutions)
        if i in labels
    ]


@dataclass(frozen=True)
class PRMTrainingConfig:
    """How the PRM learns its +/- calls."""

    learning_rate: float = 1e-3
    batch_size: int = 32
    steps: int = 400
    warmup_steps: int = 20
    seed: int = 0


def _batch(scorer: PRMScorer, items: Sequence[LabelledSolution]):
    """Right-padded PRM inputs, the tag positions that fit, and their 0 (good) / 1 (bad) targets."""
    encoded = [scorer.encode(s.question, list(s.steps)) for s in items]
    width = max(len(ids) for ids, _, _ in encoded)
    ids = torch.full((len(items), width), scorer.tokenizer.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.long)
    rows, cols, targets = [], [], []
    for row, ((x, tags, _), item) in enumerate(zip(encoded, items)):
        ids[row, : len(x)], mask[row, : len(x)] = torch.tensor(x), 1
        for position, label in zip(tags, item.labels):
            rows.append(row)
            cols.append(position)
            targets.append(0 if label else 1)
    return ids, mask, torch.tensor(rows), torch.tensor(cols), torch.tensor(targets)


def train_prm(scorer: PRMScorer, data: Sequence[LabelledSolution], config: PRMTrainingConfig) -> list[float]:
    """Cross-entropy on the (good, bad) token logits at each step tag, the quantity the scorer reads."""
    model = scorer.model
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / config.warmup_steps))
    candidates = torch.tensor(scorer.candidate_ids)
    losses = []
    model.train()
    for _ in tqdm(range(config.steps), desc="train PRM", leave=False, mininterval=2):
        ids, mask, rows, cols, targets = _batch(scorer, rng.sample(list(data), min(config.batch_size, len(data))))
        logits = model(input_ids=ids, attention_mask=mask).logits[rows, cols][:, candidates]
        loss = torch.nn.functional.cross_entropy(logits.float(), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


def step_accuracy(scorer: PRMScorer, data: Sequence[LabelledSolution]) -> dict[str, float]:
    """Held-out step classification at P(+) > 0.5, beside the majority-class rate it must beat."""
    scores, _ = scorer.score_batch([s.question for s in data], [list(s.steps) for s in data])
    pairs = [(p > 0.5, label) for s, ps in zip(data, scores) for p, label in zip(ps, s.labels)]
    if not pairs:
        raise ValueError("no labelled steps to score")
    good = [call for call, label in pairs if label]
    bad = [not call for call, label in pairs if not label]
    positive_rate = len(good) / len(pairs)
    return {
        "steps": len(pairs),
        "accuracy": sum(call == label for call, label in pairs) / len(pairs),
        "majority_baseline": max(positive_rate, 1 - positive_rate),
        "good_fraction": positive_rate,
        "recall_good": sum(good) / len(good) if good else float("nan"),
        "recall_bad": sum(bad) / len(bad) if bad else float("nan"),
    }

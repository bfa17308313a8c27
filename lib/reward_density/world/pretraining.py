"""Supervised pretraining of a causal LM on (prompt, completion) pairs: the loss sits on completion tokens."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class SupervisedConfig:
    """How long and how fast to pretrain, and how often to look at held-out accuracy."""

    learning_rate: float = 3e-3
    batch_size: int = 64
    max_steps: int = 2000
    eval_every: int = 50
    warmup_steps: int = 50
    final_lr_fraction: float = 0.1  # cosine decay from learning_rate to this fraction at max_steps
    seed: int = 0


def lr_factor(step: int, config: SupervisedConfig) -> float:
    """Linear warm-up, then cosine decay to final_lr_fraction at max_steps."""
    warmup = min(1.0, (step + 1) / config.warmup_steps)
    progress = min(step, config.max_steps) / config.max_steps
    floor = config.final_lr_fraction
    return warmup * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def encode_pairs(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                 completions: Sequence[str]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with special tokens, completion ids + EOS) for every pair."""
    prompt_ids = tokenizer(list(prompts))["input_ids"]
    completion_ids = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    return [(p, c + [tokenizer.eos_token_id]) for p, c in zip(prompt_ids, completion_ids, strict=True)]


def collate(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 outside the completions)."""
    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(pairs), width, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    for row, (p, c) in enumerate(pairs):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        mask[row, : len(p) + len(c)] = 1
        labels[row, len(p) : len(p) + len(c)] = torch.tensor(c)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pretrain(
    model: torch.nn.Module,
    pairs: Sequence[tuple[list[int], list[int]]],
    pad_id: int,
    config: SupervisedConfig,
    evaluate: Callable[[torch.nn.Module], float] = lambda model: float("nan"),
    stop: Callable[[list[tuple[int, float]]], bool] = lambda evals: False,
    desc: str = "pretrain",
) -> list[tuple[int, float, float]]:
    """Train until stop(evals so far) or max_steps; returns (step, train loss, dev score) per eval.

    The model is left in the state of its last evaluation, so callers can choose among checkpoints.
    """
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config))
    history: list[tuple[int, float, float]] = [(0, float("nan"), evaluate(model))]
    bar = tqdm(range(1, config.max_steps + 1), desc=desc, leave=False, mininterval=2)
    for step in bar:
        drawn = torch.randint(len(pairs), (config.batch_size,), generator=generator)
        batch = collate([pairs[i] for i in drawn], pad_id)
        model.train()
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % config.eval_every == 0 or step == config.max_steps:
            history.append((step, loss.item(), evaluate(model)))
            bar.set_postfix(loss=f"{history[-1][1]:.3f}", dev=f"{history[-1][2]:.3f}")
            if stop([(s, score) for s, _, score in history]):
                break
    model.eval()
    return history

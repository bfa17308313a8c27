"""Peak memory of one training step, per method: what "Token-Efficient RL for LLM Reasoning" designs its
methods to save (it reports tokens in the loss as the proxy; this measures the bytes).

One LoRA or FullFT arm through peft (engine peft, as the paper trains), the method's own step settings from
its profile. A warm-up step at learning rate 0 allocates the optimizer state without moving the weights, so
every method's measured step samples from the base model; it is the most bytes that step holds at once
beyond what was allocated before it (the model, the reference, the optimizer state). The warm-up's gradients are
freed before it, so the step's own gradients count as its memory on either device (CUDA's peak statistic would
otherwise subtract them, as held before the step; the CPU profiler, which sees no free of them, would not).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

from ..data.answer_check import make_checker
from ..grpo.step import grpo_step
from . import cell
from .config import CellConfig
from .profiles import REPO_ROOT, cell_config, find_profile, load_profile

T = TypeVar("T")
MIB = 2**20


def peak_allocated(fn: Callable[[], T], device: str | torch.device = "cpu") -> tuple[T, int]:
    """fn's result and the most bytes fn held allocated at once, beyond what was allocated when it started.

    CUDA: the allocator's peak statistic. CPU has none, so the profiler records every allocation and free
    made while fn runs, and the peak of their running sum is taken (a free of memory allocated before fn
    started is not recorded, so it cannot push the sum below fn's own allocations).
    """
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - start
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        result = fn()
    events = sorted((e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()  # negative for a free
        peak = max(peak, held)
    return result, peak


def step_peak_memory(config: CellConfig) -> dict[str, float]:
    """The peak bytes of one GRPO step of a cell's arm through peft, after a warm-up step, with the completion
    tokens that step sampled and the tokens it put into the loss (per completion)."""
    config = replace(config, engine="peft")
    checker = make_checker(config.answer_format)
    try:
        inputs = cell.load_inputs(config, checker)
        policy = cell.make_policy([config], inputs.student)
        optimizer = cell.make_optimizer([config], policy)
        settings = cell.step_config(config)
        replay = cell.make_replay(config)
        problems = cell.batches(inputs.train, config.prompts_per_step, config.seed)

        def step(index: int) -> dict[str, float]:
            return grpo_step(policy, inputs.tokenizer, optimizer, next(problems), inputs.reward, settings,
                             seed=config.seed + index, replay=replay)

        rates = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        step(1)
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        optimizer.zero_grad(set_to_none=True)
        row, peak = peak_allocated(lambda: step(2), config.device)
    finally:
        checker.close()
    return {"peak_mib": peak / MIB, "len_mean": row["len_mean"], "loss_tokens": row["loss_tokens"],
            "completions": config.prompts_per_step * config.group_size}


def method_memory(methods: dict[str, str], regime: str, ranks: Sequence[int | str | None], seed: int = 0,
                  root: Path = REPO_ROOT, per_completion: bool = True) -> list[dict]:
    """Per method (name -> profile) and arm: step_peak_memory of the profile's cell. per_completion adds the
    first method run one completion at a time (micro-batches of 1, gradients accumulated: the paper's GRPO
    baseline), the other lever on a step's memory."""
    variants = [(name, profile, {}) for name, profile in methods.items()]
    if per_completion:
        name, profile = next(iter(methods.items()))
        variants.insert(1, (f"{name}, one completion at a time", profile, {"micro_batch_size": 1}))
    rows = []
    for name, profile_name, settings in variants:
        profile = load_profile(find_profile(profile_name, root))
        for rank in ranks:
            config = cell_config(profile, regime, rank, seed, root=root, **settings)  # its folder stays unwritten
            arm = "full" if config.rank is None else f"r{config.rank}"
            rows.append({"method": name, "profile": profile_name, "arm": arm} | step_peak_memory(config))
    return rows

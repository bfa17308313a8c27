"""What the benchmarks share: device-aware clocks, a trainer step timer, the environment they record."""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers
from transformers import TrainerCallback

from ..experiment.provenance import CODE_ROOT, cpu_model, git_state, package_versions, working_tree


def arm_name(rank: int | None) -> str:
    """The benchmarks' arm label: "FullFT", or "LoRA r=<rank>"."""
    return "FullFT" if rank is None else f"LoRA r={rank}"


def on_cuda(device: str | torch.device) -> bool:
    """Whether the device is a CUDA GPU."""
    return torch.device(device).type == "cuda"


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA), so a clock read next includes it."""
    if on_cuda(device):
        torch.cuda.synchronize(device)


def median_seconds(work: Callable[[], object], device: str | torch.device = "cpu", repeats: int = 10,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds on a clock of work() after three warmup calls, the device synchronised around each."""
    for _ in range(3):
        work()
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = clock()
        work()
        synchronize(device)
        seconds.append(clock() - start)
    return statistics.median(seconds)


class StepTimer(TrainerCallback):
    """Seconds of each optimizer step of a trainer on a clock, the device synchronised before each reading."""

    def __init__(self, clock: Callable[[], float] = time.process_time, device: str = "cpu") -> None:
        self.clock, self.device, self.seconds, self._start = clock, device, [], 0.0

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        """Read the clock as an optimizer step starts."""
        synchronize(self.device)
        self._start = self.clock()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        """Record the step's seconds."""
        synchronize(self.device)
        self.seconds.append(self.clock() - self._start)


def cpu_seconds_with_children() -> float:
    """CPU-seconds of this process and of the processes it started: those still running (torch.compile's worker
    pool) with what they waited for, and those it has waited for (the C++ compiler)."""
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    running = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile: counted once waited for
            times = child.cpu_times()
            running += times.user + times.system + times.children_user + times.children_system
    return time.process_time() + waited.ru_utime + waited.ru_stime + running


def environment(device: str = "cpu") -> dict[str, Any]:
    """Library versions, the GPU (if any), the CPU, threads, the git commit the numbers were taken with, whether
    tracked files differed from it, and the tree of the files as they stood (provenance.working_tree)."""
    versions, git = package_versions(), git_state(CODE_ROOT, root=CODE_ROOT)
    return {
        "torch": torch.__version__,
        **{name: versions[name] for name in ("transformers", "trl", "peft")},
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(device) if on_cuda(device) else None,
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count() or 0,
        "load_average": list(os.getloadavg()),  # 1, 5, 15 min: above the threads used, the wall-s phases read high
        **git,
        "tree": working_tree(CODE_ROOT) if git["commit"] else None,
    }


def quiet() -> None:
    """Silence transformers' warnings and progress bars."""
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def parse_ranks(text: str) -> tuple[int | None, ...]:
    """'1,4,full' as (1, 4, None): LoRA ranks, and None for FullFT; '' as none."""
    ranks = []
    for item in text.split(",") if text else []:
        if item != "full" and not (item.isdigit() and int(item) >= 1):
            raise argparse.ArgumentTypeError(f"each rank is a positive integer or 'full', got {item!r}")
        rank = None if item == "full" else int(item)
        if rank in ranks:
            raise argparse.ArgumentTypeError(f"rank {item!r} is given twice: each arm once")
        ranks.append(rank)
    return tuple(ranks)


def parse_device(text: str) -> str:
    """A torch device this machine has ('cuda', 'cuda:1', 'cpu'), refused up front when it has none."""
    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device ({error})") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text!r}: torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s) here; on a machine "
            "without a GPU, '--scale tiny --device cpu' runs it on tiny models (a check, not a measurement)")
    return text


def free_memory(device: str | torch.device) -> None:
    """Drop unreferenced tensors and, on CUDA, return the cached blocks, so the next measurement starts clean."""
    gc.collect()
    if on_cuda(device):
        torch.cuda.empty_cache()


def attempt(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """work()'s result, or its error and traceback (a failed part must not cost the parts already measured)."""
    try:
        return work()
    except Exception as error:  # any failure: the report says which part failed and how
        return {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}


def write_report(report: dict[str, Any], out: Path | None) -> None:
    """The report as indented JSON at out, if given, its folder made; on stderr when it cannot be written there, so
    that minutes of measuring are not lost to a mistyped path."""
    if out is None:
        return
    text = json.dumps(report, indent=2)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as error:
        print(f"warning: the report could not be written ({error}); here it is:\n{text}", file=sys.stderr)

"""Speed levers that change the arithmetic, timed on the benchmark's stacked step: bf16 autocast, torch.compile.

Neither is in the study: each would change the bits behind every committed result (README, Speed). This tool
keeps the measurement that weighed them reproducible. A lever replaces the stacked forward that scores
completions (the training forward and the reference pass, grpo/stacked.py); sampling is left as it is.
Every lever is timed in one run beside the plain fp32 step, on the benchmark's random Qwen3 and settings
(tools/benchmark.py), one CPU thread, CPU-seconds, median over the timed steps after a warmup. Compiling
shows as the set-up and warm-up CPU-seconds beyond the plain step's.

    python -m reward_density.tools.levers [--steps N] ... [--levers bf16,compile] [--out FILE.json]
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import torch
from torch._inductor import config as inductor_config

from ..analysis.speed import phase_split
from ..grpo import qwen3, stacked
from .benchmark import BenchConfig, bench_parser, build_model, one_thread, parse_bench, quiet, time_stacked
from .measurement import environment

LEVERS = ("fp32", "bf16", "compile", "bf16+compile")  # fp32: the study's own forward, the baseline


def check_levers(names: Sequence[str]) -> tuple[str, ...]:
    """The levers asked for, fp32 first (every ratio is against it), or a ValueError naming the unknown one."""
    unknown = [name for name in names if name not in LEVERS]
    if unknown:
        raise ValueError(f"unknown lever {unknown[0]!r}; expected some of {', '.join(LEVERS)}")
    return ("fp32",) + tuple(dict.fromkeys(name for name in names if name != "fp32"))


def lever_forward(lever: str) -> Callable:
    """The stacked Qwen3 forward with the lever applied."""
    forward = qwen3.forward
    if "bf16" in lever:
        plain = forward

        def forward(*args, **kwargs):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return plain(*args, **kwargs)
    if "compile" in lever:
        torch._dynamo.reset()  # each lever compiles from scratch: its cost is part of what is measured
        forward = torch.compile(forward, dynamic=True)  # the packed length changes every step
    return forward


def time_lever(model_dir: Path, config: BenchConfig, lever: str) -> dict:
    """The stacked step's median CPU-seconds under the lever, its set-up and warm-up CPU-seconds, its phases."""
    # no on-disk compile cache: a lever compiled by an earlier run would otherwise look cheap to compile
    with mock.patch.object(stacked, "forward", lever_forward(lever)), inductor_config.patch(force_disable_caches=True):
        start = time.process_time()
        seconds, phases = time_stacked(model_dir, config)
        total = time.process_time() - start
    return {"cpu_seconds_per_step": statistics.median(seconds), "setup_and_warmup_cpu_seconds": total - sum(seconds),
            "phase_wall_seconds": phases}


def run_levers(config: BenchConfig, levers: Sequence[str], workdir: Path) -> dict:
    """Time the plain stacked step and each lever on one stand-in; the report with each lever's speed-up."""
    levers = check_levers(levers)
    with one_thread():
        model = build_model(config, workdir)
        timings = {lever: time_lever(model, config, lever) for lever in levers}
        env = environment()
    plain = timings["fp32"]["cpu_seconds_per_step"]
    return {"config": dataclasses.asdict(config), "environment": env, "levers": timings,
            "speedup_over_fp32": {lever: plain / t["cpu_seconds_per_step"] for lever, t in timings.items()}}


def format_table(report: dict) -> str:
    """Per lever: CPU-seconds per stacked step, its speed-up over fp32, set-up and warm-up, and the phases."""
    lines = [f"{'lever':<14} {'CPU-s / step':>12} {'x fp32':>7} {'set-up + warm-up CPU-s':>23}  phases (wall-s)"]
    for lever, timing in report["levers"].items():
        lines.append(f"{lever:<14} {timing['cpu_seconds_per_step']:>12.3f} {report['speedup_over_fp32'][lever]:>7.2f} "
                     f"{timing['setup_and_warmup_cpu_seconds']:>23.1f}  {phase_split(timing['phase_wall_seconds'])}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Time the levers, print the table, write the JSON report when asked."""
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--levers", default=",".join(LEVERS[1:]),
                        help=f"comma-separated, some of {', '.join(LEVERS)} (fp32 is always timed)")
    config, args = parse_bench(parser, argv)
    try:
        levers = check_levers(args["levers"].split(","))
    except ValueError as error:
        parser.error(str(error))
    quiet()
    with tempfile.TemporaryDirectory() as workdir:
        report = run_levers(config, levers, Path(workdir))
    print(f"{report['environment']}\nstacked step, median of {config.steps} steps after {config.warmup} warmup")
    print(format_table(report))
    if args["out"] is not None:
        args["out"].write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()

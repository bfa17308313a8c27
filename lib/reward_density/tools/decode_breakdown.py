"""Where a sampled token's time goes on a GPU: the paper policy's decode step taken apart, measurement by measurement.

The paper benchmark times whole steps; this times single tokens of their sampling loop on the paper's Qwen3-1.7B
(random weights, the profile's precision, P x G rows, a prompt of PROMPT_TOKENS and a cache for the length cap).
For each decode step below, ms per token after a few warm-up tokens of:
- sampler: the loop as the study runs it (sampler._pick's draw, the check that every row has finished, the step);
- no draw: the same loop feeding one token back, without the draw and the check;
- replay: the CUDA graph's replay alone, back to back (GPU only);
- draw: sampler._pick alone on the step's logits.
The steps: the study's (SDPA over the whole preallocated cache under a mask, replayed as a CUDA graph); the same with
a cache only as long as the tokens timed (what attending over the whole cache costs); the read-only step of
tools/levers.py (grouped queries folded into one matmul) in the graph; and that step compiled by torch.compile, in
the graph, with the seconds compiling took. Each step's logits after a few fixed tokens are compared with the
study's, and the eager step is profiled (kernels per token, their device time, the kernels that take the most). On a
CPU there are no graphs and the steps run eagerly: that is the check CI runs, not a measurement.

    python -m reward_density.tools.decode_breakdown --out decode.json              # on a GPU
    python -m reward_density.tools.decode_breakdown --scale tiny --device cpu     # tiny models (CI: shorter still)
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any Hugging Face import: everything here is local

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from ..experiment.profiles import cell_config, find_profile, load_profile
from ..grpo.cuda_graph import GraphedDecoder, StaticDecoder
from ..grpo.precision import autocast, frozen_dtype
from ..grpo.qwen3 import Decoder, Qwen3Weights, weights_of
from ..grpo.sampler import SamplingConfig, _pick
from .gpu_memory import PROMPT_TOKENS
from .levers import FoldedDecoder, GraphedFoldedDecoder, compiled_decoder, uncached_compiles
from .measurement import attempt, environment, free_memory, on_cuda, parse_device, quiet, synchronize, write_report
from .paper_benchmark import PROFILED_TOKENS, SCALES, profile_per_token, random_model, student_tokenizer

FIXED_TOKENS = 12  # tokens fed back without a draw before the steps' logits are compared


@dataclass(frozen=True)
class BreakdownConfig:
    """What to take apart; rows, the cap, the draw's settings and the precision come from the profile's cell."""

    scale: str = "paper"
    device: str = "cuda"
    tokens: int = 40  # tokens timed per measurement, warm-up included
    warmup: int = 8
    prompt_tokens: int = PROMPT_TOKENS
    compile_modes: tuple[str, ...] = ("default",)  # torch.compile modes of the folded step; none: skip compiling
    profile: str = "paper"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; expected one of {sorted(SCALES)}")
        if not 0 < self.warmup < self.tokens or self.tokens < FIXED_TOKENS:
            raise ValueError(f"need 0 < warmup < tokens and tokens >= {FIXED_TOKENS}, got warmup={self.warmup}, "
                             f"tokens={self.tokens}")
        if self.prompt_tokens < 1:
            raise ValueError(f"need prompt_tokens >= 1, got {self.prompt_tokens}")


def decode_steps(config: BreakdownConfig, cache: int, timed: int) -> dict[str, tuple[type[Decoder], int]]:
    """Each step's decoder class and cache length, by name; graphed on a GPU, eager elsewhere."""
    graphs = on_cuda(config.device)
    study = GraphedDecoder if graphs else StaticDecoder
    folded = GraphedFoldedDecoder if graphs else FoldedDecoder
    steps = {"study (SDPA), whole cache": (study, cache), "study (SDPA), short cache": (study, timed),
             "folded, whole cache": (folded, cache)}
    for mode in config.compile_modes:
        compiled = compiled_decoder(folded, None if mode == "default" else mode)
        steps[f"folded compiled ({mode}), whole cache"] = (compiled, cache)
    return steps


def timed_tokens(decoder: Decoder, prompt: torch.Tensor, sampling: SamplingConfig, tokens: int, warmup: int,
                 draw: bool = True, profiler: profile | None = None) -> tuple[float, torch.Tensor]:
    """ms per token of the sampling loop after `warmup` tokens, and the last logits; the profiler, if any, records
    the timed tokens only."""
    rows, length = prompt.shape
    device = prompt.device
    generator = torch.Generator(device=device).manual_seed(0)
    positions = torch.arange(length, device=device).expand(rows, -1)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    logits = decoder.prefill(prompt, torch.ones_like(prompt), positions)
    token = logits.argmax(-1)
    for step in range(tokens):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
            if profiler is not None:
                profiler.start()
        if draw:  # as sampler._decode does at every token
            token, _ = _pick(logits.float(), sampling, torch.rand(rows, 1, generator=generator, device=device))
            finished |= token == -1  # no row finishes; the check stays for its wait on the device at every token
            if finished.all():
                break
        logits = decoder.extend(token, positions[:, -1:] + 1 + step, ~finished)
    synchronize(device)
    ms = 1e3 * (time.perf_counter() - start) / (tokens - warmup)
    if profiler is not None:
        profiler.stop()
    return ms, logits


def back_to_back_ms(work: Callable[[], object], device: str | torch.device, repeats: int) -> float:
    """ms per call of work() called `repeats` times without waiting in between, the device synchronised around."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    synchronize(device)
    return 1e3 * (time.perf_counter() - start) / repeats


def take_apart(kind: type[Decoder], cache: int, weights: Qwen3Weights, prompt: torch.Tensor, sampling: SamplingConfig,
               config: BreakdownConfig) -> tuple[dict[str, float], torch.Tensor]:
    """One step's measurements, and its logits after FIXED_TOKENS fed-back tokens."""
    rows = prompt.shape[0]
    start = time.perf_counter()
    sampler_ms, logits = timed_tokens(kind(weights, rows, cache), prompt, sampling, config.tokens, config.warmup)
    result = {"set_up_seconds": time.perf_counter() - start, "sampler_ms": sampler_ms}
    decoder = kind(weights, rows, cache)
    result["no_draw_ms"], _ = timed_tokens(decoder, prompt, sampling, config.tokens, config.warmup, draw=False)
    if isinstance(decoder, GraphedDecoder):
        result["replay_ms"] = back_to_back_ms(decoder.graph.replay, prompt.device, config.tokens)
    uniform = torch.rand(rows, 1, device=prompt.device)
    result["draw_ms"] = back_to_back_ms(lambda: _pick(logits.float(), sampling, uniform), prompt.device, config.tokens)
    _, fixed = timed_tokens(kind(weights, rows, cache), prompt, sampling, FIXED_TOKENS, 1, draw=False)
    return result, fixed.float()


def eager_profile(weights: Qwen3Weights, prompt: torch.Tensor, sampling: SamplingConfig,
                  config: BreakdownConfig) -> dict[str, Any]:
    """The eager decoder's sampling loop: ms per token, then under torch.profiler its ATen calls, kernels and their
    device time per token."""
    rows, length = prompt.shape
    cache = length + config.warmup + PROFILED_TOKENS
    tokens = config.warmup + PROFILED_TOKENS
    ms, _ = timed_tokens(Decoder(weights, rows, cache), prompt, sampling, tokens, config.warmup)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda(config.device) else [])
    profiler = profile(activities=activities)
    timed_tokens(Decoder(weights, rows, cache), prompt, sampling, tokens, config.warmup, profiler=profiler)
    return {"sampler_ms": ms, **profile_per_token(profiler.key_averages())}


def run(config: BreakdownConfig, out: Path | None = None) -> dict[str, Any]:
    """Every measurement; the report is rewritten to out after each step, so a run stopped part way keeps them."""
    cell = cell_config(load_profile(find_profile(config.profile)), "outcome", None, config.seed,
                       device=config.device)
    sampling = SamplingConfig(cell.max_new_tokens, temperature=cell.temperature, top_p=cell.top_p)
    shape = SCALES[config.scale]["student"]
    model = random_model(shape, student_tokenizer(shape.vocab), config.device, frozen_dtype(cell.precision),
                         config.seed)
    rows, cache = cell.prompts_per_step * cell.group_size, config.prompt_tokens + cell.max_new_tokens
    torch.manual_seed(config.seed)
    prompt = torch.randint(2, shape.vocab, (rows, config.prompt_tokens), device=config.device)
    report: dict[str, Any] = {
        "config": dataclasses.asdict(config), "environment": environment(config.device),
        "setting": {"rows": rows, "cache_positions": cache, "precision": cell.precision,
                    "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                    "whole_cache_bytes": 2 * shape.layers * rows * shape.kv_heads * cache * shape.head_dim
                    * torch.finfo(frozen_dtype(cell.precision)).bits // 8},
        "steps": {}}
    with torch.no_grad(), autocast(config.device, cell.precision), uncached_compiles():
        weights = weights_of(model)
        report["eager_profile"] = eager_profile(weights, prompt, sampling, config)
        write_report(report, out)
        reference: list[torch.Tensor] = []  # the first step's logits, once measured

        def measured(kind: type[Decoder], length: int) -> dict[str, Any]:
            result, logits = take_apart(kind, length, weights, prompt, sampling, config)
            reference[:] = reference or [logits]
            report["largest_reference_logit"] = reference[0].abs().max().item()
            return result | {"max_logit_difference": (logits - reference[0]).abs().max().item()}

        for name, (kind, length) in decode_steps(config, cache, config.prompt_tokens + config.tokens).items():
            free_memory(config.device)
            report["steps"][name] = attempt(lambda: measured(kind, length))  # a failed step keeps the others
            write_report(report, out)
    return report


def format_table(report: dict[str, Any]) -> str:
    """ms per token of each step's measurements, its set-up and its logits against the study step's."""
    eager = report["eager_profile"]
    lines = [f"{report['environment']['gpu'] or report['environment']['cpu']}; {report['setting']}",
             f"eager sampling loop: {eager['sampler_ms']:.1f} ms per token; under the profiler "
             f"{eager['kernels_per_token']:.0f} kernels and {eager['device_kernel_ms_per_token']:.2f} ms of them "
             "per token",
             f"{'step':<40} {'sampler':>8} {'no draw':>8} {'replay':>8} {'draw':>8} {'set-up s':>9} {'logits':>8}"]
    for name, r in report["steps"].items():
        if "error" in r:
            lines.append(f"{name:<40} failed: {r['error']}")
            continue
        replay = f"{r['replay_ms']:.2f}" if "replay_ms" in r else "-"
        lines.append(f"{name:<40} {r['sampler_ms']:>8.2f} {r['no_draw_ms']:>8.2f} {replay:>8} {r['draw_ms']:>8.2f} "
                     f"{r['set_up_seconds']:>9.1f} {r['max_logit_difference']:>8.3f}")
    lines.append("(ms per token; logits: the largest difference from the first step's logits, whose largest is "
                 f"{report.get('largest_reference_logit', float('nan')):.2f})")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[BreakdownConfig, Path | None]:
    """The BreakdownConfig (defaults from the dataclass) and the JSON path from the command line."""
    defaults = BreakdownConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default=defaults.scale, choices=sorted(SCALES))
    parser.add_argument("--device", type=parse_device, default=defaults.device)
    for name in ("tokens", "warmup", "prompt_tokens", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--compile-modes", default=",".join(defaults.compile_modes),
                        help="comma-separated torch.compile modes of the folded step; empty for none")
    parser.add_argument("--profile", default=defaults.profile)
    parser.add_argument("--out", type=Path, default=None, help="write the report to this JSON file")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    args["compile_modes"] = tuple(mode for mode in args["compile_modes"].split(",") if mode)
    try:
        return BreakdownConfig(**args), out
    except ValueError as error:
        parser.error(str(error))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Take the decode step apart, print the table, write the JSON report when asked."""
    config, out = parse_args(argv)
    quiet()
    report = run(config, out)
    print(format_table(report))
    return report


if __name__ == "__main__":
    main()

"""Speed levers that change the arithmetic, timed on the benchmark's stacked step: bf16 autocast, torch.compile.

None is in the study: each would change the bits behind every committed result (docs/speed.md). This tool
keeps the measurement that weighed them reproducible. bf16 and compile replace the stacked forward that scores
completions (the training forward and the reference pass, grpo/stacked.py), leaving sampling as it is;
compiled-decode replaces sampling's per-token step with a compiled one (CompiledDecoder), leaving scoring as it is.
Every lever is timed in one run between two runs of the plain fp32 step (fp32, lever, fp32, lever, ..., fp32), on
the benchmark's random Qwen3 and settings (tools/benchmark.py; given --student and --problems, a world's student
on its training prompts), one CPU thread, CPU-seconds, median over the timed steps after a warmup; its speed-up is
over the mean of the two plain runs beside it. Compiling shows as the set-up and warm-up CPU-seconds beyond the
plain step's, the compile workers' and the C++ compiler's processes included.

    python -m reward_density.tools.levers [--steps N] ... [--levers bf16,compile] [--out FILE.json]
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch._inductor import config as inductor_config
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from ..analysis.speed import phase_split
from ..grpo import qwen3, sampler, stacked
from ..grpo.cuda_graph import GraphedDecoder, StaticDecoder
from .benchmark import BenchConfig, bench_parser, build_model, one_thread, parse_bench, quiet, time_stacked
from .measurement import cpu_seconds_with_children, environment, write_report

LEVERS = ("fp32", "bf16", "compile", "bf16+compile", "compiled-decode")  # fp32: the study's own step, the baseline


def check_levers(names: Sequence[str]) -> tuple[str, ...]:
    """The levers asked for, fp32 first (every ratio is against it), or a ValueError naming the unknown one."""
    unknown = [name for name in names if name not in LEVERS]
    if unknown:
        raise ValueError(f"unknown lever {unknown[0]!r}; expected some of {', '.join(LEVERS)}")
    return ("fp32",) + tuple(dict.fromkeys(name for name in names if name != "fp32"))


def lever_forward(lever: str) -> Callable:
    """The stacked Qwen3 forward with the lever applied."""
    forward, parts = qwen3.forward, lever.split("+")
    if "bf16" in parts:
        plain = forward

        def forward(*args, **kwargs):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return plain(*args, **kwargs)
    if "compile" in parts:
        torch._dynamo.reset()  # each lever compiles from scratch: its cost is part of what is measured
        forward = torch.compile(forward, dynamic=True)  # the packed length changes every step
    return forward


def decode_step(weights: qwen3.Qwen3Weights, tokens: torch.Tensor, positions: torch.Tensor, index: torch.Tensor,
                key_mask: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """StaticDecoder's step without writing the cache: logits [R, V] of one new token per row, and the new keys and
    values [layers, R, kv_heads, 1, head_dim] for the caller to store at `index`.

    Attention is one softmax over the cached keys before `index` that the row may see and the new key, computed as
    two parts sharing the maximum, so the cache is only read.
    """
    shape, arms = weights.shape, weights.arms
    rows = tokens.shape[0]
    batch, group = rows // arms, shape.heads // shape.kv_heads
    x = qwen3.embed(weights, tokens.view(arms, batch, 1))
    cos, sin = qwen3.rotary(shape, positions, x.dtype)
    key = torch.arange(key_mask.shape[1], device=key_mask.device)
    hidden = ~((key < index) & key_mask)[:, None, None, :]  # [R, 1, 1, T]: cached keys the row may not see
    new_keys, new_values = [], []
    for layer, w in enumerate(weights.layers):
        h = qwen3.rms_norm(x, w["input_layernorm"], shape.eps)

        def heads(name: str, count: int, norm: str | None = None) -> torch.Tensor:  # [R, count, 1, head_dim]
            out = qwen3.linear(h, w[name]).reshape(arms, batch * count, shape.head_dim)
            out = qwen3.rms_norm(out, w[norm], shape.eps) if norm else out
            return out.view(rows, 1, count, shape.head_dim).transpose(1, 2)

        q, k = apply_rotary_pos_emb(heads("q_proj", shape.heads, "q_norm"), heads("k_proj", shape.kv_heads, "k_norm"),
                                    cos, sin)
        v = heads("v_proj", shape.kv_heads)
        new_keys.append(k)
        new_values.append(v)
        q = q.reshape(rows, shape.kv_heads, group, shape.head_dim) * shape.head_dim ** -0.5
        cached = (q @ keys[layer].transpose(-1, -2)).masked_fill(hidden, float("-inf"))  # [R, kv_heads, group, T]
        own = (q * k).sum(-1, keepdim=True)
        top = torch.maximum(cached.amax(-1, keepdim=True), own)
        cached, own = (cached - top).exp(), (own - top).exp()
        out = (cached @ values[layer] + own * v) / (cached.sum(-1, keepdim=True) + own)
        x = x + qwen3.linear(out.reshape(arms, batch, 1, -1), w["o_proj"])
        h = qwen3.rms_norm(x, w["post_attention_layernorm"], shape.eps)
        x = x + qwen3.linear(F.silu(qwen3.linear(h, w["gate_proj"])) * qwen3.linear(h, w["up_proj"]), w["down_proj"])
    logits = qwen3.lm_head(weights, x)
    return logits.reshape(rows, -1), torch.stack(new_keys), torch.stack(new_values)


class FoldedDecoder(StaticDecoder):
    """StaticDecoder with decode_step as its step, the cache written outside it: written inside a compiled step, the
    cache is copied whole at every layer (functionalisation's price for a mutated input), which made sampling slower."""

    step = staticmethod(decode_step)

    def _step(self) -> torch.Tensor:
        cache = self.cache  # filled by the prefill
        logits, keys, values = self.step(self.weights, self.tokens, self.positions, self.index, cache.key_mask,
                                         cache.keys, cache.values)
        cache.keys.index_copy_(3, self.index, keys)
        cache.values.index_copy_(3, self.index, values)
        return logits


class GraphedFoldedDecoder(FoldedDecoder, GraphedDecoder):
    """FoldedDecoder's step recorded as a CUDA graph, as GraphedDecoder records StaticDecoder's."""


def compiled_decoder(base: type[FoldedDecoder] = FoldedDecoder, mode: str | None = None) -> type[FoldedDecoder]:
    """base with decode_step compiled by torch.compile in this mode (None: torch.compile's default)."""
    step = torch.compile(decode_step, fullgraph=True, mode=mode)
    return type(f"Compiled{base.__name__}", (base,), {"step": staticmethod(step)})


CompiledDecoder = compiled_decoder()
CompiledGraphedDecoder = compiled_decoder(GraphedFoldedDecoder)


def uncached_compiles() -> contextlib.AbstractContextManager:
    """torch.compile without its on-disk cache, for as long as the context lasts.

    A step compiled by an earlier run would look cheap to compile. And the cache is not keyed to the kernels ATen was
    told to use (ATEN_CPU_CAPABILITY, pinned by ./run_all.sh test): code generated for AVX-512 reloaded under the
    AVX2 pin reads and writes past its buffers (a segfault, torch 2.13).
    """
    return inductor_config.patch(force_disable_caches=True)


def compiled_sampling() -> contextlib.ExitStack:
    """Sampling with the compiled decode step in place of the study's (graphed where the study's would be), compiled
    from scratch: its compile counts as set-up of the run that uses it."""
    study_kind = sampler.decoder_kind

    def kind(config: sampler.SamplingConfig, device: torch.device) -> type[FoldedDecoder]:
        return CompiledGraphedDecoder if study_kind(config, device) is GraphedDecoder else CompiledDecoder

    patches = contextlib.ExitStack()
    patches.enter_context(uncached_compiles())
    torch._dynamo.reset()
    patches.enter_context(mock.patch.object(sampler, "decoder_kind", kind))
    return patches


def lever_patches(lever: str) -> contextlib.AbstractContextManager:
    """The patches that put the lever in place: the scoring forward, or sampling's decoder; no on-disk compile cache."""
    if lever == "compiled-decode":
        return compiled_sampling()
    patches = contextlib.ExitStack()
    patches.enter_context(uncached_compiles())
    patches.enter_context(mock.patch.object(stacked, "forward", lever_forward(lever)))
    return patches


def time_lever(model_dir: Path, config: BenchConfig, lever: str) -> dict:
    """The stacked step's median CPU-seconds under the lever, its set-up and warm-up CPU-seconds, its phases."""
    with lever_patches(lever):
        start = cpu_seconds_with_children()  # Inductor compiles in worker processes and the C++ compiler
        timing = time_stacked(model_dir, config)
        total = cpu_seconds_with_children() - start
    return {"cpu_seconds_per_step": statistics.median(timing.seconds),
            "setup_and_warmup_cpu_seconds": total - sum(timing.seconds), "phase_wall_seconds": timing.phases}


def run_levers(config: BenchConfig, levers: Sequence[str], workdir: Path) -> dict:
    """Time the plain stacked step before the first lever and after each, on one stand-in; the report with each
    lever's speed-up over the mean of the two plain runs beside it, so that a machine drifting during the run does
    not bias the levers timed late."""
    levers = check_levers(levers)
    with one_thread():
        model = build_model(config, workdir)
        plain, timings = [time_lever(model, config, "fp32")], {}
        for lever in levers[1:]:
            timings[lever] = time_lever(model, config, lever)
            plain.append(time_lever(model, config, "fp32"))
        env = environment()
    speedup = {lever: statistics.mean(run["cpu_seconds_per_step"] for run in plain[i:i + 2])
               / timing["cpu_seconds_per_step"] for i, (lever, timing) in enumerate(timings.items())}
    return {"config": dataclasses.asdict(config), "environment": env, "fp32_runs": plain, "levers": timings,
            "speedup_over_fp32": speedup}


def format_table(report: dict) -> str:
    """In the order timed, the plain runs between the levers: CPU-seconds per stacked step, each lever's speed-up
    over the plain runs beside it, set-up and warm-up, and the phases."""
    def row(name: str, timing: dict, speedup: str) -> str:
        return (f"{name:<15} {timing['cpu_seconds_per_step']:>12.3f} {speedup:>7} "
                f"{timing['setup_and_warmup_cpu_seconds']:>23.1f}  {phase_split(timing['phase_wall_seconds'])}")

    plain = iter(report["fp32_runs"])
    lines = [f"{'lever':<15} {'CPU-s / step':>12} {'x fp32':>7} {'set-up + warm-up CPU-s':>23}  phases (wall-s)",
             row("fp32", next(plain), "")]
    for (lever, timing), after in zip(report["levers"].items(), plain):
        lines += [row(lever, timing, f"{report['speedup_over_fp32'][lever]:.2f}"), row("fp32", after, "")]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Time the levers, print the table, write the JSON report when asked."""
    parser = bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--levers", default=",".join(LEVERS[1:]),
                        help=f"comma-separated, some of {', '.join(LEVERS)} (fp32 is timed first and after each)")
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
    write_report(report, args["out"])
    return report


if __name__ == "__main__":
    main()

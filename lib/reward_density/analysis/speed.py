"""The report's speed section: our GRPO step against TRL's GRPOTrainer, from the benchmark's JSON if one was run."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..experiment.provenance import read_json

BENCHMARK_FILE = "benchmark.json"  # written into a study's outputs folder by `--stages benchmark`


def speed_markdown(out_dir: str | Path, study_tokens: float | None = None) -> str:
    """The benchmark's samples per CPU-second and ratio as markdown, or how to measure them when not measured.
    study_tokens: the study's own mean completion length over training, set beside the benchmark's."""
    path = Path(out_dir) / BENCHMARK_FILE
    if not path.is_file():
        return (f"Not measured for this study: `./run_all.sh --stages benchmark,analysis` writes `{BENCHMARK_FILE}` "
                "here (`python -m reward_density.tools.benchmark`), and the analysis reports it.\n")
    bench = read_json(path)
    env, config = bench["environment"], bench["config"]
    rows = "\n".join(f"| {name} | {value:.1f} |" for name, value in bench["samples_per_cpu_second"].items())
    lines = [
        f"One GRPO step of every arm at the mini study's settings (P={config['prompts']} x G={config['generations']}, "
        f"{config['max_new_tokens']} new tokens, beta {config['beta']:g}) {_workload(bench, study_tokens)}. Median "
        f"of {config['steps']} steps after {config['warmup']} warm-up, "
        f"{env['torch_threads']} thread(s) on {env['cpu']} (torch {env['torch']}, transformers "
        f"{env['transformers']}, trl {env['trl']}; commit {str(env.get('commit'))[:12]}"
        f"{_uncommitted(env)}).",
        "",
        "| implementation | samples / CPU-s |",
        "|---|---|",
        rows,
        "",
        f"Ours (stacked) / TRL: **{bench['ours_over_trl']:.2f}x** in samples per CPU-second.",
        "",
    ]
    phases = bench.get("stacked_phase_wall_seconds")  # absent from benchmarks run before it was recorded
    if phases:
        lines += [f"Where the stacked step's time goes (wall-seconds, median): {phase_split(phases)}.", ""]
    sampling = bench.get("stacked_sampling_ms_per_decoding_step")  # recorded since the benchmark profiles sampling
    if sampling:
        lines += [f"Where the stacked sampling's time goes: {sampling_split(sampling)}.", ""]
    floor = bench.get("compute_floor")  # recorded since the benchmark counts the step's FLOPs
    if floor:
        lines += [f"Against its compute floor: {floor_split(floor)}.", ""]
    return "\n".join(lines)


def _workload(bench: dict[str, Any], study_tokens: float | None) -> str:
    """'on <model> (hidden x layers), prompts from <prompts>: completions N tokens long on average in the timed
    steps, against the study's M', as far as recorded."""
    model = bench.get("model")  # recorded since the benchmark can time a world's student
    if model is None:
        config = bench["config"]
        return f"on a random Qwen3 of hidden {config['hidden']} x {config['layers']} layers"
    timed = bench.get("completion_tokens_mean")  # the timed steps' length; older benchmarks hold only the
    if timed is None:  # profiled rollout's, sampled at the base weights before any step
        tokens = bench["stacked_sampling_ms_per_decoding_step"]["completion_tokens_mean"]
        length = f"completions {tokens:.1f} tokens long on average in the profiled rollout (at the base weights)"
    else:
        length = f"completions {timed:.1f} tokens long on average in the timed steps"
    study = "" if study_tokens is None else f", against {study_tokens:.1f} over the study's training (`len_mean`)"
    return (f"on {model['timed']} (hidden {model['hidden']} x {model['layers']} layers), prompts from "
            f"{model['prompts']}: {length}{study}")


def _uncommitted(env: dict[str, Any]) -> str:
    """' with uncommitted changes' and the tree of the files it ran (provenance.working_tree) where the tree differed
    from its commit; else ''."""
    if not env.get("dirty"):
        return ""
    tree = env.get("tree")
    return " with uncommitted changes" + (f", files of git tree {tree[:12]}" if tree else "")


def phase_split(phases: dict[str, float]) -> str:
    """Seconds by phase as text: 'generate 0.371, reward 0.001, ...'."""
    return ", ".join(f"{phase} {value:.3f}" for phase, value in phases.items())


def sampling_split(sampling: dict[str, Any]) -> str:
    """The benchmark's sampling profile as text: ms per decoding step, then the profiled step by kind."""
    return (f"{sampling['cpu_ms']:.2f} CPU-ms per decoding step of every row ({sampling['decoding_steps']} steps); "
            f"under the profiler {sampling['profiled_ms']:.2f} ms: weight products {sampling['products_ms']:.2f}, "
            f"attention {sampling['attention_ms']:.2f}, other ATen operations {sampling['other_aten_ms']:.2f}, "
            f"outside ATen (Python, the profiler) {sampling['outside_aten_ms']:.2f}")


def floor_split(floor: dict[str, Any]) -> str:
    """The benchmark's compute floor as text: the step's GFLOP by kind, the product rate, the floor and the ratios."""
    flops = floor["gflop_per_step"]
    return (f"{flops['products']:.1f} GFLOP of weight products and {flops['attention']:.1f} of attention per step at "
            f"{floor['matmul_gflop_per_cpu_second']:.0f} GFLOP per CPU-s (one thread, a large fp32 product) take "
            f"{floor['floor_cpu_seconds']:.3f} CPU-s; the step takes {floor['step_over_floor']:.1f}x that, TRL's "
            f"arms {floor['trl_over_floor']:.1f}x")

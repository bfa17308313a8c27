"""Throughput benchmark: samples per CPU-second of our GRPO step against TRL's GRPOTrainer, in one run.

The mini study trains six arms per regime and seed (LoRA ranks 1-16 and FullFT). TRL trains one arm per
trainer; our stacked engine (grpo/stacked.py) trains the six in one batched pass, and our peft engine one
at a time like TRL. Each is timed on the same model and prompts: a random Qwen3 of the mini student's shape on
addition prompts, or, given --student and --problems, a built world's student on its training problems (the
study's own workload, whose completions are far shorter than a random model's); with the same
settings (P x G prompts and samples, the completion cap, temperature, top-p, KL beta; TRL's `bnpo` loss
= our token mean; gradient checkpointing off), one CPU thread, in CPU-seconds (`time.process_time`),
median over the timed steps after a warmup. A sample is one completion generated and trained on.
It also splits the stacked sampling's time per decoding step into weight products, attention, the other ATen
operations and what runs outside ATen (Python), under torch.profiler: where a faster decode would have to cut.
And it sets the stacked step against its compute floor: the FLOPs of its products and attention, counted, at
the fp32 product rate one thread reaches on a large product.

    python -m reward_density.tools.benchmark [--steps N] ... [--student DIR --problems DIR] [--out FILE.json]
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any Hugging Face import: everything here is local

import argparse
import contextlib
import dataclasses
import functools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import datasets
import torch
import trl
from peft import LoraConfig
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count
from transformers import PreTrainedTokenizerBase, PrinterCallback

from ..analysis.speed import floor_split, phase_split, sampling_split
from ..data.problem_sets import TRAIN_FILE
from ..data.problems import Problem, read_problems
from ..data.sources import MODEL_CONFIG, load_causal_lm, load_config, load_tokenizer
from ..grpo.deposits import Deposits
from ..grpo.loss import LossConfig
from ..grpo.policy import Policy, PolicyConfig
from ..grpo.rollout import Rollout
from ..grpo.sampler import SamplingConfig, sample_rollout
from ..grpo.stacked import StackedPolicy
from ..grpo.step import StepConfig, grpo_step, stacked_grpo_step
from .measurement import StepTimer, arm_name, environment, median_seconds, parse_ranks, write_report
from .measurement import quiet as quiet_transformers
from .stand_ins import build_qwen3, build_tokenizer

SIZES = ("prompts", "generations", "max_new_tokens", "hidden", "layers")  # each at least 1
CLI_FIELDS = ("steps", "warmup", *SIZES)
PHASES = ("generate", "reward", "reference", "train")  # the stacked step's parts, as its metrics time them
PRODUCT_OPS = ("aten::bmm", "aten::mm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear")
ATTENTION_OPS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product")  # name prefixes
TOP_OTHER_OPS = 6  # the other ATen operations the sampling profile names
PROBE_SIDE = 1024  # the product rate's probe, 2.1 GFLOP: large enough to run at the core's peak rate


@dataclass(frozen=True)
class BenchConfig:
    """Benchmark sizes and the GRPO settings all implementations share; the defaults are the mini study's, except
    one learning rate for every arm and the k3 KL estimate, TRL's (speed does not depend on either)."""

    steps: int = 8
    warmup: int = 2
    prompts: int = 4
    generations: int = 4
    max_new_tokens: int = 64
    hidden: int = 128
    layers: int = 3
    ranks: tuple[int | None, ...] = (1, 2, 4, 8, 16, None)  # None: FullFT
    temperature: float = 0.7
    top_p: float = 0.95
    beta: float = 0.05
    epsilon: float = 0.2
    learning_rate: float = 1e-5
    lora_alpha: float = 32.0
    max_grad_norm: float = 1.0
    seed: int = 0
    student: str | None = None  # a save_pretrained folder timed instead of the random Qwen3 (hidden, layers unused)
    problems: str | None = None  # a world's problems folder: prompts drawn from its train.jsonl (with student)

    def __post_init__(self) -> None:
        if (self.student is None) != (self.problems is None):
            raise ValueError("--student and --problems go together: a world's student and its problems folder")
        if self.student is not None and not (Path(self.student) / MODEL_CONFIG).is_file():
            raise ValueError(f"--student {self.student}: no {MODEL_CONFIG} there (a save_pretrained model folder)")
        if self.problems is not None and not (Path(self.problems) / TRAIN_FILE).is_file():
            raise ValueError(f"--problems {self.problems}: no {TRAIN_FILE} there (a world's problems folder)")
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={self.steps}, warmup={self.warmup}")
        if not self.ranks:
            raise ValueError("need at least one arm in ranks")
        for name in SIZES:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def samples_per_step(self) -> int:
        """Completions per GRPO step: prompts x generations."""
        return self.prompts * self.generations

    def step_config(self) -> StepConfig:
        """Our GRPO step's settings, as TRL is configured (bnpo = our token mean, k3 without bias correction)."""
        return StepConfig(
            group_size=self.generations,
            sampling=SamplingConfig(self.max_new_tokens, self.temperature, self.top_p),
            loss=LossConfig(epsilon=self.epsilon, beta=self.beta, kl_estimator="k3", normalisation="token_mean"),
            max_grad_norm=self.max_grad_norm,
        )


@functools.cache
def _training_problems(folder: str) -> tuple[Problem, ...]:
    """A world's training problems, read once per run (every implementation and arm draws its prompts from them)."""
    return tuple(read_problems(Path(folder) / TRAIN_FILE))


def problem_set(config: BenchConfig) -> list[Problem]:
    """The prompts of every timed step: config.prompts training problems of the world's, or addition problems,
    drawn with the config's seed."""
    rng = random.Random(config.seed)
    if config.problems is not None:
        problems = _training_problems(config.problems)
        if len(problems) < config.prompts:
            raise ValueError(f"{config.problems}/{TRAIN_FILE} holds {len(problems)} problems, fewer than the "
                             f"{config.prompts} prompts a step needs")
        return rng.sample(problems, config.prompts)
    pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(config.prompts)]
    return [Problem(f"p{i}", f"Problem: {a} + {b} = ?\n", str(a + b)) for i, (a, b) in enumerate(pairs)]


class RandomOutcomeReward:
    """One random deposit on each completion's last token: an outcome-shaped reward that costs nothing."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, rollout: Rollout) -> Deposits:
        mask = rollout.completion_mask.bool()
        rows = torch.arange(mask.shape[0])
        last = mask.sum(-1) - 1  # the first token is always in the mask
        scores = torch.rand(mask.shape[0], generator=self.generator)
        token_rewards = torch.zeros(mask.shape)
        token_rewards[rows, last] = scores
        return Deposits(token_rewards=token_rewards, deposit_mask=token_rewards != 0, trajectory_rewards=scores)


def random_reward_func(seed: int) -> Callable[..., list[float]]:
    """TRL's counterpart of RandomOutcomeReward: one random float per completion."""
    rng = random.Random(seed)

    def random_reward(completions, **_) -> list[float]:
        return [rng.random() for _ in completions]

    return random_reward


def _step_inputs(config: BenchConfig) -> tuple[list[Problem], RandomOutcomeReward, StepConfig]:
    """The problems, reward and step settings every timed step of our engines uses."""
    return problem_set(config), RandomOutcomeReward(config.seed), config.step_config()


def _cpu_seconds(step: Callable[[int], object], config: BenchConfig) -> list[float]:
    """CPU-seconds of each timed call of step(i), after the warmup calls."""
    seconds = []
    for i in range(config.warmup + config.steps):
        start = time.process_time()
        step(i)
        seconds.append(time.process_time() - start)
    return seconds[config.warmup:]


def _stacked_steps(model_dir: Path, config: BenchConfig) -> Callable[[int], dict[str, float]]:
    """step(i): the i-th stacked step of every arm of a fresh policy (seed + i), its first arm's metrics row (its
    timings are the whole step's). Two policies stepped alike take identical steps."""
    tokenizer, policy = _stacked_policy(model_dir, config)
    optimizer = torch.optim.AdamW([{"params": policy.parameters(a), "lr": config.learning_rate}
                                   for a in range(policy.n_arms)], weight_decay=0.0)
    problems, reward, settings = _step_inputs(config)
    return lambda i: stacked_grpo_step(policy, tokenizer, optimizer, problems, reward, settings,
                                       seed=config.seed + i)[0]


class StackedTiming(NamedTuple):
    """The timed stacked steps: CPU-seconds of each, the median wall-seconds of each phase (on one thread, close to
    their CPU-seconds where nothing else runs: the environment records the load average), and the mean completion
    length they sampled (of the first arm)."""

    seconds: list[float]
    phases: dict[str, float]
    completion_tokens_mean: float


def time_stacked(model_dir: Path, config: BenchConfig) -> StackedTiming:
    """The stacked step of every arm at once (our engine for the mini world), timed after its warm-up steps."""
    step = _stacked_steps(model_dir, config)
    metrics: list[dict[str, float]] = []
    seconds = _cpu_seconds(lambda i: metrics.append(step(i)), config)
    timed = metrics[config.warmup:]
    return StackedTiming(seconds, {phase: statistics.median(m[f"{phase}_seconds"] for m in timed) for phase in PHASES},
                         statistics.mean(m["len_mean"] for m in timed))


def _stacked_policy(model_dir: Path, config: BenchConfig) -> tuple[PreTrainedTokenizerBase, StackedPolicy]:
    """The tokenizer and a fresh stacked policy of every arm."""
    torch.manual_seed(config.seed)
    policy = StackedPolicy(load_causal_lm(model_dir), [PolicyConfig(rank=r, alpha=config.lora_alpha)
                                                        for r in config.ranks], config.seed)
    return load_tokenizer(model_dir), policy


def profile_sampling(model_dir: Path, config: BenchConfig) -> dict[str, Any]:
    """Where the stacked sampling's time goes, in ms per decoding step (a token for every row of every arm).

    One rollout is timed in CPU-seconds, then another, identical, under torch.profiler, whose ATen operations' own
    time is split into weight products, attention and the rest. What the profiled rollout spent outside ATen
    (Python, our code, the profiler's own bookkeeping) is an upper bound on what running the loop without Python
    would save. Prefill and the token draw are counted in.
    """
    tokenizer, policy = _stacked_policy(model_dir, config)
    problems, _, settings = _step_inputs(config)

    def sample() -> Rollout:
        with torch.no_grad():
            return sample_rollout(policy.weights(), tokenizer, problems, settings.group_size, settings.sampling,
                                  config.seed)

    sample()  # warm-up: the first call allocates what later ones reuse
    start = time.process_time()
    rollout = sample()
    cpu_seconds = time.process_time() - start
    steps = rollout.completion_ids.shape[1]
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        sample()
        profiled_seconds = time.perf_counter() - start
    kinds, other = aten_ms_by_kind(profiler.key_averages())
    per_step = {name: ms / steps for name, ms in kinds.items()}
    profiled_ms = 1e3 * profiled_seconds / steps
    return {"decoding_steps": steps, "completion_tokens_mean": rollout.completion_mask.sum(-1).float().mean().item(),
            "cpu_ms": 1e3 * cpu_seconds / steps, "profiled_ms": profiled_ms,
            **per_step, "outside_aten_ms": profiled_ms - sum(per_step.values()),
            "top_other_ops_ms": {name: ms / steps for name, ms in other.items()}}


def aten_ms_by_kind(events: EventList) -> tuple[dict[str, float], dict[str, float]]:
    """The ATen operations' own CPU milliseconds (children excluded, so nothing counts twice) by kind, and the
    costliest of the other operations by name."""
    kinds = {"products_ms": 0.0, "attention_ms": 0.0, "other_aten_ms": 0.0}
    other = {}
    for event in events:
        if not event.key.startswith("aten::"):
            continue
        ms = event.self_cpu_time_total / 1e3
        if event.key in PRODUCT_OPS:
            kinds["products_ms"] += ms
        elif event.key.startswith(ATTENTION_OPS):
            kinds["attention_ms"] += ms
        else:
            kinds["other_aten_ms"] += ms
            other[event.key] = ms
    return kinds, dict(sorted(other.items(), key=lambda item: -item[1])[:TOP_OTHER_OPS])


def _attention_flops(query, key, value, *_, **__) -> int:
    return sdpa_flop_count(query, key, value)


def _attention_backward_flops(grad_out, query, key, value, *_, **__) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# torch's counter knows the GPU's attention kernels only; the CPU's does the same products (shapes in, FLOPs out).
CPU_ATTENTION_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops,
                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward_flops}


def count_stacked_flops(model_dir: Path, config: BenchConfig) -> dict[str, float]:
    """The mean GFLOP of the timed stacked steps by kind (weight products, attention), counted on a replay of them.

    Counted is the arithmetic our step does, padding and masked keys included: each product's 2 m n k, and
    attention's score and value products (their gradient's five, the scores recomputed). Elementwise work is not.
    """
    step = _stacked_steps(model_dir, config)
    for i in range(config.warmup):
        step(i)
    totals = {"products": 0.0, "attention": 0.0}
    for i in range(config.warmup, config.warmup + config.steps):
        with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
            step(i)
        for op, flops in counter.get_flop_counts()["Global"].items():
            totals["attention" if op in CPU_ATTENTION_FLOPS else "products"] += flops / 1e9 / config.steps
    return totals


def matmul_gflops(side: int = PROBE_SIDE) -> float:
    """One thread's fp32 product rate, GFLOP per CPU-second: a [side x side] by [side x side] product, median."""
    a, b = torch.randn(side, side), torch.randn(side, side)
    return 2 * side**3 / median_seconds(lambda: a @ b, clock=time.process_time) / 1e9


def compute_floor(flops: dict[str, float], rate: float, stacked: float, trl: float) -> dict[str, Any]:
    """The least CPU-seconds our step's counted arithmetic takes at the measured product rate, against the step
    and TRL's steps of every arm (CPU-seconds for the same samples)."""
    floor = sum(flops.values()) / rate
    return {"gflop_per_step": flops, "matmul_gflop_per_cpu_second": rate, "floor_cpu_seconds": floor,
            "step_over_floor": stacked / floor, "trl_over_floor": trl / floor}


def time_single(model_dir: Path, config: BenchConfig, rank: int | None) -> list[float]:
    """CPU-seconds of each grpo_step of one arm through peft and transformers (our engine for other models)."""
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(model_dir)
    policy = Policy(load_causal_lm(model_dir), PolicyConfig(rank=rank, alpha=config.lora_alpha),
                    keep_reference=config.beta > 0)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate, weight_decay=0.0)
    problems, reward, settings = _step_inputs(config)
    return _cpu_seconds(lambda i: grpo_step(policy, tokenizer, optimizer, problems, reward, settings,
                                            seed=config.seed + i), config)


def time_trl(model_dir: Path, config: BenchConfig, rank: int | None, workdir: Path) -> list[float]:
    """CPU-seconds of each GRPOTrainer optimizer step of one arm after the warmup."""
    args = trl.GRPOConfig(
        output_dir=str(workdir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # TRL turns it on by default; our step does not checkpoint
        per_device_train_batch_size=config.samples_per_step,
        num_generations=config.generations,
        max_completion_length=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        beta=config.beta,
        epsilon=config.epsilon,
        loss_type="bnpo",  # = our token_mean
        use_bias_correction_kl=False,  # = our k3
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=config.max_grad_norm,
        max_steps=config.warmup + config.steps,
        seed=config.seed,
        shuffle_dataset=False,  # every step's batch is the same P prompts, as ours are (the dataset repeats them)
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
    )
    prompts = [p.prompt for p in problem_set(config)] * (config.warmup + config.steps)
    lora = None if rank is None else LoraConfig(r=rank, lora_alpha=config.lora_alpha, target_modules="all-linear")
    trainer = trl.GRPOTrainer(
        model=str(model_dir),
        reward_funcs=random_reward_func(config.seed),
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=load_tokenizer(model_dir),
        peft_config=lora,
    )
    trainer.remove_callback(PrinterCallback)  # it would print the end-of-training metrics
    timer = StepTimer()  # CPU-seconds
    trainer.add_callback(timer)
    trainer.train()
    return timer.seconds[config.warmup:]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one CPU thread, as every benchmark timing is taken, then restore the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build_model(config: BenchConfig, workdir: Path) -> Path:
    """The model timed: config.student, or the random Qwen3 of the benchmark's shape and its tokenizer, saved in
    workdir/model."""
    if config.student is not None:
        return Path(config.student)
    model = workdir / "model"
    tokenizer = build_tokenizer(model)
    build_qwen3(len(tokenizer), seed=config.seed, hidden=config.hidden, layers=config.layers).save_pretrained(model)
    return model


def describe_model(model_dir: Path, config: BenchConfig) -> dict[str, Any]:
    """What was timed: the student given (its folder) or the random stand-in, its shape and its prompts."""
    model = load_config(model_dir)
    return {"timed": config.student or "a random Qwen3 (tools/stand_ins.py)", "hidden": model.hidden_size,
            "layers": model.num_hidden_layers,
            "prompts": f"{config.problems}/{TRAIN_FILE}" if config.problems else "addition problems"}


def run_benchmark(config: BenchConfig, workdir: Path, report: dict | None = None) -> dict:
    """Build the stand-in in workdir, time every implementation on every arm, return the report. report, where
    given, is filled as each part is timed, so a caller keeps what was measured before a later part failed."""
    with one_thread():
        return _run(config, workdir, {} if report is None else report)


def _run(config: BenchConfig, workdir: Path, report: dict) -> dict:
    model = build_model(config, workdir)
    report.update(config=dataclasses.asdict(config), model=describe_model(model, config), environment=environment())
    seconds = report["cpu_seconds_per_step"] = {}
    timing = time_stacked(model, config)
    stacked = seconds["ours (stacked, all arms)"] = statistics.median(timing.seconds)
    report.update(stacked_phase_wall_seconds=timing.phases,
                  completion_tokens_mean=timing.completion_tokens_mean,  # of the timed steps
                  stacked_sampling_ms_per_decoding_step=profile_sampling(model, config))
    flops = count_stacked_flops(model, config)
    # The same step without the KL penalty and without tracking it: the reference pass is skipped.
    kl_free = statistics.median(time_stacked(model, dataclasses.replace(config, beta=0.0)).seconds)
    seconds["ours (stacked, all arms, beta 0)"] = kl_free
    report["kl_free_saving"] = 1 - kl_free / stacked  # the share of the step the reference pass costs
    single = seconds["ours (peft)"] = {}
    for rank in config.ranks:
        single[arm_name(rank)] = statistics.median(time_single(model, config, rank))
    trl_seconds = seconds["TRL"] = {}
    for rank in config.ranks:
        trl_seconds[arm_name(rank)] = statistics.median(time_trl(model, config, rank, workdir / f"trl-{rank}"))
    report["compute_floor"] = compute_floor(flops, matmul_gflops(), stacked, sum(trl_seconds.values()))
    samples = config.samples_per_step * len(config.ranks)  # one step of every arm
    throughput = report["samples_per_cpu_second"] = {
        "ours (stacked)": samples / stacked, "ours (peft, one arm at a time)": samples / sum(single.values()),
        "TRL GRPOTrainer (one arm at a time)": samples / sum(trl_seconds.values())}
    report["ours_over_trl"] = throughput["ours (stacked)"] / throughput["TRL GRPOTrainer (one arm at a time)"]
    return report


def format_table(report: dict) -> str:
    """Samples per CPU-second per implementation, CPU-seconds per step per arm, and the ratio."""
    lines = [f"{'implementation':<40} {'samples / CPU-s':>16}"]
    lines += [f"{name:<40} {value:>16.1f}" for name, value in report["samples_per_cpu_second"].items()]
    lines.append(f"ours (stacked) / TRL: {report['ours_over_trl']:.2f}x")
    seconds = report["cpu_seconds_per_step"]
    lines.append(f"beta 0 (reference pass skipped): {seconds['ours (stacked, all arms, beta 0)']:.3f} "
                 f"CPU-s per stacked step, {report['kl_free_saving']:.0%} less than with the KL penalty")
    lines.append(f"CPU-s per step: stacked, all arms {seconds['ours (stacked, all arms)']:.3f}; per arm peft / TRL: "
                 + ", ".join(f"{arm} {seconds['ours (peft)'][arm]:.3f} / {seconds['TRL'][arm]:.3f}"
                             for arm in seconds["TRL"]))
    lines.append(f"stacked step by phase (wall-s, median): {phase_split(report['stacked_phase_wall_seconds'])}")
    lines.append(f"stacked sampling: {sampling_split(report['stacked_sampling_ms_per_decoding_step'])}")
    lines.append(f"compute floor: {floor_split(report['compute_floor'])}")
    return "\n".join(lines)


def quiet() -> None:
    """Silence Hugging Face warnings and progress bars, datasets' included."""
    quiet_transformers()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def bench_parser(description: str) -> argparse.ArgumentParser:
    """A command line with BenchConfig's sizes and arms (defaults from the dataclass) and --out."""
    defaults = BenchConfig()
    parser = argparse.ArgumentParser(description=description)
    for name in CLI_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--ranks", type=parse_ranks, default=defaults.ranks,
                        help="comma-separated LoRA ranks, 'full' for FullFT (default: the mini study's arms)")
    parser.add_argument("--student", default=None, help="time this model folder (a world's student) instead of a "
                                                        "random Qwen3 of --hidden x --layers; needs --problems")
    parser.add_argument("--problems", default=None, help="its world's problems folder: the prompts are drawn from "
                                                         f"its {TRAIN_FILE}")
    parser.add_argument("--out", type=Path, default=None, help="write the report to this JSON file")
    return parser


def parse_bench(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> tuple[BenchConfig, dict]:
    """The BenchConfig from a bench_parser's command line, and every parsed argument; a usage error on bad sizes."""
    args = vars(parser.parse_args(argv))
    try:
        fields = (*CLI_FIELDS, "ranks", "student", "problems")
        return dataclasses.replace(BenchConfig(), **{name: args[name] for name in fields}), args
    except ValueError as error:
        parser.error(str(error))


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchConfig, Path | None]:
    """The BenchConfig and the JSON path from the command line."""
    config, args = parse_bench(bench_parser(__doc__.split("\n\n")[0]), argv)
    return config, args["out"]


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, write the JSON report when asked; where a part fails, what was measured
    before it goes to the report's .partial.json, and the error is raised."""
    config, out = parse_args(argv)
    quiet()
    report: dict = {}
    try:
        with tempfile.TemporaryDirectory() as workdir:
            run_benchmark(config, Path(workdir), report)
    except Exception as error:
        if out is not None and report:
            partial = out.with_suffix(".partial.json")
            write_report({**report, "error": f"{type(error).__name__}: {error}"}, partial)
            print(f"the benchmark failed; what it measured before is in {partial}", file=sys.stderr)
        raise
    model = report["model"]
    print(f"{report['environment']}\nmedian of {config.steps} steps after {config.warmup} warmup, P={config.prompts} "
          f"G={config.generations} T={config.max_new_tokens}, {model['timed']} (hidden {model['hidden']} x "
          f"{model['layers']} layers) on {model['prompts']}, arms {', '.join(arm_name(r) for r in config.ranks)}")
    print(format_table(report))
    write_report(report, out)
    if out is not None:
        out.with_suffix(".partial.json").unlink(missing_ok=True)  # an earlier failure's, superseded
    return report


if __name__ == "__main__":
    main()

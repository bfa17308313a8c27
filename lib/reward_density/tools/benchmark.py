"""Step-speed benchmark: our grpo_step against TRL's GRPOTrainer on the same tiny model and settings.

Run as `python -m reward_density.tools.benchmark [--steps N] ... [--out FILE.json]`; see BenchConfig.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any Hugging Face import: everything here is local

import argparse
import dataclasses
import json
import platform
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import peft
import torch
import transformers
import trl
from peft import LoraConfig
from transformers import PrinterCallback, TrainerCallback

from ..data.problems import Problem
from ..data.sources import load_causal_lm, load_tokenizer
from ..grpo.deposits import Deposits
from ..grpo.loss import LossConfig
from ..grpo.policy import Policy, PolicyConfig
from ..grpo.rollout import Rollout
from ..grpo.sampler import SamplingConfig
from ..grpo.step import StepConfig, grpo_step
from .stand_ins import build_qwen3, build_tokenizer

PHASES = ("step_seconds", "generate_seconds", "reward_seconds", "train_seconds")
CLI_FIELDS = ("steps", "warmup", "prompts", "generations", "max_new_tokens", "hidden", "layers", "rank")


@dataclass(frozen=True)
class BenchConfig:
    """Benchmark sizes and the GRPO settings both implementations share."""

    steps: int = 20
    warmup: int = 3
    prompts: int = 1
    generations: int = 4
    max_new_tokens: int = 32
    hidden: int = 64
    layers: int = 2
    rank: int = 1
    temperature: float = 0.7
    top_p: float = 1.0
    beta: float = 0.05
    epsilon: float = 0.2
    learning_rate: float = 1e-5
    lora_alpha: float = 32.0
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={self.steps}, warmup={self.warmup}")

    @property
    def arms(self) -> dict[str, int | None]:
        """Arm name -> LoRA rank (None: full fine-tuning)."""
        return {f"LoRA r={self.rank}": self.rank, "FullFT": None}


def problem_set(count: int, seed: int) -> list[Problem]:
    """count addition problems drawn with a fixed seed."""
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(count)]
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


def time_ours(model_dir: Path, config: BenchConfig, rank: int | None) -> list[dict[str, float]]:
    """Timings of each grpo_step after the warmup, from its metrics rows."""
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(model_dir)
    policy = Policy(
        load_causal_lm(model_dir), PolicyConfig(rank=rank, alpha=config.lora_alpha), keep_reference=config.beta > 0
    )
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate, weight_decay=0.0)
    step_config = StepConfig(
        group_size=config.generations,
        sampling=SamplingConfig(config.max_new_tokens, config.temperature, config.top_p),
        loss=LossConfig(epsilon=config.epsilon, beta=config.beta, kl_estimator="k3", normalisation="token_mean"),
        max_grad_norm=config.max_grad_norm,
    )
    problems, reward = problem_set(config.prompts, config.seed), RandomOutcomeReward(config.seed)
    rows = [
        grpo_step(policy, tokenizer, optimizer, problems, reward, step_config, seed=config.seed + i)
        for i in range(config.warmup + config.steps)
    ]
    return [{name: row[name] for name in PHASES} for row in rows[config.warmup:]]


class StepTimer(TrainerCallback):
    """Seconds of each optimizer step, split by the trainer methods wrapped with timed()."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self._phases: dict[str, float] = {}
        self._start = 0.0

    def timed(self, phase: str, method: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._phases[phase] = self._phases.get(phase, 0.0) + time.perf_counter() - start

        return wrapper

    def on_step_begin(self, args, state, control, **kwargs):
        self._phases, self._start = {}, time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step = time.perf_counter() - self._start
        generate, reward = self._phases.get("generate", 0.0), self._phases.get("reward", 0.0)
        self.rows.append({"step_seconds": step, "generate_seconds": generate, "reward_seconds": reward,
                          "train_seconds": step - generate - reward})


def time_trl(model_dir: Path, config: BenchConfig, rank: int | None, workdir: Path) -> list[dict[str, float]]:
    """Timings of each GRPOTrainer optimizer step after the warmup (train = everything but generate/reward)."""
    args = trl.GRPOConfig(
        output_dir=str(workdir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # TRL turns it on by default; our step does not checkpoint
        per_device_train_batch_size=config.prompts * config.generations,
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
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
    )
    prompts = [p.prompt for p in problem_set(config.prompts, config.seed)] * (config.warmup + config.steps)
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
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer._generate = timer.timed("generate", trainer._generate)
    trainer._calculate_rewards = timer.timed("reward", trainer._calculate_rewards)
    trainer.train()
    return timer.rows[config.warmup:]


def summarise(rows: Sequence[dict[str, float]]) -> dict[str, float | list[float]]:
    """Median of each phase over the timed steps, plus every step's total."""
    medians = {name: statistics.median(row[name] for row in rows) for name in PHASES}
    return {**medians, "all_step_seconds": [row["step_seconds"] for row in rows]}


def run_benchmark(config: BenchConfig, workdir: Path) -> dict:
    """Build the stand-ins in workdir, time both implementations on both arms, return the report."""
    tokenizer = build_tokenizer(workdir / "model")
    build_qwen3(len(tokenizer), seed=config.seed, hidden=config.hidden, layers=config.layers).save_pretrained(
        workdir / "model"
    )
    results = {}
    for arm, rank in config.arms.items():
        ours = summarise(time_ours(workdir / "model", config, rank))
        theirs = summarise(time_trl(workdir / "model", config, rank, workdir / f"trl-{rank}"))
        ratio = ours["step_seconds"] / theirs["step_seconds"]
        results[arm] = {"ours": ours, "trl": theirs, "ours_over_trl": ratio}
    return {"config": dataclasses.asdict(config), "environment": environment(), "results": results}


def environment() -> dict[str, str | int]:
    """Library versions, device and CPU threads the numbers were taken with."""
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "peft": peft.__version__,
        "device": f"cpu ({platform.processor() or platform.machine()})",
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count() or 0,
    }


def format_table(report: dict) -> str:
    """Median seconds per step, per arm and implementation, with our step's split."""
    lines = [f"{'arm':<10} {'impl':<5} {'step s':>8} {'generate':>9} {'reward':>8} {'train':>8}"]
    for arm, result in report["results"].items():
        for impl in ("ours", "trl"):
            row = result[impl]
            lines.append(f"{arm:<10} {impl:<5} " + " ".join(
                f"{row[name]:>{width}.4f}" for name, width in zip(PHASES, (8, 9, 8, 8))
            ))
        lines.append(f"{arm:<10} ours/TRL step time: {result['ours_over_trl']:.2f}")
    return "\n".join(lines)


def quiet() -> None:
    """Silence Hugging Face warnings and progress bars."""
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchConfig, Path | None]:
    """The BenchConfig (defaults from the dataclass) and the JSON path from the command line."""
    defaults = BenchConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in CLI_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--out", type=Path, default=None, help="write the report to this JSON file")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    return dataclasses.replace(defaults, **args), out


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, write the JSON report when asked."""
    config, out = parse_args(argv)
    quiet()
    with tempfile.TemporaryDirectory() as workdir:
        report = run_benchmark(config, Path(workdir))
    print(f"{report['environment']}\nmedian of {config.steps} steps after {config.warmup} warmup, P={config.prompts} "
          f"G={config.generations} T={config.max_new_tokens} hidden={config.hidden} layers={config.layers}")
    print(format_table(report))
    if out is not None:
        out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()

"""The paper's GRPO step on random weights of the paper's models: seconds per phase, peak GPU memory, the
physical floor, and TRL's GRPOTrainer on the same configuration.

Nothing is downloaded. The Qwen3-1.7B policy, the Qwen3-8B teacher and the 7B Mistral PRM are built with
random weights from their published shapes (gpu_memory.py), and their tokenizers are synthetic word lists of
the same vocabulary sizes. The student's EOS lies outside its vocabulary, so every completion runs to the
length cap: the step's worst case, the one the floor assumes. Every other setting is the paper profile's.
Everything sits on one device (the paper's profile puts the teacher and the PRM on a second GPU).

    python -m reward_density.tools.paper_benchmark --out paper_bench.json        # on a GPU
    python -m reward_density.tools.paper_benchmark --scale tiny --device cpu      # tiny models (CI: shorter still)
    python -m reward_density.tools.paper_benchmark --decoder compiled ...         # levers' compiled decode step
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any Hugging Face import: everything here is local

import argparse
import contextlib
import dataclasses
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peft
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerActivity, profile
from transformers import MistralConfig, PreTrainedTokenizerFast, Qwen3Config

from ..data.answer_check import AnswerChecker
from ..data.problems import Problem
from ..experiment.cell import make_optimizer, make_policy, step_config
from ..experiment.config import CellConfig
from ..experiment.profiles import cell_config, find_profile, load_profile
from ..grpo import sampler
from ..grpo.cuda_graph import GraphedDecoder
from ..grpo.loss import scores_reference
from ..grpo.policy import Policy
from ..grpo.precision import autocast, frozen_dtype
from ..grpo.qwen3 import supports
from ..grpo.rollout import Rollout
from ..grpo.sampler import SamplingConfig, sample_rollout
from ..grpo.step import StepConfig, grpo_step
from ..rewards import REGIMES, build_reward
from .gpu_memory import (
    BF16,
    GIB,
    MATH_SHEPHERD_MISTRAL_7B,
    PROMPT_TOKENS,
    QWEN3_1_7B,
    QWEN3_8B,
    DecoderShape,
    student_memory,
)
from .levers import FoldedDecoder, compiled_sampling
from .measurement import (
    StepTimer,
    arm_name,
    attempt,
    environment,
    free_memory,
    median_seconds,
    on_cuda,
    parse_device,
    parse_ranks,
    quiet,
    synchronize,
    write_report,
)

SCALES = {  # the models of each scale: the paper's, or tiny ones of the same architectures for a CPU
    "paper": {"student": QWEN3_1_7B, "teacher": QWEN3_8B, "prm": MATH_SHEPHERD_MISTRAL_7B},
    "tiny": {"student": DecoderShape(600, 32, 2, 64, 4, 2, 8, tied=True),
             "teacher": DecoderShape(600, 48, 2, 96, 4, 2, 12, tied=False),
             "prm": DecoderShape(300, 32, 2, 64, 4, 2, 8, tied=False, qk_norm=False)},
}
PROBE_SIZES = {"paper": (1 << 30, 8192), "tiny": (1 << 20, 256)}  # bytes copied, matrix side: the ceilings' probes
STEP_EVERY = 100  # every 100th student token ends a line: about 15 reasoning steps in 1536 tokens
PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
PRM_WORDS = (UNK, PAD, EOS, "ки", "+", "-")  # Math-Shepherd's step tag and its good / bad tokens
MAX_POSITIONS = 4096
# The warmup steps' completion caps: kernels and optimizer state, not the timed shapes. Two caps, so that a compiled
# decode step has seen its cache's length change (torch.compile then recompiles once, for any length) before the
# timed steps, whose cap is another.
WARMUP_TOKENS = (32, 16)
PROFILED_TOKENS = 32  # tokens sampled under torch.profiler, to see whether a decoded token waits on launches
TOP_KERNELS = 12  # the kernels with the most device time, by name, in the decode profile
DECODERS = ("study", "compiled")  # sampling's decode step: the study's, or levers' folded step compiled (not adopted)


@dataclass(frozen=True)
class PaperBenchConfig:
    """What to time; the GRPO settings are the profile's cell section (max_new_tokens may be lowered)."""

    scale: str = "paper"
    device: str = "cuda"
    ranks: tuple[int | None, ...] = (1, None, 256)  # None: FullFT
    regimes: tuple[str, ...] = REGIMES
    steps: int = 1  # timed steps per arm and regime, after two short warm-up steps per regime (WARMUP_TOKENS)
    trl_ranks: tuple[int | None, ...] = (1, None)  # each timed right after our step of the same arm
    trl_steps: int = 1  # timed TRL steps per arm after one warmup step; 0: time that first step alone
    max_new_tokens: int | None = None  # None: the profile's cap
    prompt_tokens: int = PROMPT_TOKENS
    profile: str = "paper"
    seed: int = 0
    decoder: str = "study"  # one of DECODERS

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; expected one of {sorted(SCALES)}")
        if self.decoder not in DECODERS:
            raise ValueError(f"unknown decoder {self.decoder!r}; expected one of {DECODERS}")
        unknown = [r for r in self.regimes if r not in REGIMES]
        if unknown:
            raise ValueError(f"unknown regimes {unknown}; expected some of {REGIMES}")
        if self.steps < 1 or self.trl_steps < 0 or self.prompt_tokens < 1:
            raise ValueError(f"need steps >= 1, trl_steps >= 0 and prompt_tokens >= 1, got {self}")


# ------------------------------------------------------------------------------------ models and tokenizers


def model_config(shape: DecoderShape, pad: int, eos: int) -> Qwen3Config | MistralConfig:
    """The transformers config of a shape: Qwen3 where it normalises queries and keys, else Mistral."""
    fields = dict(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                  intermediate_size=shape.intermediate, num_attention_heads=shape.heads,
                  num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, tie_word_embeddings=shape.tied,
                  max_position_embeddings=MAX_POSITIONS, pad_token_id=pad, eos_token_id=eos, bos_token_id=None)
    return Qwen3Config(**fields) if shape.qk_norm else MistralConfig(**fields, sliding_window=None)


def random_model(shape: DecoderShape, tokenizer: PreTrainedTokenizerFast, device: str, dtype: torch.dtype,
                 seed: int) -> transformers.PreTrainedModel:
    """A causal LM of this shape with random weights, initialised on the device in its dtype."""
    torch.manual_seed(seed)
    config = model_config(shape, tokenizer.pad_token_id, tokenizer.eos_token_id)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _word_tokenizer(words: dict[str, int], eos: str) -> PreTrainedTokenizerFast:
    """A whitespace-split word-level tokenizer over these words."""
    backend = Tokenizer(models.WordLevel(words, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=eos, unk_token=UNK)


def student_word(index: int) -> str:
    """The stand-in vocabulary's word number `index`: every STEP_EVERY-th one ends a reasoning step."""
    return f"s{index}\n" if index % STEP_EVERY == 0 else f"w{index}"


def student_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """Ids 0..vocab-1 are words the model can draw (every STEP_EVERY-th ends a line); EOS is id vocab, which it
    cannot, so every completion runs to the cap."""
    words = {PAD: 0, UNK: 1} | {student_word(i): i for i in range(2, vocab)} | {EOS: vocab}
    return _word_tokenizer(words, EOS)


def prm_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """The PRM's words: its specials, the step tag and +/-, then the student's words w6..w{vocab-1}."""
    words = {word: i for i, word in enumerate(PRM_WORDS)}
    words |= {f"w{i}": i for i in range(len(PRM_WORDS), vocab)}
    return _word_tokenizer(words, EOS)


def problem_set(count: int, words: int, vocab: int, seed: int) -> list[Problem]:
    """count prompts of `words` student words (one token each), gold answer 1."""
    rng = random.Random(seed)
    draws = [[rng.randrange(2, vocab) for _ in range(words)] for _ in range(count)]
    prompts = [" ".join(f"w{i + (i % STEP_EVERY == 0)}" for i in ids) for ids in draws]  # words, not line ends
    return [Problem(f"p{i}", prompt, "1", question=prompt) for i, prompt in enumerate(prompts)]


# ------------------------------------------------------------------------------------ the floor


def probe_device(device: str, scale: str) -> dict[str, float]:
    """The two ceilings measured here: copy bandwidth (bytes read + written per second) and bf16 matmul FLOP/s."""
    size, side = PROBE_SIZES[scale]
    source = torch.randn(size // 2, device=device, dtype=torch.bfloat16)
    target = torch.empty_like(source)
    copy = median_seconds(lambda: target.copy_(source), device)
    a, b = (torch.randn(side, side, device=device, dtype=torch.bfloat16) for _ in range(2))
    matmul = median_seconds(lambda: a @ b, device)
    return {"bandwidth_bytes_per_s": 2 * size / copy, "matmul_flops_per_s": 2 * side**3 / matmul}


def floor_seconds(shapes: dict[str, DecoderShape], cell: CellConfig, prompt_tokens: int,
                  probe: dict[str, float]) -> dict[str, float]:
    """The least time the step's work can take on this device, by part.

    Decoding reads the student's bf16 weights and its KV cache once per generated token (memory-bound); the
    passes over the whole sequences are matmul-bound: 2 FLOPs per weight and token forward, as many again
    backward through the activations, and for FullFT as many once more for the weights' gradients. Attention's
    own FLOPs and gradient checkpointing's recomputation are left out (the first is small, the second a choice).
    """
    student, rows, new = shapes["student"], cell.prompts_per_step * cell.group_size, cell.max_new_tokens
    layer_weights = student.linear_weights()
    head = student.vocab * student.hidden
    weights_read = (layer_weights + head) * BF16  # the embedding lookup reads one row per token
    mean_kv = rows * student.kv_cache_bytes(prompt_tokens + new // 2)
    tokens = rows * (prompt_tokens + new)
    forward = 2 * (layer_weights * tokens + head * rows * new)  # the LM head over the completion only
    backward = forward * (2 if cell.rank is None else 1)
    reference = forward if scores_reference(cell.beta, cell.track_kl) else 0
    scorer = {"outcome": None, "process": shapes["prm"], "distillation": shapes["teacher"]}[cell.regime]
    reward = 0 if scorer is None else 2 * scorer.linear_weights() * tokens
    if cell.regime == "distillation":
        reward += 2 * scorer.vocab * scorer.hidden * rows * new
    rate, bandwidth = probe["matmul_flops_per_s"], probe["bandwidth_bytes_per_s"]
    parts = {"generate": new * (weights_read + mean_kv) / bandwidth, "reward": reward / rate,
             "reference": reference / rate, "train": (forward + backward) / rate}
    return parts | {"step": sum(parts.values())}


# ------------------------------------------------------------------------------------ our step


@dataclass
class World:
    """The models and tokenizers every arm shares."""

    shapes: dict[str, DecoderShape]
    tokenizer: PreTrainedTokenizerFast
    problems: list[Problem]
    rewards: dict[str, Any]
    scorer_bytes: int  # device memory the teacher and the PRM hold throughout


def build_world(config: PaperBenchConfig, cell: CellConfig, checker: AnswerChecker) -> World:
    """The tokenizers, the prompts, and the reward of each regime with its random teacher or PRM."""
    shapes = SCALES[config.scale]
    tokenizer = student_tokenizer(shapes["student"].vocab)
    problems = problem_set(cell.prompts_per_step, config.prompt_tokens, min(shapes["student"].vocab,
                                                                            shapes["prm"].vocab), config.seed)
    before = _allocated(config.device)
    frozen = frozen_dtype(cell.precision)
    rewards = {}
    for regime in config.regimes:
        parts: dict[str, Any] = {"checker": checker, "temperature": cell.temperature,
                                 "micro_batch_size": cell.micro_batch_size}
        if regime == "process":
            prm_words = prm_tokenizer(shapes["prm"].vocab)
            parts.update(prm_model=random_model(shapes["prm"], prm_words, config.device, frozen, config.seed + 2),
                         prm_tokenizer=prm_words, student_tokenizer=tokenizer)
        if regime == "distillation":
            parts["teacher"] = random_model(shapes["teacher"], tokenizer, config.device, frozen, config.seed + 1)
        rewards[regime] = build_reward(regime, **parts)
    return World(shapes, tokenizer, problems, rewards, _allocated(config.device) - before)


def _allocated(device: str) -> int:
    return torch.cuda.memory_allocated(device) if on_cuda(device) else 0


def time_arm(world: World, cells: dict[str, CellConfig], config: PaperBenchConfig,
             probe: dict[str, float]) -> dict[str, Any]:
    """Each regime's step of one arm: its metrics' timings, the synchronised wall time, the peak memory, the floor."""
    with compiled_sampling() if config.decoder == "compiled" else contextlib.nullcontext():
        return _time_arm(world, cells, config, probe)


def _time_arm(world: World, cells: dict[str, CellConfig], config: PaperBenchConfig,
              probe: dict[str, float]) -> dict[str, Any]:
    before = _graphs_compiled()
    first = cells[config.regimes[0]]
    student = random_model(world.shapes["student"], world.tokenizer, config.device,
                           frozen_dtype(first.student_precision), config.seed)
    policy = make_policy([first], student)
    optimizer = make_optimizer([first], policy)
    settings = {regime: step_config(cell) for regime, cell in cells.items()}
    for regime, step in settings.items():  # warmup: kernels, the reward models' first calls, AdamW's state
        for cap in WARMUP_TOKENS:
            warmup = dataclasses.replace(step, sampling=dataclasses.replace(step.sampling, max_new_tokens=cap))
            grpo_step(policy, world.tokenizer, optimizer, world.problems, world.rewards[regime], warmup,
                      seed=config.seed)
    result: dict[str, Any] = {"trained_parameters": sum(p.numel() for p in policy.trainable_parameters()),
                              "sampling_decoder": _sampling_decoder(policy, settings[config.regimes[0]], config)}
    after_warmup = _graphs_compiled()
    for regime, step in settings.items():
        rows = [_timed_step(policy, optimizer, world, regime, step, config, seed=config.seed + 1 + i)
                for i in range(config.steps)]
        result[regime] = {
            "steps": rows,
            "median": {key: statistics.median(row[key] for row in rows) for key in rows[0]
                       if isinstance(rows[0][key], (int, float))},
            "floor_seconds": floor_seconds(world.shapes, cells[regime], config.prompt_tokens, probe),
        }
    # A graph compiled during the timed steps puts its compiling into their times.
    result["graphs_compiled"] = {"warmup": after_warmup - before, "timed_steps": _graphs_compiled() - after_warmup}
    # Profiled last, so that nothing the profiler leaves behind touches the timed steps.
    result["decode_profile"] = profile_decode(policy, world, settings[config.regimes[0]], config)
    estimate = student_memory(dataclasses.asdict(first), first.rank, world.shapes["student"])
    result["estimated_student_gib"] = estimate["peak (training step)"]
    del policy, optimizer, student
    free_memory(config.device)
    return result


def _sampling_decoder(policy, step: StepConfig, config: PaperBenchConfig) -> str:
    """Which decoder the timed steps sample with."""
    if not supports(policy.model):
        return "transformers"
    kind = sampler.decoder_kind(step.sampling, torch.device(config.device))
    name = "ours (qwen3.py)" + (", levers' folded step compiled" if issubclass(kind, FoldedDecoder) else "")
    return name + (", CUDA graphs" if issubclass(kind, GraphedDecoder) else "")


def _graphs_compiled() -> int:
    """How many graphs torch.compile has compiled in this process (since its counters were last cleared)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def profile_decode(policy: Policy, world: World, step: StepConfig, config: PaperBenchConfig) -> dict[str, Any]:
    """A sampled token's time, eager and replayed as a CUDA graph (the same on a CPU), and whether they agree.

    For each, the wall time per token; for the eager decode, also its ATen calls, kernels and the device's kernel time
    under torch.profiler, and the kernels that take the most of it (kernel time far below the wall time means the GPU
    waits for the host to launch work; many kernels of a few microseconds each mean fusion would pay). Graphs are
    not profiled: the profiler and CUDA graphs have crashed or hung together (pytorch/pytorch#75504, #135003). The
    prompts' prefill and the graph's recording are counted in, a small share. The two draw with one seed, so their
    tokens should agree but for rounding: the share of equal tokens, and the largest log-prob difference before a
    row's tokens differ.
    """
    result, rollouts = {}, {}
    for mode, graphs in (("eager", False), ("cuda_graphs", True)):
        sampling = dataclasses.replace(step.sampling, max_new_tokens=PROFILED_TOKENS, cuda_graphs=graphs)
        result[mode], rollouts[mode] = _profiled_decode(policy, world, step, sampling, config, profiled=not graphs)
    eager, graphed = rollouts["eager"], rollouts["cuda_graphs"]
    equal = eager.completion_ids == graphed.completion_ids
    before_divergence = equal.long().cumprod(-1).bool()
    difference = (eager.sampler_logps - graphed.sampler_logps).abs()[before_divergence]
    return result | {"tokens": PROFILED_TOKENS, "same_tokens": equal.float().mean().item(),
                     "max_logp_difference": difference.max().item() if difference.numel() else float("nan")}


def _profiled_decode(policy, world: World, step: StepConfig, sampling: SamplingConfig, config: PaperBenchConfig,
                     profiled: bool) -> tuple[dict[str, float], Rollout]:
    """One rollout's wall ms per token; if profiled, then another's ATen calls and kernel ms per token."""
    device = torch.device(config.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda(device) else [])
    with autocast(device, step.precision), policy.sampling() as model:
        synchronize(config.device)
        start = time.perf_counter()
        rollout = sample_rollout(model, world.tokenizer, world.problems, step.group_size, sampling, config.seed)
        synchronize(config.device)
        timed = {"wall_ms_per_token": 1e3 * (time.perf_counter() - start) / PROFILED_TOKENS}
        if not profiled:
            return timed, rollout
        with profile(activities=activities) as profiler:
            sample_rollout(model, world.tokenizer, world.problems, step.group_size, sampling, config.seed)
            synchronize(config.device)
    return timed | profile_per_token(profiler.key_averages()), rollout


def profile_per_token(events: EventList) -> dict[str, Any]:
    """ATen calls, kernels and kernel ms per profiled token, and the kernels that took the most device time.

    Device time is summed over the device's own events only, as torch.profiler's table does: the ATen call that
    launched a kernel reports the same time as its self device time, so a sum over every event counts it twice.
    """
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:TOP_KERNELS]
    return {"aten_calls_per_token": sum(e.count for e in events if e.key.startswith("aten::")) / PROFILED_TOKENS,
            "kernels_per_token": sum(e.count for e in kernels) / PROFILED_TOKENS,
            "device_kernel_ms_per_token": sum(e.self_device_time_total for e in kernels) / 1e3 / PROFILED_TOKENS,
            "top_kernels": [{"name": e.key[:160], "calls_per_token": e.count / PROFILED_TOKENS,
                             "ms_per_token": e.self_device_time_total / 1e3 / PROFILED_TOKENS} for e in top]}


def _timed_step(policy, optimizer, world: World, regime: str, step: StepConfig, config: PaperBenchConfig,
                seed: int) -> dict[str, float]:
    """One step: grpo_step's own phase timings, the wall time around it, peak memory (all, and the student's)."""
    if on_cuda(config.device):
        torch.cuda.reset_peak_memory_stats(config.device)
    synchronize(config.device)
    start = time.perf_counter()
    row = grpo_step(policy, world.tokenizer, optimizer, world.problems, world.rewards[regime], step, seed=seed)
    synchronize(config.device)
    keep = ("step_seconds", "generate_seconds", "reward_seconds", "reference_seconds", "train_seconds",
            "len_mean", "frac_truncated", "steps_mean")
    timed = {key: float(row[key]) for key in keep} | {"wall_seconds": time.perf_counter() - start}
    if on_cuda(config.device):
        peak = torch.cuda.max_memory_allocated(config.device)
        timed |= {"peak_gib": peak / GIB, "student_peak_gib": (peak - world.scorer_bytes) / GIB}
    return timed


# ------------------------------------------------------------------------------------ TRL


def time_trl(world: World, cell: CellConfig, config: PaperBenchConfig, workdir: Path) -> dict[str, Any]:
    """Wall seconds of TRL GRPOTrainer optimizer steps of one arm on the same model shape, prompts and settings.

    TRL loads its policy (and its FullFT reference) from a folder: the random student is saved there first.
    Each optimizer step generates P x G completions with transformers' generate (no vLLM) and trains on them
    in micro-batches of the cell's size, as our step does.
    """
    import datasets  # not in every GPU image: imported only when TRL is timed
    import trl

    folder = workdir / f"trl-student-{cell.rank}"
    dtype = frozen_dtype(cell.student_precision)  # TRL's student held as our arm holds it
    random_model(world.shapes["student"], world.tokenizer, config.device, dtype, config.seed).save_pretrained(folder)
    world.tokenizer.save_pretrained(folder)
    rows = cell.prompts_per_step * cell.group_size
    micro = min(cell.micro_batch_size or rows, rows)
    args = trl.GRPOConfig(
        output_dir=str(workdir / f"trl-{cell.rank}"), use_cpu=torch.device(config.device).type == "cpu",
        bf16=cell.precision == "bf16", model_init_kwargs={"dtype": str(dtype).removeprefix("torch.")},
        gradient_checkpointing=cell.gradient_checkpointing, per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro, num_generations=cell.group_size,
        max_completion_length=cell.max_new_tokens, temperature=cell.temperature, top_p=cell.top_p, beta=cell.beta,
        loss_type="bnpo", use_bias_correction_kl=False, learning_rate=cell.learning_rate, lr_scheduler_type="constant",
        weight_decay=cell.weight_decay, max_grad_norm=cell.max_grad_norm, max_steps=1 + config.trl_steps,
        seed=config.seed, report_to=[], logging_strategy="no", save_strategy="no", disable_tqdm=True,
    )
    prompts = [p.prompt for p in world.problems] * (1 + config.trl_steps)
    lengths: list[int] = []

    def random_reward(completions, completion_ids, **_) -> list[float]:
        lengths.extend(map(len, completion_ids))  # the report shows they all reach the cap, as ours do
        return [random.random() for _ in completions]

    lora = None if cell.rank is None else peft.LoraConfig(r=cell.rank, lora_alpha=cell.lora_alpha,
                                                          target_modules="all-linear")
    trainer = trl.GRPOTrainer(
        model=str(folder), reward_funcs=random_reward, args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}), processing_class=world.tokenizer,
        peft_config=lora,
    )
    trainer.remove_callback(transformers.PrinterCallback)
    timer = StepTimer(time.perf_counter, config.device)  # wall seconds
    trainer.add_callback(timer)
    trainer.train()
    del trainer
    free_memory(config.device)
    timed = timer.seconds[1:] if config.trl_steps else timer.seconds
    return {"wall_seconds": timed, "first_step_only": not config.trl_steps, "completion_lengths": sorted(set(lengths))}


# ------------------------------------------------------------------------------------ the report


def projected_gpu_hours(report: dict[str, Any], profile_name: str) -> dict[str, float]:
    """GPU-hours of the profile's training steps at the measured median step times (evaluations excluded).

    Each LoRA rank is charged the step of the nearest timed rank (timing ranks 1 and 256 charges 4-64 as rank 1):
    below d/8 an adapter's own cost is small beside the frozen base's.
    """
    profile = load_profile(find_profile(profile_name))
    timed = {name: arm for name, arm in report["ours"].items() if "error" not in arm}
    hours: dict[str, float] = {}
    for cell in profile.cells():
        arm = _closest_arm(cell.rank, timed)
        if arm is None or cell.regime not in timed[arm]:
            continue
        steps = profile.matrix.steps.get(cell.regime, profile.cell["steps"])
        seconds = timed[arm][cell.regime]["median"]["wall_seconds"] * steps
        hours[cell.regime] = hours.get(cell.regime, 0.0) + seconds / 3600
    return hours | {"total": sum(hours.values())}


def _closest_arm(rank: int | None, timed: dict[str, Any]) -> str | None:
    """The timed arm that stands for this rank: FullFT for FullFT, else the nearest timed LoRA rank."""
    if rank is None:
        return "FullFT" if "FullFT" in timed else None
    ranks = [int(name.removeprefix("LoRA r=")) for name in timed if name.startswith("LoRA r=")]
    return arm_name(min(ranks, key=lambda r: abs(r - rank))) if ranks else None


def run(config: PaperBenchConfig, workdir: Path, out: Path | None = None) -> dict[str, Any]:
    """Time each arm's step in every regime, and TRL's on that arm right after; the report is rewritten to out
    after each, so a run stopped part way keeps what it measured. An arm that fails records its error and the run
    goes on."""
    profile = load_profile(find_profile(config.profile))
    overrides = {"device": config.device, "teacher_device": config.device, "prm_device": config.device}
    if config.max_new_tokens is not None:
        overrides["max_new_tokens"] = config.max_new_tokens

    def cell_of(regime: str, rank: int | None) -> CellConfig:
        return cell_config(profile, regime, rank, config.seed, out_dir=workdir / "cells", **overrides)

    report: dict[str, Any] = {"config": dataclasses.asdict(config), "environment": environment(config.device),
                              "ours": {}, "trl": {}}
    report["probe"] = probe = probe_device(config.device, config.scale)
    write_report(report, out)
    with AnswerChecker() as checker:
        world = build_world(config, cell_of(config.regimes[0], None), checker)
        report["scorer_gib"] = world.scorer_bytes / GIB
        for rank in dict.fromkeys([*config.ranks, *config.trl_ranks]):
            if rank in config.ranks:
                report["ours"][arm_name(rank)] = attempt(
                    lambda: time_arm(world, {g: cell_of(g, rank) for g in config.regimes}, config, probe))
                write_report(report, out)
            if rank in config.trl_ranks:
                report["trl"][arm_name(rank)] = attempt(lambda: time_trl(world, cell_of("outcome", rank), config,
                                                                          workdir))
                write_report(report, out)
    report["ours_over_trl"] = speedups(report)
    report["projected_gpu_hours"] = projected_gpu_hours(report, config.profile)
    write_report(report, out)
    return report


def speedups(report: dict[str, Any]) -> dict[str, float]:
    """TRL's median step over ours, per arm timed by both (our outcome step: TRL's reward is free too)."""
    ratios = {}
    for arm, trl_arm in report["trl"].items():
        ours = report["ours"].get(arm, {})
        if "error" in trl_arm or "outcome" not in ours or not trl_arm["wall_seconds"]:
            continue
        ratios[arm] = statistics.median(trl_arm["wall_seconds"]) / ours["outcome"]["median"]["wall_seconds"]
    return ratios


def format_table(report: dict[str, Any]) -> str:
    """Seconds per phase, floor and memory per arm and regime, then TRL and the projected cost."""
    probe = report["probe"]
    lines = [f"{report['environment']['gpu'] or report['environment']['cpu']}: copy "
             f"{probe['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {probe['matmul_flops_per_s'] / 1e12:.0f} "
             f"TFLOP/s; teacher + PRM {report.get('scorer_gib', 0):.1f} GiB",
             f"{'arm':<12} {'regime':<13} {'step s':>7} {'gen':>6} {'reward':>6} {'ref':>6} {'train':>6} "
             f"{'floor s':>7} {'x floor':>7} {'peak GiB':>8} {'est GiB':>7}"]
    for arm, result in report["ours"].items():
        if "error" in result:
            lines.append(f"{arm:<12} failed: {result['error'][:200]}")
            continue
        for regime in report["config"]["regimes"]:
            m, floor = result[regime]["median"], result[regime]["floor_seconds"]["step"]
            peak = m.get("student_peak_gib")
            lines.append(f"{arm:<12} {regime:<13} {m['wall_seconds']:>7.2f} {m['generate_seconds']:>6.2f} "
                         f"{m['reward_seconds']:>6.2f} {m['reference_seconds']:>6.2f} {m['train_seconds']:>6.2f} "
                         f"{floor:>7.2f} {m['wall_seconds'] / floor:>7.1f} "
                         f"{'-' if peak is None else f'{peak:.1f}':>8} {result['estimated_student_gib']:>7.1f}")
    for arm, result in report["ours"].items():
        if "error" not in result:
            compiled = result["graphs_compiled"]
            lines.append(f"{arm} samples with {result['sampling_decoder']}; graphs torch.compile compiled: "
                         f"{compiled['warmup']} in the warmup, {compiled['timed_steps']} in the timed steps")
        lines += _decode_lines(arm, result.get("decode_profile", {}))
    for arm, result in report["trl"].items():
        shown = result["error"][:200] if "error" in result else \
            f"{statistics.median(result['wall_seconds']):.2f} s per step" if result["wall_seconds"] else "no timed step"
        lines.append(f"TRL {arm}: {shown}")
    lines += [f"TRL / ours, {arm}: {ratio:.1f}x" for arm, ratio in report.get("ours_over_trl", {}).items()]
    hours = report.get("projected_gpu_hours", {})
    if hours:
        lines.append("projected GPU-hours of the profile's training steps: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in hours.items()))
    return "\n".join(lines)


def _decode_lines(arm: str, profiled: dict[str, Any]) -> list[str]:
    """An arm's decode profile: ms per token eager and graphed, the eager one's profile, and their agreement."""
    lines = []
    for mode in ("eager", "cuda_graphs"):
        if mode not in profiled:
            continue
        d = profiled[mode]
        line = f"{arm} decode, {mode}: {d['wall_ms_per_token']:.1f} ms per token"
        if "aten_calls_per_token" in d:
            line += (f"; under the profiler {d['aten_calls_per_token']:.0f} ATen calls, {d['kernels_per_token']:.0f} "
                     f"kernels and {d['device_kernel_ms_per_token']:.2f} ms of them per token")
            line += "".join(f"\n    {k['ms_per_token']:.3f} ms, {k['calls_per_token']:.0f} calls: {k['name'][:80]}"
                            for k in d["top_kernels"])
        lines.append(line)
    if profiled:
        lines.append(f"{arm} decode, eager vs graphs: {profiled['same_tokens']:.1%} of tokens equal, log-probs "
                     f"within {profiled['max_logp_difference']:.2g} before rows diverge")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> tuple[PaperBenchConfig, Path | None]:
    """The PaperBenchConfig (defaults from the dataclass) and the JSON path from the command line."""
    defaults = PaperBenchConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default=defaults.scale, choices=sorted(SCALES))
    parser.add_argument("--device", type=parse_device, default=defaults.device)
    for name in ("steps", "trl_steps", "max_new_tokens", "prompt_tokens", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("ranks", "trl_ranks"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=parse_ranks, default=getattr(defaults, name),
                            help="comma-separated LoRA ranks, 'full' for FullFT; empty for none")
    parser.add_argument("--regimes", default=",".join(defaults.regimes))
    parser.add_argument("--profile", default=defaults.profile)
    parser.add_argument("--decoder", default=defaults.decoder, choices=DECODERS,
                        help="sampling's decode step: the study's, or levers' folded step compiled (not adopted)")
    parser.add_argument("--out", type=Path, default=None, help="write the report to this JSON file")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    args["regimes"] = tuple(args["regimes"].split(","))
    try:
        return PaperBenchConfig(**args), out
    except ValueError as error:
        parser.error(str(error))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table, write the JSON report when asked."""
    config, out = parse_args(argv)
    quiet()
    with tempfile.TemporaryDirectory() as workdir:
        report = run(config, Path(workdir), out)
    print(format_table(report))
    return report


if __name__ == "__main__":
    main()

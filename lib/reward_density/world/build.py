"""The mini world: the offline CPU stand-in for Qwen3 on MATH, built from nothing and saved like the real models.

Components and what each depends on (a component is rebuilt when its key, a hash of its own settings
and of the components it depends on, differs from the one in the manifest):

    problems -> tokenizer -> student, teacher -> prm
    control (the SFT control's facts, on their own)
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
import multiprocessing as mp
import random
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ..data.answer_check import Checker, make_checker
from ..data.problems import Problem, read_problems, write_problems
from ..data.sources import load_causal_lm, load_tokenizer
from ..experiment.evaluation import greedy_eval
from ..experiment.provenance import code_state, manifest, read_json, write_json_atomic
from ..grpo.sampler import SAMPLING_VERSION
from ..rewards.process import PRMScorer
from .architectures import ModelSpec, n_parameters, new_mistral, new_qwen3
from .control import ControlConfig, control_splits
from .multiplication import MultiplicationTask, Product
from .pretraining import SupervisedConfig, encode_pairs, pretrain
from .prm import (
    LabelledSolution,
    LabellingConfig,
    PRMTrainingConfig,
    label_steps,
    sample_solutions,
    step_accuracy,
    train_prm,
)
from .task import Expression, TaskConfig
from .tokenizers import BAD_TOKEN, GOOD_TOKEN, STEP_TAG, build_prm_tokenizer, build_student_tokenizer


class WorldBuildError(RuntimeError):
    """The world could not be built as specified (e.g. a model missed its accuracy target)."""


# The study's task: chains of 4-6 single-digit operands. The base works short chains step by
# step but, on long ones, mostly states an answer straight away, stopping after two operations: RL can
# teach it to work the long ones too, which the paper's base models show as a pass@k far above pass@1.
MINI_TASK = TaskConfig(min_digits=1, max_digits=1, min_operands=4, max_operands=6, p_direct=0.8,
                       direct_min_operands=5)


# Their own seed is replaced by the world's (the builders' replace(..., seed=config.seed)), yet sits in the keys.
SEEDED_BY_WORLD = ("student_training", "teacher_training", "prm_pretraining", "prm_training")


def _default(cls: type, name: str) -> Any:
    """The default of a dataclass field."""
    return next(f.default for f in fields(cls) if f.name == name)


@dataclass(frozen=True)
class WorldConfig:
    """Every setting of the world; presets below, overrides from the world-building notebook."""

    seed: int = 0
    task: TaskConfig | MultiplicationTask = MINI_TASK  # the chain task, or the token-selection papers' products
    control: ControlConfig = ControlConfig()  # the SFT control's skill: 196 facts of a table the base never saw
    n_train: int = 20000
    n_dev: int = 500  # selects the world's models and the learning rates; never reported
    n_heldout: int = 1000  # the study's fixed evaluation set
    vocab_size: int = 300
    student: ModelSpec = ModelSpec(hidden=128, layers=3)
    student_target: float = 0.3  # greedy dev pass@1 of the base, as Qwen3-1.7B-Base's 0.375
    student_tolerance: float = 0.15
    student_training: SupervisedConfig = SupervisedConfig(batch_size=32, max_steps=750, eval_every=250)
    selection_problems: int = 200  # the dev problems the pretraining evaluations read (stop and checkpoint choice)
    teacher: ModelSpec = ModelSpec(hidden=128, layers=4)
    teacher_min_accuracy: float = 0.85
    teacher_stop_accuracy: float = 0.95  # stop pretraining once reached; the minimum is what must hold
    teacher_training: SupervisedConfig = SupervisedConfig(batch_size=32, max_steps=1250, eval_every=125)
    prm: ModelSpec = ModelSpec(hidden=128, layers=3)
    # Math-Shepherd fine-tunes a pretrained LM (Mistral-7B); so the PRM is first pretrained on clean traces.
    prm_pretraining: SupervisedConfig = SupervisedConfig(batch_size=32, max_steps=200, eval_every=200)
    prm_vocab_size: int = 300
    prm_problems: int = 300  # training problems whose sampled solutions get step labels
    prm_heldout_fraction: float = 0.2
    labelling: LabellingConfig = LabellingConfig()
    prm_training: PRMTrainingConfig = PRMTrainingConfig(steps=300)
    eval_max_new_tokens: int = 64  # a clean trace is at most about 48 tokens (34 on average)

    def __post_init__(self) -> None:
        if not 0 <= self.student_target <= 1 or not 0 <= self.teacher_min_accuracy <= 1:
            raise ValueError("accuracy targets must lie in [0, 1]")
        if not 0 < self.prm_heldout_fraction < 1:
            raise ValueError(f"prm_heldout_fraction must be in (0, 1), got {self.prm_heldout_fraction}")
        if self.prm_problems > self.n_train:
            raise ValueError(f"prm_problems ({self.prm_problems}) exceeds n_train ({self.n_train})")
        for name in SEEDED_BY_WORLD:
            seed, default = getattr(self, name).seed, _default(type(getattr(self, name)), "seed")
            if seed != default:
                raise ValueError(
                    f"{name}.seed is {seed}, but the world trains every model with the world's seed (config.seed: "
                    f"a profile's build_world.seed, here {self.seed}): set that instead and leave {name}.seed at "
                    f"its default {default}"
                )

    @property
    def splits(self) -> dict[str, int]:
        """Split sizes, in the order they are drawn (held-out first: it never changes with n_train)."""
        return {"heldout": self.n_heldout, "dev": self.n_dev, "train": self.n_train}


PRESETS: dict[str, WorldConfig] = {
    "mini": WorldConfig(),
    # Seconds, for tests: nothing reaches a target, so no target is asked for.
    "smoke": WorldConfig(
        n_train=400,
        n_dev=16,
        n_heldout=16,
        student=ModelSpec(hidden=32, layers=1),
        student_target=0.0,
        student_tolerance=1.0,
        student_training=SupervisedConfig(batch_size=16, max_steps=20, eval_every=10),
        teacher=ModelSpec(hidden=32, layers=1),
        teacher_min_accuracy=0.0,
        teacher_stop_accuracy=1.0,
        teacher_training=SupervisedConfig(batch_size=16, max_steps=20, eval_every=10),
        prm=ModelSpec(hidden=32, layers=1),
        prm_pretraining=SupervisedConfig(batch_size=16, max_steps=10, eval_every=10),
        prm_problems=20,
        labelling=LabellingConfig(solutions_per_problem=2, rollouts_per_step=2, max_new_tokens=32),
        prm_training=PRMTrainingConfig(batch_size=8, steps=10),
        eval_max_new_tokens=16,
        control=ControlConfig(size=4),
    ),
}
# The multiplication task of the token-selection papers (world/multiplication.py): a world of its own, with its own
# tokenizer and models. Only its outcome regime is studied (params/mini_mult*.yaml), so its teacher and PRM are
# built small and not held to the mini world's accuracy minimum. The student's target is the paper's weak base
# (3.9% on its task); a first build aimed at 0.25 +- 0.2 and measured 0.015 after the same 750 steps.
PRESETS["mini_mult"] = replace(
    PRESETS["mini"], task=MultiplicationTask(), n_train=5700, n_dev=500, n_heldout=1000, student_target=0.04,
    student_tolerance=0.04, teacher_training=SupervisedConfig(batch_size=32, max_steps=300, eval_every=100),
    teacher_min_accuracy=0.0, prm_problems=100, prm_training=PRMTrainingConfig(steps=100),
)
PRESETS["smoke_mult"] = replace(PRESETS["smoke"], task=MultiplicationTask())


def _with_overrides(obj: Any, overrides: dict[str, Any], where: str) -> Any:
    """A copy of a (nested) frozen dataclass with overrides applied; unknown keys are errors that name themselves."""
    names = {f.name: f for f in fields(obj)}
    changes = {}
    for key, value in overrides.items():
        if key not in names:
            raise ValueError(f"unknown world setting {where}{key}; known: {sorted(names)}")
        current = getattr(obj, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"world setting {where}{key} must be a mapping, got {value!r}")
            value = _with_overrides(current, value, f"{where}{key}.")
        changes[key] = _of_kind(current, value, f"{where}{key}")
    return replace(obj, **changes)


# What may replace a preset's value of each type (a float setting also takes an integer), and its name.
_KINDS = {bool: ((bool,), "true or false"), int: ((int,), "an integer"), float: ((int, float), "a number"),
          str: ((str,), "a string"), tuple: ((tuple, list), "a list")}


def _of_kind(current: Any, value: Any, name: str) -> Any:
    """The value as the type the preset holds (so that 0 for 0.0 keys the same world); a ValueError unless it is of
    that kind."""
    if type(current) not in _KINDS:
        return value
    allowed, kind = _KINDS[type(current)]
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise ValueError(f"world setting {name} must be {kind}, as the preset's {current!r}; got {value!r}")
    return type(current)(value)


def world_config(size: str = "mini", **overrides: Any) -> WorldConfig:
    """A preset (mini, smoke; mini_mult, smoke_mult: the multiplication task) with overrides, e.g.
    world_config(seed=1, student={"hidden": 96})."""
    if size not in PRESETS:
        raise ValueError(f"unknown world size {size!r}; expected one of {sorted(PRESETS)}")
    return _with_overrides(PRESETS[size], overrides, "")


def config_from_parameters(size: str = "mini", seed: int = 0, student_target: float | None = None,
                           teacher_min_accuracy: float | None = None, overrides: dict | None = None) -> WorldConfig:
    """The world that notebooks/build_world.py's parameters (a profile's build_world) describe; a target left None
    is the preset's."""
    targets = {"student_target": student_target, "teacher_min_accuracy": teacher_min_accuracy}
    return world_config(size, seed=seed, **{k: v for k, v in targets.items() if v is not None}, **(overrides or {}))


BUILD_PARAMETERS = tuple(inspect.signature(config_from_parameters).parameters)  # those of a build's notebook


def config_of_build(parameters: dict[str, Any]) -> WorldConfig:
    """The world a profile's build_world section describes (its other keys, out_dir and force, are the stage's)."""
    return config_from_parameters(**{k: v for k, v in parameters.items() if k in BUILD_PARAMETERS})


# --------------------------------------------------------------------------------------- keys


def _key(*parts: Any) -> str:
    blob = json.dumps([asdict(p) if is_dataclass(p) else p for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def component_keys(config: WorldConfig) -> dict[str, str]:
    """The key of each component: its own settings plus the keys of what it is built from."""
    keys = {"problems": _key("problems", config.seed, config.task, config.splits),
            "control": _key("control", config.seed, config.control)}
    keys["tokenizer"] = _key("tokenizer", keys["problems"], config.vocab_size)
    keys["student"] = _key(
        "student", keys["tokenizer"], config.seed, config.student, config.student_target,
        config.student_training, config.eval_max_new_tokens, config.selection_problems,
    )
    keys["teacher"] = _key(
        "teacher", keys["tokenizer"], config.seed, config.teacher, config.teacher_stop_accuracy,
        config.teacher_training, config.eval_max_new_tokens, config.selection_problems,
    )
    keys["prm"] = _key(
        "prm", keys["student"], keys["teacher"], config.prm, config.prm_vocab_size, config.prm_pretraining,
        config.prm_problems, config.prm_heldout_fraction, config.labelling, config.prm_training, SAMPLING_VERSION,
    )
    return keys


# ------------------------------------------------------------------------------------ builders

COMPONENTS = ("problems", "control", "tokenizer", "student", "teacher", "prm")
# Fixed by the builders, so not in component_keys: a change to one changes a world its key still calls current.
TOKENIZER_TEXTS = 5000  # the training texts each tokenizer learns its merges from
LABEL_LINES = 1000  # lines of the PRM's step tag and labels in its tokenizer's corpus


@dataclass
class _Context:
    """What the builders share while one world is built."""

    config: WorldConfig
    out_dir: Path
    checker: Checker

    def problems(self, split: str, folder: str = "problems") -> list[Problem]:
        return read_problems(self.out_dir / folder / f"{split}.jsonl")

    @cached_property
    def expressions(self) -> dict[str, list[Expression] | list[Product]]:
        """The task's splits, drawn once per build."""
        return self.config.task.splits(self.config.splits, self.config.seed)


def _build_problems(ctx: _Context) -> dict[str, Any]:
    """problems/: the task's train, dev and heldout splits."""
    shutil.rmtree(ctx.out_dir / "problems", ignore_errors=True)
    for split, expressions in ctx.expressions.items():
        problems = [ctx.config.task.problem(e, f"{split}-{i:05d}") for i, e in enumerate(expressions)]
        write_problems(ctx.out_dir / "problems" / f"{split}.jsonl", problems,
                       [{"expression": e.text} for e in expressions])
    example = ctx.expressions["heldout"][0]
    task = ctx.config.task
    return {**ctx.config.splits, "example": task.problem(example, "").prompt + task.clean_trace(example)}


def _build_control(ctx: _Context) -> dict[str, Any]:
    """control/: the SFT control's facts (the same facts in train, dev and heldout; see control.py)."""
    shutil.rmtree(ctx.out_dir / "control", ignore_errors=True)
    splits = control_splits(ctx.config.control, ctx.config.seed)
    for split, problems in splits.items():
        write_problems(ctx.out_dir / "control" / f"{split}.jsonl", problems)
    example = splits["heldout"][0]
    return {"facts": len(splits["heldout"]), "bits": round(ctx.config.control.bits),
            "example": example.prompt + example.solution}


def _training_texts(ctx: _Context, clean: bool) -> tuple[list[str], list[str]]:
    """Prompts and traces of the training split: clean (teacher) or realistic (student)."""
    train = ctx.expressions["train"]
    rng = random.Random(ctx.config.seed)
    task = ctx.config.task
    traces = [task.clean_trace(e) if clean else task.realistic_trace(rng, e) for e in train]
    return [task.problem(e, "").prompt for e in train], traces


def _build_tokenizer(ctx: _Context) -> dict[str, Any]:
    prompts, traces = _training_texts(ctx, clean=False)
    corpus = [p + t for p, t in zip(prompts, traces)][:TOKENIZER_TEXTS]
    tokenizer = build_student_tokenizer(corpus, ctx.config.vocab_size)
    tokenizer.save_pretrained(ctx.out_dir / "tokenizer")
    return {"vocab_size": len(tokenizer)}


def _pretrain_lm(ctx: _Context, name: str, spec: ModelSpec, clean: bool, training: SupervisedConfig,
                 stop_at: float, pick: Callable[[list[tuple[float, dict]]], tuple[float, dict]]) -> dict[str, Any]:
    """Pretrain a fresh Qwen3 on the training traces until dev greedy pass@1 reaches stop_at (selection never
    looks at the held-out set the study reports on)."""
    tokenizer = load_tokenizer(ctx.out_dir / "tokenizer")
    model = new_qwen3(spec, tokenizer, ctx.config.seed)
    dev = ctx.problems("dev")[: ctx.config.selection_problems]
    snapshots: list[tuple[float, dict]] = []  # the last two evaluations: (accuracy, weights)

    def evaluate(m: torch.nn.Module) -> float:
        accuracy, _ = greedy_eval(m, tokenizer, dev, ctx.checker, ctx.config.eval_max_new_tokens, len(dev))
        snapshots[:] = snapshots[-1:] + [(accuracy, copy.deepcopy(m.state_dict()))]
        return accuracy

    prompts, traces = _training_texts(ctx, clean)
    pairs = encode_pairs(tokenizer, prompts, traces)
    history = pretrain(model, pairs, tokenizer.pad_token_id, replace(training, seed=ctx.config.seed), evaluate,
                       stop=lambda evals: evals[-1][1] >= stop_at, desc=f"pretrain {name}")
    accuracy, weights = pick(snapshots)
    model.load_state_dict(weights)
    model.save_pretrained(ctx.out_dir / name)
    tokenizer.save_pretrained(ctx.out_dir / name)
    return {
        "accuracy": accuracy,
        "parameters": n_parameters(model),
        "hidden": spec.hidden,
        "layers": spec.layers,
        "pretrain_steps": history[-1][0],
        "curve": [{"step": s, "loss": loss, "accuracy": a} for s, loss, a in history],
    }


def _missed_threshold(name: str, accuracy: float, config: WorldConfig) -> str | None:
    """How a student's or teacher's dev accuracy misses its acceptance threshold, or None when it meets it."""
    if name == "student" and abs(accuracy - config.student_target) > config.student_tolerance:
        return f"not within {config.student_tolerance} of its target {config.student_target}"
    if name == "teacher" and accuracy < config.teacher_min_accuracy:
        return f"below its minimum {config.teacher_min_accuracy}"
    return None


def _check_recorded_accuracies(config: WorldConfig, components: dict[str, dict]) -> None:
    """Hold the student and teacher the manifest records to today's thresholds, which no key holds."""
    for name in ("student", "teacher"):
        if name in components and (missed := _missed_threshold(name, components[name]["accuracy"], config)):
            setting = "student_tolerance" if name == "student" else "teacher_min_accuracy"
            raise WorldBuildError(
                f"the world's {name} was built with dev greedy pass@1 {components[name]['accuracy']:.3f}, {missed}: "
                f"{setting} is in no component key, so a stricter one does not rebuild the {name}; loosen it, or "
                f"change the {name}'s training or size to rebuild it"
            )


def _build_student(ctx: _Context) -> dict[str, Any]:
    """The base: trained for student_training.max_steps on the realistic traces, the last weights kept."""
    c = ctx.config
    info = _pretrain_lm(ctx, "student", c.student, False, c.student_training, stop_at=math.inf,
                        pick=lambda snaps: snaps[-1])
    if missed := _missed_threshold("student", info["accuracy"], c):
        raise WorldBuildError(
            f"the student's dev greedy pass@1 is {info['accuracy']:.3f} after {info['pretrain_steps']} steps, "
            f"{missed}: change student_training.max_steps or the task's p_direct"
        )
    return info


def _build_teacher(ctx: _Context) -> dict[str, Any]:
    """The teacher: trained on the clean traces until teacher_stop_accuracy or its last step, the better of its
    last two evaluations kept (not its best overall: the built worlds chose so, and no key records the choice)."""
    c = ctx.config
    info = _pretrain_lm(ctx, "teacher", c.teacher, True, c.teacher_training, c.teacher_stop_accuracy,
                        pick=lambda snaps: max(snaps, key=lambda s: s[0]))
    if missed := _missed_threshold("teacher", info["accuracy"], c):
        raise WorldBuildError(
            f"teacher reached greedy pass@1 {info['accuracy']:.3f} after {info['pretrain_steps']} steps, "
            f"{missed}: raise teacher_training.max_steps or the teacher size"
        )
    return info


def _write_labelled(path: Path, data: list[LabelledSolution]) -> None:
    with open(path, "w") as handle:
        for item in data:
            handle.write(json.dumps(asdict(item)) + "\n")


def _build_prm(ctx: _Context) -> dict[str, Any]:
    c = ctx.config
    tokenizer = load_tokenizer(ctx.out_dir / "student")
    student = load_causal_lm(ctx.out_dir / "student", what="student")
    teacher = load_causal_lm(ctx.out_dir / "teacher", what="teacher")
    problems = ctx.problems("train")[: c.prm_problems]
    solutions = sample_solutions(student, tokenizer, problems, c.labelling, c.seed)
    # The completer is the teacher: rollouts from a correct prefix then mostly succeed (Math-Shepherd's
    # completer is a strong fine-tuned generator for the same reason).
    labelled = label_steps(teacher, tokenizer, solutions, ctx.checker, c.labelling, c.seed)
    n_heldout = max(1, round(len(problems) * c.prm_heldout_fraction))
    heldout_ids = {p.problem_id for p in problems[-n_heldout:]}  # split by problem, never by step
    train = [s for s in labelled if s.problem_id not in heldout_ids]
    heldout = [s for s in labelled if s.problem_id in heldout_ids]

    # The backbone first learns clean traces in the PRM's own input format (question, tagged steps).
    prompts, traces = _training_texts(ctx, clean=True)
    texts = [f"{q} " + "\n".join(line + STEP_TAG for line in t.split("\n")) for q, t in zip(prompts, traces)]
    noisy = [s.question + "\n".join(s.steps) for s in labelled]
    # The +/- label tokens stand alone after a tag; the corpus must hold them so, or they never become one token.
    labels = [f"{STEP_TAG} {GOOD_TOKEN} {BAD_TOKEN}"] * LABEL_LINES
    prm_tokenizer = build_prm_tokenizer(texts[:TOKENIZER_TEXTS] + noisy + labels, c.prm_vocab_size)
    backbone = new_mistral(c.prm, prm_tokenizer, c.seed)
    pretrain(backbone, encode_pairs(prm_tokenizer, [""] * len(texts), texts), prm_tokenizer.pad_token_id,
             replace(c.prm_pretraining, seed=c.seed), desc="pretrain PRM backbone")
    scorer = PRMScorer(backbone, prm_tokenizer, STEP_TAG, GOOD_TOKEN, BAD_TOKEN)
    losses = train_prm(scorer, train, replace(c.prm_training, seed=c.seed))
    folder = ctx.out_dir / "prm"
    scorer.model.save_pretrained(folder)
    prm_tokenizer.save_pretrained(folder)
    _write_labelled(folder / "labelled_steps.jsonl", labelled)
    return {
        "parameters": n_parameters(scorer.model),
        "hidden": c.prm.hidden,
        "layers": c.prm.layers,
        "step_tag": STEP_TAG,
        "labelled_solutions": {"train": len(train), "heldout": len(heldout)},
        "heldout": step_accuracy(scorer, heldout),
        "train": step_accuracy(scorer, train),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
    }


BUILDERS: dict[str, Callable[[_Context], dict[str, Any]]] = {
    "problems": _build_problems,
    "control": _build_control,
    "tokenizer": _build_tokenizer,
    "student": _build_student,
    "teacher": _build_teacher,
    "prm": _build_prm,
}


def read_manifest(out_dir: Path) -> dict[str, Any]:
    """The world's manifest, or an empty one when none was written yet."""
    path = Path(out_dir) / "manifest.json"
    return read_json(path) if path.exists() else {}


def stale_components(config: WorldConfig, out_dir: Path) -> list[str]:
    """Components missing on disk or built with other settings (their key differs)."""
    built = read_manifest(out_dir).get("components", {})
    keys = component_keys(config)
    return [n for n in COMPONENTS if built.get(n, {}).get("key") != keys[n] or not (Path(out_dir) / n).is_dir()]


def changed_build_settings(config: WorldConfig, out_dir: Path) -> dict[str, tuple[Any, Any]]:
    """The settings (dotted) the world in out_dir was built with that config gives otherwise: {name: (then, now)}."""
    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
        return {prefix[:-1]: value}

    then = flat(read_manifest(out_dir).get("config", {}))
    now = flat(json.loads(json.dumps(asdict(config))))  # tuples as the manifest's JSON lists
    return {name: (then.get(name), value) for name, value in now.items() if then and then.get(name) != value}


# Built in this order; the components of one stage are independent and built side by side.
STAGES = (("problems", "control"), ("tokenizer",), ("student", "teacher"), ("prm",))
IN_PROCESS = ("problems", "control", "tokenizer")  # no model arithmetic: cheap, and the same wherever they run
WORKER_THREADS = 1  # torch threads of the process that builds a model component


def _build_in_worker(name: str, config: WorldConfig, out_dir: Path) -> tuple[dict[str, Any], float]:
    """Build one component in a process of its own with one torch thread, so that a world's bits do not
    depend on how many cores the machine has or on what was built beside it."""
    torch.set_num_threads(WORKER_THREADS)
    start = time.perf_counter()
    with make_checker(config.task.answer_format) as checker:
        info = BUILDERS[name](_Context(config, out_dir, checker))
    return info, time.perf_counter() - start


def _build_stage(names: list[str], config: WorldConfig, out_dir: Path) -> tuple[dict[str, tuple[dict, float]], list]:
    """Build the named components of one stage, model components in parallel worker processes: what was
    built, and the errors of what failed (a failure does not discard its neighbour's work)."""
    results, errors = {}, []
    for name in [n for n in names if n in IN_PROCESS]:
        start = time.perf_counter()
        with make_checker(config.task.answer_format) as checker:
            results[name] = BUILDERS[name](_Context(config, out_dir, checker)), time.perf_counter() - start
    workers = [n for n in names if n not in IN_PROCESS]
    if workers:
        with ProcessPoolExecutor(len(workers), mp_context=mp.get_context("spawn")) as pool:
            futures = {name: pool.submit(_build_in_worker, name, config, out_dir) for name in workers}
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except Exception as error:  # reported after the others are recorded
                    errors.append(error)
    return results, errors


def build_world(config: WorldConfig, out_dir: Path, force: bool = False, log: Callable[[str], None] = print) -> dict:
    """Build what is missing or stale, skip what exists with the same settings (once its recorded accuracy meets
    today's thresholds); returns the manifest.

    The manifest is rewritten after every stage, so a failure keeps everything built before it; a component is
    dropped from it before its folder is replaced, so the manifest never describes a folder it does not hold.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = COMPONENTS if force else stale_components(config, out_dir)
    keys, code = component_keys(config), code_state()  # the code this build started with, as a cell's
    components = {n: v for n, v in read_manifest(out_dir).get("components", {}).items() if n in COMPONENTS}
    _check_recorded_accuracies(config, {n: v for n, v in components.items() if n not in todo})
    for stage in STAGES:
        names = [n for n in stage if n in todo]
        for name in stage:
            if name not in todo:
                log(f"[world] {name}: up to date")
        if names:
            # Out of the manifest before the folders change: a failed build must not leave its rejected model
            # under the old key (which a return to the old settings would call up to date).
            for name in names:
                components.pop(name, None)
            _write_manifest(config, components, out_dir, code)
            for name in names:
                shutil.rmtree(out_dir / name, ignore_errors=True)
        built, errors = _build_stage(names, config, out_dir)
        for name, (info, seconds) in built.items():
            # Each component's own code and threads: a later partial rebuild rewrites the manifest's top-level
            # record, which then describes the last build, not the components it left alone.
            threads = torch.get_num_threads() if name in IN_PROCESS else WORKER_THREADS
            components[name] = {"key": keys[name], "seconds": round(seconds, 1), "git": code["git"],
                                "threads": threads, **info}
            log(f"[world] {name}: built in {components[name]['seconds']} s")
        if built:
            _write_manifest(config, components, out_dir, code)
        if errors:
            raise errors[0]
    return read_manifest(out_dir)


def _write_manifest(config: WorldConfig, components: dict[str, dict], out_dir: Path, code: dict[str, Any]) -> None:
    """manifest.json: the settings, and the components the folder holds as built."""
    write_json_atomic(out_dir / "manifest.json", manifest(code=code, config=asdict(config), components=components))

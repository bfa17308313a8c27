"""The schema of a cell: every parameter of one training run, written once.

`CellConfig` holds each parameter's name, type, default, meaning and check. Everything else derives
from it: the profile validator checks a profile's `cell:` section against the fields of section "cell"
and fills in their defaults (profiles.py); the training notebook's parameters cell is rendered from it
(`parameters_cell`; a test fails when the two drift); the runner and the notebook both build a cell's
config through `profiles.cell_config`.

Defaults are the paper's Table 1 on a CPU; profiles override what their world changes.
"""
from __future__ import annotations

import re
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..data.answer_check import ANSWER_FORMATS
from ..grpo.advantages import ADVANTAGE_ESTIMATORS
from ..grpo.loss import KL_ESTIMATORS, NORMALISATIONS
from ..grpo.precision import PRECISIONS
from ..rewards import DENSITY, REGIMES, REWARD_MODELS
from .checks import (
    Checker,
    InvalidValue,
    any_number,
    boolean,
    dropout_number,
    int_at_least_two,
    non_empty_string,
    non_negative_int,
    non_negative_number,
    one_of,
    optional,
    positive_int,
    positive_number,
    probability,
    prompt_template,
    seed_number,
    string_list,
    top_p_number,
    torch_device,
)

FULL = "full"  # full fine-tuning's rank, as profiles, notebooks and cell names write it
SFT = "sft"  # the positive control: supervised steps on a skill the base lacks, beside the three RL regimes
REGIME_CHOICES = (*REGIMES, SFT)
ENGINES = ("peft", "stacked")
LR_SCHEDULES = ("constant", "linear")
REPORTERS = ("none", "tensorboard")
SECTIONS = ("matrix", "cell", "world", "data", "run")  # where a setting's value comes from


def setting(default: Any = MISSING, *, check: Checker, doc: str, section: str = "cell") -> Any:
    """A CellConfig field: its default (none: required), its check, a one-line doc and its profile section."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}; expected one of {SECTIONS}")
    return field(default=default, metadata={"check": check, "doc": doc, "section": section})


def rank_label(rank: int | None) -> int | str:
    """How a rank is written outside the code: the integer, or "full" for full fine-tuning (None)."""
    return FULL if rank is None else rank


def parse_rank(value: Any) -> int | None:
    """A rank from a profile or notebook: a positive integer, or "full" (None: full fine-tuning)."""
    if value == FULL or value is None:
        return None
    try:
        return positive_int(value)
    except InvalidValue:
        raise ValueError(f"rank must be a positive integer or {FULL!r}, got {value!r}") from None


def cell_name(regime: str, rank: int | None, seed: int, learning_rate: float | None = None) -> str:
    """A cell's folder name, e.g. outcome-r4-s0 or process-rfull-s2; a learning-rate sweep tags the rate in."""
    rate = "" if learning_rate is None else f"-lr{learning_rate:g}"
    return f"{regime}-r{rank_label(rank)}{rate}-s{seed}"


# regime, rank, an optional sweep rate (as `:g` writes it, 3e-05 included), seed
CELL_NAME = re.compile(
    rf"(?P<regime>.+?)-r(?P<rank>{FULL}|[1-9][0-9]*)(?:-lr[0-9.]+(?:e[+-][0-9]+)?)?-s(?P<seed>[0-9]+)")


def parse_cell_name(name: str) -> tuple[str, int | None, int] | None:
    """(regime, rank, seed) from a cell name (a sweep's rate tag is skipped), or None when it is not one."""
    match = CELL_NAME.fullmatch(name)
    if match is None:
        return None
    rank = match["rank"] if match["rank"] == FULL else int(match["rank"])
    return match["regime"], parse_rank(rank), int(match["seed"])


@dataclass(frozen=True, kw_only=True)
class CellConfig:
    """Every parameter of one cell of the matrix (see the module docstring)."""

    # The arm, from the profile's matrix.
    regime: str = setting(check=one_of(*REGIME_CHOICES), section="matrix",
                          doc="the reward: " + " | ".join(f"{r} ({DENSITY[r]})" for r in REGIMES)
                          + "; or sft, the control")
    rank: int | None = setting(check=optional(positive_int), section="matrix",
                               doc="LoRA rank; None is full fine-tuning (written 'full')")
    seed: int = setting(check=seed_number, section="matrix",
                        doc="seeds the adapter initialisation, the problem order and the sampling")
    learning_rate: float = setting(check=positive_number, section="matrix",
                                   doc="AdamW learning rate (matrix.learning_rate of the arm; a list: one per rank)")

    # GRPO (paper Table 1).
    steps: int = setting(100, check=positive_int, doc="GRPO steps")
    prompts_per_step: int = setting(4, check=positive_int, doc="P, problems per step")
    group_size: int = setting(4, check=int_at_least_two, doc="G, samples per problem")
    temperature: float = setting(0.7, check=positive_number,
                                 doc="sampling temperature; log-probs are taken at it too")
    top_p: float = setting(0.95, check=top_p_number, doc="nucleus sampling mass")
    max_new_tokens: int = setting(1536, check=positive_int, doc="completion cap while training")
    beta: float = setting(0.05, check=non_negative_number,
                          doc="KL penalty weight; 0 with track_kl off skips the reference pass")
    track_kl: bool = setting(True, check=boolean,
                             doc="record the KL to the reference every step, also at beta 0 (runs the reference pass)")
    kl_estimator: str = setting("paper", check=one_of(*KL_ESTIMATORS), doc="paper (Eq. 5) | k3 | k1")
    loss_normalisation: str = setting("token_mean", check=one_of(*NORMALISATIONS),
                                      doc="token_mean (paper) | sequence_mean (GRPO) | constant (Dr. GRPO)")
    advantage_eps: float = setting(1e-4, check=positive_number, doc="added to the group std (Eq. 3)")
    max_grad_norm: float = setting(1.0, check=positive_number, doc="gradient-norm clip")
    weight_decay: float = setting(0.0, check=non_negative_number, doc="AdamW weight decay")
    lr_schedule: str = setting("constant", check=one_of(*LR_SCHEDULES),
                               doc="constant (paper) | linear (TRL's): to 1/steps of it at the last step")
    lora_alpha: float = setting(32, check=positive_number, doc="LoRA alpha, whatever the rank")
    lora_dropout: float = setting(0.0, check=dropout_number, doc="LoRA dropout")
    sft_batch_size: int | None = setting(None, check=optional(positive_int),
                                         doc="solutions per step of the SFT control (unset: P x G)")

    # The token-selection papers' variants of the step (grpo/token_selection.py, grpo/prefix_trie.py).
    advantage_estimator: str = setting("group", check=one_of(*ADVANTAGE_ESTIMATORS),
                                       doc="group: GRPO's (Eq. 3-4) | prefix_trie: T-SPMO's A(v|p) over each "
                                           "group's prefix trie, once per unique (prefix, token)")
    token_alpha: int | None = setting(None, check=optional(non_negative_int),
                                      doc="S-GRPO: the first this many tokens always enter the loss (set with "
                                          "token_k and token_p; unset: every token, GRPO)")
    token_k: int | None = setting(None, check=optional(positive_int),
                                  doc="S-GRPO: at most this many tokens in the loss")
    token_p: float | None = setting(None, check=optional(probability),
                                    doc="S-GRPO: each later token enters with this probability while there is room")
    l2: float = setting(0.0, check=non_negative_number,
                        doc="T-SPMO's penalty lambda * sum ||W||^2 on the LoRA weights (none on FullFT)")
    replay_successes: int = setting(0, check=non_negative_int,
                                    doc="T-SPMO's replay: stored successes restarted per step (engine peft)")
    replay_failures: int = setting(0, check=non_negative_int,
                                   doc="T-SPMO's replay: stored failures restarted per step (engine peft)")
    replay_threshold: float = setting(1.0, check=any_number,
                                      doc="T-SPMO's replay: a completion with at least this reward is a success")

    # Evaluation: greedy pass@1 on a fixed held-out set.
    answer_format: str = setting("boxed", check=one_of(*ANSWER_FORMATS),
                                 doc="how an answer is read: boxed (math-verify on the \\boxed{} answer) | "
                                     "last_integer (the completion's last integer: the multiplication task)")
    eval_every: int = setting(10, check=positive_int, doc="evaluate every this many steps (and at 0 and the end)")
    eval_problems: int = setting(100, check=positive_int,
                                 doc="the first this many held-out problems (the SFT control: all its facts)")
    curve_problems: int | None = setting(None, check=optional(positive_int),
                                         doc="the first this many of them, scored at every evaluation: the learning "
                                             "curve (none: all)")
    eval_split: str = setting("heldout", check=one_of("heldout", "dev"),
                              doc="the mini world's split evaluated: heldout (the study) | dev (choosing settings)")
    dev_problems: int | None = setting(None, check=optional(positive_int),
                                       doc="also score the first this many dev problems at every evaluation after step "
                                           "0, to choose each arm's step on dev (analysis: stopping.py; none: no dev)")
    eval_max_new_tokens: int = setting(1536, check=positive_int, doc="completion cap while evaluating")
    eval_batch_size: int = setting(50, check=positive_int, doc="held-out problems per greedy batch")
    logged_completions: int = setting(16, check=non_negative_int,
                                      doc="greedy completions of the first this many held-out problems kept at every "
                                          "evaluation (completions.jsonl)")

    # What a running cell shows while it trains.
    report_to: str = setting("none", check=one_of(*REPORTERS),
                             doc="none | tensorboard: per-step metrics as event files in the cell folder, live "
                                 "(tensorboard --logdir outputs/<profile>/cells)")

    # Execution.
    engine: str = setting("peft", check=one_of(*ENGINES),
                          doc="peft: one cell per process, any model | stacked: a regime and seed's arms in one "
                              "batched pass (Qwen3, fp32)")
    device: str = setting("cpu", check=torch_device, doc="the student's device (policy and reference)")
    teacher_device: str = setting("cpu", check=torch_device, doc="the distillation teacher's device")
    prm_device: str = setting("cpu", check=torch_device, doc="the process reward model's device")
    precision: str = setting("fp32", check=one_of(*PRECISIONS),
                             doc="fp32 | bf16 (autocast; trained weights stay fp32)")
    micro_batch_size: int | None = setting(None, check=optional(positive_int),
                                           doc="rows per forward/backward pass (unset: the whole batch)")
    gradient_checkpointing: bool = setting(False, check=boolean, doc="recompute activations in the backward")

    # The world, from the profile's world section: a local path or a hub id each.
    student: str = setting(check=non_empty_string, section="world", doc="the policy's base model")
    teacher: str = setting(check=non_empty_string, section="world", doc="the distillation teacher")
    prm: str = setting(check=non_empty_string, section="world", doc="the process reward model")
    problems: str = setting(check=non_empty_string, section="world", doc="the training problems")
    control: str | None = setting(None, check=optional(non_empty_string), section="world",
                                  doc="the SFT control's problems (train.jsonl, heldout.jsonl with solutions)")
    heldout: str | None = setting(None, check=optional(non_empty_string), section="world",
                                  doc="held-out set (unset: problems/<eval_split>.jsonl; MATH schema: its test split)")

    # How MATH-schema datasets become prompts, from the profile's data section (the paper world).
    prompt_template: str | None = setting(None, check=optional(prompt_template), section="data",
                                          doc="the prompt around each problem (unset: the mini world's own files)")
    problem_subsets: list[str] | None = setting(None, check=optional(string_list), section="data",
                                                doc="dataset configs of `problems` to read (unset: the default one)")

    # Where the run writes, set by whoever runs the cell.
    out_dir: str = setting(check=non_empty_string, section="run", doc="the cell folder")
    profile: str = setting("custom", check=non_empty_string, section="run", doc="the profile's name")
    base_answers: str | None = setting(
        None, check=optional(non_empty_string), section="run",
        doc="a folder of base evaluations computed once per world (unset: the cell's own)")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            try:
                f.metadata["check"](value)
            except InvalidValue as exc:
                raise ValueError(f"cell setting {f.name} = {value!r}: expected {exc}") from None
        rule = {"token_alpha": self.token_alpha, "token_k": self.token_k, "token_p": self.token_p}
        if None in rule.values() and any(v is not None for v in rule.values()):
            missing = sorted(k for k, v in rule.items() if v is None)
            raise ValueError(f"S-GRPO's token rule needs token_alpha, token_k and token_p together; {missing} unset")
        if self.heldout is not None and self.eval_split == "dev":
            raise ValueError("eval_split dev reads the mini world's dev.jsonl; with world.heldout set the cell would "
                             "evaluate on that held-out set instead: unset one of them")
        if self.prompt_template is not None and (self.eval_split == "dev" or self.dev_problems is not None):
            raise ValueError("eval_split dev and dev_problems read a mini-world folder's dev.jsonl; MATH-schema data "
                             "(data.prompt_template set) has no dev split, so the cell would score its test split: "
                             "unset them")
        if self.regime == SFT and self.control is None:
            raise ValueError("regime sft trains on the SFT control's problems: set world.control")
        rl_only = {"l2": self.l2 > 0, "token_alpha": self.token_alpha is not None,
                   "replay_successes": self.replay_successes > 0, "replay_failures": self.replay_failures > 0}
        if self.regime == SFT and any(rl_only.values()):
            raise ValueError(f"regime sft takes supervised steps, which read none of the RL methods' "
                             f"{', '.join(k for k, v in rl_only.items() if v)}: unset them, or leave sft out of "
                             f"the matrix")
        if self.dev_problems is not None and self.eval_split == "dev":
            raise ValueError("dev_problems scores the dev split beside the held-out one; with eval_split dev every "
                             "evaluation is on dev already")
        if self.curve_problems is not None and self.curve_problems > self.eval_problems:
            raise ValueError(f"curve_problems = {self.curve_problems} exceeds eval_problems = {self.eval_problems}: "
                             "the curve scores the first curve_problems of the problems evaluated")
        if self.regime == "process" and (self.replay_successes or self.replay_failures):
            raise ValueError("replay restarts completions inside their steps, which the process reward cannot score: "
                             "set replay_successes and replay_failures to 0, or choose another regime")
        if self.engine == "stacked":
            self._check_stackable()

    def _check_stackable(self) -> None:
        """The stacked engine's arms run in fp32 without LoRA dropout or checkpointing, and share their prompts."""
        unsupported = {"precision": self.precision != "fp32", "lora_dropout": self.lora_dropout > 0,
                       "gradient_checkpointing": self.gradient_checkpointing,
                       "replay_successes": self.replay_successes > 0, "replay_failures": self.replay_failures > 0}
        found = [name for name, bad in unsupported.items() if bad]
        if found:
            raise ValueError(f"engine stacked trains its arms in fp32, without LoRA dropout or gradient checkpointing, "
                             f"and cannot replay (T-SPMO's replay restarts each arm from its own completions, where "
                             f"stacked arms share their prompts): set engine: peft, or change {', '.join(found)}")
        if self.device != "cpu":
            raise ValueError(f"engine stacked runs on the CPU only (its packed scoring pass has not been run on "
                             f"{self.device!r}): set engine: peft, or device: cpu")

    @classmethod
    def settings(cls, *sections: str) -> list[Field]:
        """The fields of the given sections (all when none is given), in declaration order."""
        return [f for f in fields(cls) if not sections or f.metadata["section"] in sections]

    @property
    def name(self) -> str:
        """The cell's name: its folder's."""
        return Path(self.out_dir).name

    def to_parameters(self) -> dict[str, Any]:
        """The values as a notebook receives them (rank written 'full' for full fine-tuning)."""
        return asdict(self) | {"rank": rank_label(self.rank)}

    @classmethod
    def from_parameters(cls, values: dict[str, Any]) -> CellConfig:
        """The config to_parameters() wrote (a cell's params.json; keys the schema does not know are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known} | {"rank": parse_rank(values["rank"])})

    @property
    def student_precision(self) -> str:
        """How the cell holds the student: FullFT keeps fp32 master weights (and the stacked engine runs fp32), a
        peft LoRA arm stores it frozen in the cell's precision."""
        return "fp32" if self.rank is None or self.engine == "stacked" else self.precision

    @property
    def problems_per_step(self) -> int:
        """The problems a training step draws: P prompts, each sampled G times, or the SFT control's solutions
        (sft_batch_size, else P x G)."""
        if self.regime == SFT:
            return self.sft_batch_size or self.prompts_per_step * self.group_size
        return self.prompts_per_step

    @property
    def world_inputs(self) -> dict[str, str]:
        """The world entries the cell reads, by name: the student, its problems (the SFT control: its own), and
        the model its regime's reward reads."""
        names = ("student", "control") if self.regime == SFT else \
            ("student", "problems", "heldout", *REWARD_MODELS.get(self.regime, ()))
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    @property
    def heldout_file(self) -> Path:
        """What the cell is evaluated on: a mini-world folder's split file (the SFT control: its own facts), the
        held-out dataset, or, for a MATH-schema training dataset without one, that dataset (its test split)."""
        if self.regime == SFT:
            return Path(self.control) / f"{self.eval_split}.jsonl"
        if self.heldout:
            return Path(self.heldout)
        folder = Path(self.problems)
        return folder if self.prompt_template is not None else folder / f"{self.eval_split}.jsonl"


# ------------------------------------------------------------------------------ the notebook's parameters

# The notebook's own defaults for the parameters that pick the cell: a smoke cell runs in seconds.
NOTEBOOK_CELL = {"profile": "smoke", "regime": "outcome", "rank": 1, "seed": 0, "cells_dir": None}
_NOTEBOOK_CELL_LINES = {
    "profile": 'profile: str = "smoke"  # a profile name (params/<name>.yaml) or the path of a profile file',
    "regime": 'regime: str = "outcome"  # the reward: outcome | process | distillation; or sft, the control',
    "rank": 'rank: Union[int, str, list] = 1  # LoRA rank, "full", or a list trained stacked (papermill: '
            "-y 'rank: [1, 2]')",
    "seed": "seed: int = 0  # seeds the adapter initialisation, the problem order and the sampling",
    "cells_dir": "cells_dir: Optional[str] = None  # where each cell's folder goes; None: outputs/<profile>/cells",
}
_NONE_MEANS = {"learning_rate": "the profile's rate for each arm"}
_NOTEBOOK_TYPES = {"learning_rate": "Union[float, list]"}  # a group's arms may each have their own


def _optional_annotation(annotation: str) -> str:
    """'int' -> 'Optional[int]', 'list[str] | None' -> 'Optional[list[str]]' (papermill reads typing names)."""
    inner = annotation.removesuffix(" | None")
    return f"Optional[{inner}]"


def notebook_settings() -> list[Field]:
    """The settings a notebook may override: every field but those that pick the cell and say where it goes."""
    return [f for f in CellConfig.settings() if f.name not in NOTEBOOK_CELL and f.name not in ("profile", "out_dir")]


def parameters_cell() -> str:
    """The source of the training notebook's parameters cell, rendered from CellConfig."""
    lines = [
        "from typing import Optional, Union  # the annotations below are what `papermill --help-notebook` shows",
        "",
        *(_NOTEBOOK_CELL_LINES[name] for name in NOTEBOOK_CELL),
        "# Every setting below left at None takes the profile's value, or the schema default in [brackets]",
        "# (reward_density.experiment.config.CellConfig).",
    ]
    for f in notebook_settings():
        if f.name in _NONE_MEANS:
            meaning = f"; None: {_NONE_MEANS[f.name]}"
        elif f.default is MISSING:
            meaning = f"; None: the profile's {f.metadata['section']}.{f.name}"
        else:
            meaning = f" [{f.default!r}]"
        annotation = _optional_annotation(_NOTEBOOK_TYPES.get(f.name, f.type))
        lines.append(f"{f.name}: {annotation} = None  # {f.metadata['doc']}{meaning}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(parameters_cell())

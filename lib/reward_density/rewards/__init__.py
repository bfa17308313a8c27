"""The three reward modules; each turns a Rollout into Deposits. The reward is chosen here, by regime; the loss and
the advantages never see the regime, only deposits and masks."""
from __future__ import annotations

from ..grpo.deposits import RewardModule
from .distillation import DistillationReward
from .outcome import OutcomeReward
from .process import PRMScorer, ProcessReward

REGIMES = ("outcome", "process", "distillation")
# The study's axis: how many deposits a completion gets, one, one per step or one per token; sparsest first.
DENSITIES = ("O(1)", "O(S)", "O(N)")
DENSITY = {"outcome": "O(1)", "process": "O(S)", "distillation": "O(N)"}
REWARD_MODELS = {"process": ("prm",), "distillation": ("teacher",)}  # the world's models a regime's reward reads


def check_regime(regime: str) -> str:
    """The regime name, or a ValueError listing the known ones."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    return regime


def build_reward(regime: str, **parts) -> RewardModule:
    """The reward module of a regime from the parts it needs.

    outcome: checker (make_checker's); process: prm_model, prm_tokenizer, student_tokenizer
    (optionally prm_max_length); distillation: teacher, temperature. Optionally micro_batch_size, the
    rows per teacher or PRM forward pass.
    """
    needs = {
        "outcome": ("checker",),
        "process": ("prm_model", "prm_tokenizer", "student_tokenizer"),
        "distillation": ("teacher", "temperature"),
    }[check_regime(regime)]
    missing = [name for name in needs if parts.get(name) is None]
    if missing:
        raise ValueError(f"the {regime} reward needs {missing}")
    if regime == "outcome":
        return OutcomeReward(parts["checker"])
    if regime == "process":
        batch = {"batch_size": parts["micro_batch_size"]} if parts.get("micro_batch_size") else {}
        scorer = PRMScorer(parts["prm_model"], parts["prm_tokenizer"], max_length=parts.get("prm_max_length"), **batch)
        return ProcessReward(scorer, parts["student_tokenizer"])
    return DistillationReward(parts["teacher"], parts["temperature"], parts.get("micro_batch_size"))

"""The trained policy: a LoRA adapter (reference = adapter disabled) or full fine-tuning."""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model

from .logprobs import completion_logprobs
from .rollout import Rollout


@dataclass(frozen=True)
class PolicyConfig:
    """rank=None means full fine-tuning; otherwise a LoRA adapter of that rank (paper Table 1)."""

    rank: int | None
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"

    def __post_init__(self) -> None:
        rank = self.rank
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ValueError(f"LoRA rank must be a positive integer (or None for full fine-tuning), got {rank!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")

    @property
    def is_lora(self) -> bool:
        return self.rank is not None


class Policy:
    """The model being trained and how to get its reference log-probs."""

    def __init__(self, base_model: torch.nn.Module, config: PolicyConfig, keep_reference: bool):
        self.config = config
        if config.is_lora:
            lora = LoraConfig(
                r=config.rank,
                lora_alpha=config.alpha,
                lora_dropout=config.dropout,
                target_modules=list(config.target_modules)
                if isinstance(config.target_modules, tuple)
                else config.target_modules,
                task_type="CAUSAL_LM",
            )
            self.model = get_peft_model(base_model, lora)
            self._reference = None
        else:
            # FullFT keeps fp32 master weights; the frozen copy exists only when the KL term needs it.
            self.model = base_model.float()
            self._reference = _frozen_copy(base_model) if keep_reference else None
        self.has_reference = config.is_lora or keep_reference

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _reference_context(self) -> contextlib.AbstractContextManager:
        """Inside it, the model to score under is the reference (LoRA: adapter disabled)."""
        if self.config.is_lora:
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout, temperature: float) -> torch.Tensor:
        """log pi_ref of the completion tokens at the sampling temperature."""
        if not self.has_reference:
            raise RuntimeError("this full fine-tuning policy was built without a reference copy (beta = 0)")
        scorer = self._reference if self._reference is not None else self.model
        with self._reference_context():
            return completion_logprobs(
                scorer, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
                temperature,
            )


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference

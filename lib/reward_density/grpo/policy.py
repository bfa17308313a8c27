"""The trained policy: a LoRA adapter (reference = adapter disabled) or full fine-tuning."""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer

from .logprobs import completion_logprobs
from .precision import check_precision, frozen_dtype, stored_in
from .rollout import Rollout


@dataclass(frozen=True)
class PolicyConfig:
    """rank=None means full fine-tuning; otherwise a LoRA adapter of that rank (paper Table 1).

    precision: "fp32", or "bf16" (frozen weights stored in bf16, trained weights fp32; see precision.py).
    gradient_checkpointing: recompute each layer's activations in the backward pass instead of keeping them.
    """

    rank: int | None
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"
    precision: str = "fp32"
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        rank = self.rank
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ValueError(f"LoRA rank must be a positive integer (or None for full fine-tuning), got {rank!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        check_precision(self.precision)

    @property
    def is_lora(self) -> bool:
        return self.rank is not None


class Policy:
    """The model being trained and how to get its reference log-probs."""

    def __init__(self, base_model: torch.nn.Module, config: PolicyConfig, keep_reference: bool):
        self.config = config
        if config.gradient_checkpointing:
            _enable_checkpointing(base_model)
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
            # The frozen base in storage precision; peft keeps the adapters fp32 (autocast_adapter_dtype).
            self.model = get_peft_model(stored_in(base_model, frozen_dtype(config.precision)), lora)
            self._reference = None
            self._lora_layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]
        else:
            # FullFT keeps fp32 master weights; the frozen copy exists only when the KL term needs it.
            self.model = base_model.float()
            reference = _frozen_copy(base_model, frozen_dtype(config.precision)) if keep_reference else None
            self._reference = reference
            self._lora_layers = []
        self.has_reference = config.is_lora or keep_reference

    n_arms = 1  # one policy; StackedPolicy holds several

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def parameters(self, arm: int = 0) -> list[torch.nn.Parameter]:
        """The trainable parameters (of its one arm: the StackedPolicy interface)."""
        if arm != 0:
            raise IndexError(f"a Policy has one arm, asked for arm {arm}")
        return self.trainable_parameters()

    def logprobs(self, rollout: Rollout, temperature: float) -> torch.Tensor:
        """log pi of the completion tokens at the temperature, with gradients (train mode)."""
        self.model.train()
        return completion_logprobs(self.model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                   rollout.completion_mask, temperature)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[torch.nn.Module]:
        """The model to sample from; an fp32 LoRA adapter is merged into the base weights meanwhile.

        Merged, each linear layer is one matmul per token instead of three in the transformers
        forward; the Qwen3 sampling decoder (qwen3.py) reads the merged weights as they are. Unmerging
        subtracts B @ A again, which leaves round-off in the frozen base, so the base weights are
        restored exactly from a copy. A bf16 base is not merged: unmerging would leave bf16 rounding in the frozen
        base. The Qwen3 decoder then folds each adapter into a bf16 copy of the weights (qwen3.effective_weight),
        where an update below bf16's resolution at the weight's size is rounded away while sampling (README,
        precision options).
        """
        layers = self._lora_layers
        if not layers or any(layer.get_base_layer().weight.dtype != torch.float32 for layer in layers):
            yield self.model
            return
        saved = [layer.get_base_layer().weight.detach().clone() for layer in layers]
        self.model.merge_adapter()
        try:
            yield self.model
        finally:
            self.model.unmerge_adapter()
            with torch.no_grad():
                for layer, weight in zip(layers, saved):
                    layer.get_base_layer().weight.copy_(weight)

    def _reference_context(self) -> contextlib.AbstractContextManager:
        """Inside it, the model to score under is the reference (LoRA: adapter disabled)."""
        if self.config.is_lora:
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout, temperature: float,
                           micro_batch_size: int | None = None) -> torch.Tensor:
        """log pi_ref of the completion tokens at the sampling temperature."""
        if not self.has_reference:
            raise RuntimeError("this full fine-tuning policy was built without a reference copy (beta = 0)")
        scorer = self._reference if self._reference is not None else self.model
        with self._reference_context():
            return completion_logprobs(
                scorer, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
                temperature, micro_batch_size,
            )


def _frozen_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    reference = stored_in(copy.deepcopy(model), dtype).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


def _enable_checkpointing(model: torch.nn.Module) -> None:
    """Activation (gradient) checkpointing of every decoder layer; it acts in train mode only, not while sampling."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()  # non-reentrant by default, so frozen inputs under LoRA still pass gradients through

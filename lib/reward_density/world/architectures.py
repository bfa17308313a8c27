"""The mini world's models: small Qwen3 decoders (student, teacher) and a Mistral one (the PRM), freshly initialised."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import MistralConfig, MistralForCausalLM, PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM


@dataclass(frozen=True)
class ModelSpec:
    """Size of a small decoder (4 attention heads, 2 key-value heads, MLP 2x wide)."""

    hidden: int
    layers: int
    max_positions: int = 256

    def __post_init__(self) -> None:
        if self.hidden % 8 or self.hidden <= 0 or self.layers <= 0:
            raise ValueError(f"hidden must be a positive multiple of 8 and layers positive, got {self}")


def _decoder_settings(spec: ModelSpec, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """Config fields Qwen3 and Mistral share: size, 4 heads / 2 KV heads, MLP 2x wide, the special ids."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=2 * spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=spec.hidden // 4,
        max_position_embeddings=spec.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def new_qwen3(spec: ModelSpec, tokenizer: PreTrainedTokenizerBase, seed: int,
              tie_word_embeddings: bool = False) -> Qwen3ForCausalLM:
    """A freshly initialised Qwen3ForCausalLM of the given size for this tokenizer."""
    torch.manual_seed(seed)
    config = Qwen3Config(**_decoder_settings(spec, tokenizer), tie_word_embeddings=tie_word_embeddings)
    return Qwen3ForCausalLM(config).eval()


def new_mistral(spec: ModelSpec, tokenizer: PreTrainedTokenizerBase, seed: int) -> MistralForCausalLM:
    """A freshly initialised MistralForCausalLM (Math-Shepherd's architecture) for the PRM tokenizer."""
    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(**_decoder_settings(spec, tokenizer), sliding_window=None)).eval()


def n_parameters(model: torch.nn.Module) -> int:
    """How many parameters the model has."""
    return sum(p.numel() for p in model.parameters())

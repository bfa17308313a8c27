"""A plain Qwen3 forward with a preallocated KV cache, for sampling only.

Per generated token, transformers' forward spends more time building masks, caches and output
objects than multiplying matrices at the mini world's sizes (hidden 128), and a rollout is one
forward per token. This module does the same arithmetic as `Qwen3ForCausalLM` (the transformers
norm modules and rotary helper are reused as they are) with the weights read once per rollout: a
LoRA layer contributes W + scale * B @ A, the weight merging would give. Training and scoring keep
the transformers forward; `tests/test_qwen3_decode.py` pins the logits to it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

_LAYER_LINEARS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def effective_weight(linear: torch.nn.Module) -> torch.Tensor:
    """The weight a linear layer applies: a peft LoRA layer's base plus each active, unmerged adapter's B @ A."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight
    weight = base.weight
    if not linear.merged and not linear.disable_adapters:
        for name in linear.active_adapters:
            if name in linear.lora_A:
                weight = weight + linear.get_delta_weight(name).to(weight.dtype)
    return weight


def causal_lm_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (the model itself when unwrapped)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


class Qwen3Decoder:
    """Prefill a left-padded batch, then extend it one token at a time; each call returns the last logits."""

    def __init__(self, model: Qwen3ForCausalLM, batch_size: int, max_length: int) -> None:
        config = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm
        self.lm_head = effective_weight(model.lm_head)
        self.inv_freq = inner.rotary_emb.inv_freq
        self.layers = [
            (layer, {name: effective_weight(getattr(getattr(layer, block), name))
                     for block, names in _LAYER_LINEARS.items() for name in names})
            for layer in inner.layers
        ]
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim,
        )
        self.cache_shape = (len(self.layers), batch_size, self.kv_heads, max_length, self.head_dim)
        self.keys = self.values = None  # allocated on first use, in the dtype keys come out in (autocast)
        self.key_mask = torch.zeros(batch_size, max_length, dtype=torch.bool, device=self.embed.device)
        self.length = 0

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether the decoder reproduces the model: a Qwen3 with full attention and plain rotary embedding,
        no forward hooks (it bypasses module calls) and no dropout in force."""
        lm = causal_lm_of(model)
        if not isinstance(lm, Qwen3ForCausalLM):
            return False
        config = lm.config
        rope = getattr(config, "rope_parameters", None) or {}
        modules = list(lm.modules())
        return (
            not getattr(config, "use_sliding_window", False)
            and rope.get("rope_type", "default") == "default"
            and lm.model.rotary_emb.attention_scaling == 1.0
            and not any(m._forward_hooks or m._forward_pre_hooks for m in modules)
            and not (lm.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in modules))
        )

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompts ([B, L], left-padded) into the cache; logits of their last position, [B, V]."""
        self.key_mask[:, : input_ids.shape[1]] = attention_mask.bool()
        return self._forward(input_ids, position_ids)

    def extend(self, tokens: torch.Tensor, position_ids: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """Append one token per row ([B]); rows with attend False are padding from now on. Logits [B, V]."""
        self.key_mask[:, self.length] = attend
        return self._forward(tokens.unsqueeze(1), position_ids)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        start, new = self.length, input_ids.shape[1]
        end = start + new
        x = F.embedding(input_ids, self.embed)
        freqs = position_ids[..., None].float() * self.inv_freq.float()
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        mask = self._attention_mask(start, new)
        for index, (layer, weights) in enumerate(self.layers):
            x = x + self._attention(index, layer, weights, layer.input_layernorm(x), cos, sin, mask, start, end)
            h = layer.post_attention_layernorm(x)
            x = x + F.linear(F.silu(F.linear(h, weights["gate_proj"])) * F.linear(h, weights["up_proj"]),
                             weights["down_proj"])
        self.length = end
        return F.linear(self.norm(x[:, -1]), self.lm_head)

    def _attention(self, index, layer, weights, h, cos, sin, mask, start, end) -> torch.Tensor:
        """Grouped-query self-attention of the new positions over the cache (Qwen3: RMSNorm on q and k per head)."""
        attn = layer.self_attn
        batch, new, _ = h.shape
        q = attn.q_norm(F.linear(h, weights["q_proj"]).view(batch, new, self.heads, self.head_dim)).transpose(1, 2)
        k = attn.k_norm(F.linear(h, weights["k_proj"]).view(batch, new, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = F.linear(h, weights["v_proj"]).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if self.keys is None:
            self.keys = torch.zeros(self.cache_shape, dtype=k.dtype, device=k.device)
            self.values = torch.zeros(self.cache_shape, dtype=v.dtype, device=v.device)
        self.keys[index, :, :, start:end] = k
        self.values[index, :, :, start:end] = v
        out = F.scaled_dot_product_attention(
            q, self.keys[index, :, :, :end], self.values[index, :, :, :end],
            attn_mask=mask, scale=attn.scaling, enable_gqa=True,
        )
        return F.linear(out.transpose(1, 2).reshape(batch, new, -1), weights["o_proj"])

    def _attention_mask(self, start: int, new: int) -> torch.Tensor:
        """[B, 1, new, end]: causal, over real keys; a padding query also sees itself, so no row is empty."""
        end = start + new
        device = self.key_mask.device
        query = torch.arange(start, end, device=device)[:, None]
        key = torch.arange(end, device=device)[None, :]
        allowed = (key <= query) & (self.key_mask[:, None, :end] | (key == query))
        return allowed[:, None]


def make_decoder(model: torch.nn.Module, batch_size: int, max_length: int) -> Qwen3Decoder | None:
    """A Qwen3Decoder for the model, or None when it is not a Qwen3 the decoder reproduces."""
    if not Qwen3Decoder.supports(model):
        return None
    return Qwen3Decoder(causal_lm_of(model), batch_size, max_length)

"""A plain Qwen3 forward over weights stacked along a leading arm dimension.

Two uses share it. The sampler decodes with it over a preallocated KV cache: per generated token,
transformers' forward spends more time on masks, cache objects and output wrappers than on arithmetic at
the mini world's sizes (hidden 128). And several policies of one base (LoRA adapters of different ranks,
a full fine-tuning copy: stacked.py) run in one batched pass through it, forward and backward, each
arm with its own weights: a linear layer of arm a applies W[a] (LoRA: W + scale * B @ A, the weight
merging would give). A plain model is the case of one arm.

The arithmetic is `Qwen3ForCausalLM`'s (its RMSNorm in float32, its rotary helper, grouped-query SDPA);
`tests/test_qwen3.py` pins the logits to the transformers forward.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

LINEARS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
NORMS = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
         "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}


@dataclass(frozen=True)
class Qwen3Shape:
    """The sizes a forward needs beside the weights."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    inv_freq: torch.Tensor
    padding_idx: int | None  # the row the embedding lookup sends no gradient to (transformers' padding_idx); tied
                             # embeddings still give it one through the LM head

    @classmethod
    def of(cls, model: Qwen3ForCausalLM) -> Qwen3Shape:
        config = model.config
        return cls(config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.rms_norm_eps,
                   model.model.rotary_emb.inv_freq, model.model.embed_tokens.padding_idx)


@dataclass
class Qwen3Weights:
    """Every tensor a Qwen3 forward reads, each with a leading arm dimension A.

    embed and lm_head [A, V, d]; norm [A, d]; per layer, each linear [A, out, in] and each norm [A, width].
    """

    embed: torch.Tensor
    layers: list[dict[str, torch.Tensor]]
    norm: torch.Tensor
    lm_head: torch.Tensor
    shape: Qwen3Shape
    ends: tuple[int, ...] = ()  # the end-of-text ids the model's generation config names (sampler.stop_ids)

    @property
    def arms(self) -> int:
        return self.embed.shape[0]


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


def module_at(root: torch.nn.Module, dotted: str) -> torch.nn.Module:
    """A submodule by dotted name."""
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def weights_of(model: torch.nn.Module) -> Qwen3Weights:
    """One arm: the weights a (possibly peft-wrapped) Qwen3 applies, LoRA adapters folded in."""
    lm = causal_lm_of(model)
    inner = lm.model
    layers = [
        {**{name: effective_weight(getattr(getattr(layer, block), name))[None]
            for block, names in LINEARS.items() for name in names},
         **{key: module_at(layer, path).weight[None] for key, path in NORMS.items()}}
        for layer in inner.layers
    ]
    return Qwen3Weights(inner.embed_tokens.weight[None], layers, inner.norm.weight[None],
                        effective_weight(lm.lm_head)[None], Qwen3Shape.of(lm), configured_ends(lm))


def configured_ends(model: torch.nn.Module) -> tuple[int, ...]:
    """The end-of-text ids a model's generation config names: one id, a list, or none."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return tuple(configured) if isinstance(configured, (list, tuple)) else () if configured is None else (configured,)


def supports(model: torch.nn.Module) -> bool:
    """Whether this forward reproduces the model: a Qwen3 with full attention, plain rotary embedding, SiLU MLPs
    and no biases, no forward hooks that could change a value (it bypasses module calls) and no dropout in force."""
    lm = causal_lm_of(model)
    if not isinstance(lm, Qwen3ForCausalLM):
        return False
    config = lm.config
    rope = getattr(config, "rope_parameters", None) or {}
    modules = list(lm.modules())
    return (
        not getattr(config, "use_sliding_window", False)
        and not getattr(config, "attention_bias", False)
        and config.hidden_act == "silu"
        and rope.get("rope_type", "default") == "default"
        and lm.model.rotary_emb.attention_scaling == 1.0
        and not any(_value_hooks(m) for m in modules)
        and not (lm.training and has_dropout(lm))
    )


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether the model drops anything in train mode: a Dropout module, or attention's own dropout rate."""
    return bool(getattr(causal_lm_of(model).config, "attention_dropout", 0.0)) or any(
        isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


# transformers' and peft's hook on the input embeddings under gradient checkpointing: it marks their output as
# requiring grad and leaves every value alone, so a forward that bypasses it computes the same logits.
GRADIENT_ONLY_HOOKS = ("make_inputs_require_grads", "make_inputs_require_grad")


def _value_hooks(module: torch.nn.Module) -> list:
    """The module's forward hooks that may change what it computes (all but the gradient-only ones)."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return [hook for hook in hooks if getattr(hook, "__name__", None) not in GRADIENT_ONLY_HOOKS]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm: normalised in float32, scaled by the arm's weight (broadcast over x's middle dims)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.view(weight.shape[0], *[1] * (x.dim() - 2), weight.shape[-1]) * h.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [A, ..., in] through each arm's weight [A, out, in]."""
    flat = x.reshape(x.shape[0], -1, x.shape[-1])
    return torch.bmm(flat, weight.transpose(1, 2)).view(*x.shape[:-1], weight.shape[1])


def embed(weights: Qwen3Weights, input_ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings [A, B, L, d] of input_ids [A, B, L], each arm through its own table."""
    padding_idx = weights.shape.padding_idx
    return torch.stack([F.embedding(ids, table, padding_idx=padding_idx)
                        for ids, table in zip(input_ids, weights.embed)])


def rotary(shape: Qwen3Shape, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [R, L, head_dim] of positions [R, L]."""
    freqs = position_ids[..., None].float() * shape.inv_freq.float()
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class KVCache:
    """Keys and values of every layer for R = A * B rows, preallocated up to max_length positions."""

    def __init__(self, layers: int, rows: int, shape: Qwen3Shape, max_length: int, device: torch.device) -> None:
        self.size = (layers, rows, shape.kv_heads, max_length, shape.head_dim)
        self.keys = self.values = None  # allocated on first use, in the dtype keys come out in (autocast)
        self.key_mask = torch.zeros(rows, max_length, dtype=torch.bool, device=device)
        self.length = 0

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only these rows (an index tensor), in this order."""
        self.key_mask = self.key_mask[rows]
        if self.keys is not None:
            self.keys, self.values = self.keys[:, rows], self.values[:, rows]
        self.size = (self.size[0], len(rows), *self.size[2:])

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys/values at the current positions; return all of them so far."""
        if self.keys is None:
            self.keys = torch.zeros(self.size, dtype=k.dtype, device=k.device)
            self.values = torch.zeros(self.size, dtype=v.dtype, device=v.device)
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


def forward(
    weights: Qwen3Weights, input_ids: torch.Tensor, key_mask: torch.Tensor, position_ids: torch.Tensor,
    cache: KVCache | None = None, keep: slice | torch.Tensor = slice(None), allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits of input_ids [A, B, L] at the kept positions: [A, B, len(keep), V] for a slice of each row's
    positions, or [A, K, V] for an index tensor [A, K] into each arm's B * L positions.

    key_mask [A, B, S]: which of all S key positions (cached and new) are real tokens; position_ids
    [A, B, L]. With a cache, the new positions are appended to it; without, L = S. allowed [A, B, L, L]:
    which positions of its row each position may attend to besides causality and the key mask (several
    sequences packed in one row).
    """
    arms, batch, new = input_ids.shape
    start = cache.length if cache is not None else 0
    rows = arms * batch
    x = embed(weights, input_ids)
    cos, sin = rotary(weights.shape, position_ids.reshape(rows, new), x.dtype)
    mask = _attention_mask(key_mask.reshape(rows, -1), start, new)
    if allowed is not None:
        mask = mask & allowed.reshape(rows, 1, new, new)
    x = decoder_layers(weights, x, cos, sin, mask, cache)
    if cache is not None:
        cache.length = start + new
    if isinstance(keep, torch.Tensor):
        x = torch.gather(x.reshape(arms, batch * new, -1), 1, keep[..., None].expand(*keep.shape, x.shape[-1]))
    else:
        x = x[:, :, keep]
    return lm_head(weights, x)


def decoder_layers(weights: Qwen3Weights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                   cache) -> torch.Tensor:
    """Hidden states [A, B, L, d] through every layer; cache: None, or anything with KVCache's store()."""
    for index, layer in enumerate(weights.layers):
        h = rms_norm(x, layer["input_layernorm"], weights.shape.eps)
        x = x + _attention(weights.shape, layer, h, cos, sin, mask, cache, index)
        h = rms_norm(x, layer["post_attention_layernorm"], weights.shape.eps)
        x = x + linear(F.silu(linear(h, layer["gate_proj"])) * linear(h, layer["up_proj"]), layer["down_proj"])
    return x


def lm_head(weights: Qwen3Weights, x: torch.Tensor) -> torch.Tensor:
    """Logits of final hidden states x [A, ..., d]."""
    return linear(rms_norm(x, weights.norm, weights.shape.eps), weights.lm_head)


def _attention(shape: Qwen3Shape, layer: dict, h: torch.Tensor, cos, sin, mask, cache, index) -> torch.Tensor:
    """Grouped-query self-attention of the new positions (Qwen3: RMSNorm on q and k per head)."""
    arms, batch, new, _ = h.shape
    rows = arms * batch

    def heads(name: str, count: int) -> torch.Tensor:  # [A, B, L, count * hd] -> [A, B * L * count, hd]
        return linear(h, layer[name]).reshape(arms, batch * new * count, shape.head_dim)

    q = rms_norm(heads("q_proj", shape.heads), layer["q_norm"], shape.eps)
    k = rms_norm(heads("k_proj", shape.kv_heads), layer["k_norm"], shape.eps)
    q = q.view(rows, new, shape.heads, shape.head_dim).transpose(1, 2)
    k = k.view(rows, new, shape.kv_heads, shape.head_dim).transpose(1, 2)
    v = heads("v_proj", shape.kv_heads).view(rows, new, shape.kv_heads, shape.head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.store(index, k, v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=shape.head_dim ** -0.5, enable_gqa=True)
    return linear(out.transpose(1, 2).reshape(arms, batch, new, -1), layer["o_proj"])


def _attention_mask(key_mask: torch.Tensor, start: int, new: int) -> torch.Tensor:
    """[R, 1, new, end]: causal, over real keys; a padding query also sees itself, so no row is empty."""
    end = start + new
    device = key_mask.device
    query = torch.arange(start, end, device=device)[:, None]
    key = torch.arange(end, device=device)[None, :]
    allowed = (key <= query) & (key_mask[:, None, :end] | (key == query))
    return allowed[:, None]


def cast_for_autocast(weights: Qwen3Weights) -> Qwen3Weights:
    """Under autocast, the linear layers' and the LM head's weights in its dtype, cast once: autocast would cast
    them the same way on every decoded token (a bf16 copy of fp32 weights costs three times the weights' bytes
    in memory traffic). Norms and embeddings, which autocast leaves alone, keep their dtype."""
    device_type = weights.embed.device.type
    if not torch.is_autocast_enabled(device_type):
        return weights
    dtype = torch.get_autocast_dtype(device_type)
    linears = {name for names in LINEARS.values() for name in names}
    layers = [{key: value.to(dtype) if key in linears else value for key, value in layer.items()}
              for layer in weights.layers]
    return dataclasses.replace(weights, layers=layers, lm_head=weights.lm_head.to(dtype))


class Decoder:
    """Prefill a left-padded batch of every arm, then extend it one token at a time; each call returns the
    last position's logits, [A * B, V] (arm-major rows)."""

    def __init__(self, weights: Qwen3Weights, batch_size: int, max_length: int) -> None:
        self.weights, self.batch = cast_for_autocast(weights), batch_size
        device = weights.embed.device
        self.cache = KVCache(len(weights.layers), weights.arms * batch_size, weights.shape, max_length, device)

    def _arms(self, x: torch.Tensor) -> torch.Tensor:
        """Rows [A * B, ...] as [A, B, ...]."""
        return x.reshape(self.weights.arms, self.batch, *x.shape[1:])

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompts ([A * B, L], left-padded) into the cache."""
        self.cache.key_mask[:, : input_ids.shape[1]] = attention_mask.bool()
        logits = forward(self.weights, self._arms(input_ids), self._arms(self.cache.key_mask), self._arms(position_ids),
                         self.cache, keep=slice(-1, None))
        return logits.reshape(-1, logits.shape[-1])

    def extend(self, tokens: torch.Tensor, position_ids: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """Append one token per row ([A * B]); rows with attend False are padding from now on."""
        self.cache.key_mask[:, self.cache.length] = attend
        logits = forward(self.weights, self._arms(tokens[:, None]), self._arms(self.cache.key_mask),
                         self._arms(position_ids), self.cache)
        return logits.reshape(-1, logits.shape[-1])

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Decode only these rows from now on (arm-major; the same number of rows in every arm)."""
        if len(rows) % self.weights.arms:
            raise ValueError(f"{len(rows)} rows do not split evenly over {self.weights.arms} arms")
        self.cache.keep_rows(rows)
        self.batch = len(rows) // self.weights.arms


def make_decoder(model: torch.nn.Module, batch_size: int, max_length: int,
                 kind: type[Decoder] = Decoder) -> Decoder | None:
    """A decoder of this kind for a model this forward reproduces (weights read once, here), else None."""
    if not supports(model):
        return None
    return kind(weights_of(model), batch_size, max_length)

"""GPU memory of one paper cell, estimated from the model shapes: what must fit on each device.

An estimate, not a measurement: it counts the tensors that scale with the model and the sequence and
ignores allocator fragmentation and CUDA workspaces (add ~10%). Run as
`python -m reward_density.tools.gpu_memory [--profile paper]` for the table the README shows.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..experiment.profiles import find_profile, load_profile
from ..grpo.loss import scores_reference

GIB = 1024**3
BF16, FP32 = 2, 4
PROMPT_TOKENS = 256  # a long MATH prompt with the template, in Qwen tokens


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of a Qwen3 / Mistral decoder that decide its memory (its config.json fields)."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qk_norm: bool = True  # Qwen3 normalises queries and keys per head; Mistral does not

    @classmethod
    def of(cls, config: Any) -> DecoderShape:
        """From a transformers config."""
        return cls(config.vocab_size, config.hidden_size, config.num_hidden_layers, config.intermediate_size,
                   config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                   bool(config.tie_word_embeddings), config.model_type == "qwen3")

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of every linear layer of one decoder layer (the ones LoRA 'all-linear' adapts)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    def linear_weights(self) -> int:
        """The weights of every decoder layer's linear layers together (what a token's pass multiplies by)."""
        return self.layers * sum(a * b for a, b in self.linears())

    def parameters(self) -> int:
        """Every weight: embeddings, layers (linears and norms), final norm and the LM head unless tied."""
        norms = self.layers * (2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0))
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.linear_weights() + norms + self.hidden + head

    def lora_parameters(self, rank: int) -> int:
        """LoRA A and B of every linear layer of every decoder layer (the LM head is not adapted)."""
        return self.layers * sum(rank * (a + b) for a, b in self.linears())

    def kv_cache_bytes(self, tokens: int, value_bytes: int = BF16, key_bytes: int | None = None) -> int:
        """Keys and values of every layer for `tokens` positions: value_bytes each (bf16 unless given), keys
        key_bytes where they differ."""
        key_bytes = value_bytes if key_bytes is None else key_bytes
        return tokens * self.layers * self.kv_heads * self.head_dim * (key_bytes + value_bytes)


# Published config.json values of the paper's models.
QWEN3_1_7B = DecoderShape(151936, 2048, 28, 6144, 16, 8, 128, tied=True)
QWEN3_8B = DecoderShape(151936, 4096, 36, 12288, 32, 8, 128, tied=False)
MATH_SHEPHERD_MISTRAL_7B = DecoderShape(32000, 4096, 32, 14336, 32, 8, 128, tied=False, qk_norm=False)


def _activations(shape: DecoderShape, rows: int, tokens: int, checkpointing: bool, value_bytes: int) -> int:
    """Activations kept for the backward pass of one micro-batch (value_bytes each), roughly.

    Per layer and token a decoder keeps ~ (10 hidden + 3 intermediate) values for the backward (norm
    inputs, q/k/v, attention output, MLP gate/up/act); with checkpointing only each layer's input is kept,
    plus one layer's worth while it is recomputed. Attention is flash/SDPA: no tokens^2 term.
    """
    per_layer = rows * tokens * (10 * shape.hidden + 3 * shape.intermediate) * value_bytes
    if checkpointing:
        return shape.layers * rows * tokens * shape.hidden * value_bytes + per_layer
    return shape.layers * per_layer


def _logits(shape: DecoderShape, rows: int, completion: int, value_bytes: int = BF16) -> int:
    """The LM head's output over the completion and what the log-prob needs of it (logits_to_keep)."""
    # The logits (value_bytes each), their fp32 copy (none when they are fp32 already: .float() returns them), the
    # tempered copy, and the softmax kept for the backward.
    fp32_copies = 2 if value_bytes == FP32 else 3
    return rows * completion * shape.vocab * (value_bytes + fp32_copies * FP32)


def student_memory(cell: dict[str, Any], rank: int | None, shape: DecoderShape = QWEN3_1_7B) -> dict[str, float]:
    """GiB on the student's device for one cell of a profile's `cell` section; rank None is FullFT."""
    p = shape.parameters()
    trained = p if rank is None else shape.lora_parameters(rank)
    rows = cell["prompts_per_step"] * cell["group_size"]
    micro = _micro_batch(cell)
    prompt, completion = PROMPT_TOKENS, cell["max_new_tokens"]
    mixed = cell["precision"] == "bf16"
    frozen = values = BF16 if mixed else FP32  # the frozen weights' bytes; the activations' and caches' too
    persistent = {
        "weights": p * FP32 if rank is None else p * frozen + trained * FP32,
        "reference copy": p * frozen if rank is None and scores_reference(cell["beta"], cell["track_kl"]) else 0,
        "gradients": trained * FP32,
        "AdamW moments": 2 * trained * FP32,
    }
    backward = {
        "activations (one micro-batch)": _activations(shape, micro, prompt + completion,
                                                      cell["gradient_checkpointing"], values),
        "logits (one micro-batch)": _logits(shape, micro, completion, values),
        # Autocast's bf16 copy of the fp32 master weights, kept for the backward (measured on an H200: README).
        "bf16 copy of the weights (FullFT)": _bf16_copy(shape, with_head=True) if rank is None and mixed else 0,
    }
    # The sampling decoder's weights (grpo/qwen3.py): in bf16 each linear layer with its adapter folded in, and
    # FullFT's LM head, cast once from the fp32 master; in fp32 FullFT reads its parameters themselves, while LoRA
    # merges its adapters into the base in place and keeps an fp32 copy of the base's linear layers to restore
    # them exactly (grpo/policy.py, Policy.sampling).
    sampler_weights = _bf16_copy(shape, with_head=rank is None) if mixed else \
        0 if rank is None else shape.linear_weights() * FP32
    # FullFT's fp32 k_norm weight promotes the keys to fp32 under autocast (as in transformers' own forward), so
    # its cache holds fp32 keys beside bf16 values.
    keys = FP32 if rank is None and shape.qk_norm else values
    sampling = {"KV cache while sampling": shape.kv_cache_bytes(rows * (prompt + completion), values, keys),
                "weights as the sampler reads them": sampler_weights}
    evaluating = {
        "KV cache while evaluating": shape.kv_cache_bytes(
            cell["eval_batch_size"] * (prompt + cell["eval_max_new_tokens"]), values, keys)
    }
    # Sampling, evaluating and the backward happen one after another: only the largest phase counts.
    step = sum(persistent.values()) + max(sum(backward.values()), sum(sampling.values()))
    peak = max(step, sum(persistent.values()) + sum(evaluating.values()))
    parts = {**persistent, **backward, **sampling, **evaluating, "peak (training step)": step, "peak": peak}
    return {k: v / GIB for k, v in parts.items()}


def _micro_batch(cell: dict[str, Any]) -> int:
    """Rows per forward pass: the cell's micro_batch_size, or the whole P x G batch where it sets none."""
    rows = cell["prompts_per_step"] * cell["group_size"]
    return rows if cell["micro_batch_size"] is None else min(cell["micro_batch_size"], rows)


def _bf16_copy(shape: DecoderShape, with_head: bool) -> int:
    """Bytes of a bf16 copy of every decoder layer's linear weights, and of the LM head's when asked."""
    return (shape.linear_weights() + (shape.vocab * shape.hidden if with_head else 0)) * BF16


def scorer_memory(cell: dict[str, Any], shape: DecoderShape, tokens: int) -> float:
    """GiB on the teacher's or the PRM's device: bf16 weights and one scoring micro-batch."""
    micro = _micro_batch(cell)
    activations = micro * tokens * (2 * shape.hidden + shape.intermediate) * BF16  # no backward: one layer at a time
    return (shape.parameters() * BF16 + activations + _logits(shape, micro, cell["max_new_tokens"])) / GIB


def memory_table(cell: dict[str, Any], ranks: Sequence[int | None]) -> str:
    """A markdown table of the student-device estimate per arm, and the teacher / PRM device."""
    arms = [student_memory(cell, rank) for rank in ranks]
    names = ["FullFT" if r is None else f"LoRA r={r}" for r in ranks]
    lines = ["| GiB on the student's GPU | " + " | ".join(names) + " |", "|---" * (len(ranks) + 1) + "|"]
    for key in arms[0]:
        lines.append(f"| {key} | " + " | ".join(f"{arm[key]:.1f}" for arm in arms) + " |")
    tokens = PROMPT_TOKENS + cell["max_new_tokens"]
    teacher, prm = scorer_memory(cell, QWEN3_8B, tokens), scorer_memory(cell, MATH_SHEPHERD_MISTRAL_7B, tokens)
    lines.append(f"\nSecond GPU: teacher Qwen3-8B {teacher:.1f} GiB (distillation), "
                 f"PRM Math-Shepherd 7B {prm:.1f} GiB (process); both together {teacher + prm:.1f} GiB.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    """Print the estimate for a profile's cell settings (default: the paper profile)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="paper")
    args = parser.parse_args(argv)
    profile = load_profile(find_profile(args.profile))
    table = memory_table(profile.cell, [None, max(profile.matrix.ranks), min(profile.matrix.ranks)])
    print(table)
    return table


if __name__ == "__main__":
    main()

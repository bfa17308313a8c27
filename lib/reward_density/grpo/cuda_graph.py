"""Decoding one token as a CUDA graph: the step's thousands of kernels recorded once and replayed per token.

On a GPU the eager decoder (qwen3.Decoder) is bound by launches, not by arithmetic: for a 28-layer Qwen3 it makes
about 6,000 ATen calls per token, their small kernels each launched from Python. A graph replays them in one
launch (docs/speed.md: 6.5 ms per token on an H100, where the eager sampler took 38-131 ms on an H200). It needs
fixed shapes and addresses, so the step here attends over the whole preallocated cache, masked to the positions
filled so far, and writes each token's keys and values at a position it reads from the device.
"""
from __future__ import annotations

import contextlib

import torch

from .qwen3 import Decoder, KVCache, Qwen3Weights, decoder_layers, embed, lm_head, rotary


class _SlotWriter:
    """KVCache.store() at a position held in a device tensor [1], returning every position's keys and values."""

    def __init__(self, cache: KVCache, index: torch.Tensor) -> None:
        self.cache, self.index = cache, index

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys.index_copy_(2, self.index, k)
        values.index_copy_(2, self.index, v)
        return keys, values


class StaticDecoder(Decoder):
    """The eager decoder's extend() with fixed shapes: the same logits up to the order of floating-point sums."""

    def __init__(self, weights: Qwen3Weights, batch_size: int, max_length: int) -> None:
        super().__init__(weights, batch_size, max_length)
        self.tokens = self.positions = self.index = None  # the step's inputs, allocated for each batch size

    def extend(self, tokens: torch.Tensor, position_ids: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """Append one token per row ([A * B]); rows with attend False are padding from now on."""
        cache = self.cache
        cache.key_mask[:, cache.length] = attend
        if self.tokens is None:
            self.tokens, self.positions = torch.empty_like(tokens), torch.empty_like(position_ids)
            self.index = torch.empty(1, dtype=torch.long, device=tokens.device)
        self.tokens.copy_(tokens)
        self.positions.copy_(position_ids)
        self.index.fill_(cache.length)
        logits = self._run()
        cache.length += 1
        return logits

    def keep_rows(self, rows: torch.Tensor) -> None:
        super().keep_rows(rows)
        self.tokens = self.positions = self.index = None

    def _run(self) -> torch.Tensor:
        return self._step()

    def _step(self) -> torch.Tensor:
        """Logits [A * B, V] of the tokens in self.tokens, every key position attended to under a mask."""
        weights, cache = self.weights, self.cache
        x = embed(weights, self._arms(self.tokens[:, None]))
        cos, sin = rotary(weights.shape, self.positions, x.dtype)
        key = torch.arange(cache.key_mask.shape[1], device=cache.key_mask.device)
        # qwen3._attention_mask for one new position: causal, over real keys, a padding query seeing itself.
        mask = (key <= self.index) & (cache.key_mask | (key == self.index))
        x = decoder_layers(weights, x, cos, sin, mask[:, None, None], _SlotWriter(cache, self.index))
        logits = lm_head(weights, x)
        return logits.reshape(-1, logits.shape[-1])


class GraphedDecoder(StaticDecoder):
    """StaticDecoder's step recorded as a CUDA graph at the first token of each batch size, then replayed."""

    def __init__(self, weights: Qwen3Weights, batch_size: int, max_length: int) -> None:
        super().__init__(weights, batch_size, max_length)
        self.graph = self.logits = None

    def keep_rows(self, rows: torch.Tensor) -> None:
        super().keep_rows(rows)  # the cache and the inputs move: the graph's addresses are stale
        self.graph = self.logits = None

    def _run(self) -> torch.Tensor:
        if self.graph is None:
            self._record()
        self.graph.replay()
        return self.logits.clone()  # the graph overwrites its output at the next token

    def _record(self) -> None:
        # Warm up on a side stream first (PyTorch's recipe: lazy initialisations stay out of the graph). The
        # warmup writes this token's keys and values, which the replay rewrites with the same numbers.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), _uncached_autocast():
            self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), _uncached_autocast():
            self.logits = self._step()


def _uncached_autocast() -> contextlib.AbstractContextManager:
    """Autocast as it stands, without its cast cache: a graph must not keep tensors cached outside its pool."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)

"""Batched, left-padded sampling with a KV cache: P prompts x G completions -> Rollout."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..data.problems import Problem
from .decode import make_decoder
from .logprobs import position_ids_from_mask
from .rollout import Rollout

# Bumped whenever the same seed would draw different tokens (the mini world's PRM is labelled from
# sampled solutions, so its build key includes this and a changed draw rebuilds it).
SAMPLING_VERSION = 2  # 2: inverse-CDF draws instead of torch.multinomial


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are drawn; temperature 0 means greedy decoding."""

    max_new_tokens: int
    temperature: float = 0.7
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0):
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def special_token_ids(tokenizer) -> tuple[int, int]:
    """(eos, pad) ids; a tokenizer without EOS cannot end a completion and is refused."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no EOS token")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return tokenizer.eos_token_id, pad


@torch.no_grad()
def sample_rollout(
    model: torch.nn.Module,
    tokenizer,
    problems: Sequence[Problem],
    group_size: int,
    config: SamplingConfig,
    seed: int,
) -> Rollout:
    """Draw group_size completions for each problem; rows g*G..g*G+G-1 answer problems[g]."""
    eos, pad = special_token_ids(tokenizer)
    device = next(model.parameters()).device
    encoded = tokenizer([p.prompt for p in problems], padding=True, padding_side="left", return_tensors="pt")
    prompt_ids = encoded["input_ids"].repeat_interleave(group_size, dim=0)
    prompt_mask = encoded["attention_mask"].repeat_interleave(group_size, dim=0)
    generator = torch.Generator(device=device).manual_seed(seed)

    completion_ids, sampler_logps, finished = _decode(
        model, prompt_ids.to(device), prompt_mask.to(device), config, eos, pad, generator
    )
    completion_mask = _completion_mask(completion_ids, eos)
    completion_ids = completion_ids.masked_fill(~completion_mask, pad)
    texts = tokenizer.batch_decode(
        [ids[m].tolist() for ids, m in zip(completion_ids, completion_mask)], skip_special_tokens=True
    )
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids.cpu(),
        completion_mask=completion_mask.cpu(),
        sampler_logps=(sampler_logps * completion_mask).cpu(),
        truncated=(~finished).cpu(),
        group_size=group_size,
        prompts=[p.prompt for p in problems for _ in range(group_size)],
        completions=texts,
        answers=[p.answer for p in problems for _ in range(group_size)],
        questions=[p.question or p.prompt for p in problems for _ in range(group_size)],
    )


def _decode(model, prompt_ids, prompt_mask, config, eos, pad, generator):
    """The token loop: one cached forward per new token until every row has an EOS or the cap."""
    batch, prompt_len = prompt_ids.shape
    decoder = make_decoder(model, batch, prompt_len + config.max_new_tokens) or _TransformersDecoder(model)
    positions = position_ids_from_mask(prompt_mask)
    logits = decoder.prefill(prompt_ids, prompt_mask.long(), positions)
    next_position = positions[:, -1:] + 1
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
    tokens, logps = [], []
    for _ in range(config.max_new_tokens):
        token, logp = _pick(logits.float(), config, generator)
        token = token.masked_fill(finished, pad)
        tokens.append(token)
        logps.append(logp)
        finished = finished | (token == eos)
        if finished.all():
            break
        logits = decoder.extend(token, next_position, ~finished)
        next_position = next_position + 1
    return torch.stack(tokens, dim=1), torch.stack(logps, dim=1), finished


class _TransformersDecoder:
    """The model's own cached forward, for architectures qwen3_decode does not reproduce."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = self.attention_mask = None

    def prefill(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        self.attention_mask = attention_mask
        return self._forward(input_ids, position_ids)

    def extend(self, tokens, position_ids, attend) -> torch.Tensor:
        self.attention_mask = torch.cat([self.attention_mask, attend.long().unsqueeze(1)], dim=1)
        return self._forward(tokens.unsqueeze(1), position_ids)

    def _forward(self, input_ids, position_ids) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids, attention_mask=self.attention_mask, position_ids=position_ids,
            past_key_values=self.cache, use_cache=True,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1, :]


def _pick(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator):
    """Next token and its log-prob under logits / temperature (top-p only restricts the draw)."""
    if config.temperature == 0:
        token = logits.argmax(dim=-1)
        return token, torch.log_softmax(logits, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
    logp_all = torch.log_softmax(logits / config.temperature, dim=-1)
    sorted_probs, order = logp_all.exp().sort(dim=-1, descending=True)
    if config.top_p < 1:
        outside = sorted_probs.cumsum(-1) - sorted_probs > config.top_p  # the first token always stays
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    # Inverse-CDF draw over the kept tokens: one uniform per row (cheaper than multinomial per token).
    cdf = sorted_probs.cumsum(-1)
    uniform = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]
    index = torch.searchsorted(cdf, uniform, right=True).clamp(max=cdf.shape[-1] - 1)
    token = order.gather(-1, index).squeeze(-1)
    return token, logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def _completion_mask(completion_ids: torch.Tensor, eos: int) -> torch.Tensor:
    """True up to and including the first EOS (everything, for a truncated row)."""
    is_eos = completion_ids == eos
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return ~after_eos

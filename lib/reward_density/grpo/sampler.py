"""Batched, left-padded sampling with a KV cache: P prompts x G completions -> Rollout."""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from ..data.problems import Problem
from .cuda_graph import GraphedDecoder
from .logprobs import position_ids_from_mask
from .qwen3 import Decoder, Qwen3Weights, causal_lm_of, configured_ends, make_decoder
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
    cuda_graphs: bool = True  # on a GPU, each token's decode step replayed as one CUDA graph (cuda_graph.py)

    def __post_init__(self) -> None:
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0):
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """(eos, pad) ids; a tokenizer without EOS cannot end a completion and is refused."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no EOS token")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return tokenizer.eos_token_id, pad


def stop_ids(model: torch.nn.Module | Qwen3Weights, eos: int) -> torch.Tensor:
    """The token ids that end a completion: the tokenizer's EOS and those of the model's generation config. A
    model's tokenizer and its generation config can name different ends of text (a base model trained to end with
    one while its tokenizer declares a chat model's), and a sampler that stopped on one alone would run past the
    model's own end to the length cap. Stacked weights carry their base model's (Qwen3Weights.ends)."""
    configured = model.ends if isinstance(model, Qwen3Weights) else configured_ends(model)
    return torch.tensor(sorted({eos, *configured}), dtype=torch.long)


def left_padded(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The texts' token ids left-padded with pad, and their attention mask: [rows, longest] each (padded here, so a
    tokenizer without a pad token of its own pads with the id special_token_ids gives)."""
    encoded = tokenizer(list(texts))["input_ids"]
    width = max(map(len, encoded))
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros(len(encoded), width, dtype=torch.long)
    for row, tokens in enumerate(encoded):
        if tokens:
            ids[row, -len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            mask[row, -len(tokens):] = 1
    return ids, mask


@torch.no_grad()
def sample_rollout(
    model: torch.nn.Module | Qwen3Weights,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    group_size: int,
    config: SamplingConfig,
    seed: int,
) -> Rollout:
    """Draw group_size completions for each problem; rows g*G..g*G+G-1 answer problems[g].

    model: a causal LM, or the stacked weights of several arms (qwen3.py): then every arm answers every
    problem, arm-major (arm a's rows are a*N..a*N+N-1), and each arm draws with the same random stream,
    so an arm samples what it would sample alone.
    """
    eos, pad = special_token_ids(tokenizer)
    arms = model.arms if isinstance(model, Qwen3Weights) else 1
    device = model.embed.device if isinstance(model, Qwen3Weights) else next(model.parameters()).device
    stops = stop_ids(model, eos).to(device)
    ids, mask = left_padded(tokenizer, [p.prompt for p in problems], pad)
    prompt_ids = ids.repeat_interleave(group_size, dim=0).repeat(arms, 1)
    prompt_mask = mask.repeat_interleave(group_size, dim=0).repeat(arms, 1)
    generator = torch.Generator(device=device).manual_seed(seed)

    completion_ids, sampler_logps, finished = _decode(
        model, arms, prompt_ids.to(device), prompt_mask.to(device), config, stops, pad, generator
    )
    completion_mask = _completion_mask(completion_ids, stops)
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
        prompts=[p.prompt for p in problems for _ in range(group_size)] * arms,
        completions=texts,
        answers=[p.answer for p in problems for _ in range(group_size)] * arms,
        questions=[p.question or p.prompt for p in problems for _ in range(group_size)] * arms,
        prefixes=[p.prefix for p in problems for _ in range(group_size)] * arms,
    )


def _decode(model, arms, prompt_ids, prompt_mask, config, stops, pad, generator):
    """The token loop: one cached forward per new token until every row has a stop token or the cap.

    When at most half of the rows still decode, the finished ones leave the batch (the stacked decoder
    keeps the same number of rows in every arm); a row's draws do not depend on who else is decoding.
    """
    rows, prompt_len = prompt_ids.shape
    per_arm = rows // arms
    max_length = prompt_len + config.max_new_tokens
    kind = decoder_kind(config, prompt_ids.device)
    if isinstance(model, Qwen3Weights):
        decoder = kind(model, per_arm, max_length)
    else:
        decoder = make_decoder(model, rows, max_length, kind) or _TransformersDecoder(model)
    positions = position_ids_from_mask(prompt_mask)
    logits = decoder.prefill(prompt_ids, prompt_mask.long(), positions)
    next_position = positions[:, -1] + 1
    finished = torch.zeros(rows, dtype=torch.bool, device=prompt_ids.device)
    tokens = torch.full((rows, config.max_new_tokens), pad, dtype=torch.long, device=prompt_ids.device)
    logps = torch.zeros(rows, config.max_new_tokens, device=prompt_ids.device)
    active = torch.arange(rows, device=prompt_ids.device)  # the full-batch row of each decoding row
    for step in range(config.max_new_tokens):
        uniform = _uniforms(per_arm, generator, prompt_ids.device).repeat(arms, 1)[active]
        token, logp = _pick(logits.float(), config, uniform)
        token = token.masked_fill(finished[active], pad)
        tokens[active, step], logps[active, step] = token, logp
        finished[active] |= torch.isin(token, stops)
        if finished.all():
            return tokens[:, : step + 1], logps[:, : step + 1], finished
        keep = _rows_to_keep(finished, active, arms)
        if keep is not None:
            decoder.keep_rows(keep)
            active, token = active[keep], token[keep]
        logits = decoder.extend(token, next_position[active, None] + step, ~finished[active])
    return tokens, logps, finished


def decoder_kind(config: SamplingConfig, device: torch.device) -> type[Decoder]:
    """The decoder class sampling uses on this device (for a model qwen3.py reproduces): graphed on a GPU."""
    return GraphedDecoder if config.cuda_graphs and device.type == "cuda" else Decoder


def _uniforms(per_arm: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """This token's uniform draw for each row of an arm ([per_arm, 1]); every arm reuses them."""
    return torch.rand(per_arm, 1, generator=generator, device=device)


def _rows_to_keep(finished: torch.Tensor, active: torch.Tensor, arms: int) -> torch.Tensor | None:
    """Indices into the decoding rows worth keeping once at most half still decode: in every arm its live
    rows, padded with finished ones to the same count; None while compacting would not halve the batch."""
    live = ~finished[active].view(arms, -1)
    width = int(live.sum(-1).max())
    if width > live.shape[1] // 2 or width == 0:
        return None
    # Live rows first, in order (a stable sort on "finished"), then finished ones as padding.
    order = torch.sort((~live).long(), dim=-1, stable=True).indices[:, :width]
    return (order + torch.arange(arms, device=order.device)[:, None] * live.shape[1]).reshape(-1)


class _TransformersDecoder:
    """The model's own cached forward, for architectures qwen3.py does not reproduce."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = self.attention_mask = None
        # transformers 5.x renamed past_key_values to cache (the old name to go in 5.40); the range allows both.
        forward = inspect.signature(causal_lm_of(model).forward).parameters
        self.cache_argument = "cache" if "cache" in forward else "past_key_values"

    def prefill(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        self.attention_mask = attention_mask
        return self._forward(input_ids, position_ids)

    def extend(self, tokens, position_ids, attend) -> torch.Tensor:
        self.attention_mask = torch.cat([self.attention_mask, attend.long().unsqueeze(1)], dim=1)
        return self._forward(tokens.unsqueeze(1), position_ids)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.attention_mask = self.attention_mask[rows]
        self.cache.reorder_cache(rows)

    def _forward(self, input_ids, position_ids) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids, attention_mask=self.attention_mask, position_ids=position_ids,
            use_cache=True, **{self.cache_argument: self.cache},
        )
        self.cache = out.past_key_values
        return out.logits[:, -1, :]


def _pick(logits: torch.Tensor, config: SamplingConfig, uniform: torch.Tensor):
    """Next token and its log-prob under logits / temperature (top-p only restricts the draw).

    uniform: one U(0, 1) per row, the draw of an inverse-CDF sample over the kept tokens.
    """
    if config.temperature == 0:
        token = logits.argmax(dim=-1)
        return token, torch.log_softmax(logits, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
    logp_all = torch.log_softmax(logits / config.temperature, dim=-1)
    sorted_probs, order = logp_all.exp().sort(dim=-1, descending=True)
    if config.top_p < 1:
        outside = sorted_probs.cumsum(-1) - sorted_probs > config.top_p  # the first token always stays
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    cdf = sorted_probs.cumsum(-1)
    index = torch.searchsorted(cdf, uniform.to(cdf.dtype) * cdf[:, -1:], right=True).clamp(max=cdf.shape[-1] - 1)
    token = order.gather(-1, index).squeeze(-1)
    return token, logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def _completion_mask(completion_ids: torch.Tensor, stops: torch.Tensor) -> torch.Tensor:
    """True up to and including the first stop token (everything, for a truncated row)."""
    is_eos = torch.isin(completion_ids, stops)
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return ~after_eos

"""Per-token log-probs of completion tokens at the sampling temperature."""
from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on the first real token, so left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
    micro_batch_size: int | None = None,
) -> torch.Tensor:
    """log pi(o_t | s_t) of each completion token under logits / temperature; 0 on padding. [N, T].

    micro_batch_size bounds the rows per forward pass (the logits of a 150k vocabulary are the
    largest tensor); use it without gradients, since a graph would keep every micro-batch alive.
    """
    rows = micro_batches(prompt_ids.shape[0], micro_batch_size)
    parts = [
        _logprobs(model, prompt_ids[r], prompt_mask[r], completion_ids[r], completion_mask[r], temperature)
        for r in rows
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def micro_batches(n: int, size: int | None) -> list[slice]:
    """Row slices of at most size rows covering 0..n (one slice when size is None)."""
    if size is None or size >= n:
        return [slice(0, n)]
    if size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {size}")
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature) -> torch.Tensor:
    """completion_logprobs for one forward pass."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()
    device = _device_of(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    completion_len = completion_ids.shape[1]
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=completion_len + 1,  # the LM head only where a completion token is predicted
    ).logits
    # The logit at position p predicts token p + 1: keep those predicting the completion.
    logits = logits[:, :-1, :].float() / temperature
    logps = token_logprobs(logits, completion_ids.to(device))
    return (logps * completion_mask.to(device)).to(completion_ids.device)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] without materialising the whole log-softmax twice."""
    return torch.gather(logits, -1, token_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device

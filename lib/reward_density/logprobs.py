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
) -> torch.Tensor:
    """log pi(o_t | s_t) of each completion token under logits / temperature; 0 on padding. [N, T]."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()
    device = _device_of(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).logits
    # The logit at position p predicts token p + 1: keep those predicting the completion.
    completion_len = completion_ids.shape[1]
    logits = logits[:, -completion_len - 1 : -1, :].float() / temperature
    logps = token_logprobs(logits, completion_ids.to(device))
    return (logps * completion_mask.to(device)).to(completion_ids.device)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] without materialising the whole log-softmax twice."""
    return torch.gather(logits, -1, token_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device

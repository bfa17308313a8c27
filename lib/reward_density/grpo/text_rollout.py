"""A rollout built from given completion text instead of sampled: solutions to train on (the SFT control),
or completions logged by a cell to score again (the reward-debug notebook)."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..data.problems import Problem
from .rollout import Rollout
from .sampler import left_padded, special_token_ids


def rollout_from_text(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], completions: Sequence[str], group_size: int = 1,
    truncated: Sequence[bool] | None = None,
) -> Rollout:
    """Row i answers problems[i] with completions[i] (+ EOS unless truncated[i]); consecutive rows of one problem
    form its group. The completion's tokens are the tokenizer's encoding of the text, which need not be the
    ids a sampler drew for it; sampler log-probs are 0."""
    if len(problems) != len(completions) or len(problems) % group_size:
        raise ValueError(f"{len(problems)} problems and {len(completions)} completions: need one completion per "
                         f"row and whole groups of {group_size}")
    truncated = [False] * len(problems) if truncated is None else list(truncated)
    empty = [row for row, (text, cut) in enumerate(zip(completions, truncated, strict=True)) if cut and not text]
    if empty:
        raise ValueError(f"rows {empty}: an empty completion cannot be truncated (it would hold no token at all)")
    mixed = [g for g in range(0, len(problems), group_size)
             if len({p.prompt for p in problems[g : g + group_size]}) > 1]
    if mixed:
        raise ValueError(f"the groups starting at rows {mixed} hold different prompts: a group's rows answer one "
                         "problem (its completions share that prompt when scored)")
    eos, pad = special_token_ids(tokenizer)
    prompt_ids, prompt_mask = left_padded(tokenizer, [p.prompt for p in problems], pad)
    encoded = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    targets = [ids if cut else ids + [eos] for ids, cut in zip(encoded, truncated, strict=True)]
    width = max(1, *map(len, targets))
    completion_ids = torch.full((len(problems), width), pad, dtype=torch.long)
    completion_mask = torch.zeros(len(problems), width, dtype=torch.bool)
    for row, ids in enumerate(targets):
        completion_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        completion_mask[row, : len(ids)] = True
    return Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        completion_ids=completion_ids, completion_mask=completion_mask,
        sampler_logps=torch.zeros(len(problems), width), truncated=torch.tensor(truncated, dtype=torch.bool),
        group_size=group_size, prompts=[p.prompt for p in problems], completions=list(completions),
        answers=[p.answer for p in problems], questions=[p.question or p.prompt for p in problems],
        prefixes=[p.prefix for p in problems],
    )

"""T-SPMO's token-level advantages over the prefix trie of a group ("Token-Efficient RL for LLM Reasoning",
Eq. 7-10).

The G completions of a prompt share prefixes; every unique transition (prefix p, next token v) gets
A(v | p) = E[R | p + v] - E[R | p] (Eq. 7), each expectation the mean reward of the group's completions that
start with that prefix (Eq. 8-9). The objective counts each unique transition once (Eq. 10), so it sits on
the first completion that makes it, and the token subset marks exactly those positions.
"""
from __future__ import annotations

from collections import defaultdict

import torch


def prefix_advantages(completion_ids: torch.Tensor, completion_mask: torch.Tensor, rewards: torch.Tensor,
                      group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [N, T], token_subset [N, T] bool): A(v | p) at the first occurrence of each unique (p, v)
    of a group, and where those occurrences are; rows g*G .. g*G+G-1 are group g, rewards [N] per completion."""
    n, width = completion_ids.shape
    if n % group_size:
        raise ValueError(f"{n} completions do not split into groups of {group_size}")
    advantages = torch.zeros(n, width)
    subset = torch.zeros(n, width, dtype=torch.bool)
    for start in range(0, n, group_size):
        rows = range(start, start + group_size)
        sequences = {row: completion_ids[row][completion_mask[row].bool()].tolist() for row in rows}
        totals: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])  # prefix -> [sum R, count]
        for row, tokens in sequences.items():
            for length in range(len(tokens) + 1):
                entry = totals[tuple(tokens[:length])]
                entry[0] += float(rewards[row])
                entry[1] += 1
        seen: set[tuple[int, ...]] = set()
        for row, tokens in sequences.items():
            for t in range(len(tokens)):
                extended = tuple(tokens[: t + 1])
                if extended in seen:
                    continue  # this (prefix, token) is already counted on an earlier completion
                seen.add(extended)
                with_v, prefix = totals[extended], totals[extended[:-1]]
                advantages[row, t] = with_v[0] / with_v[1] - prefix[0] / prefix[1]
                subset[row, t] = True
    return advantages, subset

"""Packing a rollout's tokens into a few dense sequences per arm, for the stacked forward (stacked.py).

Padded, a batch of P x G rows spends most of its arithmetic on padding and on each group's prompt G
times. Packed, every row's real tokens go into sequences of one width; a group's completions share one
copy of its prompt per sequence, each completion attending to that prompt and to itself (a prefix tree),
at the positions it has in its own row, so its log-probs are those of the padded batch. The width is
chosen per rollout from PACK_WIDTHS, the one with the fewest multiply-adds: more padding at one width
against longer attention at another.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .qwen3 import Qwen3Weights
from .rollout import Rollout

PACK_WIDTHS = (128, 160, 192, 224, 256)  # candidate sequence lengths (a longer row gets its own length)
PROMPT, PADDING = -1, -2  # the branch of a prompt's tokens; the group and branch of padding slots


@dataclass
class Packed:
    """A rollout's real tokens packed per arm: [A, bins, width] tensors and where each completion token went."""

    ids: torch.Tensor
    real: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor  # [A, bins, width, width]: which slots of its sequence each slot may attend to
    keep: torch.Tensor  # [A, K]: the flat slot (bin * width + offset) whose logits predict each target
    targets: torch.Tensor  # [A, K]: those completion tokens, arm by arm
    target_real: torch.Tensor  # [A, K] bool
    rows: torch.Tensor  # for each real target, its row and column in the [A * N, T] completion layout
    columns: torch.Tensor


@dataclass
class _Sequence:
    """One packed sequence under construction: per slot its token, position, group and branch.

    A prompt's tokens carry its group and branch PROMPT; a completion's carry its group and its own branch
    (its row), so it sees its group's prompt and itself.
    """

    width: int
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    group_of: list[int] = field(default_factory=list)
    branch_of: list[int] = field(default_factory=list)
    prompt_ends: dict[int, int] = field(default_factory=dict)  # group -> the slot after its prompt here
    completions: list[tuple[int, int, int]] = field(default_factory=list)  # (row, its prompt's last slot, first slot)

    def __len__(self) -> int:
        return len(self.ids)

    def room_for(self, group: int, prompt: list[int], completion: list[int]) -> bool:
        """Whether the completion fits, with its group's prompt unless the prompt is here already."""
        needed = len(completion) + (0 if group in self.prompt_ends else len(prompt))
        return len(self) + needed <= self.width

    def place(self, group: int, prompt: list[int], completion: list[int], row: int) -> None:
        """Add the completion, and its group's prompt if it is not here yet."""
        if group not in self.prompt_ends:
            self._add(prompt, range(len(prompt)), group, PROMPT)
            self.prompt_ends[group] = len(self)
        self.completions.append((row, self.prompt_ends[group] - 1, len(self)))
        self._add(completion, range(len(prompt), len(prompt) + len(completion)), group, row)

    def _add(self, tokens: list[int], positions: range, group: int, branch: int) -> None:
        self.ids += tokens
        self.positions += positions
        self.group_of += [group] * len(tokens)
        self.branch_of += [branch] * len(tokens)


def pack(rollout: Rollout, weights: Qwen3Weights) -> Packed:
    """The rollout's rows packed for the stacked forward of these weights (arm-major rows, A = weights.arms)."""
    tokens = [(p[m.bool()].tolist(), c[n.bool()].tolist()) for p, m, c, n in
              zip(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)]
    longest = max(len(p) + len(c) for p, c in tokens)
    widths = [w for w in PACK_WIDTHS if w >= longest] or [longest]
    per_key = attention_per_key(weights)
    packings = [first_fit(tokens, rollout.group_size, weights.arms, w) for w in widths]

    def cost(sequences: list[list[_Sequence]]) -> float:  # in units of one slot's linear-layer multiply-adds
        width = sequences[0][0].width
        return max(map(len, sequences)) * width * (1 + width * per_key)

    return _tensors(min(packings, key=cost), tokens)


def attention_per_key(weights: Qwen3Weights) -> float:
    """Attention's multiply-adds per query and key (scores and values, every head) over the linear layers'
    per token: what one more slot of sequence width costs each slot."""
    layer = weights.layers[0]
    linear = sum(w.shape[-2] * w.shape[-1] for w in layer.values() if w.dim() == 3)
    return 2 * weights.shape.heads * weights.shape.head_dim / linear


def first_fit(tokens: list[tuple[list[int], list[int]]], group_size: int, arms: int,
              width: int) -> list[list[_Sequence]]:
    """Each arm's rows, in order, each into the first sequence with room for it (its group's prompt added there
    unless another row of the group put it there already)."""
    per_arm = len(tokens) // arms
    sequences: list[list[_Sequence]] = [[] for _ in range(arms)]
    for row, (prompt, completion) in enumerate(tokens):
        group, bins = row // group_size, sequences[row // per_arm]
        sequence = next((s for s in bins if s.room_for(group, prompt, completion)), None)
        if sequence is None:
            sequence = _Sequence(width)
            bins.append(sequence)
        sequence.place(group, prompt, completion, row)
    return sequences


def _tensors(sequences: list[list[_Sequence]], tokens: list[tuple[list[int], list[int]]]) -> Packed:
    """The packed sequences as [A, bins, width] tensors, the attention mask, and each target's predictor."""
    arms, n_bins, width = len(sequences), max(map(len, sequences)), sequences[0][0].width
    ids = torch.zeros(arms, n_bins, width, dtype=torch.long)
    positions = torch.zeros(arms, n_bins, width, dtype=torch.long)
    group_of = torch.full((arms, n_bins, width), PADDING, dtype=torch.long)
    branch_of = torch.full((arms, n_bins, width), PADDING, dtype=torch.long)
    predictors: list[list[int]] = [[] for _ in range(arms)]  # per arm: the flat slot predicting each target
    targets: list[list[int]] = [[] for _ in range(arms)]
    rows, columns = [], []
    for arm, bins in enumerate(sequences):
        for b, sequence in enumerate(bins):
            used = slice(0, len(sequence))
            ids[arm, b, used] = torch.tensor(sequence.ids)
            positions[arm, b, used] = torch.tensor(sequence.positions)
            group_of[arm, b, used] = torch.tensor(sequence.group_of)
            branch_of[arm, b, used] = torch.tensor(sequence.branch_of)
            for row, prompt_last, start in sequence.completions:
                completion, offset = tokens[row][1], b * width
                # The prompt's last token predicts the first completion token, each completion token the next
                # (an empty completion has no target, so none of them).
                slots = [offset + prompt_last] + [offset + start + j for j in range(len(completion) - 1)]
                predictors[arm] += slots[: len(completion)]
                targets[arm] += completion
                rows += [row] * len(completion)
                columns += list(range(len(completion)))
    same_group = group_of[..., :, None] == group_of[..., None, :]
    # A prompt's key is seen by each of its branches, a completion's by its own branch only; padding slots
    # see only themselves (forward's key mask).
    allowed = same_group & ((branch_of[..., None, :] == PROMPT) | (branch_of[..., :, None] == branch_of[..., None, :]))
    k = max(map(len, targets))
    target_ids = torch.zeros(arms, k, dtype=torch.long)
    target_real = torch.zeros(arms, k, dtype=torch.bool)
    keep = torch.zeros(arms, k, dtype=torch.long)
    for arm in range(arms):
        target_ids[arm, : len(targets[arm])] = torch.tensor(targets[arm], dtype=torch.long)
        target_real[arm, : len(targets[arm])] = True
        keep[arm, : len(predictors[arm])] = torch.tensor(predictors[arm], dtype=torch.long)
    return Packed(ids, group_of != PADDING, positions, allowed, keep, target_ids, target_real,
                  torch.tensor(rows, dtype=torch.long), torch.tensor(columns, dtype=torch.long))

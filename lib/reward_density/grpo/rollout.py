"""What the sampler hands to the rewards and the loss: one batch of P prompts x G completions."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """P*G completions; rows g*G .. g*G+G-1 answer prompt g (the group).

    prompt_ids/prompt_mask: [N, Tp], left-padded.
    completion_ids/completion_mask: [N, T], right-padded; the mask includes the EOS token.
    sampler_logps: [N, T] log-probs of the sampled tokens at the sampling temperature (0 on padding).
    truncated: [N] bool, True where the completion hit the length cap without an EOS.
    prompts/completions: decoded text (special tokens skipped), one entry per row.
    answers: the gold answer of each row's problem (only the outcome reward reads it).
    questions: the bare question of each row's problem, for a PRM (None: the prompts are the questions).
    prefixes: the part of each row's completion already at the end of its prompt (T-SPMO's replay; None: none).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampler_logps: torch.Tensor
    truncated: torch.Tensor
    group_size: int
    prompts: list[str]
    completions: list[str]
    answers: list[str | None]
    questions: list[str] | None = None
    prefixes: list[str] | None = None

    @property
    def num_completions(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def whole_completions(self) -> list[str]:
        """Each row's completion as a reward scores it: its prefix (if restarted by replay), then the sampled text."""
        if self.prefixes is None:
            return self.completions
        return [prefix + text for prefix, text in zip(self.prefixes, self.completions, strict=True)]

    def rows(self, start: int, stop: int) -> Rollout:
        """Rows start..stop-1 as a rollout of their own (whole groups: one arm's share of a stacked rollout)."""
        if start % self.group_size or stop % self.group_size:
            raise ValueError(f"rows {start}..{stop} cut through a group of {self.group_size}")
        cut = slice(start, stop)
        return Rollout(
            self.prompt_ids[cut], self.prompt_mask[cut], self.completion_ids[cut], self.completion_mask[cut],
            self.sampler_logps[cut], self.truncated[cut], self.group_size, self.prompts[cut], self.completions[cut],
            self.answers[cut], None if self.questions is None else self.questions[cut],
            None if self.prefixes is None else self.prefixes[cut],
        )

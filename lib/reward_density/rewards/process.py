"""Process reward: a Math-Shepherd-style PRM scores every reasoning step; the score sits on the step's last token."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from ..data.steps import split_steps, step_end_tokens
from ..grpo.deposits import Deposits
from ..grpo.rollout import Rollout


def _single_token(tokenizer: Any, token: str, ids: list[int]) -> int:
    """The one id `ids` must hold, or a ValueError naming `token`."""
    if len(ids) != 1 or ids[0] == tokenizer.unk_token_id:
        raise ValueError(f"the PRM tokenizer cannot represent {token!r} as a single token (it encodes to {ids})")
    return ids[0]


def _tag_token(tokenizer: Any, step_tag: str) -> int:
    """Id of the token the PRM reads at a step tag, found by tokenizing the tag after some step text."""
    before = tokenizer.encode("1", add_special_tokens=False)
    after = tokenizer.encode("1" + step_tag, add_special_tokens=False)
    if after[: len(before)] != before or len(after) == len(before):
        raise ValueError(f"the PRM tokenizer merges the step tag {step_tag!r} into the text before it")
    # Like Math-Shepherd's encode("ки")[-1]: a lone leading-space piece may precede the tag token.
    tag_id = after[-1]
    if tokenizer.decode([tag_id]).strip() != step_tag.strip():
        raise ValueError(f"the PRM tokenizer cannot represent the step tag {step_tag!r} as a single token")
    return _single_token(tokenizer, step_tag, [tag_id])


class PRMScorer:
    """A causal-LM PRM (Math-Shepherd interface): P(good) = softmax(logit_good, logit_bad) at each step tag."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        step_tag: str = " ки",
        good_token: str = "+",
        bad_token: str = "-",
        max_length: int | None = None,
        batch_size: int = 32,
    ) -> None:
        self.model, self.tokenizer, self.step_tag, self.batch_size = model, tokenizer, step_tag, batch_size
        self.tag_id = _tag_token(tokenizer, step_tag)
        self.candidate_ids = [
            _single_token(tokenizer, t, tokenizer.encode(t, add_special_tokens=False)) for t in (good_token, bad_token)
        ]
        self.max_length = max_length or model.config.max_position_embeddings

    def encode(self, question: str, steps: list[str]) -> tuple[list[int], list[int], int]:
        """PRM input ids cut at the last tag that fits, the tag positions kept, and the number of steps lost."""
        question, steps = self._untagged(question), [self._untagged(s) for s in steps]
        text = f"{question} " + "\n".join(s + self.step_tag for s in steps)
        ids = self.tokenizer.encode(text)
        tags = [p for p, i in enumerate(ids) if i == self.tag_id]
        if len(tags) != len(steps):
            raise ValueError(f"found {len(tags)} step tags for {len(steps)} steps: the tag merged with its neighbours")
        kept = [p for p in tags if p < self.max_length]
        return ids[: kept[-1] + 1] if kept else [], kept, len(steps) - len(kept)

    def _untagged(self, text: str) -> str:
        """text without the tag's text, which would read as an extra tag; dropped until none is left, since one
        pass leaves a tag where two overlapped ("ккии")."""
        bare = self.step_tag.strip()
        while bare in text:
            text = text.replace(bare, "")
        return text

    def score(self, question: str, steps: list[str]) -> tuple[list[float], int]:
        """P(good) for each step that fits in the PRM's context, and the number of steps that did not."""
        scores, lost = self.score_batch([question], [steps])
        return scores[0], lost[0]

    @torch.no_grad()
    def score_batch(self, questions: list[str], steps_per_item: list[list[str]]) -> tuple[list[list[float]], list[int]]:
        """score() for many items, batch_size items per PRM forward."""
        encoded = [self.encode(q, s) for q, s in zip(questions, steps_per_item, strict=True)]
        scores: list[list[float]] = [[] for _ in encoded]
        todo = sorted((i for i, e in enumerate(encoded) if e[1]), key=lambda i: len(encoded[i][0]))
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start : start + self.batch_size]
            for i, probs in zip(batch, self._forward([encoded[i][0] for i in batch], [encoded[i][1] for i in batch])):
                scores[i] = probs
        return scores, [e[2] for e in encoded]

    def _forward(self, inputs: list[list[int]], tags: list[list[int]]) -> list[list[float]]:
        """One PRM forward over right-padded inputs; P(good) at each row's tag positions."""
        width, n_tags = max(map(len, inputs)), max(map(len, tags))
        ids = torch.zeros(len(inputs), width, dtype=torch.long)
        mask = torch.zeros(len(inputs), width, dtype=torch.long)
        keep = torch.zeros(len(inputs), n_tags, dtype=torch.long)  # padded with position 0, read and ignored
        for row, (x, t) in enumerate(zip(inputs, tags)):
            ids[row, : len(x)], mask[row, : len(x)], keep[row, : len(t)] = torch.tensor(x), 1, torch.tensor(t)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        device = self.model.device
        logits = self.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=position_ids.to(device),
            logits_to_keep=keep.to(device),  # only the tag positions go through the LM head
        ).logits
        probs = torch.softmax(logits[..., self.candidate_ids].float(), dim=-1)[..., 0].cpu()
        return [probs[row, : len(t)].tolist() for row, t in enumerate(tags)]


class ProcessReward:
    """One deposit per reasoning step the PRM sees: its P(good) on the student's last token of the step (steps
    ending on one token share it, averaged; steps past the PRM's length limit get none)."""

    def __init__(self, scorer: PRMScorer, student_tokenizer: Any) -> None:
        self.scorer, self.tokenizer = scorer, student_tokenizer

    def __call__(self, rollout: Rollout) -> Deposits:
        """Score every row's steps with the PRM (question and steps only, never the gold answer)."""
        if any(rollout.prefixes or []):
            raise ValueError("the process reward does not score completions restarted by replay: their steps before "
                             "the restart have no tokens to carry a deposit")
        n, width = rollout.completion_ids.shape
        completion_ids, completion_mask = rollout.completion_ids.cpu(), rollout.completion_mask.cpu().bool()
        steps_per_row, ends_per_row = [], []
        for i in range(n):
            positions = completion_mask[i].nonzero().squeeze(-1)
            steps = split_steps(rollout.completions[i])
            ends = step_end_tokens(self.tokenizer, completion_ids[i, positions].tolist(), rollout.completions[i], steps)
            steps_per_row.append([s.text for s in steps])
            ends_per_row.append(positions[ends].tolist())
        scores, lost = self.scorer.score_batch(list(rollout.questions or rollout.prompts), steps_per_row)

        token_rewards = torch.zeros(n, width)
        deposit_mask = torch.zeros(n, width, dtype=torch.bool)
        trajectory_rewards = torch.zeros(n)
        sharing = 0
        for i in range(n):
            # Lost steps are the last ones, so the scores line up with the first step ends.
            by_token: dict[int, list[float]] = defaultdict(list)
            for position, p in zip(ends_per_row[i], scores[i]):
                by_token[position].append(p)
            sharing += len(scores[i]) - len(by_token)
            for position, ps in by_token.items():
                token_rewards[i, position], deposit_mask[i, position] = sum(ps) / len(ps), True
            if scores[i]:
                trajectory_rewards[i] = sum(scores[i]) / len(scores[i])
        device = rollout.completion_ids.device
        return Deposits(
            token_rewards=token_rewards.to(device),
            deposit_mask=deposit_mask.to(device),
            trajectory_rewards=trajectory_rewards.to(device),
            counters={
                "process/steps_mean": sum(map(len, steps_per_row)) / max(n, 1),
                "process/steps_lost": float(sum(lost)),
                "process/steps_sharing_token": float(sharing),
                "process/no_steps": float(sum(not s for s in steps_per_row)),
            },
        )

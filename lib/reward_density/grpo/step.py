"""One GRPO step: sample -> rewards -> advantages -> loss -> clip -> optimizer step -> metrics row.

grpo_step updates one Policy (any causal LM, peft LoRA or FullFT); stacked_grpo_step updates every arm
of a StackedPolicy in one batched pass (the mini world's engine), one metrics row per arm.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from ..data.answer_check import checker_class
from ..data.problems import Problem
from ..data.steps import split_steps
from .advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from .deposits import Deposits, RewardModule
from .logprobs import completion_logprobs, micro_batches
from .loss import BatchTotals, LossConfig, LossOutput, grpo_loss, scores_reference
from .policy import Policy
from .precision import autocast, check_precision
from .prefix_trie import prefix_advantages
from .replay import ReplayBuffer
from .rollout import Rollout
from .sampler import SamplingConfig, sample_rollout, special_token_ids
from .stacked import StackedPolicy
from .token_selection import TokenSelection, select_tokens

REPLAY_SEED_OFFSET = 500_009  # the replay update's sampling stream, apart from every step's own
# S-GRPO's coins: a stream apart from the step's sampling, whose draws chose the tokens (Eq. 6's coins are independent)
TOKEN_SELECTION_SEED_OFFSET = 700_001


@dataclass(frozen=True)
class StepConfig:
    """Everything a GRPO step needs besides the models (paper Table 1 values in params/)."""

    group_size: int
    sampling: SamplingConfig
    loss: LossConfig = field(default_factory=LossConfig)
    advantage_eps: float = 1e-4
    max_grad_norm: float = 1.0
    track_kl: bool = False  # score the reference even when beta = 0, to plot KL against rank
    precision: str = "fp32"  # or "bf16": forward passes under bf16 autocast (precision.py)
    micro_batch_size: int | None = None  # rows per forward/backward pass; None: the whole batch at once
    advantage_estimator: str = "group"  # group: GRPO's (Eq. 3-4); prefix_trie: T-SPMO's over the group's trie
    token_selection: TokenSelection | None = None  # S-GRPO's subset of tokens in the loss; None: all (GRPO)
    l2: float = 0.0  # lambda of T-SPMO's penalty lambda * sum ||W||^2 on the LoRA weights (its Eq. 10)
    answer_format: str = "boxed"  # how the task states an answer (data/answer_check.py): for frac_answered

    def __post_init__(self) -> None:
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown advantage estimator {self.advantage_estimator!r}; expected one of "
                             f"{ADVANTAGE_ESTIMATORS}")
        if not self.l2 >= 0:
            raise ValueError(f"the L2 penalty must be >= 0, got {self.l2}")
        if not (isinstance(self.group_size, int) and self.group_size >= 1):
            raise ValueError(f"group_size must be a positive integer, got {self.group_size!r}")
        if self.sampling.temperature == 0:
            raise ValueError("GRPO samples its groups: the sampling temperature must be > 0")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        check_precision(self.precision)
        checker_class(self.answer_format)
        size = self.micro_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"micro_batch_size must be a positive integer or None, got {size!r}")


def grpo_step(
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    problems: Sequence[Problem],
    reward: RewardModule,
    config: StepConfig,
    seed: int,
    replay: ReplayBuffer | None = None,
) -> dict[str, float]:
    """Run one GRPO update on P problems x G samples and return its metrics row; with a replay buffer (T-SPMO),
    then a second update on groups restarted from inside stored completions (replay.py)."""
    start = time.perf_counter()
    model = policy.model
    model.eval()
    device = next(model.parameters()).device
    with autocast(device, config.precision), policy.sampling() as sampler:
        rollout = sample_rollout(sampler, tokenizer, problems, config.group_size, config.sampling, seed)
    generated = time.perf_counter()

    with autocast(device, config.precision):
        deposits = reward(rollout)
    advantages, subset = loss_inputs(rollout, deposits, config, seed)
    rewarded = time.perf_counter()

    ref_logps = None
    if scores_reference(config.loss.beta, config.track_kl):
        with autocast(device, config.precision):
            ref_logps = policy.reference_logprobs(rollout, config.sampling.temperature, config.micro_batch_size)
    referenced = time.perf_counter()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = _backward(model, device, rollout, advantages, subset, ref_logps, config)
    out.loss += l2_penalty(policy.trainable_parameters() if policy.config.is_lora else [], config.l2)
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), config.max_grad_norm)
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the optimizer's kernels are queued, not done: stop the clock after them
    done = time.perf_counter()

    timings = {"step_seconds": done - start, "generate_seconds": generated - start,
               "reward_seconds": rewarded - generated, "reference_seconds": referenced - rewarded,
               "train_seconds": done - referenced}
    row = step_metrics(rollout, deposits, advantages, subset, out, float(grad_norm), config) | timings
    if replay is None:
        return row
    replay.add(problems, rollout, deposits.trajectory_rewards, special_token_ids(tokenizer)[0])
    replayed = replay.draw(tokenizer)
    if not replayed:
        return row | {"replayed": 0}
    again = grpo_step(policy, tokenizer, optimizer, replayed, reward, config, seed=seed + REPLAY_SEED_OFFSET)
    # The second update's completions enter a loss too: what counts tokens per completion must weigh both.
    return row | {"replayed": len(replayed), "replay_loss": again["loss"], "replay_reward_mean": again["reward_mean"],
                  "completions": rollout.num_completions, "replay_completions": len(replayed) * config.group_size,
                  "replay_loss_tokens": again["loss_tokens"], "replay_len_mean": again["len_mean"]}


def loss_inputs(rollout: Rollout, deposits: Deposits, config: StepConfig,
                seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the loss weights each token's log-prob by, and which tokens it counts (None: every valid one).

    group: GRPO's advantages from the deposits (Eq. 3-4). prefix_trie: T-SPMO's A(v | p) from the trajectory
    rewards, once per unique transition, times the token's sampled probability: its objective is
    pi_theta(v | p) A(v | p) (Eq. 10), whose gradient at the sampled policy is the ratio surrogate's with that
    weight. A token selection (S-GRPO, Eq. 6; coins drawn from the step's seed, apart from its sampling) then
    keeps a subset of those tokens.
    """
    if config.advantage_estimator == "prefix_trie":
        advantages, subset = prefix_advantages(rollout.completion_ids, rollout.completion_mask,
                                               deposits.trajectory_rewards, config.group_size)
        advantages = advantages * rollout.sampler_logps.exp()
    else:
        advantages = compute_advantages(deposits.token_rewards, deposits.deposit_mask, rollout.completion_mask,
                                        config.group_size, config.advantage_eps)
        subset = None
    if config.token_selection is not None:
        coins = torch.Generator().manual_seed(seed + TOKEN_SELECTION_SEED_OFFSET)
        chosen = select_tokens(rollout.completion_mask, config.token_selection, coins, config.sampling.max_new_tokens)
        subset = chosen if subset is None else subset & chosen
    return advantages, subset


def l2_penalty(parameters: Sequence[torch.Tensor], coefficient: float) -> torch.Tensor:
    """lambda * sum ||W||^2 over the parameters, its gradient accumulated; 0 (and nothing done) at lambda 0 or
    without parameters. T-SPMO's Eq. 10 penalises the LoRA weights: a FullFT arm passes none (its weights are
    the pretrained model's, which the penalty would shrink towards 0)."""
    if coefficient == 0 or not parameters:
        return torch.zeros(())
    penalty = coefficient * sum(p.pow(2).sum() for p in parameters)
    penalty.backward()
    return penalty.detach().cpu()


def step_metrics(rollout: Rollout, deposits: Deposits, advantages: torch.Tensor, subset: torch.Tensor | None,
                 out: LossOutput, grad_norm: float, config: StepConfig) -> dict[str, float]:
    """The metrics row of one policy's step: statistics over valid tokens only."""
    answered = checker_class(config.answer_format).has_answer
    mask = rollout.completion_mask.bool()
    valid = advantages[mask]
    lengths = mask.sum(-1).float()
    in_loss = mask if subset is None else mask & subset
    return {
        "loss": float(out.loss.detach()),
        "reward_mean": float(deposits.trajectory_rewards.mean()),
        "advantage_std": float(valid.std()) if valid.numel() > 1 else 0.0,
        "advantage_abs_max": float(valid.abs().max()) if valid.numel() else 0.0,
        "kl_ref": out.kl_ref,
        "clip_frac": out.clip_frac,
        "ratio_mean": out.ratio_mean,
        "grad_norm": grad_norm,
        "loss_tokens": float(in_loss.sum(-1).float().mean()),  # per completion (the token-selection papers' Table 3)
        "len_mean": float(lengths.mean()),
        "len_max": float(lengths.max()),
        "frac_truncated": float(rollout.truncated.float().mean()),
        "frac_answered": sum(map(answered, rollout.completions)) / rollout.num_completions,
        "steps_mean": sum(len(split_steps(t)) for t in rollout.completions) / rollout.num_completions,
        "deposits_mean": float(deposits.deposit_mask.sum(-1).float().mean()),  # per completion: the reward's density
        **deposits.counters,
    }


def stacked_grpo_step(
    policy: StackedPolicy,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    problems: Sequence[Problem],
    reward: RewardModule,
    config: StepConfig,
    seed: int,
) -> list[dict[str, float]]:
    """One GRPO update of every arm of a stacked policy on the same problems; one metrics row per arm.

    Each arm samples with the same random stream, gets its own rewards, advantages and loss, and its
    gradient is clipped on its own: per arm, exactly grpo_step on that arm's policy. Sampling and the
    forward passes run stacked; the timings are the whole step's, shared by its arms.
    """
    start = time.perf_counter()
    if config.precision != "fp32":
        raise ValueError("the stacked engine runs in fp32")
    with torch.no_grad():
        rollout = sample_rollout(policy.weights(), tokenizer, problems, config.group_size, config.sampling, seed)
    generated = time.perf_counter()

    per_arm = rollout.num_completions // policy.n_arms
    shares = [rollout.rows(a * per_arm, (a + 1) * per_arm) for a in range(policy.n_arms)]
    deposits = [reward(share) for share in shares]
    advantages, subsets = zip(*(loss_inputs(share, d, config, seed) for share, d in zip(shares, deposits)))
    rewarded = time.perf_counter()

    temperature = config.sampling.temperature
    scored = scores_reference(config.loss.beta, config.track_kl)
    ref_logps = policy.reference_logprobs(rollout, temperature) if scored else None
    referenced = time.perf_counter()
    logps = policy.logprobs(rollout, temperature)
    outs = []
    for a, share in enumerate(shares):
        rows = slice(a * per_arm, (a + 1) * per_arm)
        outs.append(grpo_loss(logps[rows], share.sampler_logps, advantages[a], share.completion_mask, config.loss,
                              ref_logps=None if ref_logps is None else ref_logps[rows], token_subset=subsets[a]))
    optimizer.zero_grad(set_to_none=True)
    sum(out.loss for out in outs).backward()
    for a, out in enumerate(outs):
        lora = policy.parameters(a) if policy.configs[a].is_lora else []
        out.loss = out.loss.detach() + l2_penalty(lora, config.l2)
    grad_norms = [torch.nn.utils.clip_grad_norm_(policy.parameters(a), config.max_grad_norm)
                  for a in range(policy.n_arms)]
    optimizer.step()
    done = time.perf_counter()

    timings = {"step_seconds": done - start, "generate_seconds": generated - start,
               "reward_seconds": rewarded - generated, "reference_seconds": referenced - rewarded,
               "train_seconds": done - referenced, "arms": policy.n_arms}
    return [step_metrics(share, d, adv, subset, out, float(norm), config) | timings
            for share, d, adv, subset, out, norm in zip(shares, deposits, advantages, subsets, outs, grad_norms)]


def _backward(
    model: torch.nn.Module, device: torch.device, rollout, advantages: torch.Tensor, subset: torch.Tensor | None,
    ref_logps: torch.Tensor | None, config: StepConfig,
) -> LossOutput:
    """Loss and gradients one micro-batch at a time; they add up to the whole batch's (loss.BatchTotals)."""
    mask = rollout.completion_mask
    in_loss = mask.bool() if subset is None else mask.bool() & subset
    totals = BatchTotals(rows=mask.shape[0], tokens=float(in_loss.sum()))
    total = LossOutput(torch.zeros(()), 0.0, 0.0, 0.0)
    for rows in micro_batches(mask.shape[0], config.micro_batch_size):
        with autocast(device, config.precision):
            logps = completion_logprobs(model, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                        rollout.completion_ids[rows], mask[rows], config.sampling.temperature)
            out = grpo_loss(logps, rollout.sampler_logps[rows], advantages[rows], mask[rows], config.loss,
                            ref_logps=None if ref_logps is None else ref_logps[rows],
                            token_subset=None if subset is None else subset[rows], totals=totals)
        out.loss.backward()
        share = float(in_loss[rows].sum()) / max(totals.tokens, 1)  # statistics: token-weighted means
        total.loss += out.loss.detach().cpu()
        total.kl_ref += out.kl_ref * share
        total.clip_frac += out.clip_frac * share
        total.ratio_mean += out.ratio_mean * share
    return total

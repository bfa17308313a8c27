"""Theorem 1 of "LoRA as an Implicit KL Regularizer in GRPO Fine-Tuning: From Theory to Practice" on Optdigits.

The paper (Section 5.1) checks its KL bound on a one-hidden-layer network: k = 64 pixels go through a hidden
layer of d = 256 sigmoid units whose weight W0 (d x k) carries LoRA adapters, z = (W0 + B A) x, and the
paper's policy is that layer's output pi(x) = sigmoid(z) (its Table 1). A head turns pi(x) into one binary
prediction trained with BCE. The base (W0 and the head) is pretrained in full, then frozen, and only A and B
are fine-tuned with plain SGD and gradient clipping; the empirical KL D_KL(pi_t(x_e) || pi_0(x_e)) is set
against the bound of Eq. (5), mu(r) * exp(mu(r)).

Choices the paper leaves open, made here:
- pi(x_e) is a vector of d sigmoids, while Proposition 2 and Theorem 1 read it as a distribution over the d
  units (they take expectations over j ~ pi_0(x_e)); the empirical KL therefore normalises pi over the units,
  p = pi / sum(pi), and reports D_KL(p_t || p_0) per evaluation input, averaged over the evaluation inputs
  (and its maximum over them: the theorem holds for any single x_e).
- A0 and B0 have i.i.d. N(0, 1) entries (Assumption 1, `lora_init="assumption1"`); `lora_init="lora"` is the
  LoRA paper's Gaussian A and zero B instead. Either way the reference policy pi_0 is the model at the start
  of fine-tuning, z_0 = (W0 + B0 A0) x, as in the paper's Eq. (2).
- Inputs are standardised on the training split (Assumption 2: mean-zero, unit-variance entries).
- The binary label is "the digit is odd"; the base is pretrained on the same label with Adam.
- Gradient clipping is PyTorch's joint L2-norm clipping of the (A, B) gradient, and its threshold is the G
  of Assumption 3 and Eq. (7).
- t is the number of SGD steps: epochs x ceil(n_train / batch_size), the last batch of an epoch being smaller.
- Everything runs in float64: steps of lr x clip = 1e-11 are below float32's resolution at weights of order
  one. The adapters are trained as displacements from A0 and B0 (same gradients, same SGD steps), so that
  Delta A_t and Delta B_t, and the logit shift, keep their own precision.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from tqdm.auto import tqdm

INPUTS = 64  # k: the 8 x 8 pixels of a digit
_LARGEST_EXPONENT = math.log(np.finfo(np.float64).max)  # exp of more overflows a float
LORA_INITS = ("assumption1", "lora")
DTYPE = torch.float64


def lora_constant(eta: float, k: int, grad_bound: float, steps: int) -> float:
    """C := eta sqrt(k) G t (1 + eta sqrt(k) G)^t, Eq. (7) of the paper named in the module docstring; inf past
    a float's range."""
    rate = eta * math.sqrt(k) * grad_bound
    try:
        return rate * steps * (1.0 + rate) ** steps
    except OverflowError:
        return math.inf


def logit_shift_bound(
    rank: int, k: int, a0_norm: float, b0_norm: float, delta_a_norm: float, delta_b_norm: float,
) -> float:
    """mu(r) := sqrt(r k) (||B0||_2 ||Delta A_t||_2 + ||A0||_2 ||Delta B_t||_2), defined with Theorem 1."""
    return math.sqrt(rank * k) * (b0_norm * delta_a_norm + a0_norm * delta_b_norm)


def kl_bound(
    rank: int, k: int, a0_norm: float, b0_norm: float, delta_a_norm: float, delta_b_norm: float,
) -> float:
    """The bound mu(r) exp(mu(r)) of Theorem 1, Eq. (5), of "LoRA as an Implicit KL Regularizer in GRPO
    Fine-Tuning: From Theory to Practice".

    rank: the LoRA rank r; k: the input dimension (columns of W0); a0_norm, b0_norm: spectral norms of the
    adapters at the start of fine-tuning, ||A0||_2 and ||B0||_2; delta_a_norm, delta_b_norm: spectral norms of
    their displacement after t SGD steps, ||A_t - A0||_2 and ||B_t - B0||_2.
    """
    mu = logit_shift_bound(rank, k, a0_norm, b0_norm, delta_a_norm, delta_b_norm)
    return mu * math.exp(mu)


def kl_bound_high_probability(rank: int, d: int, k: int, eta: float, grad_bound: float, steps: int) -> float:
    """C (2 sqrt(r) + sqrt(d) + sqrt(k))^2 exp(C (2 sqrt(r) + sqrt(d) + sqrt(k))^2), Theorem 1, Eq. (6)."""
    shift = lora_constant(eta, k, grad_bound, steps) * (2 * math.sqrt(rank) + math.sqrt(d) + math.sqrt(k)) ** 2
    return shift * math.exp(shift) if shift <= _LARGEST_EXPONENT else math.inf


@dataclass(frozen=True)
class OptdigitsConfig:
    """Settings of the paper's Section 5.1 experiment (defaults are the paper's, or the choices above)."""

    ranks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    seeds: int = 20  # seeds 0 .. seeds - 1
    epochs: int = 30  # LoRA fine-tuning epochs
    batch_size: int = 64
    lr: float = 1e-8  # eta
    grad_clip: float = 1e-3  # G
    hidden: int = 256  # d
    lora_init: str = "assumption1"
    positive_digits: tuple[int, ...] = (1, 3, 5, 7, 9)
    eval_fraction: float = 0.2  # held-out inputs x_e
    split_seed: int = 0
    pretrain_epochs: int = 20
    pretrain_lr: float = 1e-2  # Adam

    def __post_init__(self) -> None:
        for name in ("seeds", "epochs", "batch_size", "hidden", "pretrain_epochs"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("lr", "grad_clip", "pretrain_lr"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if not isinstance(self.ranks, tuple) or not self.ranks:
            raise ValueError(f"ranks must be a non-empty tuple of positive integers, got {self.ranks!r}")
        largest = min(self.hidden, INPUTS)
        for rank in self.ranks:
            if not _is_int(rank) or rank < 1:
                raise ValueError(f"ranks: every rank must be a positive integer, got {rank!r}")
            if rank > largest:
                raise ValueError(f"ranks: rank {rank} exceeds min(d, k) = min({self.hidden}, {INPUTS}) = {largest}")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ranks must not repeat, got {self.ranks!r}")
        if self.lora_init not in LORA_INITS:
            raise ValueError(f"lora_init must be one of {LORA_INITS}, got {self.lora_init!r}")
        digits = self.positive_digits
        if not isinstance(digits, tuple) or not all(_is_int(x) and 0 <= x <= 9 for x in digits) \
                or not 0 < len(set(digits)) < 10:
            raise ValueError(f"positive_digits must be a tuple of some but not all of the digits 0-9, got {digits!r}")
        if not isinstance(self.eval_fraction, float) or not 0 < self.eval_fraction < 1:
            raise ValueError(f"eval_fraction must be a float strictly between 0 and 1, got {self.eval_fraction!r}")
        if not _is_int(self.split_seed) or self.split_seed < 0:
            raise ValueError(f"split_seed must be a non-negative integer, got {self.split_seed!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class OptdigitsData:
    """Standardised training and evaluation inputs (n x k, float64) and binary labels (n, float64)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_eval: torch.Tensor
    y_eval: torch.Tensor


@dataclass(frozen=True)
class BaseModel:
    """The pretrained, frozen base: hidden weight W0 (d x k), head weight (d,) and bias, eval accuracy."""

    w0: torch.Tensor
    head: torch.Tensor
    bias: torch.Tensor
    accuracy: float


def load_optdigits(config: OptdigitsConfig) -> OptdigitsData:
    """scikit-learn's bundled Optdigits test set (1797 x 64), split, standardised on the training part."""
    digits = load_digits()
    labels = np.isin(digits.target, config.positive_digits).astype(np.float64)
    x_train, x_eval, y_train, y_eval = train_test_split(
        digits.data, labels, test_size=config.eval_fraction, random_state=config.split_seed, stratify=digits.target,
    )
    scaler = StandardScaler().fit(x_train)  # a pixel constant in training is only centred (0 there)
    as_tensor = lambda a: torch.as_tensor(a, dtype=DTYPE)  # noqa: E731
    return OptdigitsData(
        as_tensor(scaler.transform(x_train)), as_tensor(y_train),
        as_tensor(scaler.transform(x_eval)), as_tensor(y_eval),
    )


def _batches(n: int, batch_size: int, generator: torch.Generator):
    order = torch.randperm(n, generator=generator)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def _output_logit(z: torch.Tensor, head: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(z) @ head + bias


def pretrain_base(config: OptdigitsConfig, data: OptdigitsData, seed: int) -> BaseModel:
    """Train W0 and the head in full with Adam and BCE (no adapters); the result is frozen."""
    generator = torch.Generator().manual_seed(seed)
    d, k = config.hidden, INPUTS
    # PyTorch's default Linear initialisation, drawn from the seed's own generator
    w0 = ((torch.rand(d, k, generator=generator, dtype=DTYPE) * 2 - 1) / math.sqrt(k)).requires_grad_()
    head = ((torch.rand(d, generator=generator, dtype=DTYPE) * 2 - 1) / math.sqrt(d)).requires_grad_()
    bias = torch.zeros((), dtype=DTYPE, requires_grad=True)
    optimizer = torch.optim.Adam([w0, head, bias], lr=config.pretrain_lr)
    for _ in range(config.pretrain_epochs):
        for rows in _batches(len(data.x_train), config.batch_size, generator):
            logit = _output_logit(data.x_train[rows] @ w0.T, head, bias)
            loss = F.binary_cross_entropy_with_logits(logit, data.y_train[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        logit = _output_logit(data.x_eval @ w0.T, head, bias)
        accuracy = ((logit > 0).to(DTYPE) == data.y_eval).to(DTYPE).mean().item()
    return BaseModel(w0.detach(), head.detach(), bias.detach(), accuracy)


def policy_kl(z0: torch.Tensor, dz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per input (rows): D_KL(p_t || p_0) of the unit-normalised policies, and ||Delta log pi||_inf (Eq. (3)).

    z0 are the reference logits z_0(x_e) and dz the shift Delta z_t(x_e) = z_t(x_e) - z_0(x_e) (n x d).
    """
    # log sigma(z0 + dz) - log sigma(z0) = -log1p((1 - sigma(z0)) expm1(-dz)), exact and free of cancellation
    dlogpi = -torch.log1p(torch.sigmoid(-z0) * torch.expm1(-dz))
    p0 = torch.softmax(F.logsigmoid(z0), dim=-1)  # pi_0 / sum(pi_0)
    log_ratio = dlogpi - torch.log1p((p0 * torch.expm1(dlogpi)).sum(-1, keepdim=True))  # log p_t - log p_0
    # sum p_t log(p_t / p_0) = sum p_0 (l e^l - e^l + 1), as sum p_0 e^l = 1; the terms are O(l^2), not O(l)
    kl = (p0 * (log_ratio * torch.exp(log_ratio) - torch.expm1(log_ratio))).sum(-1)
    return kl, dlogpi.abs().amax(-1)


def _spectral_norm(matrix: torch.Tensor) -> float:
    return torch.linalg.matrix_norm(matrix, ord=2).item()


def finetune_lora(config: OptdigitsConfig, data: OptdigitsData, base: BaseModel, rank: int, seed: int) -> dict:
    """Fine-tune A and B of one rank on the frozen base; the row of `run_grid` for (seed, rank)."""
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))
    d, k = config.hidden, INPUTS
    a0 = torch.randn(rank, k, generator=generator, dtype=DTYPE)
    b0 = torch.randn(d, rank, generator=generator, dtype=DTYPE) if config.lora_init == "assumption1" \
        else torch.zeros(d, rank, dtype=DTYPE)
    # A = A0 + delta_a and B = B0 + delta_b: the same parameters for SGD, with the displacements kept exact
    delta_a = torch.zeros(rank, k, dtype=DTYPE, requires_grad=True)
    delta_b = torch.zeros(d, rank, dtype=DTYPE, requires_grad=True)
    optimizer = torch.optim.SGD([delta_a, delta_b], lr=config.lr)
    steps = clipped = 0
    for _ in range(config.epochs):
        for rows in _batches(len(data.x_train), config.batch_size, generator):
            x = data.x_train[rows]
            z = x @ base.w0.T + (x @ (a0 + delta_a).T) @ (b0 + delta_b).T
            loss = F.binary_cross_entropy_with_logits(_output_logit(z, base.head, base.bias), data.y_train[rows])
            optimizer.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_([delta_a, delta_b], config.grad_clip)
            clipped += int(norm.item() > config.grad_clip)
            optimizer.step()
            steps += 1
    with torch.no_grad():
        x = data.x_eval
        z0 = x @ base.w0.T + (x @ a0.T) @ b0.T
        dz = (x @ delta_a.T) @ b0.T + (x @ a0.T) @ delta_b.T + (x @ delta_a.T) @ delta_b.T
        kl, dlogpi = policy_kl(z0, dz)
    norms = dict(a0_norm=_spectral_norm(a0), b0_norm=_spectral_norm(b0),
                 delta_a_norm=_spectral_norm(delta_a.detach()), delta_b_norm=_spectral_norm(delta_b.detach()))
    return dict(
        seed=seed, rank=rank, empirical_kl=kl.mean().item(), empirical_kl_max=kl.max().item(),
        bound=kl_bound(rank, k, **norms), mu=logit_shift_bound(rank, k, **norms),
        bound_eq6=kl_bound_high_probability(rank, d, k, config.lr, config.grad_clip, steps),
        c=lora_constant(config.lr, k, config.grad_clip, steps), max_abs_dlogpi=dlogpi.max().item(),
        **norms, eta=config.lr, grad_bound=config.grad_clip, steps=steps, d=d, k=k,
        clipped_fraction=clipped / steps, base_accuracy=base.accuracy,
    )


def run_grid(config: OptdigitsConfig, progress: bool = True) -> pd.DataFrame:
    """One row per (seed, rank): empirical KL, the Eq. (5) bound (and Eq. (6)), and what they are made of."""
    data = load_optdigits(config)
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # these matrices are tiny: more threads only add contention
    try:
        with tqdm(total=config.seeds * len(config.ranks), desc="seed x rank", disable=not progress) as bar:
            for seed in range(config.seeds):
                base = pretrain_base(config, data, seed)  # one base per seed, shared by its ranks
                for rank in config.ranks:
                    rows.append(finetune_lora(config, data, base, rank, seed))
                    bar.update()
    finally:
        torch.set_num_threads(threads)
    return pd.DataFrame(rows)


def bound_violations(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows where an empirical KL (mean or worst input) exceeds the Eq. (5) bound."""
    return frame[(frame.empirical_kl > frame.bound) | (frame.empirical_kl_max > frame.bound)]


def shift_violations(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows where the step Eq. (5) takes before its bound, ||Delta log pi(x_e)||_inf <= mu(r), fails for some
    evaluation input. The KL is second order in that shift and the bound first order, so the KL bound holds with
    a gap of about 1 / mu(r) whatever the adapters do; this step compares first order with first order."""
    return frame[frame.max_abs_dlogpi > frame.mu]


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per rank over seeds: mean and sd of the empirical KL and the bounds, and log10(bound / KL)."""
    looseness = np.log10(frame.bound / frame.empirical_kl).rename("log10_gap")
    grouped = pd.concat([frame, looseness], axis=1).groupby("rank")
    table = grouped[["empirical_kl", "bound", "bound_eq6", "log10_gap"]].agg(["mean", "std"])
    table.columns = [f"{name}_{stat}" for name, stat in table.columns]
    return table.assign(seeds=grouped.size())


def summary_markdown(table: pd.DataFrame) -> str:
    """`summary` as a markdown table: mean ± sd per rank."""
    pairs = [("empirical KL", "empirical_kl", ".3e"), ("bound, Eq. (5)", "bound", ".3e"),
             ("bound, Eq. (6)", "bound_eq6", ".3e"), ("log10(bound / KL)", "log10_gap", ".2f")]
    lines = ["| r | " + " | ".join(title for title, _, _ in pairs) + " | seeds |",
             "|---:|" + "---:|" * (len(pairs) + 1)]
    for rank, row in table.iterrows():
        cells = [f"{row[f'{name}_mean']:{fmt}} ± {row[f'{name}_std']:{fmt}}" for _, name, fmt in pairs]
        lines.append(f"| {rank} | " + " | ".join(cells) + f" | {int(row['seeds'])} |")
    return "\n".join(lines)

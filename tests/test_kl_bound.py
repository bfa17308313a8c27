"""Theorem 1 of "LoRA as an Implicit KL Regularizer in GRPO Fine-Tuning: From Theory to Practice" on Optdigits."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from reward_density.experiment.kl_bound import (
    OptdigitsConfig,
    bound_violations,
    kl_bound,
    kl_bound_high_probability,
    lora_constant,
    policy_kl,
    run_grid,
    shift_violations,
    summary,
    summary_markdown,
)


def test_constant_c_of_eq7_matches_a_hand_computation():
    # C = eta sqrt(k) G t (1 + eta sqrt(k) G)^t
    assert lora_constant(eta=0.1, k=1, grad_bound=1.0, steps=1) == pytest.approx(0.1 * 1 * 1.1)
    assert lora_constant(eta=0.1, k=4, grad_bound=0.5, steps=2) == pytest.approx(0.1 * 2 * 0.5 * 2 * 1.1**2)


def test_bound_of_eq5_matches_a_hand_computation():
    # mu = sqrt(r k) (||B0|| ||dA|| + ||A0|| ||dB||) = sqrt(1 * 4) (3 * 0.01 + 2 * 0.02) = 0.14
    bound = kl_bound(rank=1, k=4, a0_norm=2.0, b0_norm=3.0, delta_a_norm=0.01, delta_b_norm=0.02)
    assert bound == pytest.approx(0.14 * math.exp(0.14))


def test_bound_of_eq6_matches_a_hand_computation():
    # C = 0.1 * 1 * 1 * 1 * 1.1 = 0.11; (2 sqrt(1) + sqrt(4) + sqrt(1))^2 = 25; C * 25 = 2.75
    bound = kl_bound_high_probability(rank=1, d=4, k=1, eta=0.1, grad_bound=1.0, steps=1)
    assert bound == pytest.approx(2.75 * math.exp(2.75))


def test_bounds_grow_with_the_rank_at_fixed_other_arguments():
    ranks = [1, 2, 4, 8, 16, 32, 64]
    eq5 = [kl_bound(r, 64, 10.0, 20.0, 1e-3, 2e-3) for r in ranks]
    eq6 = [kl_bound_high_probability(r, 256, 64, 1e-3, 1e-2, 100) for r in ranks]
    assert all(a < b for a, b in zip(eq5, eq5[1:]))
    assert all(a < b for a, b in zip(eq6, eq6[1:]))


def test_policy_kl_is_the_kl_of_the_unit_normalised_sigmoids():
    generator = torch.Generator().manual_seed(0)
    z0 = 3 * torch.randn(5, 16, generator=generator, dtype=torch.float64)
    dz = 0.1 * torch.randn(5, 16, generator=generator, dtype=torch.float64)
    p0 = torch.sigmoid(z0) / torch.sigmoid(z0).sum(-1, keepdim=True)
    pt = torch.sigmoid(z0 + dz) / torch.sigmoid(z0 + dz).sum(-1, keepdim=True)
    kl, dlogpi = policy_kl(z0, dz)
    torch.testing.assert_close(kl, (pt * (pt.log() - p0.log())).sum(-1))
    torch.testing.assert_close(dlogpi, (torch.sigmoid(z0 + dz).log() - torch.sigmoid(z0).log()).abs().amax(-1))


def test_policy_kl_keeps_its_precision_for_shifts_far_below_float_resolution():
    # for tiny shifts the KL is half the p0-variance of Delta log pi (to second order), here ~1e-20
    generator = torch.Generator().manual_seed(1)
    z0 = 3 * torch.randn(4, 32, generator=generator, dtype=torch.float64)
    dz = 1e-9 * torch.randn(4, 32, generator=generator, dtype=torch.float64)
    p0 = torch.softmax(torch.nn.functional.logsigmoid(z0), -1)
    delta = torch.sigmoid(-z0) * dz
    variance = (p0 * delta**2).sum(-1) - (p0 * delta).sum(-1) ** 2
    torch.testing.assert_close(policy_kl(z0, dz)[0], variance / 2, rtol=1e-6, atol=0.0)


SMALL = OptdigitsConfig(ranks=(1, 4), seeds=2, epochs=1, pretrain_epochs=2)


@pytest.fixture(scope="module")
def small_grid() -> pd.DataFrame:
    return run_grid(SMALL, progress=False)


def test_a_small_grid_has_one_row_per_seed_and_rank(small_grid):
    assert sorted(zip(small_grid.seed, small_grid["rank"])) == [(0, 1), (0, 4), (1, 1), (1, 4)]
    assert (small_grid.steps == SMALL.epochs * math.ceil(1437 / 64)).all()  # 1797 digits, 20% held out
    assert (small_grid.empirical_kl > 0).all() and (small_grid.bound > 0).all()
    assert summary(small_grid).index.tolist() == [1, 4]
    assert summary_markdown(summary(small_grid)).count("\n") == 3


def test_the_grid_is_deterministic(small_grid):
    pd.testing.assert_frame_equal(run_grid(SMALL, progress=False), small_grid, check_exact=True)


def test_the_bound_of_eq5_holds_for_every_seed_and_rank(small_grid):
    assert bound_violations(small_grid).empty
    assert (small_grid.empirical_kl_max <= small_grid.bound).all()


def test_the_step_before_the_bound_holds_and_is_not_loose_by_construction(small_grid):
    ratio = small_grid.max_abs_dlogpi / small_grid.mu
    assert shift_violations(small_grid).empty, f"||Delta log pi||_inf exceeds mu(r): ratios {ratio.tolist()}"
    assert ratio.max() > 1e-3, f"the shift sits far under mu(r) ({ratio.max()}): a check that cannot fail"
    assert len(shift_violations(small_grid.assign(mu=small_grid.max_abs_dlogpi / 2))) == len(small_grid)


def test_the_bounds_are_infinite_past_a_floats_range_not_an_error():
    assert lora_constant(eta=1.0, k=64, grad_bound=1.0, steps=690) == math.inf
    assert kl_bound_high_probability(rank=1, d=256, k=64, eta=1.0, grad_bound=1e-3, steps=690) == math.inf
    assert kl_bound_high_probability(rank=1, d=256, k=64, eta=1e-3, grad_bound=1e-3, steps=10) < math.inf


@pytest.mark.parametrize("setting, value, message", [
    ("ranks", (0,), "ranks: every rank must be a positive integer"),
    ("ranks", (2.5,), "ranks: every rank must be a positive integer"),
    ("ranks", (65,), r"ranks: rank 65 exceeds min\(d, k\)"),
    ("ranks", (), "ranks must be a non-empty tuple"),
    ("ranks", (2, 2), "ranks must not repeat"),
    ("seeds", 0, "seeds must be a positive integer"),
    ("epochs", 1.5, "epochs must be a positive integer"),
    ("batch_size", True, "batch_size must be a positive integer"),
    ("lr", 0.0, "lr must be a positive finite number"),
    ("grad_clip", -1e-3, "grad_clip must be a positive finite number"),
    ("lora_init", "kaiming", "lora_init must be one of"),
    ("positive_digits", tuple(range(10)), "positive_digits must be"),
    ("eval_fraction", 1.0, "eval_fraction must be"),
])
def test_bad_settings_raise_a_value_error_naming_the_setting(setting, value, message):
    with pytest.raises(ValueError, match=message):
        OptdigitsConfig(**{setting: value})

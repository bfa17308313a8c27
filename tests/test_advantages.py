"""Advantages (paper Eq. 3-4) against an independent float64 loop reference."""
import math

import pytest
import torch

from reward_density.grpo.advantages import compute_advantages, is_dense
from reward_density.grpo.deposits import Deposits

EPS = 1e-4


def reference_advantages(rewards, deposits, valid, group_size, eps):
    """Plain-Python Eq. 3-4: normalise over the group's deposits, then per-token or return-to-go."""
    n, t = len(rewards), len(rewards[0])
    dense = all(deposits[i][j] == valid[i][j] for i in range(n) for j in range(t))
    out = [[0.0] * t for _ in range(n)]
    for g in range(0, n, group_size):
        values = [rewards[i][j] for i in range(g, g + group_size) for j in range(t) if deposits[i][j]]
        mu = sum(values) / len(values) if values else 0.0
        sd = math.sqrt(sum((v - mu) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        for i in range(g, g + group_size):
            normed = [(rewards[i][j] - mu) / (sd + eps) if deposits[i][j] else 0.0 for j in range(t)]
            for j in range(t):
                value = normed[j] if dense else sum(normed[j:])
                out[i][j] = value if valid[i][j] else 0.0
    return out


def random_batch(seed, n_groups=3, group_size=4, t=9):
    g = torch.Generator().manual_seed(seed)
    n = n_groups * group_size
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    valid = torch.arange(t)[None, :] < lengths[:, None]
    return g, n, t, valid


def outcome_like(seed):
    g, n, t, valid = random_batch(seed)
    deposits = torch.zeros(n, t, dtype=torch.bool)
    deposits[torch.arange(n), valid.sum(-1) - 1] = True
    rewards = torch.randint(0, 2, (n, t), generator=g).double() * deposits
    return rewards, deposits, valid


def process_like(seed):
    g, n, t, valid = random_batch(seed)
    deposits = (torch.rand(n, t, generator=g) < 0.4) & valid
    deposits[torch.arange(n), valid.sum(-1) - 1] = True
    rewards = torch.rand(n, t, generator=g).double() * deposits
    return rewards, deposits, valid


def distillation_like(seed):
    g, n, t, valid = random_batch(seed)
    rewards = torch.randn(n, t, generator=g).double() * valid
    return rewards, valid.clone(), valid


@pytest.mark.parametrize("make", [outcome_like, process_like, distillation_like])
@pytest.mark.parametrize("seed", range(5))
def test_advantages_equal_float64_reference(make, seed):
    rewards, deposits, valid = make(seed)
    got = compute_advantages(rewards, deposits, valid, group_size=4, eps=EPS)
    want = torch.tensor(reference_advantages(rewards.tolist(), deposits.tolist(), valid.tolist(), 4, EPS),
                        dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-6, rtol=0), f"max abs error {(got - want).abs().max():.3g}"


def test_outcome_gives_every_valid_token_its_group_normalised_scalar():
    rewards, deposits, valid = outcome_like(7)
    adv = compute_advantages(rewards, deposits, valid, group_size=4, eps=EPS)
    for g in range(0, rewards.shape[0], 4):
        r = rewards[g : g + 4].sum(-1)
        scalar = (r - r.mean()) / (r.std() + EPS)
        for i in range(4):
            row = adv[g + i][valid[g + i]]
            assert torch.allclose(row, scalar[i].expand_as(row)), (
                f"row {g + i} is not constant at {scalar[i]:.4f}: {row}")
            assert torch.all(adv[g + i][~valid[g + i]] == 0), "padding got an advantage"


def test_process_gives_the_return_to_go_of_normalised_step_rewards():
    rewards = torch.tensor([[0.0, 0.9, 0.0, 0.2, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    deposits = rewards > 0
    valid = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    values = torch.tensor([0.9, 0.2, 0.5], dtype=torch.float64)
    z = (values - values.mean()) / (values.std() + EPS)
    want = torch.tensor([[z[0] + z[1], z[0] + z[1], z[1], z[1], 0], [z[2], 0, 0, 0, 0]], dtype=torch.float64)
    got = compute_advantages(rewards, deposits, valid, group_size=2, eps=EPS)
    assert torch.allclose(got, want), f"expected the return-to-go\n{want}\ngot\n{got}"


def test_distillation_uses_the_normalised_deposit_per_token_without_cumsum():
    rewards, deposits, valid = distillation_like(3)
    adv = compute_advantages(rewards, deposits, valid, group_size=4, eps=EPS)
    group = rewards[:4][valid[:4]]
    want = (rewards[:4] - group.mean()) / (group.std() + EPS) * valid[:4]
    assert is_dense(deposits, valid)
    assert torch.allclose(adv[:4], want), "dense deposits must not be reverse-cumsummed"


def test_a_group_with_identical_rewards_gets_zero_advantage():
    rewards, deposits, valid = outcome_like(0)
    rewards = deposits.double()  # every completion correct
    adv = compute_advantages(rewards, deposits, valid, group_size=4, eps=EPS)
    assert torch.all(adv == 0), "no within-group variance must mean no learning signal"


@pytest.mark.parametrize("deposits_left", [0, 1], ids=["no-deposit", "one-deposit"])
def test_a_group_with_fewer_than_two_deposits_gets_zero_advantage_not_nan(deposits_left):
    rewards, deposits, valid = process_like(0)
    deposits[:4] = False  # group 0: rows without steps, as a process reward leaves them
    if deposits_left:
        deposits[0, 0] = True
    rewards = rewards * deposits + deposits.double()
    adv = compute_advantages(rewards, deposits, valid, group_size=4, eps=EPS)
    assert torch.isfinite(adv).all(), "a NaN advantage turns the whole loss into NaN"
    assert torch.all(adv[:4] == 0), "a group with no spread of rewards must give no learning signal"


def test_deposit_on_padding_is_refused():
    rewards, deposits, valid = outcome_like(1)
    deposits[0, -1], valid[0, -1] = True, False
    with pytest.raises(ValueError, match="outside the completion mask"):
        compute_advantages(rewards, deposits, valid, group_size=4, eps=EPS)


def test_disagreeing_shapes_are_refused():
    rewards, deposits, valid = outcome_like(1)
    with pytest.raises(ValueError, match="shapes disagree"):
        compute_advantages(rewards[:, :-1], deposits, valid, group_size=4, eps=EPS)


def test_batch_that_does_not_split_into_groups_is_refused():
    rewards, deposits, valid = outcome_like(1)
    with pytest.raises(ValueError, match="groups of 5"):
        compute_advantages(rewards, deposits, valid, group_size=5, eps=EPS)


@pytest.mark.parametrize("rewards, deposits, trajectory, said", [
    (torch.tensor([[1.0, 0.0]]), torch.tensor([[False, True]]), torch.tensor([1.0]), "0 wherever deposit_mask"),
    (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), torch.zeros(3), "trajectory"),
], ids=["a-reward-off-its-deposits", "trajectory-rewards-of-another-shape"])
def test_deposits_a_reward_module_got_wrong_are_refused(rewards, deposits, trajectory, said):
    with pytest.raises(ValueError, match=said):
        Deposits(rewards, deposits, trajectory)

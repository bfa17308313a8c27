"""Paired bootstrap CI and TOST against cases with known answers."""
import numpy as np
import pandas as pd
import pytest

from reward_density.analysis.statistics import bootstrap_ci, paired_bootstrap_diff, paired_differences, tost


def arm(correct: dict[int, list[int]]) -> pd.DataFrame:
    """Per-problem results of one arm from {seed: [correct of problem p0, p1, ...]}."""
    return pd.DataFrame(
        [{"seed": s, "problem_id": f"p{i}", "correct": c} for s, values in correct.items() for i, c in enumerate(values)]
    )


def test_identical_arms_are_equivalent_with_zero_difference():
    rng = np.random.default_rng(0)
    results = {s: rng.integers(0, 2, 50).tolist() for s in range(3)}
    diff = paired_bootstrap_diff(arm(results), arm(results), n_boot=500)
    assert diff.estimate == 0 and diff.ci_low == 0 and diff.ci_high == 0
    assert (diff.n_pairs, diff.n_seeds, diff.n_problems) == (150, 3, 50)
    assert tost(diff, margin=0.05).verdict == "equivalent"


def test_lora_always_right_full_always_wrong_is_different():
    diff = paired_bootstrap_diff(arm({0: [1] * 20, 1: [1] * 20}), arm({0: [0] * 20, 1: [0] * 20}), n_boot=500)
    assert (diff.estimate, diff.ci_low, diff.ci_high) == (1, 1, 1)
    result = tost(diff, margin=0.05)
    assert result.verdict == "different" and result.p_value == 1


def test_small_noisy_sample_is_inconclusive():
    lora, full = arm({0: [1, 0, 1, 0, 1, 0]}), arm({0: [0, 1, 1, 0, 0, 1]})
    diff = paired_bootstrap_diff(lora, full, n_boot=1000)
    assert diff.estimate == 0 and diff.ci_low < 0 < diff.ci_high
    assert tost(diff, margin=0.05).verdict == "inconclusive"


def test_small_significant_difference_inside_margin_is_equivalent():
    """Equivalence wins when a real but small difference lies within the margin."""
    lora = arm({s: [1] * 1000 for s in range(2)})
    full = arm({s: [0] * 10 + [1] * 990 for s in range(2)})
    diff = paired_bootstrap_diff(lora, full, n_boot=1000)
    assert diff.ci_low > 0
    assert tost(diff, margin=0.05).verdict == "equivalent"


def test_pairs_by_seed_and_problem_id_regardless_of_row_order():
    lora = arm({0: [1, 1, 0], 1: [0, 1, 1], 2: [1, 1, 1]}).sample(frac=1, random_state=1)
    full = arm({0: [0, 1, 0, 1], 1: [0, 0, 1, 1], 7: [0, 0, 0, 0]})
    diffs = paired_differences(lora, full)
    assert list(diffs.index) == [0, 1] and list(diffs.columns) == ["p0", "p1", "p2"]
    assert diffs.to_numpy().tolist() == [[1, 0, 0], [0, 1, 0]]
    assert paired_bootstrap_diff(lora, full, n_boot=200).estimate == pytest.approx(2 / 6)


def test_problem_missing_in_one_seed_is_dropped():
    lora = arm({0: [1, 1, 1], 1: [1, 1]})
    full = arm({0: [0, 0, 0], 1: [0, 0, 0]})
    assert list(paired_differences(lora, full).columns) == ["p0", "p1"]


def test_tost_reads_the_1_minus_2alpha_percentile_interval():
    rng = np.random.default_rng(3)
    diff = bootstrap_ci(rng.integers(-1, 2, (3, 40)), confidence=0.95, n_boot=2000, seed=4)
    result = tost(diff, margin=0.1)
    assert result.alpha == pytest.approx(0.05)
    assert (result.ci_low, result.ci_high) == tuple(np.quantile(diff.replicates, [0.05, 0.95]))
    assert diff.ci_low <= result.ci_low <= result.ci_high <= diff.ci_high


def test_deterministic_for_a_fixed_seed():
    rng = np.random.default_rng(1)
    lora, full = arm({s: rng.integers(0, 2, 30).tolist() for s in range(3)}), arm({s: rng.integers(0, 2, 30).tolist() for s in range(3)})
    a, b = paired_bootstrap_diff(lora, full, seed=5), paired_bootstrap_diff(lora, full, seed=5)
    assert np.array_equal(a.replicates, b.replicates) and (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert not np.array_equal(a.replicates, paired_bootstrap_diff(lora, full, seed=6).replicates)


@pytest.mark.parametrize("n_seeds", [1, 3])
def test_ci_covers_a_known_true_difference(n_seeds):
    """Problems drawn afresh each simulation; LoRA solves each problem 0.1 more often than FullFT."""
    rng = np.random.default_rng(2024)
    covered, n_sims, true_diff = 0, 200, 0.1
    for sim in range(n_sims):
        p_full = rng.uniform(0.2, 0.7, 60)
        lora = rng.random((n_seeds, 60)) < p_full + true_diff
        full = rng.random((n_seeds, 60)) < p_full
        diff = bootstrap_ci(lora.astype(float) - full, confidence=0.95, n_boot=400, seed=sim)
        covered += diff.ci_low <= true_diff <= diff.ci_high
    assert covered / n_sims >= 0.85


def test_no_shared_seed_is_an_error():
    with pytest.raises(ValueError, match="share no seed"):
        paired_bootstrap_diff(arm({0: [1, 0]}), arm({1: [1, 0]}))


def test_no_shared_problem_is_an_error():
    full = arm({0: [1, 0]}).assign(problem_id=["q0", "q1"])
    with pytest.raises(ValueError, match="share no problem"):
        paired_bootstrap_diff(arm({0: [1, 0]}), full)


def test_duplicate_answers_are_an_error():
    lora = pd.concat([arm({0: [1, 0]}), arm({0: [1]})])
    with pytest.raises(ValueError, match="more than one answer"):
        paired_bootstrap_diff(lora, arm({0: [1, 0]}))


def test_bad_margin_is_an_error():
    diff = bootstrap_ci(np.zeros((1, 5)), n_boot=10)
    with pytest.raises(ValueError, match="margin"):
        tost(diff, margin=0)

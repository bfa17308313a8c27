"""The crossed (seeds x problems) interval, TOST and power, against cases with known answers and by simulation."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from reward_density.analysis.statistics import (
    PairedDiff,
    StudyDesign,
    crossed_interval,
    minimum_detectable_difference,
    paired_diff,
    paired_differences,
    seeds_can_decide,
    seeds_for_equivalence,
    simulate_coverage,
    simulate_differences,
    t_interval,
    tost,
    variance_of_mean,
)


def arm(correct: dict[int, list[int]]) -> pd.DataFrame:
    """Per-problem results of one arm from {seed: [correct of problem p0, p1, ...]}."""
    return pd.DataFrame(
        [{"seed": s, "problem_id": f"p{i}", "correct": c}
         for s, values in correct.items() for i, c in enumerate(values)]
    )


def interval_of(diffs: np.ndarray, confidence: float) -> tuple[float, float]:
    result = crossed_interval(diffs, confidence)
    return result.ci_low, result.ci_high


def test_the_variance_is_the_two_way_anova_estimate_computed_by_hand():
    rng = np.random.default_rng(7)
    # Scaled so that the interval stays inside [-1, 1], where a mean difference of 0/1 results lies.
    d = 0.2 * (rng.normal(size=(4, 9)) + rng.normal(size=(4, 1)) + rng.normal(size=(1, 9)))
    s, p = d.shape
    grand = sum(map(sum, d.tolist())) / (s * p)
    rows = [sum(r) / p for r in d.tolist()]
    cols = [sum(d[i][j] for i in range(s)) / s for j in range(p)]
    ms_s = p * sum((r - grand) ** 2 for r in rows) / (s - 1)
    ms_p = s * sum((c - grand) ** 2 for c in cols) / (p - 1)
    ms_e = sum((d[i][j] - rows[i] - cols[j] + grand) ** 2 for i in range(s) for j in range(p)) / ((s - 1) * (p - 1))
    expected = (ms_s + ms_p - ms_e) / (s * p)
    df = (ms_s + ms_p - ms_e) ** 2 / (ms_s ** 2 / (s - 1) + ms_p ** 2 / (p - 1) + ms_e ** 2 / ((s - 1) * (p - 1)))
    variance, got_df = variance_of_mean(d)
    assert variance == pytest.approx(expected, rel=1e-12) and got_df == pytest.approx(df, rel=1e-12)
    result = crossed_interval(d, 0.9)
    half = stats.t.ppf(0.95, df) * expected ** 0.5
    assert (result.ci_low, result.ci_high) == pytest.approx((grand - half, grand + half), rel=1e-12)


def test_at_the_variance_floor_the_degrees_of_freedom_are_the_residuals():
    # seeds and problems explain nothing here, so the floor (the residual mean square) applies, with its df
    assert variance_of_mean(np.array([[1.0, -1.0], [-1.0, 1.0]])) == (1.0, 1.0)


def test_one_seed_gives_no_interval_because_the_spread_between_training_runs_is_unknown():
    # Over problems alone, one run's interval would claim far more than it knows about a new run.
    with pytest.raises(ValueError, match="one seed: the spread between training runs cannot be estimated"):
        variance_of_mean(np.array([[1.0, 0.0, 1.0, 1.0, -1.0, 0.0]]))


def test_one_problem_is_the_ordinary_interval_over_seeds():
    d = np.array([[1.0], [0.0], [1.0], [-1.0]])
    variance, df = variance_of_mean(d)
    assert variance == pytest.approx(d.var(ddof=1) / d.size) and df == d.size - 1


def test_identical_arms_are_equivalent_with_zero_difference():
    rng = np.random.default_rng(0)
    results = {s: rng.integers(0, 2, 50).tolist() for s in range(3)}
    diff = paired_diff(arm(results), arm(results))
    assert diff.estimate == 0 and diff.ci_low == 0 and diff.ci_high == 0
    assert (diff.n_pairs, diff.n_seeds, diff.n_problems) == (150, 3, 50)
    assert tost(diff, margin=0.05).verdict == "equivalent"


def test_lora_always_right_full_always_wrong_is_different():
    diff = paired_diff(arm({0: [1] * 20, 1: [1] * 20}), arm({0: [0] * 20, 1: [0] * 20}))
    assert (diff.estimate, diff.ci_low, diff.ci_high) == (1, 1, 1)
    result = tost(diff, margin=0.05)
    assert result.verdict == "different" and result.p_value == 1


def test_small_noisy_sample_is_inconclusive():
    diff = paired_diff(arm({0: [1, 0, 1, 0, 1, 0], 1: [0, 1, 0, 0, 1, 1]}),
                       arm({0: [0, 1, 1, 0, 0, 1], 1: [1, 0, 0, 0, 1, 1]}))
    assert diff.estimate == 0 and diff.ci_low < 0 < diff.ci_high
    assert tost(diff, margin=0.05).verdict == "inconclusive"


def test_small_significant_difference_inside_margin_is_equivalent():
    """Equivalence wins when a real but small difference lies within the margin."""
    rng = np.random.default_rng(1)
    full = {s: rng.integers(0, 2, 1000).tolist() for s in range(3)}
    lora = {s: [max(c, int(i % 50 == 0)) for i, c in enumerate(values)] for s, values in full.items()}
    diff = paired_diff(arm(lora), arm(full))
    assert diff.ci_low > 0
    assert tost(diff, margin=0.05).verdict == "equivalent"


def test_seeds_that_disagree_widen_the_interval():
    """The same problem-level noise, once with training runs that agree and once with runs that do not."""
    rng = np.random.default_rng(5)
    noise = rng.choice([-1.0, 0.0, 1.0], size=(3, 1000), p=[0.1, 0.8, 0.1])
    agree = crossed_interval(noise)
    disagree = crossed_interval(noise + np.array([[-0.05], [0.0], [0.05]]))
    assert disagree.half_width > 2 * agree.half_width
    assert disagree.df < 10, "the seed mean square has S - 1 = 2 degrees of freedom and must dominate"


def test_pairs_by_seed_and_problem_id_regardless_of_row_order():
    lora = arm({0: [1, 1, 0], 1: [0, 1, 1], 2: [1, 1, 1]}).sample(frac=1, random_state=1)
    full = arm({0: [0, 1, 0, 1], 1: [0, 0, 1, 1], 7: [0, 0, 0, 0]})
    diffs = paired_differences(lora, full)
    assert list(diffs.index) == [0, 1] and list(diffs.columns) == ["p0", "p1", "p2"]
    assert diffs.to_numpy().tolist() == [[1, 0, 0], [0, 1, 0]]
    assert paired_diff(lora, full).estimate == pytest.approx(2 / 6)


def test_problem_missing_in_one_seed_is_dropped():
    lora = arm({0: [1, 1, 1], 1: [1, 1]})
    full = arm({0: [0, 0, 0], 1: [0, 0, 0]})
    assert list(paired_differences(lora, full).columns) == ["p0", "p1"]


def test_tost_reads_the_1_minus_2alpha_interval():
    rng = np.random.default_rng(3)
    diff = crossed_interval(rng.integers(-1, 2, (3, 40)), confidence=0.95)
    result = tost(diff, margin=0.1)
    assert result.alpha == pytest.approx(0.05)
    assert (result.ci_low, result.ci_high) == pytest.approx(diff.interval(0.90))
    assert diff.ci_low <= result.ci_low <= result.ci_high <= diff.ci_high


def a_diff(estimate: float, se: float, df: float = 10, confidence: float = 0.95) -> PairedDiff:
    """A paired difference with its t interval, as crossed_interval reports one."""
    return PairedDiff(estimate, se, df, *t_interval(estimate, se, df, confidence), confidence, 100, 4, 25)


def test_a_difference_only_the_tost_interval_excludes_from_zero_is_inconclusive_not_different():
    diff = a_diff(0.03, 0.016)  # 90% interval [0.001, 0.059]: off 0, past the margin; 95% [-0.006, 0.066]
    result = tost(diff, margin=0.05)
    assert result.ci_low > 0 > diff.ci_low, "the case needs 0 between the two intervals' lower ends"
    assert result.verdict == "inconclusive", "'different' is read from the confidence interval, not the TOST one"


def test_an_interval_ending_exactly_on_the_margin_is_not_equivalent():
    assert tost(a_diff(0.05, 0.0), margin=0.05).verdict == "different", "equivalence needs (-m, m), open"
    assert tost(a_diff(0.049, 0.0), margin=0.05).verdict == "equivalent"


def test_the_tost_p_value_is_the_larger_of_the_two_one_sided_p_values():
    diff, margin = a_diff(0.02, 0.015), 0.05
    lower = stats.t.sf((0.02 + margin) / 0.015, 10)  # H0-: diff <= -m
    upper = stats.t.cdf((0.02 - margin) / 0.015, 10)  # H0+: diff >= m, the one nearer the estimate
    assert upper > lower
    assert tost(diff, margin).p_value == pytest.approx(upper, rel=1e-12)


def test_an_interval_for_a_gain_near_one_stops_at_one_where_the_true_difference_must_lie():
    """A skill learned almost whole by every seed but one (as by the 400-step SFT control's rank 4): the t interval
    would reach past 1, which no difference of two 0/1 results can."""
    gains = np.ones((4, 50))
    gains[0, :10] = 0  # one seed missed a fifth of the problems
    diff = crossed_interval(gains, confidence=0.95)
    half = stats.t.ppf(0.975, diff.df) * diff.se
    assert diff.estimate + half > 1, "the case must be one whose uncut interval passes 1"
    assert (diff.ci_low, diff.ci_high) == pytest.approx((diff.estimate - half, 1.0))
    assert diff.interval(0.90)[1] == 1.0
    assert crossed_interval(-gains).ci_low == -1.0


def test_the_minimum_detectable_difference_is_the_t_quantiles_times_the_standard_error():
    diff = crossed_interval(np.random.default_rng(4).integers(-1, 2, (5, 200)).astype(float))
    expected = (stats.t.ppf(0.975, diff.df) + stats.t.ppf(0.8, diff.df)) * diff.se
    assert minimum_detectable_difference(diff) == pytest.approx(expected)


# (4, 0.1): seed effects small enough that about a fifth of studies floor the variance at the residual's share.
@pytest.mark.parametrize("seeds, seed_sd", [(3, 0.3), (5, 0.3), (3, 0.0), (4, 0.1)])
def test_the_interval_holds_its_level_when_training_runs_differ(seeds, seed_sd):
    """Simulated studies with a known population difference (correct ~ Bernoulli(sigmoid(arm + problem
    difficulty + a per-run seed effect))): the 90% and 95% intervals hold the truth about as often as they
    claim, within the simulation's own noise (300 studies: sd about 0.017 at 90%)."""
    design = StudyDesign(seeds=seeds, problems=300, seed_sd=seed_sd)
    assert simulate_coverage(design, interval_of, 0.90, studies=300) >= 0.85
    assert simulate_coverage(design, interval_of, 0.95, studies=300) >= 0.90


def test_a_percentile_bootstrap_over_three_seeds_does_not_hold_its_level():
    """Why the crossed interval: the two-way bootstrap the study used before covers far less than it claims."""

    def bootstrap(diffs, confidence, replicates=400):
        rng = np.random.default_rng(0)
        s, p = diffs.shape
        w_s, w_p = rng.multinomial(s, np.full(s, 1 / s), replicates), rng.multinomial(p, np.full(p, 1 / p), replicates)
        means = np.einsum("bs,sp,bp->b", w_s, diffs, w_p) / diffs.size
        return tuple(np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2]))

    design = StudyDesign(seeds=3, problems=300, seed_sd=0.3)
    assert simulate_coverage(design, bootstrap, 0.95, studies=200) < 0.88


def test_the_projected_number_of_seeds_gives_the_tost_power_it_promises():
    # A large pilot estimates the variance components; studies of the projected size, with no true difference,
    # must then show equivalence about 80% of the time, and studies of half that size far less often.
    pilot = simulate_differences(StudyDesign(seeds=40, problems=300, seed_sd=0.3, arm_gap=0.0),
                                 np.random.default_rng(0))
    needed = seeds_for_equivalence(pilot, margin=0.05, alpha=0.05, power=0.8)
    assert needed is not None and 10 < needed < 100, f"projected {needed} seeds for a seed sd of 0.3 on the logit"

    def share_equivalent(seeds: int) -> float:
        design, rng = StudyDesign(seeds=seeds, problems=300, seed_sd=0.3, arm_gap=0.0), np.random.default_rng(1)
        verdicts = [tost(crossed_interval(simulate_differences(design, rng)), 0.05).verdict for _ in range(200)]
        return verdicts.count("equivalent") / len(verdicts)

    at_needed, at_half = share_equivalent(needed), share_equivalent(needed // 2)
    assert 0.75 <= at_needed <= 0.95, f"{needed} seeds showed equivalence in {at_needed:.0%} of studies, not ~80%"
    assert at_half < 0.6, f"half the projected seeds ({needed // 2}) still showed equivalence in {at_half:.0%}"


def test_a_pilot_is_projected_powered_at_its_own_size_exactly_when_its_own_test_is():
    # Where no mean square falls below the residual's (problems that differ in difficulty, as here), the projection
    # at the pilot's own seeds is the test the pilot ran: the same standard error and degrees of freedom. Giving
    # each variance component its mean square's degrees of freedom instead made a 4-seed pilot look powered at 4
    # seeds (df ~15-34 where its test had ~3).
    rng, margin, t = np.random.default_rng(3), 0.05, stats.t.ppf
    agreed = powered = 0
    for _ in range(60):
        a = (rng.random((4, 1000)) < np.clip(0.6 + rng.normal(0, 0.03, (4, 1)), 0, 1)).astype(float)
        diffs = a - (rng.random((4, 1000)) < 0.6)
        own = crossed_interval(diffs)
        own_powered = margin >= (t(0.95, own.df) + t(0.9, own.df)) * own.se  # TOST at alpha 0.05, power 0.8
        needed = seeds_for_equivalence(diffs, margin, alpha=0.05, power=0.8)
        projected_powered = needed is not None and needed <= 4
        assert projected_powered == own_powered, (
            f"the 4-seed test (se {own.se:.4f}, df {own.df:.1f}) is {'' if own_powered else 'not '}powered, but the "
            f"projection asks for {needed} seeds")
        agreed, powered = agreed + 1, powered + own_powered
    assert 0 < powered < agreed, f"the pilots should include powered and unpowered ones ({powered} of {agreed})"


@pytest.mark.parametrize("seed_sd", [0.0, 0.1])
def test_a_projection_whose_components_were_floored_never_calls_an_unpowered_pilot_powered(seed_sd):
    # With no arm-by-problem spread, a mean square often falls below the residual's; its component is floored at 0,
    # which projects at least the pilot's own variance: more seeds, never fewer than its own test needs.
    rng, t = np.random.default_rng(1), stats.t.ppf
    floored = 0
    for _ in range(40):
        diffs = simulate_differences(StudyDesign(seeds=4, problems=1000, seed_sd=seed_sd, arm_gap=0.0), rng)
        own = crossed_interval(diffs)
        margin = 0.97 * (t(0.95, own.df) + t(0.9, own.df)) * own.se  # just short of powering the pilot's own test
        needed = seeds_for_equivalence(diffs, margin, alpha=0.05, power=0.8)
        assert needed is None or needed > 4, f"projected {needed} seeds where the 4-seed test is not powered"
        floored += own.df == 3 * 999
    assert floored, "no pilot took the floor: the case this test exists for did not occur"


def test_mean_squares_equal_but_for_round_off_take_the_floor_as_exact_arithmetic_does():
    # One (seed, problem) pair differs: in exact arithmetic MS_seed = MS_problem = MS_residual = 1 / (S P), so
    # MS_seed + MS_problem <= 2 MS_residual and the floor applies; summation round-off must not decide it.
    for seeds, problems in [(4, 10), (6, 1000), (12, 1000)]:
        diffs = np.zeros((seeds, problems))
        diffs[0, 0] = 1.0
        variance, df = variance_of_mean(diffs)
        assert df == (seeds - 1) * (problems - 1), f"{seeds} x {problems}: df {df}, not the residual's at the floor"
        assert variance == pytest.approx(1 / (seeds * problems) ** 2)


def test_without_seed_variance_two_seeds_suffice_and_problem_variance_alone_can_need_more_problems():
    rng = np.random.default_rng(0)
    quiet = rng.normal(0, 0.01, (4, 1000))  # tiny problem-level noise, no seed effect
    assert seeds_for_equivalence(quiet, margin=0.05) == 2
    noisy = rng.choice([-1.0, 1.0], size=(4, 20)) + rng.normal(0, 1, (1, 20))  # 20 problems cannot pin the mean
    assert seeds_for_equivalence(noisy, margin=0.05) is None, "more seeds cannot shrink the problems' share"
    assert not seeds_can_decide(noisy, margin=0.05), "no number of seeds decides 20 problems this noisy"
    assert seeds_can_decide(quiet, margin=0.05)


def test_a_projection_beyond_its_cap_still_says_seeds_would_decide():
    rng = np.random.default_rng(0)
    runs_differ = rng.normal(0, 0.01, (4, 1000)) + rng.normal(0, 0.2, (4, 1))  # the seeds' spread dominates
    assert seeds_for_equivalence(runs_differ, margin=0.05, max_seeds=5) is None
    assert seeds_can_decide(runs_differ, margin=0.05), "enough seeds shrink a seed effect to nothing"


def test_no_shared_seed_is_an_error():
    with pytest.raises(ValueError, match="share no seed"):
        paired_diff(arm({0: [1, 0]}), arm({1: [1, 0]}))


def test_no_shared_problem_is_an_error():
    full = arm({0: [1, 0]}).assign(problem_id=["q0", "q1"])
    with pytest.raises(ValueError, match="share no problem"):
        paired_diff(arm({0: [1, 0]}), full)


def test_duplicate_answers_are_an_error():
    lora = pd.concat([arm({0: [1, 0]}), arm({0: [1]})])
    with pytest.raises(ValueError, match="more than one answer"):
        paired_diff(lora, arm({0: [1, 0]}))


def test_bad_margin_is_an_error():
    with pytest.raises(ValueError, match="margin"):
        tost(crossed_interval(np.zeros((2, 5))), margin=0)

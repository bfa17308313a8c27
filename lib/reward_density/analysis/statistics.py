"""Paired comparisons of two arms on the held-out set: an interval for their difference, TOST, power.

Each arm is a table of greedy results with columns ``seed``, ``problem_id`` and ``correct``. Seed s of one
arm is paired with seed s of the other on each problem, giving a seeds x problems matrix of differences
D[s, p]; the statistic is its mean.

Seeds and problems are crossed random factors: the conclusion should hold for new training runs and for
new problems. The interval comes from the two-way random-effects model D[s, p] = theta + a_s + b_p + e_sp
(Searle, Casella & McCulloch, *Variance Components*, 1992, ch. 4): the variance of the grand mean is
sigma_a^2 / S + sigma_b^2 / P + sigma_e^2 / (S P), estimated without bias from the ANOVA mean squares as
(MS_seed + MS_problem - MS_residual) / (S P), with Satterthwaite's degrees of freedom (Satterthwaite, 1946),
and the interval uses Student's t at those degrees of freedom. With few seeds the seed mean square has
S - 1 degrees of freedom and the interval widens accordingly; a percentile bootstrap over seeds cannot,
and covers the truth far less often than it claims when training runs differ (`simulate_coverage`;
tests/test_statistics.py measures both). Where the data show no spread beyond the residual's
(MS_seed + MS_problem <= 2 MS_residual, common when two arms hardly differ), the variance is floored at
the residual's share, MS_residual / (S P), at its (S - 1)(P - 1) degrees of freedom. Simulated at 1,000
problems and nominal 90%, the interval covered 0.89-0.93 of studies at 3, 4 and 12 seeds with seed effects
of sd 0 to 0.3 on the logit scale (the floor taken in up to 61% of them), but only 0.84-0.86 at 2 seeds
with sd 0.1-0.3: read a 2-seed interval as too narrow. With one seed there is no interval at all: the
spread between training runs cannot be estimated from one, and an interval over problems alone would claim
to know the next run.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats


@dataclass(frozen=True)
class PairedDiff:
    """The mean difference of two arms with its standard error, degrees of freedom and confidence interval."""

    estimate: float
    se: float
    df: float
    ci_low: float
    ci_high: float
    confidence: float
    n_pairs: int
    n_seeds: int
    n_problems: int

    def interval(self, confidence: float) -> tuple[float, float]:
        """The two-sided interval at another confidence level, from the same standard error."""
        return t_interval(self.estimate, self.se, self.df, confidence)

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2


@dataclass(frozen=True)
class Tost:
    """Equivalence verdict at margin m with the (1 - 2 alpha) interval it was read from."""

    margin: float
    alpha: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str


def paired_differences(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Seeds x problems matrix of correct_a - correct_b over the seeds and problems both arms share."""
    wide = {name: _by_seed_and_problem(arm, name) for name, arm in (("first", a), ("second", b))}
    seeds = wide["first"].index.intersection(wide["second"].index).sort_values()
    if seeds.empty:
        raise ValueError("the two arms share no seed: nothing can be paired")
    first, second = (wide[name].loc[seeds] for name in ("first", "second"))
    # A problem is paired only if every shared seed answered it in both arms.
    problems = first.columns.intersection(second.columns)
    problems = problems[first[problems].notna().all().to_numpy() & second[problems].notna().all().to_numpy()]
    if problems.empty:
        raise ValueError("the two arms share no problem answered in every shared seed: nothing can be paired")
    problems = problems.sort_values()
    return first[problems] - second[problems]


def _by_seed_and_problem(arm: pd.DataFrame, name: str) -> pd.DataFrame:
    """Pivot one arm to seeds x problem ids of 0/1 correctness, rejecting duplicate answers."""
    missing = {"seed", "problem_id", "correct"} - set(arm.columns)
    if missing:
        raise ValueError(f"{name} arm lacks columns {sorted(missing)}")
    keys = arm[["seed", "problem_id"]].astype({"problem_id": str})
    if keys.duplicated().any():
        raise ValueError(f"{name} arm has more than one answer for some (seed, problem_id)")
    frame = keys.assign(correct=arm["correct"].astype(float).to_numpy())
    return frame.pivot(index="seed", columns="problem_id", values="correct")


def _mean_squares(diffs: np.ndarray) -> tuple[float, float, float]:
    """The two-way ANOVA mean squares of a seeds x problems matrix: seeds, problems, residual."""
    n_seeds, n_problems = diffs.shape
    grand = diffs.mean()
    seed_means, problem_means = diffs.mean(axis=1), diffs.mean(axis=0)
    ms_seed = n_problems * ((seed_means - grand) ** 2).sum() / (n_seeds - 1)
    ms_problem = n_seeds * ((problem_means - grand) ** 2).sum() / (n_problems - 1)
    residual = diffs - seed_means[:, None] - problem_means[None, :] + grand
    ms_residual = (residual ** 2).sum() / ((n_seeds - 1) * (n_problems - 1))
    return float(ms_seed), float(ms_problem), float(ms_residual)


ROUND_OFF = 1e-9  # relative: mean squares equal in exact arithmetic (tiny 0/1 matrices) differ by summation order


def _excess(mean_square: float, ms_residual: float) -> float:
    """How far a mean square exceeds the residual's, 0 where it does not beyond round-off."""
    excess = mean_square - ms_residual
    return excess if excess > ROUND_OFF * ms_residual else 0.0


def _satterthwaite(terms: list[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of independent variance estimates, given as (value, its df) pairs (a mean
    square the sum subtracts enters with a negative value)."""
    return sum(v for v, _ in terms) ** 2 / sum(v ** 2 / df for v, df in terms)


MIN_SEEDS = 2  # an interval that holds for new training runs needs their spread, which one run cannot show


def shared_seeds(a: pd.DataFrame, b: pd.DataFrame) -> int:
    """How many seeds two arms' results share: the training runs a paired comparison rests on."""
    return len(set(a["seed"]) & set(b["seed"]))


def variance_of_mean(diffs: np.ndarray) -> tuple[float, float]:
    """Estimated variance of the grand mean of a seeds x problems matrix, and its degrees of freedom."""
    n_seeds, n_problems = diffs.shape
    if n_seeds < MIN_SEEDS:
        raise ValueError("one seed: the spread between training runs cannot be estimated, so no interval holds "
                         "for new runs")
    if n_problems == 1:  # one crossed factor left: the ordinary variance of a mean over seeds
        return float(diffs.var(ddof=1) / n_seeds), float(n_seeds - 1)
    return _grand_mean_variance(*_mean_squares(diffs), n_seeds, n_problems)


def _grand_mean_variance(ms_seed: float, ms_problem: float, ms_residual: float, n_seeds: int,
                         n_problems: int) -> tuple[float, float]:
    """The grand mean's variance from the two-way mean squares, (MS_seed + MS_problem - MS_residual) / (S P), and
    its Satterthwaite degrees of freedom."""
    cells, df_residual = n_seeds * n_problems, (n_seeds - 1) * (n_problems - 1)
    combined = ms_seed + ms_problem - ms_residual
    if not _excess(combined, ms_residual):  # seeds and problems add no spread: the residual's share is the floor
        return ms_residual / cells, float(df_residual)
    df = _satterthwaite([(ms_seed, n_seeds - 1), (ms_problem, n_problems - 1), (-ms_residual, df_residual)])
    return combined / cells, float(df)


MAX_PROJECTED_SEEDS = 1000  # seeds_for_equivalence gives up beyond this many


def _tost_powered(se: float, df: float, margin: float, alpha: float, power: float) -> bool:
    """TOST's power at a true 0 reaches power: both one-sided tests reject when margin / SE >= t(1 - alpha) +
    t(1 - beta/2)."""
    return margin >= (stats.t.ppf(1 - alpha, df) + stats.t.ppf(1 - (1 - power) / 2, df)) * se


def _components(diffs: np.ndarray) -> tuple[float, float, float]:
    """Seed and problem variance of D[s, p] = theta + a_s + b_p + e_sp, floored at 0, and the residual mean square
    (Searle et al., ch. 4)."""
    n_seeds, n_problems = diffs.shape
    ms_seed, ms_problem, ms_residual = _mean_squares(diffs)
    return _excess(ms_seed, ms_residual) / n_problems, _excess(ms_problem, ms_residual) / n_seeds, ms_residual


def seeds_for_equivalence(diffs: np.ndarray, margin: float, alpha: float = 0.05, power: float = 0.8,
                          max_seeds: int = MAX_PROJECTED_SEEDS) -> int | None:
    """The fewest seeds with which TOST at ±margin shows equivalence with the given power when the true
    difference is 0, on the same problems, projected from this matrix's variance components; None when more
    than max_seeds would be needed (seeds_can_decide says whether any number would)."""
    n_seeds, n_problems = diffs.shape
    if n_seeds < 2 or n_problems < 2:
        return None
    seed_var, problem_var, ms_residual = _components(diffs)
    if not _seeds_suffice(problem_var, n_problems, margin, alpha, power):  # the problems' share alone is too large
        return None
    for seeds in range(2, max_seeds + 1):
        variance, df = _projected_variance(seed_var, problem_var, ms_residual, seeds, n_problems)
        if variance == 0 or _tost_powered(np.sqrt(variance), df, margin, alpha, power):
            return seeds
    return None


def _projected_variance(seed_var: float, problem_var: float, ms_residual: float, n_seeds: int,
                        n_problems: int) -> tuple[float, float]:
    """The grand mean's variance and degrees of freedom that variance_of_mean would give a study of n_seeds seeds
    on these problems: from the mean squares such a study expects (E[MS_seed] = sigma_e^2 + P sigma_seed^2,
    E[MS_problem] = sigma_e^2 + S sigma_problem^2), so its degrees of freedom are those of the test it projects."""
    return _grand_mean_variance(ms_residual + n_problems * seed_var, ms_residual + n_seeds * problem_var,
                                ms_residual, n_seeds, n_problems)


def seeds_can_decide(diffs: np.ndarray, margin: float, alpha: float = 0.05, power: float = 0.8) -> bool:
    """Whether some number of seeds on these problems gives TOST that power at a true 0: as seeds grow, the seed
    and residual terms vanish and the problems' own, at P - 1 degrees of freedom, is left; when it alone is too
    large, only more problems decide."""
    n_seeds, n_problems = diffs.shape
    return n_seeds >= 2 and n_problems >= 2 and _seeds_suffice(_components(diffs)[1], n_problems, margin, alpha, power)


def _seeds_suffice(problem_var: float, n_problems: int, margin: float, alpha: float, power: float) -> bool:
    """Whether the problems' term alone, what infinitely many seeds leave, still lets TOST reach that power."""
    return problem_var == 0 or _tost_powered(np.sqrt(problem_var / n_problems), n_problems - 1, margin, alpha, power)


DIFFERENCE_RANGE = (-1.0, 1.0)  # a mean of differences of 0/1 results, such as two arms' pass@1, lies here


def t_interval(estimate: float, se: float, df: float, confidence: float) -> tuple[float, float]:
    """Student's t interval around an estimate, cut to DIFFERENCE_RANGE.

    The cut keeps the coverage: the true difference lies in that range, so it lies in the cut interval whenever
    it lies in the whole one. A t interval can otherwise reach past 1 for a gain near 1 (an arm that learns a
    whole skill the base lacks).
    """
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    low, high = DIFFERENCE_RANGE
    return max(estimate - half, low), min(estimate + half, high)


def crossed_interval(diffs: np.ndarray, confidence: float = 0.95) -> PairedDiff:
    """Mean of a seeds x problems matrix of differences of 0/1 results, with its crossed random-effects t interval."""
    diffs = np.asarray(diffs, dtype=float)
    if diffs.ndim != 2 or diffs.size == 0:
        raise ValueError(f"expected a non-empty seeds x problems matrix, got shape {diffs.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    variance, df = variance_of_mean(diffs)
    estimate, se = float(diffs.mean()), float(np.sqrt(variance))
    return PairedDiff(estimate, se, df, *t_interval(estimate, se, df, confidence), confidence, diffs.size,
                      *diffs.shape)


def mean_over(answers: pd.DataFrame, paired: pd.DataFrame) -> float:
    """An arm's mean correctness over the seeds (rows) and problems (columns) a paired-differences matrix kept."""
    rows = answers["seed"].isin(paired.index) & answers["problem_id"].astype(str).isin(paired.columns)
    return float(answers.loc[rows, "correct"].mean())


def paired_diff(a: pd.DataFrame, b: pd.DataFrame, confidence: float = 0.95) -> PairedDiff:
    """Pair two arms' per-problem results by seed and problem id: mean of a - b with its interval."""
    return crossed_interval(paired_differences(a, b).to_numpy(), confidence)


def tost(diff: PairedDiff, margin: float, alpha: float | None = None) -> Tost:
    """Two one-sided tests of H0: |diff| >= margin, and the overall verdict.

    TOST at level alpha rejects both H0-: diff <= -m and H0+: diff >= m exactly when the two-sided
    (1 - 2 alpha) interval lies inside (-m, m); alpha defaults to 1 - confidence, so at confidence 0.95
    the TOST reads the 90% interval. Its p-value is the larger of the two one-sided t-test p-values.

    Verdict rules, first match wins:
      "equivalent"   the (1 - 2 alpha) interval lies strictly inside (-m, m);
      "different"    the confidence interval excludes 0 (and equivalence was not shown);
      "inconclusive" otherwise: the data cannot tell a difference from a match within the margin.
    Equivalence wins over a significant difference because the margin defines what difference matters.
    """
    if margin <= 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    alpha = 1 - diff.confidence if alpha is None else alpha
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha}")
    low, high = diff.interval(1 - 2 * alpha)
    if diff.se > 0:
        p_value = float(max(stats.t.sf((diff.estimate + margin) / diff.se, diff.df),
                            stats.t.cdf((diff.estimate - margin) / diff.se, diff.df)))
    else:
        p_value = 0.0 if abs(diff.estimate) < margin else 1.0
    if -margin < low and high < margin:
        verdict = "equivalent"
    elif diff.ci_low > 0 or diff.ci_high < 0:
        verdict = "different"
    else:
        verdict = "inconclusive"
    return Tost(margin=margin, alpha=alpha, ci_low=low, ci_high=high, p_value=p_value, verdict=verdict)


def minimum_detectable_difference(diff: PairedDiff, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference a two-sided test at alpha detects with the given power, from the
    observed standard error and degrees of freedom."""
    return float((stats.t.ppf(1 - alpha / 2, diff.df) + stats.t.ppf(power, diff.df)) * diff.se)


# ------------------------------------------------------------------------------ coverage, by simulation


@dataclass(frozen=True)
class StudyDesign:
    """A simulated comparison: correct ~ Bernoulli(sigmoid(arm + problem difficulty + per-run seed effect))."""

    seeds: int
    problems: int
    seed_sd: float  # sd of each training run's effect on the logit scale
    problem_sd: float = 1.0  # sd of the problems' difficulty on the logit scale
    arm_gap: float = 0.2  # the first arm's logit advantage over the second's
    base_logit: float = 0.0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def true_difference(design: StudyDesign, draws: int = 400_000, seed: int = 0) -> float:
    """The population difference of the two arms' accuracy, over problems and training runs (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(0, design.problem_sd, draws)
    first = _sigmoid(design.base_logit + design.arm_gap + difficulty + rng.normal(0, design.seed_sd, draws))
    second = _sigmoid(design.base_logit + difficulty + rng.normal(0, design.seed_sd, draws))
    return float((first - second).mean())


def simulate_differences(design: StudyDesign, rng: np.random.Generator) -> np.ndarray:
    """One simulated study's seeds x problems matrix of paired differences."""
    difficulty = rng.normal(0, design.problem_sd, design.problems)[None, :]
    runs = rng.normal(0, design.seed_sd, (2, design.seeds, 1))
    shape = (design.seeds, design.problems)
    first = rng.random(shape) < _sigmoid(design.base_logit + design.arm_gap + difficulty + runs[0])
    second = rng.random(shape) < _sigmoid(design.base_logit + difficulty + runs[1])
    return first.astype(float) - second.astype(float)


def simulate_coverage(design: StudyDesign, interval: Callable[[np.ndarray, float], tuple[float, float]],
                      confidence: float, studies: int, seed: int = 0) -> float:
    """The fraction of simulated studies whose interval(diffs, confidence) -> (low, high) holds the truth."""
    truth = true_difference(design, seed=seed)
    rng = np.random.default_rng(seed + 1)
    hits = 0
    for _ in range(studies):
        low, high = interval(simulate_differences(design, rng), confidence)
        hits += low <= truth <= high
    return hits / studies

"""Paired comparisons of two arms on the held-out set: bootstrap CI of LoRA minus FullFT, and TOST.

Each arm is a table of greedy results with columns ``seed``, ``problem_id`` and ``correct``. Seed s of
LoRA is paired with seed s of FullFT on each problem, giving a seeds x problems matrix of differences
D[s, p] = correct_lora - correct_full; the statistic is its mean.

Bootstrap scheme: seeds and problems are *crossed* factors (every seed answers every problem), and the
conclusion should generalise over both new training runs and new problems. Each replicate therefore
resamples problems with replacement (a problem is a cluster: all of its seeds move together) and,
independently, seeds with replacement (a seed is a cluster: all of its problems move together); this
is the two-way "pigeonhole" bootstrap of Owen (2007, Ann. Appl. Stat. 1(2)). Its variance estimate is
mildly conservative (it counts the seed x problem interaction twice), the safe side for both an
equivalence claim and a difference claim. With one seed it is the ordinary cluster bootstrap over
problems. The CI is the percentile interval of the replicate means.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class PairedDiff:
    """LoRA-minus-FullFT mean difference with its percentile bootstrap CI and replicates."""

    estimate: float
    ci_low: float
    ci_high: float
    confidence: float
    n_pairs: int
    n_seeds: int
    n_problems: int
    replicates: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class Tost:
    """Equivalence verdict at margin m with the (1 - 2 alpha) interval it was read from."""

    margin: float
    alpha: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str


def paired_differences(lora: pd.DataFrame, full: pd.DataFrame) -> pd.DataFrame:
    """Seeds x problems matrix of correct_lora - correct_full over seeds and problems both arms share."""
    wide = {name: _by_seed_and_problem(arm, name) for name, arm in (("lora", lora), ("full", full))}
    seeds = wide["lora"].index.intersection(wide["full"].index).sort_values()
    if seeds.empty:
        raise ValueError("the two arms share no seed: nothing can be paired")
    lora_w, full_w = (wide[name].loc[seeds] for name in ("lora", "full"))
    # A problem is paired only if every shared seed answered it in both arms.
    problems = lora_w.columns.intersection(full_w.columns)
    problems = problems[lora_w[problems].notna().all().to_numpy() & full_w[problems].notna().all().to_numpy()]
    if problems.empty:
        raise ValueError("the two arms share no problem answered in every shared seed: nothing can be paired")
    problems = problems.sort_values()
    return lora_w[problems] - full_w[problems]


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


def bootstrap_ci(diffs: np.ndarray, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> PairedDiff:
    """Mean of a seeds x problems difference matrix with a two-way (seeds, problems) bootstrap CI."""
    diffs = np.asarray(diffs, dtype=float)
    if diffs.ndim != 2 or diffs.size == 0:
        raise ValueError(f"expected a non-empty seeds x problems matrix, got shape {diffs.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    n_seeds, n_problems = diffs.shape
    rng = np.random.default_rng(seed)
    # Multinomial counts are the resampling weights: replicate b's mean is w_s[b] @ D @ w_p[b] / (S P).
    w_problems = rng.multinomial(n_problems, np.full(n_problems, 1 / n_problems), size=n_boot)
    if n_seeds > 1:
        w_seeds = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=n_boot)
    else:
        w_seeds = np.ones((n_boot, 1), dtype=int)
    replicates = np.einsum("bs,sp,bp->b", w_seeds, diffs, w_problems) / diffs.size
    low, high = np.quantile(replicates, [(1 - confidence) / 2, (1 + confidence) / 2])
    return PairedDiff(
        estimate=float(diffs.mean()), ci_low=float(low), ci_high=float(high), confidence=confidence,
        n_pairs=diffs.size, n_seeds=n_seeds, n_problems=n_problems, replicates=replicates,
    )


def paired_bootstrap_diff(
    lora: pd.DataFrame, full: pd.DataFrame, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> PairedDiff:
    """Pair two arms' per-problem results by seed and problem id, then bootstrap the mean difference."""
    return bootstrap_ci(paired_differences(lora, full).to_numpy(), confidence, n_boot, seed)


def tost(diff: PairedDiff, margin: float, alpha: float | None = None) -> Tost:
    """Two one-sided tests of H0: |diff| >= margin on the bootstrap replicates, and the overall verdict.

    TOST at level alpha rejects both H0-: diff <= -m and H0+: diff >= m exactly when the two-sided
    (1 - 2 alpha) CI lies inside (-m, m): each one-sided test at alpha is the matching end of that CI.
    alpha defaults to 1 - confidence, so at confidence 0.95 the TOST reads the 90% CI.
    The bootstrap p-value is max(P*(diff <= -m), P*(diff >= m)) over the replicates.

    Verdict rules, first match wins:
      "equivalent"   the (1 - 2 alpha) CI lies strictly inside (-m, m);
      "different"    the confidence CI excludes 0 (and equivalence was not shown);
      "inconclusive" otherwise: the data cannot tell a difference from a match within the margin.
    Equivalence wins over a significant difference because the margin defines what difference matters.
    """
    if margin <= 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    alpha = 1 - diff.confidence if alpha is None else alpha
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha}")
    reps = diff.replicates
    low, high = np.quantile(reps, [alpha, 1 - alpha])
    p_value = float(max(np.mean(reps <= -margin), np.mean(reps >= margin)))
    if -margin < low and high < margin:
        verdict = "equivalent"
    elif diff.ci_low > 0 or diff.ci_high < 0:
        verdict = "different"
    else:
        verdict = "inconclusive"
    return Tost(margin=margin, alpha=alpha, ci_low=float(low), ci_high=float(high), p_value=p_value, verdict=verdict)

"""With and without the KL penalty: the same arms, seeds and held-out problems trained at beta > 0 and at
beta = 0 ("LoRA as an Implicit KL Regularizer in GRPO Fine-Tuning": removing the penalty leaves LoRA's
accuracy within noise, and its Figure 3: FullFT without KL collapses where LoRA without KL does not).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .load import Cells, arms, regimes
from .plots import plot_kl_ablation
from .statistics import MIN_SEEDS, mean_over, paired_differences, shared_seeds
from .tables import Table, compared_worlds_sentence, comparison, final_answers, markdown_table


def with_without_kl(with_kl: Cells, without_kl: Cells, margin: float, confidence: float = 0.95) -> Table:
    """Per regime and arm in both studies: final pass@1 without minus with the penalty, paired over seeds and
    problems (crossed interval), and the TOST verdict at ±margin; an arm the two cannot be paired on is a skipped row
    with the reason."""
    kept, dropped = final_answers(with_kl), final_answers(without_kl)
    rows = []
    for regime in [r for r in regimes(without_kl) if r in regimes(with_kl)]:
        for arm in [a for a in arms(without_kl) if a in arms(with_kl)]:
            a, b = (frame[(frame["regime"] == regime) & (frame["arm"] == arm)] for frame in (dropped, kept))
            reason = _unpaired(a, b)
            if reason:
                rows.append({"regime": regime, "arm": arm, "verdict": "skipped", "reason": reason})
                continue
            paired = paired_differences(a, b)  # the means beside the difference are over the rows it pairs
            rows.append({"regime": regime, "arm": arm, "with_kl": mean_over(b, paired),
                         "without_kl": mean_over(a, paired), **comparison(a, b, margin, confidence), "reason": ""})
    columns = ["regime", "arm", "with_kl", "without_kl", "estimate", "ci_low", "ci_high", "tost_low", "tost_high",
               "mdd", "verdict", "n_seeds", "n_problems", "reason"]
    frame = pd.DataFrame(rows, columns=columns).astype({"n_seeds": "Int64", "n_problems": "Int64"})
    tost_level = 1 - 2 * (1 - confidence)
    lines = [[r.regime, r.arm, "–", "–", "–", "–", "–", f"skipped: {r.reason}", "–"] if r.verdict == "skipped" else
             [r.regime, r.arm, f"{r.with_kl:.3f}", f"{r.without_kl:.3f}", f"{r.estimate:+.3f}",
              f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]", f"[{r.tost_low:+.3f}, {r.tost_high:+.3f}]", r.verdict,
              f"{r.n_seeds} × {r.n_problems}"] for r in frame.itertuples()]
    header = ["regime", "arm", "pass@1 with KL", "without KL", "without − with", f"{confidence:.0%} CI",
              f"{tost_level:.0%} CI (TOST)", f"verdict (±{margin:g})", "seeds × problems"]
    return Table(frame, markdown_table(header, lines) if lines else "No arm ran both with and without KL.\n")


def _unpaired(without: pd.DataFrame, with_: pd.DataFrame) -> str:
    """Why an arm's answers without and with the penalty cannot be paired into an interval, or "" when they can."""
    seeds = shared_seeds(without, with_)
    if seeds < MIN_SEEDS:
        return ("one seed run both ways: no interval that holds for new training runs" if seeds else
                "no seed run both ways")
    try:
        paired_differences(without, with_)
    except ValueError as error:  # the problems are not all answered in every shared seed
        return str(error)
    return ""


ABLATION_REGIME, ABLATION_ARMS = "outcome", ("r4", "full")  # the seed paper's Figure 3: a mid rank and FullFT


def ablation_table(with_kl: Cells, without_kl: Cells, regime: str = ABLATION_REGIME,
                   ablated: tuple[str, ...] = ABLATION_ARMS) -> Table:
    """Per ablated arm, with and without the penalty: base, peak and final pass@1 (mean over seeds), and whether
    any seed collapsed (ended below its base). The peak is taken over the problems both studies scored at every
    evaluation: a study whose curve scores fewer problems would otherwise peak over noisier means."""
    shared = scored_everywhere([cells.answers[cells.answers["regime"] == regime] for cells in (with_kl, without_kl)])
    rows = []
    for arm in ablated:
        for cells, penalty in ((with_kl, "with KL"), (without_kl, "without KL")):
            s = cells.summaries[(cells.summaries["regime"] == regime) & (cells.summaries["arm"] == arm)]
            if s.empty:
                continue
            answers = cells.answers[cells.answers["cell"].isin(s["cell"]) & cells.answers["problem_id"].isin(shared)
                                    & (cells.answers["step"] > 0)]  # the peak of training, not the base
            peaks = answers.groupby(["cell", "step"])["correct"].mean().groupby("cell").max()
            rows.append({"arm": arm, "penalty": penalty, "base": s["base_pass1"].mean(), "peak": peaks.mean(),
                         "final": s["final_pass1"].mean(),
                         "collapsed_seeds": int((s["final_pass1"] < s["base_pass1"]).sum()), "seeds": len(s)})
    frame = pd.DataFrame(rows, columns=["arm", "penalty", "base", "peak", "final", "collapsed_seeds", "seeds"])
    lines = [[r.arm, r.penalty, f"{r.base:.3f}", f"{r.peak:.3f}", f"{r.final:.3f}", f"{r.collapsed_seeds} of {r.seeds}"]
             for r in frame.itertuples()]
    header = ["arm", "penalty", "base", f"peak pass@1 ({len(shared)} problems)", "final pass@1",
              "seeds ending below base"]
    return Table(frame, markdown_table(header, lines) if lines else "No ablated arm ran.\n")


def scored_everywhere(answers: list[pd.DataFrame]) -> set[str]:
    """The problems every evaluation of every cell in these answer tables scored."""
    scored = [set(ids) for frame in answers for _, ids in frame.groupby(["cell", "step"])["problem_id"]]
    return set.intersection(*scored) if scored else set()


def write_kl_comparison(with_kl: Cells, without_kl: Cells, out_dir: str | Path, margin: float,
                        confidence: float = 0.95, names: tuple[str, str] = ("with KL", "without KL")) -> Path:
    """with_without_kl.csv, ablation.csv, figures/kl_ablation.png and kl_comparison.md under out_dir; returns the
    markdown's path."""
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    compared, ablation = with_without_kl(with_kl, without_kl, margin, confidence), ablation_table(with_kl, without_kl)
    for name, table in (("with_without_kl", compared), ("ablation", ablation)):
        table.frame.to_csv(out / f"{name}.csv", index=False)
    plot_kl_ablation(with_kl, without_kl, ABLATION_REGIME, list(ABLATION_ARMS), out / "figures" / "kl_ablation.png")
    text = "\n".join([
        f"# With and without the KL penalty ({names[0]} vs {names[1]})",
        "",
        compared_worlds_sentence({names[0]: with_kl.worlds, names[1]: without_kl.worlds}),
        "",
        "## Accuracy",
        "",
        "Final greedy pass@1 without minus with the penalty, paired over seeds and held-out problems; "
        f"{confidence:.0%} crossed interval; TOST: equivalent when the interval of the test lies inside the margin.",
        "",
        compared.markdown,
        f"## The ablation of the seed paper's Figure 3 ({ABLATION_REGIME}, {' and '.join(ABLATION_ARMS)})",
        "",
        "The paper: FullFT without KL collapses, LoRA without KL does not.",
        "",
        ablation.markdown,
        "![kl_ablation](figures/kl_ablation.png)",
        "",
        "Time: these KL-free cells still score the reference to record the KL (`track_kl`), so what skipping the "
        "reference pass saves is measured by the benchmark (`python -m reward_density.tools.benchmark`), not here.",
    ])
    path = out / "kl_comparison.md"
    path.write_text(text)
    return path

"""The study's tables: accuracy over seeds, the gain of RL over the base, LoRA-vs-FullFT equivalence."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from .load import KEYS, Cells, arm_name, arms, regimes, world_entries
from .statistics import (
    MAX_PROJECTED_SEEDS,
    MIN_SEEDS,
    crossed_interval,
    mean_over,
    minimum_detectable_difference,
    paired_differences,
    seeds_can_decide,
    seeds_for_equivalence,
    shared_seeds,
    tost,
)


@dataclass(frozen=True)
class Table:
    """A tidy numeric table (for CSV) with its markdown rendering."""

    frame: pd.DataFrame
    markdown: str


def _mean_sd(values: pd.Series) -> dict:
    """Mean, sample sd (NaN for one value) and count."""
    return {"mean": values.mean(), "sd": values.std(ddof=1), "n": int(values.count())}


def peak_pass1(cells: Cells) -> pd.DataFrame:
    """Per cell, the best greedy pass@1 over evaluations after training began (step > 0)."""
    trained = cells.evals[cells.evals["step"] > 0]
    return trained.groupby(KEYS, dropna=False, sort=False)["pass1"].max().reset_index()


def accuracy_table(cells: Cells) -> Table:
    """Mean ± sd over seeds of greedy pass@1 per regime x arm, process also at its peak, with the base."""
    peak = peak_pass1(cells)
    rows = []
    for regime in regimes(cells):
        end = cells.summaries[cells.summaries["regime"] == regime]
        sources = {regime: (end, "final_pass1")}
        if regime == "process":
            sources = {"process (peak)": (peak[peak["regime"] == regime], "pass1"),
                       "process (end)": (end, "final_pass1")}
        base = _mean_sd(end["base_pass1"])
        for label, (frame, column) in sources.items():
            rows.append({"row": label, "regime": regime, "arm": "base", **base})
            for arm in arms(cells):
                values = frame.loc[frame["arm"] == arm, column]
                if len(values):
                    rows.append({"row": label, "regime": regime, "arm": arm, **_mean_sd(values)})
    frame = pd.DataFrame(rows, columns=["row", "regime", "arm", "mean", "sd", "n"])
    return Table(frame, _accuracy_markdown(frame, ["base", *arms(cells)]))


def _accuracy_markdown(frame: pd.DataFrame, columns: list[str]) -> str:
    """Regime rows x arm columns of "mean ± sd" strings, with the seeds per row."""
    lines = []
    for row, group in frame.groupby("row", sort=False):
        cells = {r.arm: _format_mean_sd(r.mean, r.sd, r.n) for r in group.itertuples()}
        n = group.loc[group["arm"] != "base", "n"]
        seeds = f"{n.min()}" if n.min() == n.max() else f"{n.min()}–{n.max()}"
        lines.append([row, *(cells.get(c, "–") for c in columns), seeds if len(n) else "0"])
    return markdown_table(["regime", *columns, "n seeds"], lines)


def _format_mean_sd(mean: float, sd: float, n: int) -> str:
    """"0.412 ± 0.021", or "0.412 (n=1)" when there is one seed."""
    return mean_sd(mean, sd, 3) + (" (n=1)" if n == 1 else "")


def mean_sd(mean: float, sd: float, digits: int) -> str:
    """"mean ± sd" to the digits; the mean alone where there is no sd (one seed)."""
    return f"{mean:.{digits}f}" if pd.isna(sd) else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def rounded(frame: pd.DataFrame, decimals: int = 4) -> pd.DataFrame:
    """frame rounded for printing, without -0.0: the sign of a value that rounds to zero is float noise that
    differs between CPUs (a GRPO loss near 0), and printed outputs are compared across machines."""
    out = frame.round(decimals)
    floats = out.select_dtypes("float").columns
    out[floats] = out[floats] + 0.0  # IEEE 754: -0.0 + 0.0 = +0.0
    return out


def markdown_table(header: list[str], rows: Iterable[list]) -> str:
    """A GitHub-flavoured markdown table from a header and rows of cell values."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def final_answers(cells: Cells) -> pd.DataFrame:
    """Per-problem answers at each cell's last evaluation step."""
    answers = cells.answers
    last = answers.groupby("cell")["step"].transform("max")
    return answers[answers["step"] == last]


def equivalence_table(cells: Cells, margin: float, confidence: float = 0.95,
                      answers: pd.DataFrame | None = None) -> Table:
    """Per regime and rank: LoRA minus FullFT final pass@1 with its crossed (seeds x problems) interval, the
    TOST verdict, and the power the comparison had: the half-width of the TOST interval and the minimum
    detectable difference (80% power, at the level of the test behind "different": two-sided, 1 - confidence),
    and the seeds a powered TOST would need. answers: other per-problem answers to compare, in the
    regimes they cover (stopping.py's at each cell's dev-chosen step); unset, every cell's final ones. Each regime
    gets a row for every rank any compared regime ran, skipped where it has no answers, so that a rank whose cells
    failed in one regime leaves that regime's needed rank open rather than absent from its grid."""
    compared = regimes(cells) if answers is None else [r for r in regimes(cells) if r in set(answers["regime"])]
    answers = final_answers(cells) if answers is None else answers
    of_compared = cells.summaries[cells.summaries["regime"].isin(compared)]
    ranks = sorted(int(r) for r in of_compared["rank"].dropna().unique())
    rows = []
    for regime in compared:
        full = _answers_of(answers, regime, None)
        for rank in ranks:
            row = {"regime": regime, "rank": rank, "arm": arm_name(rank)}
            lora = _answers_of(answers, regime, rank)
            reason = _skip_reason(lora, full)
            if reason:
                rows.append({**row, "verdict": "skipped", "reason": reason})
                continue
            rows.append({**row, **comparison(lora, full, margin, confidence), "reason": ""})
    columns = ["regime", "rank", "arm", "estimate", "se", "df", "ci_low", "ci_high", "tost_low", "tost_high",
               "tost_half_width", "mdd", "p_tost", "verdict", "seeds_needed", "seeds_suffice", "n_pairs", "n_seeds",
               "n_problems", "reason"]
    counts = ("rank", "seeds_needed", "n_pairs", "n_seeds", "n_problems")
    frame = pd.DataFrame(rows, columns=columns).astype(dict.fromkeys(counts, "Int64"))
    return Table(frame, _equivalence_markdown(frame, margin, confidence))


def comparison(a: pd.DataFrame, b: pd.DataFrame, margin: float, confidence: float = 0.95) -> dict:
    """a minus b, paired over seeds and problems: the crossed interval, TOST at ±margin, the power it had and
    the seeds it would need."""
    diffs = paired_differences(a, b).to_numpy()
    diff = crossed_interval(diffs, confidence)
    test = tost(diff, margin)
    return {"estimate": diff.estimate, "se": diff.se, "df": diff.df, "ci_low": diff.ci_low, "ci_high": diff.ci_high,
            "tost_low": test.ci_low, "tost_high": test.ci_high, "tost_half_width": (test.ci_high - test.ci_low) / 2,
            "mdd": minimum_detectable_difference(diff, alpha=1 - confidence), "p_tost": test.p_value,
            "verdict": test.verdict, "seeds_needed": seeds_for_equivalence(diffs, margin, alpha=test.alpha),
            "seeds_suffice": seeds_can_decide(diffs, margin, alpha=test.alpha),
            "n_pairs": diff.n_pairs, "n_seeds": diff.n_seeds, "n_problems": diff.n_problems}


WORLDS = "worlds.csv"  # a study's cells' world records (report.py writes it; a replication reads it back)
PAIRED_CONSEQUENCE = "A difference paired over problems then mixes what the studies compare with the world they ran on."


def worlds_frame(worlds: dict[str, dict[str, str]]) -> pd.DataFrame:
    """Cells' world records (Cells.worlds) as rows of cell, entry and fingerprint; a cell that recorded none gets
    one row with both empty."""
    rows = [[cell, entry, value] for cell, record in worlds.items() for entry, value in (record or {"": ""}).items()]
    return pd.DataFrame(rows, columns=["cell", "entry", "fingerprint"])


def frame_worlds(frame: pd.DataFrame) -> dict[str, dict[str, str]]:
    """worlds_frame's rows (read with dtype=str, empty kept as '') back as each cell's record."""
    worlds: dict[str, dict[str, str]] = {}
    for row in frame.itertuples():
        record = worlds.setdefault(row.cell, {})
        if row.entry:
            record[row.entry] = row.fingerprint
    return worlds


def compared_worlds_sentence(worlds: dict[str, dict[str, dict[str, str]]],
                             consequence: str = PAIRED_CONSEQUENCE) -> str:
    """Whether the compared studies' cells read one world, entry by entry, from each study's cells' records (study
    -> cell -> Cells.worlds' record); not known where a study's cells recorded none; `consequence` says what two
    worlds mean for the comparison."""
    if unrecorded_studies := [study for study, cells in worlds.items() if not any(cells.values())]:
        return (f"The cells of {' and '.join(unrecorded_studies)} recorded no world (they predate the record): "
                f"whether the studies read one is not known.")
    records = [(study, record) for study, cells in worlds.items() for record in cells.values()]
    read: dict[str, dict[str, set[str]]] = {}  # entry -> fingerprint -> the studies whose cells read it
    for study, record in records:
        for entry, value in record.items():
            read.setdefault(entry, {}).setdefault(value, set()).add(study)
    seen = {entry: read[entry] for entry in world_entries(record for _, record in records)}
    unrecorded = sum(not record for _, record in records)
    caveat = f" ({unrecorded} cell{'s' * (unrecorded > 1)} recorded none)" if unrecorded else ""
    differing = {entry: values for entry, values in seen.items() if len(values) > 1}
    if not differing:
        return _one_world_sentence(seen, set(worlds), caveat)
    parts = [f"{entry} " + ", ".join(f"{value} ({', '.join(sorted(names))})" for value, names in values.items())
             for entry, values in differing.items()]
    return f"**The compared studies read different worlds**{caveat}: {'; '.join(parts)}. {consequence}"


def _one_world_sentence(seen: dict[str, dict[str, set[str]]], studies: set[str], caveat: str) -> str:
    """The compared studies' one world (entry -> its one fingerprint -> the studies that read it): the entries all
    read, then each entry only some read, named with its readers."""
    shared = {entry: next(iter(values)) for entry, values in seen.items() if set().union(*values.values()) == studies}
    some = [f"only {' and '.join(sorted(readers))} read {entry} {value}"
            for entry, values in seen.items() if entry not in shared for value, readers in values.items()]
    one = [", ".join(f"{entry} {value}" for entry, value in shared.items())] if shared else []
    said = "read one world" if shared else "read no world entry in common"
    return f"The compared studies' cells {said}{caveat}: {'; '.join(one + some)} (a hash of each entry's files)."


def gain_table(cells: Cells, confidence: float = 0.95) -> Table:
    """Per regime and arm: did training move pass@1? Final minus step-0 answers of the same cells, crossed interval."""
    answers = cells.answers
    base, final = answers[answers["step"] == 0], final_answers(cells)
    final = final[final["step"] > 0]  # a cell that never trained has no gain to report
    rows = []
    for regime in regimes(cells):
        for arm in arms(cells):
            row = {"regime": regime, "arm": arm}
            before, after = (frame[(frame["regime"] == regime) & (frame["arm"] == arm)] for frame in (base, final))
            if before.empty or after.empty:
                rows.append({**row, "reason": "no step-0 and final evaluation of the same cell"})
                continue
            if shared_seeds(after, before) < MIN_SEEDS:
                rows.append({**row, "reason": "one seed: no interval that holds for new training runs"})
                continue
            try:
                paired = paired_differences(after, before)
            except ValueError as error:  # no problem answered at step 0 and at the end in every seed
                rows.append({**row, "reason": str(error)})
                continue
            diff = crossed_interval(paired.to_numpy(), confidence)
            rows.append({
                **row, "base": mean_over(before, paired),  # over the pairs the gain reads: final - base = gain
                "final": mean_over(after, paired), "gain": diff.estimate, "ci_low": diff.ci_low,
                "ci_high": diff.ci_high, "n_seeds": diff.n_seeds, "n_problems": diff.n_problems, "reason": "",
            })
    columns = ["regime", "arm", "base", "final", "gain", "ci_low", "ci_high", "n_seeds", "n_problems", "reason"]
    frame = pd.DataFrame(rows, columns=columns).astype({"n_seeds": "Int64", "n_problems": "Int64"})
    return Table(frame, _gain_markdown(frame))


def _gain_markdown(frame: pd.DataFrame) -> str:
    """Regime rows x arm columns of "gain [CI]", a star where the CI excludes 0."""
    if frame.empty:
        return "No evaluated cell.\n"
    columns = list(dict.fromkeys(frame["arm"]))
    lines = []
    for regime, group in frame.groupby("regime", sort=False):
        values = {}
        for r in group.itertuples():
            if r.reason:
                values[r.arm] = "–"
                continue
            moved = "*" if r.ci_low > 0 or r.ci_high < 0 else ""
            values[r.arm] = f"{r.gain:+.3f}{moved} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
        lines.append([regime, *(values.get(c, "–") for c in columns)])
    return markdown_table(["regime", *columns], lines)


def _answers_of(answers: pd.DataFrame, regime: str, rank: int | None) -> pd.DataFrame:
    """One arm's answers in one regime (rank None = FullFT)."""
    arm = answers["rank"].isna() if rank is None else answers["rank"] == rank
    return answers[(answers["regime"] == regime) & arm.fillna(False)]


def _skip_reason(lora: pd.DataFrame, full: pd.DataFrame) -> str:
    """Why a LoRA arm cannot be compared with FullFT, or "" when it can."""
    if full.empty:
        return "no finished FullFT cell with answers in this regime"
    if lora.empty:
        return "no answers for this LoRA arm"
    seeds = shared_seeds(lora, full)
    if not seeds:
        return "no seed shared with FullFT"
    if seeds < MIN_SEEDS:
        return "one seed shared with FullFT: no interval that holds for new training runs"
    try:
        paired_differences(lora, full)
    except ValueError as error:  # the problems are not all answered in every shared seed
        return str(error)
    return ""


def _equivalence_markdown(frame: pd.DataFrame, margin: float, confidence: float) -> str:
    """The equivalence table as markdown, skipped rows with their reason."""
    if frame.empty:
        return "No LoRA arm to compare with FullFT.\n"
    tost_level = 1 - 2 * (1 - confidence)
    header = ["regime", "arm", "LoRA − FullFT", f"{confidence:.0%} CI", f"{tost_level:.0%} CI (TOST)",
              f"verdict (±{margin:g})", "pairs (seeds × problems)"]
    lines = []
    for r in frame.itertuples():
        if r.verdict == "skipped":
            lines.append([r.regime, r.arm, "–", "–", "–", f"skipped: {r.reason}", "–"])
            continue
        lines.append([
            r.regime, r.arm, f"{r.estimate:+.3f}", f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]",
            f"[{r.tost_low:+.3f}, {r.tost_high:+.3f}]", r.verdict, f"{r.n_pairs} ({r.n_seeds} × {r.n_problems})",
        ])
    return markdown_table(header, lines)


def power_markdown(equivalence: pd.DataFrame) -> str:
    """Regime x LoRA arm: standard error, degrees of freedom, TOST half-width, minimum detectable difference and
    the seeds a powered equivalence test would need."""
    compared = equivalence[equivalence["verdict"] != "skipped"]
    if compared.empty:
        return "No LoRA arm was compared with FullFT.\n"
    lines = [[r.regime, r.arm, f"{r.se:.4f}", f"{r.df:.1f}", f"±{r.tost_half_width:.3f}", f"{r.mdd:.3f}",
              _seeds_cell(r), r.n_seeds] for r in compared.itertuples()]
    return markdown_table(["regime", "arm", "SE", "df", "TOST interval half-width", "min. detectable difference",
                           "seeds for 80% TOST power at a true 0", "seeds run"], lines)


def _seeds_cell(row) -> str:
    """The power table's projected seeds: a count, more than the projection tries, or none where only more
    problems would do."""
    if not pd.isna(row.seeds_needed):
        return str(row.seeds_needed)
    return "none: more problems" if only_more_problems(row) else f"> {MAX_PROJECTED_SEEDS}"


def only_more_problems(row) -> bool:
    """Whether an equivalence row's projection found that no number of seeds decides it, only more problems (an
    equivalence CSV written before seeds_suffice existed: not known, so no)."""
    suffice = getattr(row, "seeds_suffice", True)
    return not pd.isna(suffice) and not suffice


def capability_markdown(table: pd.DataFrame) -> str:
    """The capability baseline (paper Table 2) as markdown, numbers to three decimals."""
    rows = [[f"{v:.3f}" if isinstance(v, float) else v for v in row] for row in table.itertuples(index=False)]
    return markdown_table(list(table.columns), rows)

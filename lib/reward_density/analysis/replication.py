"""A study run again under other conditions (a world built from another seed, fresh training seeds) beside the
study it replicates: verdict by verdict, and the FullFT gains that say whether RL learned in both.

Both are read from the studies' own tables (equivalence.csv, gain.csv, written by their analyses), so the original
study's cells need not be on disk: its committed summaries are enough. Where both stopped each cell at its best dev
step (stopping.py), their comparisons at those steps are set side by side too; where both wrote the world their cells
read (worlds.csv), the report says whether it was one.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .plots import plot_equivalence
from .rank_needed import TOO_FEW_DENSITIES, growth, needed_frame, needed_ranks
from .tables import WORLDS, Table, compared_worlds_sentence, frame_worlds, markdown_table, mean_sd

SUMMARIES = ("equivalence.csv", "gain.csv")
STOPPING_SUMMARIES = ("equivalence_chosen.csv", "chosen_steps.csv")  # a dev-stopped study's (report.py), if any
OPTIONAL_SUMMARIES = (*STOPPING_SUMMARIES, WORLDS)  # WORLDS: absent where the analysis predates it
REPLICATION_FILES = ("replication.md", "replication.csv", "figures/replication.png")
STOPPING_FILES = ("replication_chosen.csv", "figures/replication_chosen.png")
STUDIES = ("original", "replication")  # the suffixes of each study's columns once both are side by side
# What two worlds mean for a replication (tables.compared_worlds_sentence)
REPLICATION_CONSEQUENCE = ("A replication in another world is meant to; for one on fresh seeds of the same world, a "
                           "verdict that did not hold may owe it to the world rather than to the seeds.")


def read_summaries(study_dir: str | Path) -> dict[str, pd.DataFrame]:
    """A finished study's equivalence and gain tables, and its dev-stopped ones and world records where it has
    them, by file name; a missing equivalence or gain table is an error naming it."""
    folder = Path(study_dir)
    missing = [name for name in SUMMARIES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} has no {' or '.join(missing)}: run that study's analysis first")
    present = [*SUMMARIES, *(name for name in OPTIONAL_SUMMARIES if (folder / name).is_file())]
    return {name: _read_summary(folder / name) for name in present}


def _read_summary(path: Path) -> pd.DataFrame:
    """One summary table; the world records as text (a fingerprint of digits is not a number)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False) if path.name == WORLDS else pd.read_csv(path)


def worlds_sentence(original: dict[str, pd.DataFrame], replication: dict[str, pd.DataFrame],
                    names: tuple[str, str]) -> str:
    """Whether the two studies' cells read one world, entry by entry, from their worlds.csv; not known where a
    study has none."""
    studies = dict(zip(names, (original, replication)))
    if missing := [name for name, summaries in studies.items() if WORLDS not in summaries]:
        return (f"Whether the two studies' cells read one world is not known: no {WORLDS} in "
                f"{' or '.join(missing)} (the analysis writes it since cells record their world).")
    return compared_worlds_sentence({name: frame_worlds(summaries[WORLDS]) for name, summaries in studies.items()},
                                    REPLICATION_CONSEQUENCE)


def both_stopped(original: dict[str, pd.DataFrame], replication: dict[str, pd.DataFrame]) -> bool:
    """Whether both studies stopped each cell at its best dev step, so their comparisons there can be set side by
    side."""
    return all(name in summaries for name in STOPPING_SUMMARIES for summaries in (original, replication))


def _side_by_side(original: pd.DataFrame, replication: pd.DataFrame, keys: list[str],
                  columns: list[str]) -> pd.DataFrame:
    """The rows both tables have (by keys), each study's columns suffixed with its name in STUDIES."""
    suffixes = tuple(f"_{study}" for study in STUDIES)
    return original[keys + columns].merge(replication[keys + columns], on=keys, suffixes=suffixes)


def verdict_agreement(original: pd.DataFrame, replication: pd.DataFrame, names: tuple[str, str]) -> Table:
    """Every LoRA-vs-FullFT comparison both equivalence tables made: both differences and verdicts, and whether
    the verdicts agree; comparisons made by one study only (a skipped one is not made) are counted, not compared."""
    original, replication = (frame[frame["verdict"] != "skipped"] for frame in (original, replication))
    both = _side_by_side(original, replication, ["regime", "arm"], ["estimate", "ci_low", "ci_high", "verdict"])
    both["agree"] = verdicts_agree(both)
    only = len(original) + len(replication) - 2 * len(both)
    rows = [[r.regime, r.arm, _with_interval(r, "estimate", "original"), r.verdict_original,
             _with_interval(r, "estimate", "replication"), r.verdict_replication, "yes" if r.agree else "**no**"]
            for r in both.itertuples()]
    header = ["regime", "arm", f"{names[0]}: LoRA − FullFT [CI]", "verdict", f"{names[1]}: LoRA − FullFT [CI]",
              "verdict", "agree"]
    summary = f"**{int(both['agree'].sum())} of {len(both)} verdicts agree**"
    summary += f"; not compared, made by one study only: {only}.\n" if only else ".\n"
    return Table(both, summary + "\n" + markdown_table(header, rows))


def verdicts_agree(both: pd.DataFrame) -> pd.Series:
    """Per side-by-side comparison, whether both studies gave one verdict; two *different* verdicts agree only when
    LoRA lies on the same side of FullFT in both."""
    same_verdict = both["verdict_original"] == both["verdict_replication"]
    same_side = both["estimate_original"].gt(0) == both["estimate_replication"].gt(0)
    return same_verdict & ((both["verdict_original"] != "different") | same_side)


def _with_interval(row, value: str, study: str) -> str:
    """A merged row's `value` of one study with that study's interval, e.g. '+0.012 [-0.004, +0.028]'."""
    return (f"{getattr(row, f'{value}_{study}'):+.3f} [{getattr(row, f'ci_low_{study}'):+.3f}, "
            f"{getattr(row, f'ci_high_{study}'):+.3f}]")


def needed_agreement(original: pd.DataFrame, replication: pd.DataFrame, names: tuple[str, str]) -> Table:
    """The rank each regime needs to match FullFT (rank_needed.py) in both studies' equivalence tables, and, where
    either spans two densities, the answer each gives to whether it grows with the reward's density."""
    needed = [needed_ranks(frame) for frame in (original, replication)]
    both = _side_by_side(*(needed_frame(study) for study in needed), ["regime"], ["needed"])
    both["agree"] = both["needed_original"] == both["needed_replication"]
    rows = [[r.regime, r.needed_original, r.needed_replication, "yes" if r.agree else "**no**"]
            for r in both.itertuples()]
    table = markdown_table(["regime", f"rank needed, {names[0]}", f"rank needed, {names[1]}", "agree"], rows)
    answers = {name: growth(study) for name, study in zip(names, needed)}
    if set(answers.values()) <= set(TOO_FEW_DENSITIES):  # the question needs two densities; neither study has them
        return Table(both, table)
    said = ", ".join(f"{name}: {answer}" for name, answer in answers.items())
    return Table(both, f"{table}\nDoes the needed rank grow with the reward's density? {said}.\n")


def fullft_gains(original: pd.DataFrame, replication: pd.DataFrame, names: tuple[str, str]) -> Table:
    """Each regime's FullFT arm in both studies: its base pass@1 and its gain over it with the interval."""
    full = [frame[frame["arm"] == "full"] for frame in (original, replication)]
    both = _side_by_side(*full, ["regime"], ["base", "gain", "ci_low", "ci_high"])
    rows = [[r.regime] + [f"{getattr(r, f'base_{s}'):.3f}" for s in STUDIES]
            + [_with_interval(r, "gain", s) for s in STUDIES] for r in both.itertuples()]
    header = ["regime", f"base, {names[0]}", f"base, {names[1]}", f"FullFT gain, {names[0]}",
              f"FullFT gain, {names[1]}"]
    return Table(both, markdown_table(header, rows))


def stopping_steps(original: pd.DataFrame, replication: pd.DataFrame, names: tuple[str, str]) -> Table:
    """Each arm of two dev-stopped studies (their chosen_steps tables): where it stopped and its held-out pass@1
    there, mean ± sd over seeds (the mean alone for one seed), in both."""
    both = _side_by_side(original, replication, ["regime", "arm"],
                         ["step_mean", "step_std", "heldout_pass1_mean", "heldout_pass1_std"])
    rows = [[r.regime, r.arm]
            + [f"{mean_sd(getattr(r, f'step_mean_{s}'), getattr(r, f'step_std_{s}'), 0)}, "
               f"{mean_sd(getattr(r, f'heldout_pass1_mean_{s}'), getattr(r, f'heldout_pass1_std_{s}'), 3)}"
               for s in STUDIES] for r in both.itertuples()]
    header = ["regime", "arm", f"{names[0]}: step, held-out pass@1", f"{names[1]}: step, held-out pass@1"]
    return Table(both, markdown_table(header, rows))


def write_replication_report(original_dir: str | Path, replication_dir: str | Path, names: tuple[str, str],
                             margin: float) -> Path:
    """replication.md (the two tables and the figure), replication.csv (the verdicts side by side) and
    figures/replication.png (both studies' intervals, arm by arm, against the margin) in replication_dir; for two
    dev-stopped studies also their comparisons at the chosen steps (a section, replication_chosen.csv and .png)."""
    original, replication = read_summaries(original_dir), read_summaries(replication_dir)
    out = Path(replication_dir)
    report, table, figure = (out / name for name in REPLICATION_FILES)
    verdicts = _write_comparison(original, replication, "equivalence.csv", names, margin, table, figure)
    needed = needed_agreement(original["equivalence.csv"], replication["equivalence.csv"], names)
    gains = fullft_gains(original["gain.csv"], replication["gain.csv"], names)
    stopping = (_stopping_section(original, replication, names, margin, out)
                if both_stopped(original, replication) else "")
    report.write_text(
        f"# {names[1]} against {names[0]}\n\n"
        f"The same LoRA-vs-FullFT comparisons in both studies, each at the margin and confidence level it was "
        f"analysed with (its report.md), read from their equivalence.csv and gain.csv. A flip from *equivalent* or "
        f"*different* to *inconclusive* is a loss of power; one between *equivalent* and *different*, or from LoRA "
        f"significantly ahead of FullFT to significantly behind it or back, is a result that did not hold.\n\n"
        f"{worlds_sentence(original, replication, names)}\n\n## Verdicts\n\n{verdicts.markdown}\n"
        f"![LoRA − FullFT per rank in both studies: TOST interval (thick), confidence interval (thin), "
        f"±{margin:g} margin (band)](figures/replication.png)\n\n"
        f"## The rank needed to match FullFT, in both\n\n{needed.markdown}\n"
        f"## Did training move both? FullFT's gain over its base (the SFT control's on its own skill)\n\n"
        f"{gains.markdown}{stopping}"
    )
    return report


def _write_comparison(original: dict[str, pd.DataFrame], replication: dict[str, pd.DataFrame], summary: str,
                      names: tuple[str, str], margin: float, table: Path, figure: Path) -> Table:
    """Both studies' verdicts in one of their equivalence tables (`summary`): written side by side to `table` and
    drawn, arm by arm against the margin, to `figure`."""
    verdicts = verdict_agreement(original[summary], replication[summary], names)
    verdicts.frame.to_csv(table, index=False)
    plot_equivalence({name: summaries[summary] for name, summaries in zip(names, (original, replication))},
                     margin, figure)
    return verdicts


def _stopping_section(original: dict[str, pd.DataFrame], replication: dict[str, pd.DataFrame],
                      names: tuple[str, str], margin: float, out: Path) -> str:
    """The report's section on two dev-stopped studies, its verdicts (replication_chosen.csv) and figure written."""
    table, figure = (out / name for name in STOPPING_FILES)
    verdicts = _write_comparison(original, replication, "equivalence_chosen.csv", names, margin, table, figure)
    needed = needed_agreement(original["equivalence_chosen.csv"], replication["equivalence_chosen.csv"], names)
    steps = stopping_steps(original["chosen_steps.csv"], replication["chosen_steps.csv"], names)
    return (f"\n## At each arm's dev-chosen step\n\nBoth studies stopped each cell at its own best dev evaluation "
            f"and compared LoRA with FullFT on the held-out answers there (the verdicts above are at the last step)."
            f"\n\n{verdicts.markdown}\n![LoRA − FullFT at the dev-chosen steps in both studies](figures/"
            f"replication_chosen.png)\n\nThe rank needed to match FullFT at those steps:\n\n{needed.markdown}\n"
            f"Where each arm stopped (mean ± sd over seeds):\n\n{steps.markdown}")

"""The study's question read off its verdicts: the LoRA rank each regime needs to match FullFT, and whether that rank
grows with the reward's density.

A rank *matches* FullFT when TOST shows it equivalent or when it is significantly ahead of FullFT; it is *behind* when
it is significantly below without equivalence shown; inconclusive and skipped comparisons decide nothing. Assuming
that a larger rank never needs less capacity, the needed rank lies above every rank behind and at or below the
smallest rank that matches. It is pinned when no undecided rank lies between the two: to one step of the grid, or,
where no rank matches, to everything above the largest rank run. Two regimes of different densities are ordered only
where their ranges do not overlap, or where both are pinned to the same step of the grid (two regimes that every rank
trails may need different ranks above it).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pandas as pd

from ..experiment.config import SFT
from ..rewards import DENSITIES, DENSITY, REGIMES
from .statistics import MAX_PROJECTED_SEEDS
from .tables import Table, markdown_table, only_more_problems

COLUMNS_READ = ("regime", "rank", "estimate", "verdict")  # of an equivalence table


@dataclass(frozen=True)
class NeededRank:
    """Where one regime's needed rank lies among the ranks it ran: above `above` (0: no rank is behind) and at most
    `at_most` (None: no rank matches); `undecided` maps each rank between the two to its verdict."""

    regime: str
    above: int
    at_most: int | None
    undecided: dict[int, str]

    @property
    def monotone(self) -> bool:
        """False when a rank is behind FullFT although a smaller one matches it."""
        return self.at_most is None or self.above < self.at_most

    @property
    def pinned(self) -> bool:
        """True when no undecided rank lies inside the range: it holds one step of the grid, or (no rank matching)
        everything above the largest rank run."""
        return self.monotone and not self.undecided

    @property
    def bounds(self) -> tuple[float, float]:
        """The needed rank's range (low, high]: high is infinite when no rank matches."""
        return self.above, math.inf if self.at_most is None else self.at_most

    def describe(self) -> str:
        """The needed rank in words: 'r1 or less', 'r8', 'more than r16', or a range with the verdicts that leave it
        open."""
        if not self.monotone:
            return f"not monotone: r{self.above} is behind FullFT although r{self.at_most} matches it"
        if self.pinned and self.above and self.at_most is not None:
            return f"r{self.at_most}"
        low = f"more than r{self.above}" if self.above else ""
        high = "" if self.at_most is None else f"at most r{self.at_most}" if low else f"r{self.at_most} or less"
        text = ", ".join(filter(None, [low, high])) or "unknown"
        if not self.undecided:
            return text
        by_verdict = [", ".join(f"r{rank}" for rank, v in self.undecided.items() if v == verdict) + f" {verdict}"
                      for verdict in dict.fromkeys(self.undecided.values())]
        return f"{text} ({'; '.join(by_verdict)})"


def standing(verdict: str, estimate: float) -> str:
    """Where one rank stands against FullFT: 'matches' (equivalent, or significantly ahead), 'behind' (significantly
    below) or 'undecided' (inconclusive or skipped)."""
    if verdict == "equivalent" or (verdict == "different" and estimate > 0):
        return "matches"
    return "behind" if verdict == "different" and estimate < 0 else "undecided"


def _needed(regime: str, rows: pd.DataFrame) -> NeededRank:
    """A regime's needed rank from its rows of the equivalence table."""
    rows = rows.sort_values("rank")
    standings = {int(r.rank): standing(r.verdict, r.estimate) for r in rows.itertuples()}
    above = max((rank for rank, s in standings.items() if s == "behind"), default=0)
    at_most = min((rank for rank, s in standings.items() if s == "matches"), default=None)
    undecided = {int(r.rank): r.verdict for r in rows.itertuples()
                 if above < r.rank < (math.inf if at_most is None else at_most)}
    return NeededRank(regime, above, at_most, undecided)


def needed_ranks(equivalence: pd.DataFrame) -> list[NeededRank]:
    """Each compared regime's needed rank, from an equivalence table (tables.equivalence_table's frame or its CSV)."""
    if missing := [column for column in COLUMNS_READ if column not in equivalence.columns]:
        raise ValueError(f"not an equivalence table: it lacks the column(s) {missing}")
    return [_needed(regime, rows) for regime, rows in equivalence.groupby("regime", sort=False)]


def _order(sparser: NeededRank, denser: NeededRank) -> str | None:
    """'more', 'less' or 'same': what the denser regime needs against the sparser one; None where unknown."""
    if not (sparser.monotone and denser.monotone):
        return None
    (low_s, high_s), (low_d, high_d) = sparser.bounds, denser.bounds
    if sparser.pinned and denser.pinned and sparser.bounds == denser.bounds and sparser.at_most is not None:
        return "same"
    if high_s <= low_d:
        return "more"
    if high_d <= low_s:
        return "less"
    return None


NO_RL_REGIME, ONE_DENSITY = "no RL regime", "one density"  # growth()'s answers where there is nothing to order
TOO_FEW_DENSITIES = (NO_RL_REGIME, ONE_DENSITY)


def by_density(needed: list[NeededRank]) -> list[NeededRank]:
    """The RL regimes, sparsest reward first (the SFT control has no density)."""
    return sorted((n for n in needed if n.regime in DENSITY), key=lambda n: DENSITIES.index(DENSITY[n.regime]))


def _orders(regimes: list[NeededRank]) -> dict[tuple[str, str], str | None]:
    """What each denser regime needs against each sparser one, over every pair of different densities."""
    return {(a.regime, b.regime): _order(a, b) for a, b in combinations(regimes, 2)
            if DENSITY[a.regime] != DENSITY[b.regime]}


def growth(needed: list[NeededRank]) -> str:
    """The answer in short: 'grows', 'does not grow', 'shrinks', 'not steadily', 'cannot tell', or one of
    TOO_FEW_DENSITIES."""
    regimes = by_density(needed)
    if not regimes:
        return NO_RL_REGIME
    orders = _orders(regimes)
    if not orders:
        return ONE_DENSITY
    found = set(orders.values())
    if {"more", "less"} <= found:  # settled whatever the unknown pairs turn out to be
        return "not steadily"
    if None in found:
        return "cannot tell"
    if found == {"same"}:
        return "does not grow"
    return "grows" if found <= {"same", "more"} else "shrinks" if found <= {"same", "less"} else "not steadily"


def density_answer(needed: list[NeededRank]) -> str:
    """Whether the needed rank grows with the reward's density, in a sentence or two, naming what each regime needs;
    the SFT control's rank effect says whether the study could have seen one."""
    regimes, answer = by_density(needed), growth(needed)
    named = "; ".join(f"{n.regime} ({DENSITY[n.regime]}): {n.describe()}" for n in regimes)
    if answer in TOO_FEW_DENSITIES:
        sentence = "The regimes compared span fewer than two reward densities: the question needs two or more."
    elif answer == "cannot tell":
        unknown = ", ".join(f"{a} against {b}" for (a, b), order in _orders(regimes).items() if order is None)
        sentence = f"Cannot tell whether the needed rank grows with the reward's density ({unknown}): {named}."
    elif answer == "does not grow":
        first = regimes[0]
        untested = (f" r{first.at_most} is the smallest rank run: below it, growth was not tested."
                    if first.above == 0 and first.at_most is not None else "")
        sentence = (f"The needed rank does not grow with the reward's density: every regime needs {first.describe()} "
                    f"({', '.join(n.regime for n in regimes)}).{untested}")
    else:
        sentence = {"grows": "The needed rank grows with the reward's density",
                    "shrinks": "The needed rank shrinks as the reward grows denser",
                    "not steadily": "The needed rank neither grows nor shrinks steadily with the reward's density",
                    }[answer] + f": {named}."
    control = next((n for n in needed if n.regime == SFT), None)
    return sentence if control is None else f"{sentence} {_control_sentence(control)}"


def _control_sentence(control: NeededRank) -> str:
    """Whether the positive control shows that these statistics detect LoRA falling behind FullFT."""
    if not control.monotone:
        return (f"The SFT control finds LoRA behind FullFT, but its verdicts are {control.describe()}: these "
                "statistics see a rank fall behind, though the control pins no needed rank.")
    if control.above:
        return (f"The SFT control needs {control.describe()}: these statistics find LoRA behind FullFT where it "
                "falls behind.")
    return (f"No rank of the SFT control is shown behind FullFT (its needed rank: {control.describe()}): this study "
            "cannot tell a regime that needs no more rank than it ran from one whose rank effect it cannot see.")


def seeds_to_decide(equivalence: pd.DataFrame, needed: list[NeededRank]) -> str:
    """The seeds the power table projects for the inconclusive ranks that leave a regime's range open (80% TOST power
    at a true difference of 0, on the same problems); '' where no range is left open by one."""
    open_ranks = {(n.regime, rank) for n in needed for rank, verdict in n.undecided.items() if verdict != "skipped"}
    rows = [r for r in equivalence.itertuples() if (r.regime, r.rank) in open_ranks]
    if not rows or "seeds_needed" not in equivalence:
        return ""
    counts = ", ".join(f"{r.regime} r{r.rank}: {_seeds_text(r)}" for r in rows)
    return (f"What would decide the open ranks: the seeds the power table projects for them (80% TOST power at a true "
            f"difference of 0, on the same problems): {counts}.")


def _seeds_text(row) -> str:
    """An equivalence row's projected seeds in words."""
    if not pd.isna(row.seeds_needed):
        return f"{int(row.seeds_needed)} seeds"
    if only_more_problems(row):
        return "no number of seeds (only more problems)"
    return f"more than {MAX_PROJECTED_SEEDS} seeds"


# above and at_most of NeededRank, named for a reader of the CSV; needed: NeededRank.describe()
COLUMNS = ["regime", "density", "largest_rank_behind", "smallest_rank_matching", "pinned", "needed"]


def needed_frame(needed: list[NeededRank]) -> pd.DataFrame:
    """Per regime: its density, the largest rank behind FullFT and the smallest that matches it, and the needed rank in
    words (the table's CSV)."""
    rows = [[n.regime, DENSITY.get(n.regime, "control" if n.regime == SFT else ""), n.above, n.at_most, n.pinned,
             n.describe()] for n in needed]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"smallest_rank_matching": "Int64"})


def rank_needed_table(equivalence: pd.DataFrame) -> Table:
    """needed_frame of a study's equivalence table, then the answer, and the seeds that would decide what is left
    open."""
    needed = needed_ranks(equivalence)
    if not needed:
        return Table(pd.DataFrame(columns=COLUMNS), "No LoRA arm was compared with FullFT.\n")
    frame = needed_frame(needed)
    lines = [[r.regime, r.density, r.needed] for r in frame.itertuples()]
    markdown = markdown_table(["regime", "reward density", "LoRA rank needed to match FullFT"], lines)
    decide = seeds_to_decide(equivalence, needed)
    return Table(frame, f"{markdown}\n{density_answer(needed)}\n" + (f"\n{decide}\n" if decide else ""))


def studies_table(tables: dict[str, pd.DataFrame]) -> str:
    """Several studies' needed ranks side by side, one row per study (name -> its equivalence table): each regime's,
    sparsest reward first and the SFT control last ('–' where the study compared none), and the answer."""
    rows = []
    for name, frame in tables.items():
        needed = needed_ranks(frame)
        described = {n.regime: n.describe() for n in needed}
        rows.append([name, *(described.get(regime, "–") for regime in (*REGIMES, SFT)), growth(needed)])
    header = ["study", *(f"{regime} ({DENSITY[regime]})" for regime in REGIMES), "SFT control", "does it grow?"]
    return markdown_table(header, rows)


def main(argv: list[str] | None = None) -> None:
    """Print the needed-rank table and the answer of a study's equivalence.csv (a committed summary will do), or, given
    several, one row per study."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("equivalence", type=Path, nargs="+",
                        help="a study's equivalence.csv (or equivalence_chosen.csv); several: one row each")
    paths = parser.parse_args(argv).equivalence
    tables = {}
    for path in paths:
        if not path.is_file():
            parser.error(f"{path}: no such file")
        try:
            tables[str(path)] = pd.read_csv(path)
            needed_ranks(tables[str(path)])  # refuses a CSV that is not an equivalence table, naming it
        except ValueError as error:  # a malformed or empty CSV too
            parser.error(f"{path}: {error}")
    print(rank_needed_table(tables[str(paths[0])]).markdown if len(paths) == 1 else studies_table(tables))


if __name__ == "__main__":
    main()

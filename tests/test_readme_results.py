"""The results the README quotes are the committed outputs' own numbers: a rerun that changes a table fails here until
the README says what came out."""
from __future__ import annotations

import re

import pandas as pd

from reward_density.analysis.rank_needed import growth, needed_ranks
from reward_density.experiment.profiles import REPO_ROOT

README = REPO_ROOT / "README.md"
OUTPUTS = REPO_ROOT / "outputs"
INTERVAL = re.compile(r"r(\d+) ([+-]\d\.\d{3}) \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\]")  # r1 -0.016 [-0.029, -0.004]


def readme_bullets() -> list[str]:
    """The README's list items, each on one line."""
    return [" ".join(item.split()) for item in re.split(r"\n- ", README.read_text())]


def markdown_rows(text: str, after: str) -> dict[str, list[str]]:
    """The first markdown table after the line starting with `after`: its first column -> the other cells."""
    lines = text[text.index(after):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def committed_intervals(study: str) -> set[tuple[str, str, str, str]]:
    """Each LoRA arm's (rank, estimate, 90% low, 90% high) as the README prints them, from every interval table the
    study committed (at the final step, and at each arm's dev-chosen step where it stops there)."""
    found = set()
    for table in sorted((OUTPUTS / study).glob("equivalence*.csv")):
        rows = pd.read_csv(table).dropna(subset=["rank"])
        found |= {(str(int(r.rank)), f"{r.estimate:+.3f}", f"{r.tost_low:+.3f}", f"{r.tost_high:+.3f}")
                  for r in rows.itertuples()}
    return found


def test_every_lora_minus_fullft_interval_the_readme_quotes_is_its_studys_committed_one():
    quoted = 0
    for bullet in readme_bullets():
        if "(90% intervals)" not in bullet:
            continue
        named = re.search(r"outputs/(\w+)/report\.md", bullet)
        study = named.group(1) if named else "mini"  # the default study's bullets name no report
        committed = committed_intervals(study)
        for text in bullet.split("(90% intervals)")[1:]:
            for item in INTERVAL.findall(text[:400]):
                quoted += 1
                assert item in committed, (f"the README quotes r{item[0]} {item[1]} [{item[2]}, {item[3]}] for "
                                           f"{study}, which none of outputs/{study}/equivalence*.csv holds: "
                                           f"rerun and committed, the README must say what came out")
    assert quoted >= 40, f"only {quoted} quoted intervals were found: has the README's wording changed?"


def test_the_gains_over_the_base_the_readme_quotes_are_the_committed_ones():
    bullet = next(b for b in readme_bullets() if b.startswith("**RL moves the student.**"))
    gains = pd.read_csv(OUTPUTS / "mini" / "gain.csv")
    committed = {(f"{r.gain:+.3f}", f"{r.ci_low:+.3f}", f"{r.ci_high:+.3f}") for r in gains.itertuples()}
    quoted = re.findall(r"([+-]\d\.\d{3}) \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\]", bullet)
    assert len(quoted) >= 3, f"the README's gains were not found in {bullet[:200]!r}"
    for item in quoted:
        assert item in committed, (f"the README quotes a gain of {item[0]} [{item[1]}, {item[2]}], "
                                   "which outputs/mini/gain.csv lacks")


def test_the_readmes_pass1_table_is_the_committed_accuracy_table():
    readme = markdown_rows(README.read_text(), "Greedy pass@1 on the 1,000 held-out problems")
    committed = markdown_rows((OUTPUTS / "mini" / "accuracy.md").read_text(), "| regime")
    labels = {"outcome (200 steps)": "outcome", "process (end)": "process (end)", "distillation": "distillation",
              "SFT control (its facts)": "sft"}
    assert set(readme) == set(labels), f"the README's pass@1 table has rows {sorted(readme)}"
    for label, regime in labels.items():
        base, *arms, _seeds = committed[regime]
        assert readme[label] == [base.split(" ± ")[0], *arms], (
            f"README row {label!r} is {readme[label]}, outputs/mini/accuracy.md's {regime!r} is {committed[regime]}")


def test_the_readmes_chosen_rates_are_the_committed_sweeps_choice():
    readme = markdown_rows(README.read_text(), "Chosen rates (`outputs/mini_sweep/sweep.md`")
    chosen = pd.read_csv(OUTPUTS / "mini_sweep" / "chosen_rates.csv").set_index("regime")
    labels = {"outcome": "outcome", "process": "process", "distillation": "distillation", "SFT control": "sft"}
    assert set(readme) == set(labels), f"the README's rates table has rows {sorted(readme)}"
    for label, regime in labels.items():
        row = chosen.loc[regime]
        expected = [f"{row['full']:.0e}".replace("e-0", "e-") + f" ({row['full_score']:.3f})",
                    f"{row['lora']:.0e}".replace("e-0", "e-") + f" ({row['lora_score']:.3f})",
                    f"{row['ratio']:.2g}x"]  # as sweep.md writes it
        assert readme[label] == expected, (f"README rates row {label!r} is {readme[label]}; "
                                           f"outputs/mini_sweep/chosen_rates.csv says {expected}")


def test_the_readmes_needed_ranks_are_read_off_each_studys_committed_verdicts():
    readme = markdown_rows(README.read_text(), "**The answer read off each study's verdicts.**")
    studies = {f.relative_to(OUTPUTS) for f in OUTPUTS.glob("mini*/equivalence*.csv")}
    assert len(readme) == len(studies), f"the README's needed-rank table has {len(readme)} rows, {len(studies)} tables"
    for label, quoted in readme.items():
        study = re.match(r"`(\w+)`", label).group(1)
        table = OUTPUTS / study / ("equivalence_chosen.csv" if "dev-chosen" in label else "equivalence.csv")
        needed = needed_ranks(pd.read_csv(table))
        described = {n.regime: n.describe() for n in needed}
        expected = [described.get(regime, "–") for regime in ("outcome", "process", "distillation", "sft")]
        assert quoted == [*expected, growth(needed)], (
            f"the README reads {label} as {quoted}; {table.relative_to(REPO_ROOT)} gives {expected}, {growth(needed)}")


def test_every_file_the_readme_links_or_shows_is_in_the_repository():
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", README.read_text())
             if not link.startswith(("http://", "https://", "#"))]
    assert len(links) >= 10, f"only {len(links)} links were found: has the README's link syntax changed?"
    missing = [link for link in links if not (REPO_ROOT / link).exists()]
    assert not missing, f"the README links or shows files the repository does not have: {missing}"

"""The markdown report of a study: its tables, its figures and what ran."""
from __future__ import annotations

from pathlib import Path

from ..experiment.config import parse_cell_name
from .load import Cells, arm_name, arms, ranks
from .plots import FIGURES
from .tables import accuracy_table, equivalence_table, gain_table


def matrix_counts(cells: Cells) -> dict[str, int]:
    """Finished cells and the size of the regimes x arms x seeds matrix seen in the cells folder."""
    seen = cells.summaries[["regime", "arm", "seed"]].astype(str).values.tolist()
    parsed = [parse_cell_name(name) for name in cells.unfinished]
    seen += [[regime, arm_name(rank), str(seed)] for regime, rank, seed in filter(None, parsed)]
    regimes_, arms_, seeds_ = ({key[i] for key in seen} for i in range(3))
    return {
        "finished": len(cells.summaries), "unfinished": len(cells.unfinished),
        "regimes": len(regimes_), "arms": len(arms_), "seeds": len(seeds_),
        "matrix": len(regimes_) * len(arms_) * len(seeds_),
    }

def _hidden_sizes(cells: Cells) -> set[int]:
    """Every hidden_size value found (at any depth) in the cells' params."""
    found = set()

    def walk(value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "hidden_size" and isinstance(inner, int):
                    found.add(inner)
                walk(inner)

    for params in cells.params.values():
        walk(params)
    return found

def _ranks_sentence(cells: Cells) -> str:
    """Which ranks ran, and each as a fraction of the hidden size when params carry it."""
    ran = ranks(cells)
    full = "FullFT ran" if "full" in arms(cells) else "no FullFT cell"
    sentence = f"LoRA ranks that ran: {', '.join(map(str, ran)) or 'none'}; {full}."
    hidden = _hidden_sizes(cells)
    if len(hidden) == 1 and ran:
        d = hidden.pop()
        sentence += f" Student hidden size d = {d}: " + ", ".join(f"r{r} = d/{d / r:g}" for r in ran) + "."
    return sentence

def write_report(
    cells: Cells, out_dir: str | Path, margin: float, confidence: float = 0.95, n_boot: int = 2000,
    profile_name: str = "", seed: int = 0,
) -> Path:
    """Write accuracy/equivalence tables, figures and report.md under out_dir; return report.md's path."""
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    accuracy = accuracy_table(cells)
    equivalence = equivalence_table(cells, margin, confidence, n_boot, seed)
    gain = gain_table(cells, confidence, n_boot, seed)
    accuracy.frame.to_csv(out / "accuracy.csv", index=False)
    gain.frame.to_csv(out / "gain.csv", index=False)
    (out / "accuracy.md").write_text(accuracy.markdown)
    equivalence.frame.to_csv(out / "equivalence.csv", index=False)
    for name, plot in FIGURES.items():
        plot(cells, out / "figures" / f"{name}.png")
    counts = matrix_counts(cells)
    text = "\n".join([
        f"# Reward density vs LoRA rank: analysis ({profile_name or 'unnamed profile'})",
        "",
        f"Finished cells: {counts['finished']} of {counts['matrix']} = {counts['regimes']} regimes × {counts['arms']} arms × "
        f"{counts['seeds']} seeds seen in cells/ (unfinished folders: {counts['unfinished']}).",
        _ranks_sentence(cells),
        "",
        "## Greedy pass@1 (mean ± sd over seeds)",
        "",
        "Columns are arms; `base` is the model before training (step-0 evaluation). "
        "Process is shown at its peak over evaluations after step 0 and at the end of training.",
        "",
        accuracy.markdown,
        "## Did RL move pass@1? Final minus base",
        "",
        f"Each cell's final answers minus its own step-0 answers, paired over seeds and held-out problems; "
        f"two-way bootstrap ({n_boot} replicates), {confidence:.0%} percentile CI; * where the CI excludes 0.",
        "",
        gain.markdown,
        "## Equivalence of LoRA and FullFT",
        "",
        f"Paired over seeds and held-out problems at each cell's final evaluation; two-way bootstrap over seeds "
        f"and problems ({n_boot} replicates), {confidence:.0%} percentile CI; TOST at margin ±{margin:g} "
        f"(equivalent when the {1 - 2 * (1 - confidence):.0%} CI lies inside the margin; different when the "
        f"{confidence:.0%} CI excludes 0; otherwise inconclusive).",
        "",
        equivalence.markdown,
        "## Figures",
        "",
        *[f"![{name}](figures/{name}.png)" for name in FIGURES],
        "",
    ])
    report = out / "report.md"
    report.write_text(text)
    return report

"""The markdown report of a study: its tables, its figures and what ran."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from ..experiment import cell_folder
from ..experiment.config import parse_cell_name
from .capacity import BITS_PER_PARAMETER, capacity_table
from .dynamics import collapse_table, plateau_table
from .kl import END_FRACTION, ESTIMATOR, kl_table
from .load import Cells, arm_name, arms, ranks, world_entries
from .plots import FIGURES, plot_equivalence, plot_kl_vs_rank, plot_rank_needed
from .rank_needed import rank_needed_table
from .speed import speed_markdown
from .stopping import answers_at_chosen_steps, chosen_table
from .tables import WORLDS, Table, accuracy_table, equivalence_table, gain_table, power_markdown, worlds_frame


def matrix_counts(cells: Cells) -> dict:
    """Finished cells and the size of the matrix seen in the cells folder: regimes x arms x each regime's seeds."""
    seen = cells.summaries[["regime", "arm", "seed"]].astype(str).values.tolist()
    parsed = [parse_cell_name(name) for name in cells.unfinished]
    seen += [[regime, arm_name(rank), str(seed)] for regime, rank, seed in filter(None, parsed)]
    regimes = sorted({regime for regime, _, _ in seen})
    arms = len({arm for _, arm, _ in seen})
    seeds = {r: len({seed for regime, _, seed in seen if regime == r}) for r in regimes}
    return {
        "finished": len(cells.summaries), "unfinished": len(cells.unfinished),
        "regimes": len(regimes), "arms": arms, "seeds": seeds, "matrix": arms * sum(seeds.values()),
    }


def seeds_phrase(seeds: dict[str, int]) -> str:
    """"4" when every regime has as many seeds, else each regime's count: "{outcome 8, process 4}"."""
    counts = set(seeds.values())
    if len(counts) <= 1:
        return str(next(iter(counts), 0))
    return "{" + ", ".join(f"{regime} {n}" for regime, n in seeds.items()) + "}"


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


MISSING_SHOWN = 8  # unfinished cells a partial report names, before "..."


def planned_sentence(cells: Cells, planned: Sequence[str]) -> str:
    """How much of the profile's matrix a report covers, naming the planned cells that have not finished."""
    finished = set(cells.summaries["cell"]) if "cell" in cells.summaries else set()
    missing = [name for name in planned if name not in finished]
    if not missing:
        return f"Every one of the {len(planned)} cells the profile plans has finished."
    shown = ", ".join(missing[:MISSING_SHOWN]) + (", ..." if len(missing) > MISSING_SHOWN else "")
    return (f"**Partial:** {len(missing)} of the {len(planned)} cells the profile plans have not finished ({shown}); "
            "every table below covers the finished cells only.")


PROVENANCE_PACKAGES = ("torch", "transformers", "peft", "trl")  # those whose version changes what a cell computes


def _counted(values: list[str]) -> str:
    """'a (3 cells), b (1 cell)': each distinct value with how many cells share it, the commonest first."""
    return ", ".join(f"{value} ({n} cell{'s' * (n > 1)})" for value, n in Counter(values).most_common())


def provenance_sentence(cells: Cells) -> str:
    """Which code, packages and device trained the finished cells, from their manifests; more than one of any
    shows with its count, so a study resumed elsewhere or at another commit says so."""
    manifests = [cells.manifests[name] for name in sorted(cells.manifests)]

    def code(manifest: dict) -> str:
        git = manifest.get("git") or {}
        if not git.get("commit"):
            return "no commit recorded"
        return git["commit"][:12] + (" with uncommitted changes" if git.get("dirty") else "")

    def packages(manifest: dict) -> str:
        versions = manifest.get("versions")
        if not versions:
            return "no versions recorded"
        return ", ".join(f"{name} {versions.get(name, '?')}" for name in PROVENANCE_PACKAGES)

    return (f"Trained by (each cell's {cell_folder.MANIFEST}): code {_counted([code(m) for m in manifests])}; "
            f"{_counted([packages(m) for m in manifests])}; "
            f"on {_counted([m.get('device', 'no device recorded') for m in manifests])}.")


def world_sentence(cells: Cells) -> str:
    """Which world the finished cells read, entry by entry, from their params.json; cells that read two worlds (a
    study resumed after the world was rebuilt, cells copied from another machine) show both, with their counts."""
    records = list(cells.worlds.values())
    parts = [f"{entry} {_counted([record[entry] for record in records if entry in record])}"
             for entry in world_entries(records)]
    if missing := [record for record in records if not record]:
        parts.append(_counted(["not recorded"] * len(missing)))
    return f"World read (each cell's {cell_folder.PARAMS}: a hash of each entry's files): {'; '.join(parts)}."


EQUIVALENCE_FIGURE = "equivalence"  # the verdicts at a glance, drawn from the equivalence table
RANK_NEEDED_FIGURE = "rank_needed"  # the answer at a glance, drawn from the same table
INTERVAL = ("two-way random-effects interval over seeds and problems (crossed): Student's t with Satterthwaite's "
            "degrees of freedom, which are few, and the interval wide, where training runs differ and few ran "
            "(statistics.py)")


RANK_NEEDED = ("The study's question read off the verdicts above (rank_needed.py). A rank matches FullFT when it is "
               "equivalent or significantly ahead, and is behind when significantly below without equivalence shown; "
               "assuming that more rank never needs less, the needed rank lies above every rank behind and at or below "
               "the smallest rank that matches, and inconclusive ranks between the two leave it open; the power "
               "table's projection says what would decide them.")


CAPACITY = ("The arithmetic behind the question (capacity.py): a reward carries about one bit per deposit, and a "
            f"trained network holds about {BITS_PER_PARAMETER:g} bits per parameter, so an arm whose parameters hold "
            "fewer bits than its cells received should fall behind. Per regime, the deposits a cell received over its "
            "training (completions x deposits per completion, mean over its arms and seeds), the bits each arm's "
            "trained parameters hold, and the smallest rank that holds them, beside the rank the verdicts above need. "
            "The SFT control's arms must hold its table of facts instead: its information in bits (world/control.py).")


def write_report(cells: Cells, out_dir: str | Path, margin: float, confidence: float = 0.95,
                 profile_name: str = "", planned: Sequence[str] | None = None) -> Path:
    """Write the tables (CSV and markdown), the cells' world records (worlds.csv), the figures and report.md under
    out_dir; return report.md's path. `planned`: the profile's cell names, when known, so that a report of part of
    the matrix says so."""
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    tables = report_tables(cells, margin, confidence)
    for name, table in tables.items():
        table.frame.to_csv(out / f"{name}.csv", index=False)
    (out / "accuracy.md").write_text(tables["accuracy"].markdown)
    worlds_frame(cells.worlds).to_csv(out / WORLDS, index=False)
    plot_equivalence(tables["equivalence"].frame, margin, out / "figures" / f"{EQUIVALENCE_FIGURE}.png")
    plot_rank_needed(tables["equivalence"].frame, out / "figures" / f"{RANK_NEEDED_FIGURE}.png")
    if "equivalence_chosen" in tables:
        plot_rank_needed(tables["equivalence_chosen"].frame, out / "figures" / f"{RANK_NEEDED_FIGURE}_chosen.png")
    for name, plot in {**FIGURES, "kl_vs_rank": partial(plot_kl_vs_rank, confidence=confidence)}.items():
        plot(cells, out / "figures" / f"{name}.png")
    report = out / "report.md"
    report.write_text("\n".join([*_header(cells, profile_name, planned),
                                 *_comparison_sections(tables, margin, confidence),
                                 *_dynamics_sections(tables, out, confidence, completion_tokens(cells))]))
    return report


def report_tables(cells: Cells, margin: float, confidence: float) -> dict[str, Table]:
    """Every table of the report under its file name; the dev-chosen-step ones only when cells scored dev problems."""
    equivalence = equivalence_table(cells, margin, confidence)
    tables = {"accuracy": accuracy_table(cells), "gain": gain_table(cells, confidence), "equivalence": equivalence,
              "rank_needed": rank_needed_table(equivalence.frame), "capacity": capacity_table(cells, equivalence.frame),
              "plateau": plateau_table(cells), "collapse": collapse_table(cells), "kl": kl_table(cells, confidence)}
    if not cells.dev_evals.empty:
        answers = answers_at_chosen_steps(cells)
        chosen = equivalence_table(cells, margin, confidence, answers=answers)
        tables |= {"chosen_steps": chosen_table(cells, answers), "equivalence_chosen": chosen,
                   "rank_needed_chosen": rank_needed_table(chosen.frame)}
    return tables


def _header(cells: Cells, profile_name: str, planned: Sequence[str] | None) -> list[str]:
    """The title, what ran (and, when known, what the profile planned), and the ranks."""
    counts = matrix_counts(cells)
    return [
        f"# Reward density vs LoRA rank: analysis ({profile_name or 'unnamed profile'})",
        "",
        f"Finished cells: {counts['finished']} of {counts['matrix']} = {counts['regimes']} regimes × "
        f"{counts['arms']} arms × {seeds_phrase(counts['seeds'])} seeds seen in cells/ "
        f"(unfinished folders: {counts['unfinished']}).",
        *([planned_sentence(cells, planned)] if planned is not None else []),
        _ranks_sentence(cells),
        provenance_sentence(cells),
        world_sentence(cells),
        "",
    ]


def _comparison_sections(tables: dict[str, Table], margin: float, confidence: float) -> list[str]:
    """Accuracy, gain over base, LoRA against FullFT and its power, and the same at the dev-chosen steps."""
    tost_level = 1 - 2 * (1 - confidence)
    return [
        "## Greedy pass@1 (mean ± sd over seeds)",
        "",
        "Columns are arms; `base` is the model before training (step-0 evaluation). "
        "Process is shown at its peak over evaluations after step 0 (on the problems every evaluation scores, "
        "`curve_problems`) and at the end of training. "
        "`sft` is the positive control: supervised steps on a skill the base lacks, evaluated on that skill.",
        "",
        tables["accuracy"].markdown,
        "## Did training move pass@1? Final minus base",
        "",
        f"Each cell's final answers minus its own step-0 answers, paired over seeds and held-out problems; "
        f"{confidence:.0%} {INTERVAL}; * where the interval excludes 0.",
        "",
        tables["gain"].markdown,
        "## Equivalence of LoRA and FullFT",
        "",
        f"LoRA minus FullFT, paired over seeds and held-out problems at each cell's final evaluation; "
        f"{confidence:.0%} {INTERVAL}. TOST at margin ±{margin:g}: equivalent when the {tost_level:.0%} interval "
        f"lies inside the margin; different when the {confidence:.0%} interval excludes 0; otherwise inconclusive.",
        "",
        tables["equivalence"].markdown,
        "## Power",
        "",
        f"How precisely each comparison was measured: its standard error and degrees of freedom, the half-width of "
        f"the {tost_level:.0%} interval TOST reads (a verdict at ±{margin:g} needs it well below {margin:g}), and the "
        f"minimum detectable difference: the smallest true LoRA − FullFT gap that the test behind \"different\" (the "
        f"{confidence:.0%} interval excluding 0, a two-sided {1 - confidence:.0%} test) finds with 80% power; and "
        "what a verdict would cost: the seeds (same problems) with which TOST shows equivalence with 80% power when "
        "LoRA and FullFT truly do not differ, projected from the comparison's seed and problem variances (none where "
        "the problems' variance alone is too large, which only more problems shrink).",
        "",
        power_markdown(tables["equivalence"].frame),
        "## The rank needed to match FullFT",
        "",
        RANK_NEEDED,
        "",
        tables["rank_needed"].markdown,
        "## The bits argument, tallied",
        "",
        CAPACITY,
        "",
        tables["capacity"].markdown,
        *_chosen_section(tables),
    ]


def completion_tokens(cells: Cells) -> float | None:
    """The RL cells' mean completion length over their training steps (history.csv's len_mean); None without one."""
    lengths = cells.history["len_mean"].dropna() if "len_mean" in cells.history else None
    return None if lengths is None or lengths.empty else float(lengths.mean())


def _dynamics_sections(tables: dict[str, Table], out: Path, confidence: float,
                       study_tokens: float | None) -> list[str]:
    """Plateau, collapse, KL to the reference, speed and the figures."""
    return [
        "## Plateau",
        "",
        "Whether each arm stopped learning before its last step: the share of its total gain (mean over seeds) made "
        "in the last 25% of its steps, read on the held-out problems every evaluation scores (`curve_problems`): "
        "its base and final can differ from the tables above, which score them all.",
        "",
        tables["plateau"].markdown,
        "## Collapse",
        "",
        "Per regime, the mean step (over its cells) of the peak advantage std and of the peak completion length, "
        "and the first evaluation after the pass@1 peak where pass@1 (mean over cells) falls below the base. "
        "The paper's process regime: advantage std peak at step 28, length saturation at 70, collapse at 79.",
        "",
        tables["collapse"].markdown,
        "## KL to the reference",
        "",
        f"Each cell's KL(π‖π_ref) averaged over its last {END_FRACTION:.0%} of steps ({ESTIMATOR}; the sampling "
        f"temperature's distributions), mean over seeds with a {confidence:.0%} t interval over seeds. "
        "The KL-free seed paper's claim: KL grows with the rank, by an order of magnitude from small to large ranks.",
        "",
        tables["kl"].markdown,
        "## Speed against TRL",
        "",
        speed_markdown(out, study_tokens),
        "## Figures",
        "",
        *[f"![{name}](figures/{name}.png)" for name in (EQUIVALENCE_FIGURE, RANK_NEEDED_FIGURE, *FIGURES)],
        "",
    ]


def _chosen_section(tables: dict[str, Table]) -> list[str]:
    """The comparison at each cell's dev-chosen step (stopping.py); nothing when no cell scored dev problems."""
    if "chosen_steps" not in tables:
        return []
    return [
        "## At each arm's dev-chosen step",
        "",
        "Each cell stopped at its own best evaluation after step 0 by dev pass@1 (the earliest of ties), chosen on its "
        "own dev curve, never on the held-out set nor against another arm; then LoRA minus FullFT on the held-out "
        "answers at those steps, with the intervals and verdicts above.",
        "",
        tables["chosen_steps"].markdown,
        tables["equivalence_chosen"].markdown,
        "The rank needed to match FullFT at those steps:",
        "",
        tables["rank_needed_chosen"].markdown,
        f"![{RANK_NEEDED_FIGURE} at the dev-chosen steps](figures/{RANK_NEEDED_FIGURE}_chosen.png)",
        "",
    ]

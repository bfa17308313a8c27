"""Join finished cells into tables, figures and a markdown report (the analysis notebook's library)."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .statistics import paired_bootstrap_diff, tost  # noqa: E402

REGIME_ORDER = ("outcome", "process", "distillation")
KEYS = ["cell", "regime", "rank", "arm", "seed"]
# Fixed PNG metadata so that reruns write byte-identical figures.
PNG_METADATA = {"Software": None}


@dataclass(frozen=True)
class Cells:
    """Finished cells as long tables; every frame carries cell, regime, rank (Int64, <NA> = FullFT), arm, seed."""

    summaries: pd.DataFrame
    history: pd.DataFrame
    evals: pd.DataFrame
    answers: pd.DataFrame
    params: dict[str, dict]
    unfinished: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A tidy numeric table (for CSV) with its markdown rendering."""

    frame: pd.DataFrame
    markdown: str


def arm_name(rank: int | None) -> str:
    """Arm label: "r<rank>" for LoRA, "full" for FullFT."""
    return "full" if rank is None or pd.isna(rank) else f"r{int(rank)}"


def load_cells(outputs_dir: str | Path) -> Cells:
    """Read every finished cell (one with summary.json) under <outputs_dir>/cells; skip the rest."""
    root = Path(outputs_dir) / "cells"
    folders = sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []
    finished = [p for p in folders if (p / "summary.json").is_file()]
    if not finished:
        raise FileNotFoundError(f"no finished cell (a folder with summary.json) under {root}")
    summaries, history, evals, answers, params = [], [], [], [], {}
    for folder in finished:
        summary = json.loads((folder / "summary.json").read_text())
        keys = _cell_keys(folder.name, summary)
        summaries.append({**summary, **keys})
        history.append(_read_csv(folder / "history.csv", keys))
        evals.append(_read_csv(folder / "evals.csv", keys))
        answers.append(_read_csv(folder / "answers.csv", keys))
        params_file = folder / "params.json"
        params[folder.name] = json.loads(params_file.read_text()) if params_file.is_file() else {}
    answers_frame = _concat(answers)
    answers_frame["correct"] = answers_frame["correct"].map(_as_int)
    return Cells(
        summaries=_with_key_types(pd.DataFrame(summaries)),
        history=_concat(history),
        evals=_concat(evals),
        answers=answers_frame,
        params=params,
        unfinished=tuple(p.name for p in folders if p not in finished),
    )


def _cell_keys(name: str, summary: dict) -> dict:
    """The key columns of one cell, taken from its summary."""
    rank = summary.get("rank")
    return {"cell": name, "regime": summary["regime"], "rank": rank, "arm": arm_name(rank), "seed": summary["seed"]}


def _read_csv(path: Path, keys: dict) -> pd.DataFrame:
    """One cell's CSV with its key columns first (problem ids kept as text: "007" is not 7)."""
    frame = pd.read_csv(path, dtype={"problem_id": str})
    for i, (column, value) in enumerate(keys.items()):
        frame.insert(i, column, [value] * len(frame))
    return frame


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate cells' frames (columns may differ between regimes) with typed keys."""
    return _with_key_types(pd.concat(frames, ignore_index=True, sort=False))


def _with_key_types(frame: pd.DataFrame) -> pd.DataFrame:
    """Rank as nullable Int64, seed as int."""
    return frame.astype({"rank": "Int64", "seed": int})


def _as_int(value) -> int:
    """0/1 from a bool, a number or a "True"/"False" string."""
    if isinstance(value, str):
        return int(value.strip().lower() in ("true", "1", "1.0"))
    return int(bool(value))


def regimes(cells: Cells) -> list[str]:
    """Regimes present, in the design's order, unknown ones after."""
    present = set(cells.summaries["regime"])
    return [r for r in REGIME_ORDER if r in present] + sorted(present - set(REGIME_ORDER))


def ranks(cells: Cells) -> list[int]:
    """LoRA ranks present, ascending."""
    return sorted(int(r) for r in cells.summaries["rank"].dropna().unique())


def arms(cells: Cells) -> list[str]:
    """Arms present: ranks ascending, then full."""
    has_full = cells.summaries["rank"].isna().any()
    return [arm_name(r) for r in ranks(cells)] + (["full"] if has_full else [])


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
            sources = {"process (peak)": (peak[peak["regime"] == regime], "pass1"), "process (end)": (end, "final_pass1")}
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
    return f"{mean:.3f} (n=1)" if n == 1 else f"{mean:.3f} ± {sd:.3f}"


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


def equivalence_table(cells: Cells, margin: float, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> Table:
    """Per regime and rank: paired bootstrap CI of LoRA minus FullFT final pass@1 and the TOST verdict."""
    answers = final_answers(cells)
    rows = []
    for regime in regimes(cells):
        of_regime = cells.summaries[cells.summaries["regime"] == regime]
        full = _answers_of(answers, regime, None)
        for rank in sorted(int(r) for r in of_regime["rank"].dropna().unique()):
            row = {"regime": regime, "rank": rank, "arm": arm_name(rank)}
            lora = _answers_of(answers, regime, rank)
            reason = _skip_reason(lora, full)
            if reason:
                rows.append({**row, "verdict": "skipped", "reason": reason})
                continue
            diff = paired_bootstrap_diff(lora, full, confidence, n_boot, seed)
            test = tost(diff, margin)
            rows.append({
                **row, "estimate": diff.estimate, "ci_low": diff.ci_low, "ci_high": diff.ci_high,
                "tost_low": test.ci_low, "tost_high": test.ci_high, "p_tost": test.p_value,
                "verdict": test.verdict, "n_pairs": diff.n_pairs, "n_seeds": diff.n_seeds,
                "n_problems": diff.n_problems, "reason": "",
            })
    columns = ["regime", "rank", "arm", "estimate", "ci_low", "ci_high", "tost_low", "tost_high", "p_tost",
               "verdict", "n_pairs", "n_seeds", "n_problems", "reason"]
    frame = pd.DataFrame(rows, columns=columns).astype({"rank": "Int64", "n_pairs": "Int64", "n_seeds": "Int64", "n_problems": "Int64"})
    return Table(frame, _equivalence_markdown(frame, margin, confidence))


def gain_table(cells: Cells, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> Table:
    """Per regime and arm: did RL move pass@1? Final minus step-0 answers of the same cells, paired bootstrap CI."""
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
            diff = paired_bootstrap_diff(after, before, confidence, n_boot, seed)
            rows.append({
                **row, "base": before["correct"].mean(),
                "final": after["correct"].mean(), "gain": diff.estimate, "ci_low": diff.ci_low,
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
    """One arm's final answers in one regime (rank None = FullFT)."""
    arm = answers["rank"].isna() if rank is None else answers["rank"] == rank
    return answers[(answers["regime"] == regime) & arm.fillna(False)]


def _skip_reason(lora: pd.DataFrame, full: pd.DataFrame) -> str:
    """Why a LoRA arm cannot be compared with FullFT, or "" when it can."""
    if full.empty:
        return "no finished FullFT cell with answers in this regime"
    if lora.empty:
        return "no answers for this LoRA arm"
    if not set(lora["seed"]) & set(full["seed"]):
        return "no seed shared with FullFT"
    if not set(lora["problem_id"]) & set(full["problem_id"]):
        return "no problem shared with FullFT"
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


def _arm_colors(cells: Cells) -> dict[str, tuple]:
    """One colour per LoRA rank along viridis, black for FullFT."""
    lora = [a for a in arms(cells) if a != "full"]
    colors = {a: plt.cm.viridis(x) for a, x in zip(lora, np.linspace(0.1, 0.85, max(len(lora), 1)))}
    return {**colors, "full": (0, 0, 0, 1)}


def _panels(n: int, **kwargs) -> tuple[Figure, np.ndarray]:
    """A row of n panels."""
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.6), squeeze=False, **kwargs)
    return fig, axes[0]


def _save(fig: Figure, path: str | Path) -> Figure:
    """Save a figure as PNG (creating its folder) and close it so figures do not pile up."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=PNG_METADATA)
    plt.close(fig)
    return fig


def _empty(ax, message: str) -> None:
    """Mark a panel whose data is missing."""
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def plot_pass1_vs_rank(cells: Cells, path: str | Path) -> Figure:
    """Per regime: final pass@1 (mean ± sd) vs LoRA rank, FullFT mean ± sd band, base dashed."""
    table = accuracy_table(cells).frame
    fig, axes = _panels(len(regimes(cells)), sharey=True)
    for ax, regime in zip(axes, regimes(cells)):
        rows = table[table["regime"] == regime]
        # Process also at its peak (dotted, FullFT without a band); the end of training always has the band.
        series = [("process (end)", "-", " end"), ("process (peak)", ":", " peak")] if regime == "process" else [(regime, "-", "")]
        for i, (label, style, suffix) in enumerate(series):
            of_row = rows[rows["row"] == label]
            lora = of_row[of_row["arm"].str.startswith("r")]
            if not lora.empty:
                ax.errorbar(lora["arm"].str[1:].astype(int), lora["mean"], yerr=lora["sd"].fillna(0), fmt="os"[i] + style,
                            color=f"C{i}", capsize=3, label=f"LoRA{suffix}")
            _hline(ax, of_row[of_row["arm"] == "full"], "k", style, f"FullFT{suffix}" + (" ± sd" if i == 0 else ""), band=i == 0)
        _hline(ax, rows[rows["arm"] == "base"].head(1), "grey", "--", "base", band=False)
        _rank_axis(ax, ranks(cells))
        ax.set(title=regime, xlabel="LoRA rank", ylabel="greedy pass@1")
        ax.legend(fontsize=7)
    return _save(fig, path)


def _rank_axis(ax, ranks_: list[int]) -> None:
    """A log2 x axis ticked at the ranks that ran (log scale needs at least one rank)."""
    if ranks_:
        ax.set_xscale("log", base=2)
        # Explicit limits: a panel with only FullFT has no x data to autoscale a log axis from.
        ax.set_xlim(min(ranks_) / 1.5, max(ranks_) * 1.5)
        ax.set_xticks(ranks_, [str(r) for r in ranks_])
    else:
        ax.set_xticks([])
        ax.text(0.5, 0.5, "no LoRA cells", ha="center", transform=ax.transAxes)


def _hline(ax, row: pd.DataFrame, color: str, style: str, label: str, band: bool) -> None:
    """A horizontal reference line at a mean, with a ±1 sd band if asked and available."""
    if row.empty:
        return
    mean, sd = float(row["mean"].iloc[0]), float(row["sd"].iloc[0])
    ax.axhline(mean, color=color, linestyle=style, label=label)
    if band and np.isfinite(sd):
        ax.axhspan(mean - sd, mean + sd, color=color, alpha=0.12)


def plot_peak_advantage_std(cells: Cells, path: str | Path) -> Figure:
    """Bar per regime: mean over cells of the peak advantage std, each cell as a dot."""
    fig, axes = _panels(1)
    ax = axes[0]
    for i, regime in enumerate(regimes(cells)):
        values = cells.summaries.loc[cells.summaries["regime"] == regime, "peak_advantage_std"].dropna()
        if values.empty:
            continue
        ax.bar(i, values.mean(), color="lightsteelblue", edgecolor="steelblue")
        ax.annotate(f"{values.mean():.2f}", (i, values.mean()), ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
        ax.plot(np.full(len(values), i), values, "k.", alpha=0.6)
    ax.set_xticks(range(len(regimes(cells))), regimes(cells))
    ax.set(ylabel="peak advantage std (per cell)", title="Peak advantage std by regime")
    return _save(fig, path)


def _mean_over_seeds(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per arm and step, the mean of a column over seeds."""
    return frame.groupby(["arm", "step"], sort=False)[column].mean().reset_index()


def _arm_lines(ax, frame: pd.DataFrame, column: str, colors: dict, arm_order: list[str], style: str) -> None:
    """One line per arm (mean over seeds) of column vs step."""
    means = _mean_over_seeds(frame, column)
    for arm in arm_order:
        line = means[means["arm"] == arm].sort_values("step")
        if not line.empty:
            ax.plot(line["step"], line[column], style, color=colors[arm], label=arm)


def plot_process_collapse(cells: Cells, path: str | Path) -> Figure:
    """Process regime: eval pass@1 (top) and rollout frac_truncated (bottom) vs step, one line per arm."""
    fig, axes = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    evals = cells.evals[cells.evals["regime"] == "process"]
    history = cells.history[cells.history["regime"] == "process"]
    if evals.empty:
        _empty(axes[0], "no finished process cells")
        _empty(axes[1], "")
        return _save(fig, path)
    colors, order = _arm_colors(cells), arms(cells)
    _arm_lines(axes[0], evals, "pass1", colors, order, ".-")
    axes[0].set(ylabel="greedy pass@1", title="Process reward: accuracy and truncation over training")
    axes[0].legend(fontsize=7, ncol=2)
    if "frac_truncated" in history.columns:
        _arm_lines(axes[1], history, "frac_truncated", colors, order, "-")
        axes[1].set(xlabel="step", ylabel="rollout frac_truncated")
    else:
        _empty(axes[1], "no frac_truncated in history")
    return _save(fig, path)


def plot_pass1_over_training(cells: Cells, path: str | Path) -> Figure:
    """Per regime: eval pass@1 vs step, one line per arm (mean over seeds), the base as a dashed anchor."""
    fig, axes = _panels(len(regimes(cells)), sharey=True)
    colors, order = _arm_colors(cells), arms(cells)
    for ax, regime in zip(axes, regimes(cells)):
        evals = cells.evals[cells.evals["regime"] == regime]
        base = evals.loc[evals["step"] == 0, "pass1"]
        if not base.empty:
            ax.axhline(base.mean(), color="grey", linestyle="--", label="base")
        _arm_lines(ax, evals, "pass1", colors, order, ".-")
        ax.set(title=regime, xlabel="step", ylabel="greedy pass@1")
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


FIGURES: dict[str, Callable[[Cells, str | Path], Figure]] = {
    "pass1_vs_rank": plot_pass1_vs_rank,
    "peak_advantage_std": plot_peak_advantage_std,
    "process_collapse": plot_process_collapse,
    "pass1_over_training": plot_pass1_over_training,
}


def matrix_counts(cells: Cells) -> dict[str, int]:
    """Finished cells and the size of the regimes x arms x seeds matrix seen in the cells folder."""
    seen = cells.summaries[["regime", "arm", "seed"]].astype(str).values.tolist()
    seen += [_parse_name(name) for name in cells.unfinished]
    seen = [key for key in seen if key]
    regimes_, arms_, seeds_ = ({key[i] for key in seen} for i in range(3))
    return {
        "finished": len(cells.summaries), "unfinished": len(cells.unfinished),
        "regimes": len(regimes_), "arms": len(arms_), "seeds": len(seeds_),
        "matrix": len(regimes_) * len(arms_) * len(seeds_),
    }


def _parse_name(name: str) -> list[str]:
    """[regime, arm, seed] from a folder name "<regime>-r<rank|full>-s<seed>", or [] if it is not one."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].startswith("r") or not parts[2].startswith("s"):
        return []
    arm = "full" if parts[1] == "rfull" else parts[1]
    return [parts[0], arm, parts[2][1:]]


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

"""The study's figures, saved as PNG with fixed metadata so that reruns write byte-identical files."""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..rewards import DENSITY  # noqa: E402
from .dynamics import has_advantages  # noqa: E402
from .kl import final_kl, kl_table  # noqa: E402
from .load import Cells, arms, ranks, regimes  # noqa: E402
from .rank_needed import by_density, growth, needed_ranks, standing  # noqa: E402
from .tables import accuracy_table  # noqa: E402

PNG_METADATA = {"Software": None}


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
    """Per regime: final pass@1 (mean ± sd) vs LoRA rank, FullFT mean ± sd band, base dashed; the process panel also
    shows the peak pass@1 (dotted, FullFT without a band)."""
    table = accuracy_table(cells).frame
    fig, axes = _panels(len(regimes(cells)), sharey=True)
    for ax, regime in zip(axes, regimes(cells)):
        rows = table[table["regime"] == regime]
        # Process also at its peak (dotted, FullFT without a band); the end of training always has the band.
        series = ([("process (end)", "-", " end"), ("process (peak)", ":", " peak")] if regime == "process"
                  else [(regime, "-", "")])
        for i, (label, style, suffix) in enumerate(series):
            of_row = rows[rows["row"] == label]
            lora = of_row[of_row["arm"].str.startswith("r")]
            if not lora.empty:
                ax.errorbar(lora["arm"].str[1:].astype(int), lora["mean"], yerr=lora["sd"].fillna(0),
                            fmt="os"[i] + style, color=f"C{i}", capsize=3, label=f"LoRA{suffix}")
            _hline(ax, of_row[of_row["arm"] == "full"], "k", style, f"FullFT{suffix}", band=i == 0)
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
    """A horizontal reference line at a mean, with a ±1 sd band if asked and available (one seed has no sd)."""
    if row.empty:
        return
    mean, sd = float(row["mean"].iloc[0]), float(row["sd"].iloc[0])
    band = band and np.isfinite(sd)
    ax.axhline(mean, color=color, linestyle=style, label=label + (" ± sd" if band else ""))
    if band:
        ax.axhspan(mean - sd, mean + sd, color=color, alpha=0.12)


def plot_peak_advantage_std(cells: Cells, path: str | Path) -> Figure:
    """Bar per regime with advantages (not the SFT control): mean over cells of the peak advantage std, each cell
    as a dot."""
    fig, axes = _panels(1)
    ax = axes[0]
    shown = [regime for regime in regimes(cells) if has_advantages(cells.history[cells.history["regime"] == regime])]
    for i, regime in enumerate(shown):
        values = cells.summaries.loc[cells.summaries["regime"] == regime, "peak_advantage_std"].dropna()
        ax.bar(i, values.mean(), color="lightsteelblue", edgecolor="steelblue")
        ax.annotate(f"{values.mean():.2f}", (i, values.mean()), ha="center", va="bottom", xytext=(0, 2),
                    textcoords="offset points")
        ax.plot(np.full(len(values), i), values, "k.", alpha=0.6)
    ax.set_xticks(range(len(shown)), shown)
    ax.set(ylabel="peak advantage std (per cell)", title="Peak advantage std by regime")
    return _save(fig, path)


def _mean_over_seeds(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per arm and step, the mean of a column over seeds, at the steps every seed of the arm reached (as
    dynamics.mean_curve: a step fewer seeds reached would show those seeds alone as the mean)."""
    if "seed" in frame:  # else the frame is such a mean already (a smoothed one, say)
        every_seed = frame.groupby(["arm", "step"])["seed"].transform("nunique") == \
            frame.groupby("arm")["seed"].transform("nunique")
        frame = frame[every_seed]
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


def plot_kl_vs_rank(cells: Cells, path: str | Path, confidence: float = 0.95) -> Figure:
    """Per regime: end-of-training KL to the reference vs LoRA rank (log-log), FullFT as its own point, each with
    its t interval over seeds at this confidence."""
    table = kl_table(cells, confidence).frame
    shown = [r for r in regimes(cells) if r in set(table["regime"])]
    fig, axes = _panels(max(len(shown), 1), sharey=True)
    if not shown:
        _empty(axes[0], "no cell recorded a KL to the reference")
        return _save(fig, path)
    ranks_ = ranks(cells)
    full_x = 2 * max(ranks_) if ranks_ else 1  # FullFT one octave right of the largest rank
    for ax, regime in zip(axes, shown):
        rows = table[table["regime"] == regime]
        lora = rows[rows["arm"] != "full"]
        errors = np.vstack([lora["kl"] - lora["low"], lora["high"] - lora["kl"]])
        ax.errorbar(lora["arm"].str[1:].astype(int), lora["kl"], yerr=np.nan_to_num(errors), fmt="o-", capsize=3,
                    label="LoRA")
        full = rows[rows["arm"] == "full"]
        if not full.empty:
            ax.errorbar([full_x], full["kl"], yerr=np.nan_to_num([full["kl"] - full["low"], full["high"] - full["kl"]]),
                        fmt="ks", capsize=3, label="FullFT")
        ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ticks = ranks_ + [full_x]
        ax.set_xticks(ticks, [str(r) for r in ranks_] + ["full"])
        ax.set(title=regime, xlabel="LoRA rank", ylabel="KL(π‖π_ref), last 10% of steps")
        ax.legend(title=f"mean, {confidence:.0%} interval over seeds", fontsize=7, title_fontsize=7)
    return _save(fig, path)


FIGURES: dict[str, Callable[[Cells, str | Path], Figure]] = {
    "pass1_vs_rank": plot_pass1_vs_rank,
    "peak_advantage_std": plot_peak_advantage_std,
    "process_collapse": plot_process_collapse,
    "pass1_over_training": plot_pass1_over_training,
    "kl_vs_rank": plot_kl_vs_rank,
}


VERDICT_COLORS = {"equivalent": "tab:green", "different": "tab:red", "inconclusive": "tab:gray"}


STUDY_MARKERS = "osD^v"  # one marker per study when several studies' comparisons share a figure


def plot_equivalence(frames: pd.DataFrame | dict[str, pd.DataFrame], margin: float, path: str | Path) -> Figure:
    """Per regime, each LoRA arm's LoRA − FullFT with its TOST interval (thick) and its confidence interval
    (thin) against the ±margin band, coloured by verdict (an equivalence_table frame; skipped rows left out).

    frames: one study's table, or several studies' by name (a replication beside its original): each arm is then
    drawn once per study, one above the other, with a marker of the study's own (named in a legend below)."""
    studies = {"": frames} if isinstance(frames, pd.DataFrame) else frames
    tested = {name: frame[frame["verdict"] != "skipped"] for name, frame in studies.items()}
    regimes_ = list(dict.fromkeys(r for frame in tested.values() for r in frame["regime"])) or ["no comparison"]
    fig, axes = _panels(len(regimes_))
    for ax, regime in zip(axes, regimes_):
        rows = {name: frame[frame["regime"] == regime] for name, frame in tested.items()}
        arms_ = list(dict.fromkeys(arm for frame in rows.values() for arm in frame["arm"]))
        if not arms_:
            _empty(ax, "no LoRA arm paired with FullFT")
            continue
        ax.axvspan(-margin, margin, color="tab:green", alpha=0.1, label=f"±{margin:g} margin")
        ax.axvline(0, color="k", linewidth=0.8)
        for k, (name, frame) in enumerate(rows.items()):
            offset, marker = (k - (len(rows) - 1) / 2) * 0.5 / len(rows), STUDY_MARKERS[k % len(STUDY_MARKERS)]
            for _, row in frame.iterrows():
                y, color = arms_.index(row["arm"]) + offset, VERDICT_COLORS.get(row["verdict"], "k")
                ax.plot([row["ci_low"], row["ci_high"]], [y, y], color=color, linewidth=1)
                ax.plot([row["tost_low"], row["tost_high"]], [y, y], color=color, linewidth=4, solid_capstyle="butt")
                ax.plot(row["estimate"], y, marker, color="white", markeredgecolor=color)
            if name:  # the study's marker in the legend, in black: the colours are the verdicts'
                ax.plot([], [], marker, color="white", markeredgecolor="k", label=name)
        single = next(iter(rows.values()))
        labels = ([f"{a} ({v})" for a, v in zip(single["arm"], single["verdict"])] if len(rows) == 1 else arms_)
        ax.set_yticks(range(len(arms_)), labels)
        ax.set_ylim(len(arms_) - 0.5, -0.5)
        bounds = pd.concat([frame[["ci_low", "ci_high"]] for frame in rows.values()])
        reach = max(1.5 * margin, bounds.abs().max().max() * 1.1)
        ax.set_xlim(-reach, reach)  # symmetric about 0, the margin always in view
        ax.xaxis.set_major_locator(MaxNLocator(5, symmetric=True))  # few enough ticks for a narrow panel
        ax.set(title=regime, xlabel="LoRA − FullFT, greedy pass@1")
        if len(rows) == 1:
            ax.legend(fontsize=7, loc="best")
        else:  # below the panel: inside, the studies' entries would cover an arm's intervals
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return _save(fig, path)


STANDING_COLORS = {"matches": "tab:green", "behind": "tab:red", "undecided": "tab:gray"}


def plot_rank_needed(equivalence: pd.DataFrame, path: str | Path) -> Figure:
    """The study's answer drawn from its equivalence table: per regime, sparsest reward first and the SFT control
    last, the range of its needed rank (rank_needed.py; open below, closed above, hatched while undecided ranks lie
    inside it) beside each rank's standing against FullFT; the title says whether the need grows with density."""
    needed = needed_ranks(equivalence)
    rl = by_density(needed)
    order = rl + [n for n in needed if n.regime not in DENSITY]
    fig, ax = plt.subplots(figsize=(1.5 * max(len(order), 2) + 2.5, 3.8))
    if not order:
        _empty(ax, "no LoRA arm paired with FullFT")
        return _save(fig, path)
    ranks_ = sorted(equivalence["rank"].astype(int).unique())
    level = {rank: i for i, rank in enumerate([0, *ranks_, math.inf])}  # an even step per grid rank
    for x, n in enumerate(order):
        for row in equivalence[equivalence["regime"] == n.regime].itertuples():
            ax.plot(x + 0.25, level[int(row.rank)], "o", markersize=5,
                    color=STANDING_COLORS[standing(row.verdict, row.estimate)])
        if not n.monotone:
            ax.text(x, len(ranks_) / 2, "not monotone", rotation=90, ha="center", va="center", fontsize=8)
            continue
        low, high = level[n.above], level[n.bounds[1]]
        ax.add_patch(Rectangle((x - 0.12, low), 0.24, high - low, facecolor="tab:blue", alpha=0.3,
                               hatch=None if n.pinned else "//", edgecolor="tab:blue"))
        ax.plot(x, low, "o", color="white", markeredgecolor="tab:blue")
        ax.plot(x, high, "o", color="tab:blue")
    if 0 < len(rl) < len(order):  # the SFT control set apart from the RL regimes
        ax.axvline(len(rl) - 0.5, color="k", linestyle=":", linewidth=0.8)
    ax.set_xticks(range(len(order)), [f"{n.regime}\n{DENSITY.get(n.regime, 'control')}" for n in order])
    ax.set_xlim(-0.5, len(order) - 0.5)
    ax.set_yticks(range(len(level)), ["0", *[f"r{r}" for r in ranks_], f"beyond r{ranks_[-1]}"])
    ax.set_ylim(-0.5, len(level) - 0.5)
    for name, color in STANDING_COLORS.items():
        ax.plot([], [], "o", color=color, label=f"rank {name}" + ("" if name == "undecided" else " FullFT"))
    ax.add_patch(Rectangle((0, 0), 0, 0, facecolor="tab:blue", alpha=0.3, label="needed rank: above ○, at most ●"))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set(ylabel="LoRA rank needed to match FullFT", title=f"Does the needed rank grow with density? {growth(needed)}")
    return _save(fig, path)


def plot_kl_ablation(with_kl: Cells, without_kl: Cells, regime: str, ablated: list[str], path: str | Path) -> Figure:
    """The seed paper's Figure 3 in miniature: KL to the reference over steps for each ablated arm with and without
    the penalty (mean over seeds), and each cell's final pass@1 against its end-of-training KL."""
    fig, (over_steps, scatter) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, arm in enumerate(ablated):
        for cells, style, label in ((with_kl, "-", "with KL"), (without_kl, "--", "without KL")):
            history = cells.history[(cells.history["regime"] == regime) & (cells.history["arm"] == arm)]
            curve = history.groupby("step")["kl_ref"].mean()
            over_steps.plot(curve.index, curve.values, style, color=f"C{i}", label=f"{arm}, {label}")
            finals = cells.summaries[(cells.summaries["regime"] == regime) & (cells.summaries["arm"] == arm)]
            kls = final_kl(cells)
            kls = kls[(kls["regime"] == regime) & (kls["arm"] == arm)].merge(finals[["seed", "final_pass1"]], on="seed")
            scatter.plot(kls["kl"], kls["final_pass1"], "o" if label == "with KL" else "x", color=f"C{i}",
                         label=f"{arm}, {label}")
    over_steps.set(yscale="log", xlabel="step", ylabel="KL(π‖π_ref) (k3, mean over seeds)",
                   title=f"{regime}: KL over training")
    scatter.set(xscale="log", xlabel="KL(π‖π_ref), last 10% of steps", ylabel="final greedy pass@1",
                title=f"{regime}: final pass@1 vs KL (one point per seed)")
    for ax in (over_steps, scatter):
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_capability(table: pd.DataFrame, path: str | Path) -> Figure:
    """The capability baseline: pass@k against k, one line per model."""
    ks = [int(c.split("@")[1]) for c in table.columns if c.startswith("pass@")]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for _, row in table.iterrows():
        ax.plot(ks, [row[f"pass@{k}"] for k in ks], marker="o", label=row["model"])
    ax.set(xscale="log", xlabel="k (samples per problem)", ylabel="pass@k (held-out)", ylim=(0, 1))
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend()
    ax.set_title("Capability baseline")
    return _save(fig, path)


def plot_method_accuracy(frame: pd.DataFrame, path: str | Path) -> Figure:
    """Final pass@1 (mean ± sd over seeds) per arm, one line per method (analysis/methods.py's table)."""
    fig, axes = _panels(1)
    order = list(dict.fromkeys(frame["arm"]))
    for method, rows in frame.groupby("method", sort=False):
        rows = rows.set_index("arm").reindex(order)
        axes[0].errorbar(range(len(order)), rows["pass1"], yerr=rows["sd"].fillna(0), marker="o", capsize=3,
                         label=method)
    axes[0].set(xticks=range(len(order)), xticklabels=order, xlabel="arm", ylabel="final greedy pass@1",
                title="each method's final pass@1")
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def plot_method_curves(studies: dict[str, Cells], regime: str, path: str | Path, window: int = 10) -> Figure:
    """Mean trajectory reward over training (mean over seeds, then a moving average over window steps), one panel
    per method, one line per arm."""
    fig, axes = _panels(len(studies), sharey=True)
    for ax, (method, cells) in zip(axes, studies.items()):
        history = cells.history[cells.history["regime"] == regime]
        if history.empty:
            _empty(ax, f"no {regime} cells")
            continue
        means = _mean_over_seeds(history, "reward_mean").sort_values(["arm", "step"])
        means["reward_mean"] = means.groupby("arm")["reward_mean"].transform(lambda x: x.rolling(window, 1).mean())
        _arm_lines(ax, means, "reward_mean", _arm_colors(cells), arms(cells), "-")
        ax.set(title=method, xlabel="step", ylabel="mean trajectory reward")
        ax.legend(fontsize=7)
    return _save(fig, path)

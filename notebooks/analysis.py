# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Analysis: does the LoRA rank needed to match FullFT grow with reward density?
#
# This notebook joins the finished cells of one profile (`<outputs_dir>/cells/<regime>-r<rank|full>-s<seed>/`,
# finished when `summary.json` exists) into the study's tables and figures, and writes a markdown report.
# A partial matrix is fine: tables show what exists and comparisons that cannot be made say why.
# All logic lives in `reward_density.analysis` (load, tables, statistics, rank_needed, capacity, dynamics, kl,
# plots, report); this notebook only calls it.

# %% tags=["parameters"]
profile = "smoke"
outputs_dir = "outputs/smoke"
equivalence_margin = 0.05
confidence = 0.95
planned_cells = None  # the profile's cell names (the runner passes them), so that a partial report says so

# %%
from IPython.display import Image, Markdown, display

from reward_density.analysis import capacity, dynamics, kl, load, plots, rank_needed, report, tables
from reward_density.experiment.profiles import REPO_ROOT

report_dir = REPO_ROOT / outputs_dir  # relative paths are taken from the repository root
cells = load.load_cells(report_dir)  # tables, figures/ and report.md are written beside cells/

# %%
# NBVAL_CHECK_OUTPUT
counts = report.matrix_counts(cells)
print(f"{counts['finished']} finished cells of a {counts['regimes']} x {counts['arms']} x "
      f"{report.seeds_phrase(counts['seeds'])} matrix")
print("regimes:", ", ".join(load.regimes(cells)), "| arms:", ", ".join(load.arms(cells)))

# %% [markdown]
# ## Accuracy
#
# Greedy pass@1 on the held-out set at the end of training, mean ± sd over seeds, for each regime (rows) and
# arm (columns: LoRA ranks ascending, then FullFT). `base` is the model before training. The process regime
# is shown twice: at its best evaluation during training (peak) and at the end, since the paper reports it
# collapsing late in training.

# %%
# NBVAL_CHECK_OUTPUT
accuracy = tables.accuracy_table(cells)
print(accuracy.markdown)

# %% [markdown]
# ## Did RL move pass@1?
#
# Before asking which rank matches FullFT, check that training moved anything: each cell's final answers
# minus its own step-0 answers, paired by seed and held-out problem, with the same crossed interval as
# below. A star marks an interval that excludes 0. The SFT control's gain is on its own skill.

# %%
# NBVAL_CHECK_OUTPUT
gain = tables.gain_table(cells, confidence)
print(gain.markdown)

# %% [markdown]
# ## Equivalence of each LoRA rank with FullFT
#
# "Inside ±1 sd" is not a test. Here each LoRA arm is paired with FullFT by seed and held-out problem at the
# final evaluation. Seeds and problems are crossed random factors, so the interval of the mean difference
# comes from a two-way random-effects model (Student's t with Satterthwaite's degrees of freedom): where
# training runs differ and few ran, it widens, where a bootstrap over seeds would claim more than it knows.
# TOST declares equivalence when the (1 − 2α) interval lies inside ±margin (α = 1 − confidence). "Different"
# means the confidence interval excludes 0 without equivalence being shown; anything else is "inconclusive".

# %%
# NBVAL_CHECK_OUTPUT
equivalence = tables.equivalence_table(cells, equivalence_margin, confidence)
print(equivalence.markdown)

# %% [markdown]
# ## Power
#
# How precisely each comparison was measured: the half-width of the interval TOST reads, and the minimum
# detectable difference (the smallest true LoRA − FullFT gap that the test behind "different", at level
# α = 1 − confidence, finds with 80% power). The last columns say what a verdict would cost: the seeds with
# which TOST shows equivalence 80% of the time when LoRA and FullFT truly do not differ, projected from this
# comparison's seed and problem variances ("none" where only more problems would do).

# %%
# NBVAL_CHECK_OUTPUT
print(tables.power_markdown(equivalence.frame))

# %% [markdown]
# ## The rank each regime needs, and the answer
#
# The question read off the verdicts. A rank matches FullFT when it is equivalent or significantly ahead, and is
# behind when significantly below without equivalence shown. If more rank never needs less, the needed rank lies
# above every rank behind and at or below the smallest rank that matches; inconclusive ranks between the two leave
# it open. Regimes of different densities are ordered only where those ranges do not overlap. The SFT control says
# whether these statistics see LoRA fall behind FullFT where it does.

# %%
# NBVAL_CHECK_OUTPUT
print(rank_needed.rank_needed_table(equivalence.frame).markdown)

# %% [markdown]
# ## LoRA − FullFT at a glance
#
# The equivalence table drawn: per regime, each rank's difference (circle), the interval TOST reads (thick)
# and the confidence interval (thin), against the ±margin band; green equivalent, red different, grey
# inconclusive. Each panel has its own scale, symmetric about 0.

# %%
figures = report_dir / "figures"
plots.plot_equivalence(equivalence.frame, equivalence_margin, figures / "equivalence.png");
display(Image(figures / "equivalence.png"))

# %% [markdown]
# ## The answer at a glance
#
# The needed rank drawn: per regime, sparsest reward first and the SFT control last, the bar spans where the needed
# rank lies, above the open circle (the largest rank behind FullFT, 0 when none is) and at most the filled one (the
# smallest rank that matches; "beyond" when none does), hatched while undecided ranks lie inside it. Beside it, each
# rank's standing: green matches FullFT, red behind, grey undecided.

# %%
plots.plot_rank_needed(equivalence.frame, figures / "rank_needed.png");
display(Image(figures / "rank_needed.png"))

# %% [markdown]
# ## The bits argument, tallied
#
# The arithmetic behind the question: a reward carries about one bit per deposit and a trained network holds about
# two bits per parameter, so the rank an arm needs should be the smallest whose parameters hold what its cells
# received. Per regime, the deposits a cell received over its training and the bits each arm holds, and the rank
# this predicts beside the rank the verdicts need. Where the two differ, the argument does not describe this world.

# %%
# NBVAL_CHECK_OUTPUT
print(capacity.capacity_table(cells, equivalence.frame).markdown)

# %% [markdown]
# ## Plateau and collapse
#
# Did each arm stop learning before its last step (at most 10% of its gain in the last quarter)? And, per
# regime, when did the advantage std and the completion length peak, and did pass@1 fall back below the base
# (the paper's process regime: steps 28, 70 and 79)?

# %%
# NBVAL_CHECK_OUTPUT
print(dynamics.plateau_table(cells).markdown)
print(dynamics.collapse_table(cells).markdown)

# %% [markdown]
# ## Pass@1 vs rank
#
# One panel per regime: LoRA's final pass@1 against rank (log scale), FullFT's mean with a ±1 sd band, the
# base as a dashed line; the process panel adds the peak pass@1 (dotted), since process may collapse. If the
# needed rank grows with density, the LoRA curve should reach the FullFT band at higher ranks for denser
# rewards (outcome < process < distillation).

# %%
plots.plot_pass1_vs_rank(cells, figures / "pass1_vs_rank.png");
display(Image(figures / "pass1_vs_rank.png"))

# %% [markdown]
# ## Peak advantage std
#
# The largest per-step advantage std of each cell (dots), averaged per regime (bars): how strongly each
# reward pushes the policy. The paper reports 0.64 (outcome), 1.00 (distillation) and 9.05 (process).

# %%
plots.plot_peak_advantage_std(cells, figures / "peak_advantage_std.png");
display(Image(figures / "peak_advantage_std.png"))

# %% [markdown]
# ## Process-reward collapse
#
# Held-out pass@1 and the fraction of truncated rollouts over training, per arm (mean over seeds). The paper
# sees the process regime collapse between steps 60 and 80 as rollouts grow to the length cap.

# %%
plots.plot_process_collapse(cells, figures / "process_collapse.png");
display(Image(figures / "process_collapse.png"))

# %% [markdown]
# ## Pass@1 over training
#
# One panel per regime, one line per arm (mean over seeds), with the base model's pass@1 as the anchor.

# %%
plots.plot_pass1_over_training(cells, figures / "pass1_over_training.png");
display(Image(figures / "pass1_over_training.png"))

# %% [markdown]
# ## KL to the reference vs rank
#
# Each cell's KL(π‖π_ref) over its last 10% of steps (the k3 estimate on its sampled tokens, recorded at every
# step whatever beta is), mean over seeds with a t interval. "LoRA as an Implicit KL Regularizer in GRPO
# Fine-Tuning" finds it growing with the rank, small ranks tightly constrained and about ten times more KL at
# high rank; FullFT is its own point at the right.

# %%
# NBVAL_CHECK_OUTPUT
print(kl.kl_table(cells, confidence).markdown)

# %%
plots.plot_kl_vs_rank(cells, figures / "kl_vs_rank.png", confidence);
display(Image(figures / "kl_vs_rank.png"))

# %% [markdown]
# ## Report
#
# The tables (CSV and markdown), the figures and `report.md` tying them together, under `<outputs_dir>`.

# %%
report_path = report.write_report(cells, report_dir, equivalence_margin, confidence, profile, planned_cells)
print(report_path)
display(Markdown(report_path.read_text()))

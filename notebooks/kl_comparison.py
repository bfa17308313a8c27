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
# # With and without the KL penalty
#
# "LoRA as an Implicit KL Regularizer in GRPO Fine-Tuning" argues that a low-rank adapter already keeps the
# policy near its reference, so GRPO under LoRA can drop the KL penalty (and the reference pass it costs)
# without losing accuracy, while full fine-tuning without it drifts and may collapse. This notebook reads two
# studies trained alike but for beta (the same world, arms, seeds, learning rates and held-out problems) and
# pairs each arm's final answers across them. Their curves may score different numbers of problems between
# the first and last evaluation (`curve_problems`), so a peak is read only on the problems both scored, after
# training began.

# %% tags=["parameters"]
profile = "mini_klfree"  # the study without the penalty (beta = 0)
outputs_dir = "outputs/mini_klfree"
compare_with = "mini"  # the study with it
compare_with_dir = "outputs/mini"  # its outputs (relative paths are taken from the repository root)
equivalence_margin = 0.05
confidence = 0.95

# %%
from IPython.display import Markdown, display

from reward_density.analysis import kl_free, load
from reward_density.experiment.profiles import REPO_ROOT

report_dir = REPO_ROOT / outputs_dir
without_kl = load.load_cells(report_dir)
with_kl = load.load_cells(REPO_ROOT / compare_with_dir)

# %% [markdown]
# ## Accuracy with and without the penalty
#
# Without minus with, per regime and arm, paired by seed and held-out problem; the seed paper finds the
# differences within noise. TOST at the study's margin says whether "within noise" was shown.

# %%
# NBVAL_CHECK_OUTPUT
print(kl_free.with_without_kl(with_kl, without_kl, equivalence_margin, confidence).markdown)

# %% [markdown]
# ## The ablation: a mid rank and FullFT, each with and without KL
#
# The KL to the reference over training and each seed's final pass@1 against its end-of-training KL. The
# paper's claim to test: FullFT without KL collapses, LoRA without KL does not.

# %%
# NBVAL_CHECK_OUTPUT
print(kl_free.ablation_table(with_kl, without_kl).markdown)

# %%
path = kl_free.write_kl_comparison(with_kl, without_kl, report_dir, equivalence_margin, confidence,
                                   (compare_with, profile))
display(Markdown(path.read_text()))

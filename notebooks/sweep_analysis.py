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
# # Learning-rate sweep: each arm's own rate, per regime
#
# A study that compares LoRA with full fine-tuning at one shared learning rate compares learning rates as
# much as ranks: each arm trains best at its own ("LoRA Without Regret" puts LoRA's near 10x FullFT's).
# This notebook reads a sweep profile's cells (several rates per arm, on the world's dev problems and seeds
# the study does not use) and picks, per regime, the FullFT rate and the LoRA rate (one for all ranks: the
# best mean over them) with the best greedy pass@1. By default that is the final pass@1, and in outcome and
# distillation, which the study reads at a plateau, only among rates whose arm made at most 10% of its gain in
# the last quarter of its steps. A sweep for a study that stops each arm at its own best dev step
# (`analysis.choose_rate_by: best_step`) scores each cell at its best evaluation after step 0 instead. Each
# arm is judged on its own curve. The study's profile takes the rates from here.

# %% tags=["parameters"]
profile = "mini_sweep"
outputs_dir = "outputs/mini_sweep"
choose_rate_by = "final"  # the profile's analysis.choose_rate_by
planned_cells = None  # the profile's cell names (the runner passes them), so that a choice on part of the grid says so

# %%
from IPython.display import Markdown, display

from reward_density.analysis import load, sweep
from reward_density.experiment.profiles import REPO_ROOT

report_dir = REPO_ROOT / outputs_dir
cells = load.load_cells(report_dir)

# %%
# NBVAL_CHECK_OUTPUT
print(sweep.chosen_rates(cells, choose_rate_by).markdown)

# %%
path = sweep.write_sweep_report(cells, report_dir, profile, choose_rate_by, planned_cells)
display(Markdown(path.read_text()))

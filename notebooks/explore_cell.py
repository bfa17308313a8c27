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
# # One cell up close
#
# The analysis notebook compares cells; this one opens a single cell folder (finished, or still training:
# it shows what the cell has written so far) and looks inside: its learning curves, the held-out problems it
# learned and the ones it forgot, and how its greedy answers to the same problems changed from evaluation to
# evaluation. Point `cell` at any folder under `outputs/<profile>/cells/`.

# %% tags=["parameters"]
cell: str = "outputs/smoke/cells/process-r1-s0"  # a cell folder (relative paths are taken from the repository root)
top: int = 5  # problems listed among the learned and among the forgotten
problems: int = 4  # problems whose logged completions are followed over training

# %%
import pandas as pd
from IPython.display import display

from reward_density.analysis.explore import (
    cell_curves,
    check_counts,
    completions_over_training,
    learned_and_forgotten,
    problem_changes,
)
from reward_density.analysis.load import load_cell
from reward_density.experiment.profiles import REPO_ROOT

check_counts(top=top, problems=problems)
record = load_cell(REPO_ROOT / cell)  # an absolute path stays as it is
params = record.params
state = "finished" if record.summary else f"still running or stopped (step {len(record.history)} so far)"
print(f"{record.name}: regime {params['regime']}, rank {params['rank']}, seed {params['seed']}, "
      f"lr {params['learning_rate']}, {params['steps']} steps; {state}")
if record.summary:
    print({k: record.summary[k] for k in ("base_pass1", "final_pass1", "peak_pass1", "peak_step", "wall_seconds")})

# %% [markdown]
# ## Curves
#
# Held-out greedy pass@1 at each evaluation, then the per-step metrics: the mean trajectory reward, the
# spread of the advantages (GRPO learns nothing from a group whose completions all score alike), the KL to
# the reference, the completion length, the gradient norm (before clipping) and the loss.

# %%
cell_curves(record);

# %% [markdown]
# ## Which problems it learned and which it forgot
#
# Each held-out problem's correctness at the first and the last evaluation, on the problems both scored (a cell
# still training may have last scored only its curve problems). Learned: wrong before, right at the end;
# forgotten: the reverse. A regime that trades some problems for others shows both.

# %%
changes = problem_changes(record.answers)
print(f"learned {int((changes['change'] > 0).sum())}, forgotten {int((changes['change'] < 0).sum())}, "
      f"of {len(changes)} problems scored at both")
learned, forgotten = learned_and_forgotten(changes, top)
display(learned)
display(forgotten)

# %% [markdown]
# ## How its answers changed
#
# The greedy completions the cell logged (`logged_completions`, the first held-out problems) at every
# evaluation: one row per problem, one column per step. Rambling, repeated steps or a lost `\boxed{}`
# answer show here before they show in any average.

# %%
over_training = completions_over_training(record.completions, problems)
if over_training.empty:
    print("this cell logged no completions (logged_completions = 0, or it ran before cells logged them)")
with pd.option_context("display.max_colwidth", None):
    display(over_training)

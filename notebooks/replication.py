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
# # A study run again elsewhere
#
# A verdict of the mini study is a statement about one world: a student, teacher, PRM and problem set built
# from one seed on one kind of CPU. A replication runs the same arms at the same settings somewhere else (a world
# built from another seed, fresh training seeds) and asks how many of the LoRA-vs-FullFT verdicts come out the
# same. Both studies are read from their own tables (equivalence.csv and gain.csv), so the original study's
# committed summaries are enough.

# %% tags=["parameters"]
profile = "mini_world1"  # the replication
outputs_dir = "outputs/mini_world1"
replicates = "mini"  # the study it runs again
replicates_dir = "outputs/mini"  # its outputs (relative paths are taken from the repository root)
equivalence_margin = 0.05  # the band the figure draws

# %%
from IPython.display import Image, display

from reward_density.analysis import replication
from reward_density.experiment.profiles import REPO_ROOT

names = (replicates, profile)
original_dir, replication_dir = REPO_ROOT / replicates_dir, REPO_ROOT / outputs_dir
original, again = replication.read_summaries(original_dir), replication.read_summaries(replication_dir)

# %% [markdown]
# ## The worlds they read
#
# Each study's analysis writes the world its cells read (worlds.csv: a hash of each entry's files). A replication in
# another world is meant to differ here; one on fresh seeds is not.

# %%
print(replication.worlds_sentence(original, again, names))

# %% [markdown]
# ## Verdict by verdict
#
# Each comparison's difference (LoRA − FullFT, pass@1 on each study's held-out set, with its interval at the
# study's confidence level) and verdict in both studies. A flip from *equivalent* or *different* to
# *inconclusive* is a loss of power; one between *equivalent* and *different*, or from LoRA significantly ahead of
# FullFT to significantly behind it or back, is a result that did not hold.

# %%
print(replication.verdict_agreement(original["equivalence.csv"], again["equivalence.csv"], names).markdown)

# %% [markdown]
# ## The rank needed to match FullFT, in both
#
# Each regime's needed rank read off each study's verdicts (above every rank behind FullFT, at or below the
# smallest that matches it), and each study's answer to the question: does it grow with the reward's density?

# %%
print(replication.needed_agreement(original["equivalence.csv"], again["equivalence.csv"], names).markdown)

# %% [markdown]
# ## Did training move both?
#
# FullFT's gain over its own base in each regime (the SFT control's on its own skill): a replication in which
# the arms did not learn could not disagree.

# %%
print(replication.fullft_gains(original["gain.csv"], again["gain.csv"], names).markdown)

# %% [markdown]
# ## At each arm's dev-chosen step
#
# Where both studies stopped each cell at its own best dev evaluation (analysis/stopping.py), their comparisons
# on the held-out answers at those steps, and where each arm stopped in both. The verdicts above are at the last
# step.

# %%
stopped = replication.both_stopped(original, again)
if stopped:
    print(replication.verdict_agreement(original["equivalence_chosen.csv"], again["equivalence_chosen.csv"],
                                        names).markdown)
    print(replication.needed_agreement(original["equivalence_chosen.csv"], again["equivalence_chosen.csv"],
                                       names).markdown)
    print(replication.stopping_steps(original["chosen_steps.csv"], again["chosen_steps.csv"], names).markdown)
else:
    print("Not both studies stopped their cells at a dev-chosen step: nothing to compare there.")

# %% [markdown]
# ## Both studies' intervals, arm by arm
#
# The report (replication.md, with the tables above and the verdicts as replication.csv) and this figure: each
# arm's difference in both studies, coloured by its verdict, against the margin; for two dev-stopped studies a
# second one at the chosen steps (their verdicts as replication_chosen.csv).

# %%
path = replication.write_replication_report(original_dir, replication_dir, names, equivalence_margin)
print("written:", path, path.with_suffix(".csv"))
figures = ["replication.png"] + (["replication_chosen.png"] if stopped else [])
for figure in figures:
    display(Image(replication_dir / "figures" / figure))

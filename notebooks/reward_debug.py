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
# # Inside the rewards: what each module deposits, token by token
#
# A surprising number ("why does the process regime collapse?") is answered by looking at completions and
# the rewards they got. This notebook takes a few completions, either sampled fresh from a world's student
# or the greedy completions a finished cell logged at one of its evaluations, and shows for each token the
# reasoning step it belongs to and the deposit every reward module puts on it: **outcome** (one deposit, on
# the last token: is the `\boxed{}` answer right), **process** (the PRM's P(+) on each step's last token),
# **distillation** (the teacher's log-prob minus the student's, on every token). For sampled groups it also
# shows the weights the loss puts on each token's log-prob, as the profile's method computes them from the
# chosen regime's deposits: GRPO's advantages (paper Eq. 3-4), T-SPMO's prefix-trie advantages times the
# token's probability, and 0 on a token that S-GRPO's selection leaves out of the loss (called "advantage" in
# the tables). Last, what the outcome checker decided about each answer, and why.

# %% tags=["parameters"]
from typing import Optional

profile: str = "smoke"  # a profile name (params/<name>.yaml) or a profile file: its world's models and problems
                        # (unused with a cell, which is scored in the world it trained in)
root: Optional[str] = None  # the project root that the profile's world paths are relative to; None: this repository
regime: str = "process"  # whose advantages and colours to show: outcome | process | distillation
problems: int = 2  # sample for the first this many held-out problems
group_size: int = 4  # completions per problem (GRPO's G): advantages are relative within a problem's group
seed: int = 0  # the sampling seed
cell: Optional[str] = None  # a finished cell folder (relative to root): score its logged completions, not samples
step: Optional[int] = None  # the evaluation whose logged completions to score; None: the cell's last
show: int = 2  # completions shown token by token

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import HTML, display

from reward_density.analysis.explore import check_counts
from reward_density.analysis.reward_debug import (
    cell_reward_configs,
    coloured_tokens,
    completion_table,
    logged_completions,
    reward_configs,
    scored_by,
    token_table,
    trace_rewards,
)
from reward_density.data.answer_check import make_checker
from reward_density.data.sources import load_causal_lm, load_tokenizer
from reward_density.experiment.cell import load_problem_splits, load_reward, step_config
from reward_density.experiment.profiles import REPO_ROOT, find_profile, load_profile
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.grpo.text_rollout import rollout_from_text
from reward_density.rewards import check_regime

check_regime(regime)
check_counts(at_least=1, problems=problems, group_size=group_size)
check_counts(show=show)
project = Path(root) if root else REPO_ROOT
if cell:  # the world and settings the cell trained with, whatever the profile
    configs = cell_reward_configs(project / cell)
    print(f"the world cell {Path(cell).name} trained in: student {configs[regime].student}")
else:
    world = load_profile(find_profile(profile, project))
    configs = reward_configs(world, seed, project)
    print(f"world of profile {world.name}: student {configs[regime].student}")
config = configs[regime]

# %% [markdown]
# ## The completions
#
# Every reward module is built as a cell of its regime builds it, with the same models. Sampled completions
# come in groups of `group_size` per problem, at the profile's training temperature; a cell's logged
# completions are its greedy answers at one evaluation, one per problem, so they have deposits but no group
# to take advantages against. A cell keeps no weights, so the distillation deposits of its logged completions
# compare the teacher with the base student (the log-ratio the cell saw came from its trained student), and
# the text is tokenized afresh (the same ids the cell sampled, except where a token was cut mid-character).

# %%
checker = make_checker(config.answer_format)
tokenizer = load_tokenizer(config.student)
student = load_causal_lm(config.student, what="student")
rewards = {name: load_reward(c, checker, tokenizer) for name, c in configs.items()}
if cell:
    logged_step, chosen, texts, truncated = logged_completions(project / cell, checker, step)
    rollout = scored_by(rollout_from_text(tokenizer, chosen, texts, truncated=truncated), student, config.temperature)
    print(f"{len(texts)} greedy completions logged by {Path(cell).name} at step {logged_step}")
else:
    heldout = load_problem_splits(config, checker)[1][:problems]
    sampling = SamplingConfig(config.max_new_tokens, temperature=config.temperature, top_p=config.top_p)
    rollout = sample_rollout(student, tokenizer, heldout, group_size, sampling, seed)
    print(f"{rollout.num_completions} completions sampled: {group_size} for each of {len(heldout)} problems")
trace = trace_rewards(rollout, rewards, checker, None if cell else step_config(config), seed)

# %% [markdown]
# ## Every completion at a glance
#
# One row per completion: its tokens and reasoning steps (non-blank lines), each reward's trajectory reward
# (outcome: 1 if correct; process: the mean step score; distillation: the summed log-ratio) and number of
# deposits, the mean advantage under each regime (sampled groups only), and the checker's verdict with the
# reason: a wrong number, no `\boxed{}` answer (unparsable), or a check that took too long (timeout).

# %%
table = completion_table(trace, checker.timeout_seconds)
with pd.option_context("display.max_colwidth", 90, "display.width", 200):
    display(table.round(3))

# %% [markdown]
# ## Token by token
#
# Each token is coloured by the deposit the chosen regime puts on it (green positive, red negative, deeper
# for larger; uncoloured: no deposit), with a bar where a reasoning step ends; hover a token for its step,
# deposit and advantage. The table below each gives every regime's numbers.

# %%
for row in range(min(show, rollout.num_completions)):
    tokens = token_table(tokenizer, trace, row)
    print(f"completion {row} (group {table['group'][row]}): {table['verdict'][row]}; {table['why'][row]}")
    display(HTML(coloured_tokens(tokens, regime)))
    display(tokens.round(3).T)

# %% [markdown]
# ## What the process reward pays for
#
# The process regime's exploit shows here. The PRM scores each step on its own and never sees whether the
# final answer is right, so a policy can raise its process reward with steps the PRM likes whatever the
# answer, and with more of them where advantages are returns-to-go (every step above the group's mean adds
# to the advantage of every token before it). The figure: process reward against the number of steps,
# coloured by the checker's verdict; on a collapsed process cell's late completions, wrong answers with many
# highly scored steps are the exploit. The table after it: per verdict, the mean steps, length and rewards.

# %%
fig, ax = plt.subplots(1, 1, figsize=(5, 3.5))
for verdict, rows in table.groupby("verdict"):
    ax.scatter(rows["steps"], rows["process reward"], label=verdict, alpha=0.7)
ax.set(xlabel="reasoning steps", ylabel="process reward (mean step P(+))", title="what the PRM pays for")
ax.legend(fontsize=8);

# %%
summary = table.groupby("verdict")[["steps", "tokens", "process reward", "outcome reward"]].mean()
display(summary.assign(completions=table.groupby("verdict").size()).round(3))
checker.close()

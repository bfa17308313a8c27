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
# # GRPO, S-GRPO and T-SPMO
#
# "Token-Efficient RL for LLM Reasoning" trains under LoRA with two variants of GRPO that put far fewer
# tokens into the loss: S-GRPO keeps a random subset of each completion's tokens (the first alpha always,
# later ones with probability P, at most k), T-SPMO gives each unique (prefix, token) of a group's prefix
# trie its own advantage, the change in expected reward that token brings. It finds plain GRPO under LoRA
# barely moving the model, and T-SPMO far ahead of S-GRPO on multiplication. Here each method is a study of
# its own on the same world, arms, seeds and held-out problems, apart from the method's own settings
# (`params/mini_sgrpo.yaml`: the token selection; `params/mini_tspmo.yaml`: its advantages, no KL penalty,
# an L2 penalty on the adapters, one prompt of 16 completions a step), and each arm's final answers are
# paired with the baseline method's.

# %% tags=["parameters"]
profile = "mini_tspmo"  # the study whose analysis runs this comparison
outputs_dir = "outputs/mini_tspmo"  # where the comparison is written
methods = {"GRPO": "mini", "S-GRPO": "mini_sgrpo", "T-SPMO": "mini_tspmo"}  # name -> profile; the first the baseline
regime = "outcome"
equivalence_margin = 0.05
confidence = 0.95
memory_ranks = [1, "full"]  # arms whose peak step memory is measured per method ([] skips the measurement)

# %%
from IPython.display import Markdown, display

from reward_density.analysis import load
from reward_density.analysis import methods as compare
from reward_density.experiment.profiles import REPO_ROOT
from reward_density.experiment.step_memory import method_memory

outputs = REPO_ROOT / outputs_dir  # the other methods' studies sit beside it
studies = {}
for name, other in methods.items():
    try:
        studies[name] = load.load_cells(outputs.parent / other)
    except FileNotFoundError as missing:  # a method not run yet is left out, and said so
        print(f"{name}: left out ({missing})")
print(f"compared: {', '.join(studies)}")

# %% [markdown]
# ## Accuracy per arm, and each method minus the baseline
#
# The paper's Tables 1-2 compare the methods at one LoRA rank; here every arm of the study runs each method.

# %%
# NBVAL_CHECK_OUTPUT
print(compare.method_accuracy(studies, regime, equivalence_margin, confidence).markdown)

# %% [markdown]
# ## Tokens in the loss
#
# What each method backpropagates through per completion (the paper's Table 3: GRPO >> S-GRPO >> T-SPMO).

# %%
# NBVAL_CHECK_OUTPUT
print(compare.loss_tokens(studies, regime).markdown)

# %% [markdown]
# ## Peak memory of one step
#
# The paper counts tokens in the loss as its memory proxy. Here one step of each method that ran is measured
# (one arm through peft, the method's own settings from its profile, after a warm-up step), beside GRPO run
# one completion at a time, the paper's low-memory GRPO baseline. Bytes depend on the completions sampled, so
# the table shows them too.

# %%
memory = []
if memory_ranks:
    memory = method_memory({name: methods[name] for name in studies}, regime, memory_ranks,
                           root=outputs.parent.parent)
    print(compare.memory_table(memory).markdown)

# %%
path = compare.write_method_comparison(studies, outputs, regime, equivalence_margin, confidence, methods, memory)
display(Markdown(path.read_text()))

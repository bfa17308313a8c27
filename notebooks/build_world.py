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
# # Building the mini world
#
# The paper trains Qwen3-1.7B-Base on MATH with Qwen3-8B as the distillation teacher and
# Math-Shepherd's Mistral-7B PRM. None of those can be downloaded where this project is built, and most
# readers have no GPU, so this notebook builds a CPU-sized stand-in for each, from nothing, and saves
# it the way the real models are saved (`save_pretrained`), so the cells load them with the same code:
#
# | paper | mini world |
# |---|---|
# | MATH problems, `\boxed{}` answers | chained arithmetic (`7+8-5+3`), one step per line, a `\boxed{}` answer line |
# | Qwen3 tokenizer | byte-level BPE with single-digit tokens, trained here |
# | Qwen3-1.7B-Base (0.375 greedy) | small `Qwen3ForCausalLM` pretrained on *imperfect* traces for a fixed number of steps, which must leave its greedy pass@1 near a target |
# | Qwen3-8B teacher | larger `Qwen3ForCausalLM`, same tokenizer, trained on clean traces to high accuracy |
# | math-shepherd-mistral-7b-prm | small `MistralForCausalLM` with its own tokenizer, a step tag after each step, P(+) from the `+`/`-` logits, trained on steps labelled by completer rollouts |
#
# Each component is rebuilt only when it is missing or its settings (or those of what it is built
# from) changed; `manifest.json` records the settings, accuracies, sizes, timings and git commit.

# %% tags=["parameters"]
size = "mini"  # preset: "mini" (the study) or "smoke" (seconds, for tests)
seed = 0
out_dir = "outputs/mini/world"  # relative paths are taken from the repository root
student_target = None  # greedy dev pass@1 the base student must land near (None: the preset's)
teacher_min_accuracy = None  # the teacher must reach at least this (None: the preset's)
overrides = {}  # any other WorldConfig field, nested, e.g. {"student": {"hidden": 96}, "task": {"max_digits": 3}}
force = False  # rebuild everything even if up to date

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from reward_density.experiment.profiles import REPO_ROOT
from reward_density.world.build import build_world, config_from_parameters, stale_components

config = config_from_parameters(size, seed, student_target, teacher_min_accuracy, overrides)
world_dir = Path(out_dir) if Path(out_dir).is_absolute() else REPO_ROOT / out_dir
print("to build:", ", ".join(stale_components(config, world_dir)) or "nothing, the world is up to date")

# %%
world = build_world(config, world_dir, force=force)
components = world["components"]

# %% [markdown]
# ## What was built
#
# One row per model: its size and greedy pass@1 on the dev problems its pretraining was evaluated on
# (`selection_problems` of them). Building the world never looks at the held-out problems the study
# reports on; the capability baseline measures the base there.

# %%
# NBVAL_CHECK_OUTPUT
rows = [
    {"model": name, "parameters": components[name]["parameters"], "hidden": components[name]["hidden"],
     "layers": components[name]["layers"], "greedy pass@1": components[name].get("accuracy")}
    for name in ("student", "teacher", "prm")
]
print(pd.DataFrame(rows).to_string(index=False))

# %% [markdown]
# ## A problem and its clean solution
#
# The base traces the student learns from are sometimes imperfect on purpose: a redundant line, a slip
# carried to a wrong answer, rambling after the answer line (see `TaskConfig` in
# `reward_density.world.task`); nothing in the world rules out length growth or reward hacking.

# %%
# NBVAL_CHECK_OUTPUT
print(components["problems"]["example"])

# %% [markdown]
# ## Pretraining curves
#
# The student trains for a fixed number of steps and keeps its last weights, which must land within
# `student_tolerance` of its target; the teacher stops once it is accurate enough (else at its last step)
# and keeps the better of its last two evaluations.

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for name in ("student", "teacher"):
    curve = pd.DataFrame(components[name]["curve"])
    ax.plot(curve["step"], curve["accuracy"], marker=".", label=name)
ax.axhline(config.student_target, ls="--", c="grey", lw=1, label="student target")
ax.set(xlabel="pretraining step", ylabel="dev greedy pass@1", ylim=(0, 1))
ax.legend();

# %% [markdown]
# ## The PRM
#
# Steps of solutions sampled from the student are labelled the Math-Shepherd way: a step is good when
# at least one of several teacher rollouts continued from it reaches the right answer (hard estimation).
# The PRM never sees the gold answer. Its accuracy on the steps of problems kept out of its training (a
# slice of the training split, not the study's held-out set) is reported beside the majority-class rate
# it has to beat.

# %%
# NBVAL_CHECK_OUTPUT
print(json.dumps({k: components["prm"][k] for k in ("labelled_solutions", "heldout")}, indent=1, sort_keys=True))

# %%
print(f"world saved under {world_dir}")

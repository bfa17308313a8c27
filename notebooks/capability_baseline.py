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
# # Capability baseline: student vs teacher before any RL
#
# The paper's Table 2 for the world a profile uses: sampled pass@1/4/8 on the held-out set, the
# exploration gap (pass@4 - pass@1, as the paper takes it: answers the model can already find when it
# may try several times, which RL can hope to pull into pass@1) and the mean response length. In the
# paper Qwen3-1.7B-Base sits far below Qwen3-8B; the mini world is built to keep that relation.

# %% tags=["parameters"]
student = "outputs/mini/world/student"  # relative paths are taken from the repository root
teacher = "outputs/mini/world/teacher"
problems = "outputs/mini/world/problems"
heldout = None  # a held-out problem file or dataset; None: <problems>/heldout.jsonl
prompt_template = None  # MATH-schema datasets (paper world): the prompt around each problem
problem_subsets = None
out_dir = "outputs/mini/baseline"
ks = [1, 4, 8]
temperature = 0.7
top_p = 0.95
max_new_tokens = 64
batch_size = 64  # problems per sampling batch (each with max(ks) samples; each batch draws from seed + its start,
                 # so the batch size is part of the result: the runner's, run/stages.py BASELINE_BATCH)
device = "cpu"  # student
teacher_device = "cpu"
precision = "fp32"  # fp32 | bf16
answer_format = "boxed"  # boxed (math-verify on the \\boxed{} answer) | last_integer (the multiplication task)
seed = 0
profile = None  # a profile name or path: also evaluate the base greedily on its held-out sets, once per world
root = None  # the project root the profile's world paths are relative to; None: the repository root

# %%
from pathlib import Path

import pandas as pd
import torch
from IPython.display import Image, display

from reward_density.analysis.plots import plot_capability
from reward_density.analysis.tables import capability_markdown
from reward_density.data.answer_check import make_checker
from reward_density.data.problem_sets import heldout_problems
from reward_density.data.sources import load_causal_lm, load_tokenizer
from reward_density.experiment.baseline import base_configs, base_evaluation, capability_row
from reward_density.experiment.cell import load_problem_splits
from reward_density.experiment.profiles import REPO_ROOT, find_profile, load_profile, resolve_world_entry
from reward_density.grpo.precision import autocast, frozen_dtype
from reward_density.grpo.sampler import SamplingConfig


def local(path):
    """Local paths are taken from the repository root wherever Jupyter started; hub ids pass through."""
    return None if path is None else resolve_world_entry(path, REPO_ROOT)


torch.manual_seed(seed)
checker = make_checker(answer_format)
problem_set = heldout_problems(local(problems), local(heldout), prompt_template, problem_subsets, checker)
sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
out = Path(local(out_dir))
out.mkdir(parents=True, exist_ok=True)
print(f"{len(problem_set)} held-out problems, {max(ks)} samples each at temperature {temperature}, top-p {top_p}")

# %%
rows = []
for name, path, on in (("student", student, device), ("teacher", teacher, teacher_device)):
    model = load_causal_lm(local(path), dtype=frozen_dtype(precision), device=on, what=name)
    with autocast(on, precision):
        rows.append(capability_row(name, model, load_tokenizer(local(path)), problem_set, checker, sampling, ks, seed,
                                   batch_size=batch_size))
    del model
table = pd.DataFrame(rows)
table.to_csv(out / "capability.csv", index=False)
_ = (out / "capability.md").write_text(capability_markdown(table) + "\n")  # its length is not an output

# %% [markdown]
# ## Table 2 (mini world)

# %%
# NBVAL_CHECK_OUTPUT
print(capability_markdown(table))

# %%
plot_capability(table, out / "capability.png")
display(Image(out / "capability.png"))

# %% [markdown]
# ## The base model's greedy evaluation, once per world
#
# Every training cell starts as the base model (a LoRA adapter starts at zero, a FullFT copy is the base),
# so every cell's step-0 evaluation is this one. It is computed here once per world and held-out set and
# saved under a key of the student's weights, the problems and the decoding settings; a cell that finds
# its key reuses it, and one that does not evaluates the base itself.

# %%
base_lines = []
for config in base_configs(load_profile(find_profile(profile)), out, Path(root or REPO_ROOT)) if profile else []:
    model = load_causal_lm(config.student, dtype=frozen_dtype(config.precision), device=config.device, what="student")
    _, heldout_set = load_problem_splits(config, checker)
    pass1, _ = base_evaluation(config, model, load_tokenizer(config.student), heldout_set, checker)
    which = "the SFT control's skill" if config.regime == "sft" else "the task"
    base_lines.append(f"base greedy pass@1 on {len(heldout_set)} held-out problems of {which}: {pass1:.3f}")
checker.close()

# %%
# NBVAL_CHECK_OUTPUT
print("\n".join(base_lines))

# %%
print(f"written: {out / 'capability.csv'}, {out / 'capability.md'}, {out / 'capability.png'}")

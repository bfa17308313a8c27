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
# exploration gap (pass@8 - pass@1: answers the model can already find when it may try several times,
# which RL can hope to pull into pass@1) and the mean response length. In the paper Qwen3-1.7B-Base
# sits far below Qwen3-8B; the mini world is built to keep that relation.

# %% tags=["parameters"]
student = "outputs/mini/world/student"  # relative paths are taken from the repository root
teacher = "outputs/mini/world/teacher"
problems = "outputs/mini/world/problems"
heldout = None  # a held-out problem file; None: <problems>/heldout.jsonl
out_dir = "outputs/mini/baseline"
ks = [1, 4, 8]
temperature = 0.7
top_p = 0.95
max_new_tokens = 64
seed = 0

# %%
from pathlib import Path

import pandas as pd
import torch
from IPython.display import Image, display

from reward_density.answer_check import AnswerChecker
from reward_density.baseline import capability_markdown, capability_row, plot_capability
from reward_density.models import load_causal_lm, load_tokenizer
from reward_density.params import REPO_ROOT
from reward_density.problems import read_problems
from reward_density.sampler import SamplingConfig


def local(path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else REPO_ROOT / path


torch.manual_seed(seed)
heldout_problems = read_problems(local(heldout) if heldout else local(problems) / "heldout.jsonl")
sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
out = local(out_dir)
out.mkdir(parents=True, exist_ok=True)
print(f"{len(heldout_problems)} held-out problems, {max(ks)} samples each at temperature {temperature}, top-p {top_p}")

# %%
rows = []
with AnswerChecker() as checker:
    for name, path in (("student", student), ("teacher", teacher)):
        model = load_causal_lm(local(path), what=name)
        rows.append(capability_row(name, model, load_tokenizer(local(path)), heldout_problems, checker, sampling, ks, seed))
table = pd.DataFrame(rows)
table.to_csv(out / "capability.csv", index=False)
(out / "capability.md").write_text(capability_markdown(table) + "\n")

# %% [markdown]
# ## Table 2 (mini world)

# %%
# NBVAL_CHECK_OUTPUT
print(capability_markdown(table))

# %%
plot_capability(table, out / "capability.png")
display(Image(out / "capability.png"))

# %%
print(f"written: {out / 'capability.csv'}, {out / 'capability.md'}, {out / 'capability.png'}")

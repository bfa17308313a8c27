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
# # One cell of the matrix: GRPO with one reward regime and one LoRA rank (or full fine-tuning)
#
# The study trains the same student with the same GRPO loss under three rewards that differ only in how
# densely they deposit reward on a completion: **outcome** (one deposit: is the `\boxed{}` answer right),
# **process** (one per reasoning step: the PRM's P(+)), **distillation** (one per token: the teacher's
# log-prob minus the student's). This notebook is one point of the matrix; papermill runs it once per
# (regime, rank, seed) of a profile (`params/<profile>.yaml`), and the matrix runner collects the folders it
# writes. Run it by hand with papermill's command line too: `papermill train_cell.ipynb out.ipynb -p profile mini
# -p rank full` trains one FullFT cell of the mini study with that profile's settings and FullFT rate
# (`papermill --help-notebook train_cell.ipynb` lists every setting with its type; see `jupytext --to ipynb`).

# %% tags=["parameters"]
from typing import Optional, Union  # the annotations below are what `papermill --help-notebook` shows

profile: str = "smoke"  # a profile name (params/<name>.yaml) or the path of a profile file
regime: str = "outcome"  # the reward: outcome | process | distillation
rank: Union[int, str] = 1  # LoRA rank, or "full" for full fine-tuning
seed: int = 0  # seeds the adapter initialisation, the problem order and the sampling
# Every setting below left at None takes the profile's value, or the schema default in [brackets]
# (reward_density.experiment.config.CellConfig).
learning_rate: Optional[float] = None  # AdamW learning rate (matrix.learning_rate of the arm); None: the profile's rate for this arm
steps: Optional[int] = None  # GRPO steps [100]
prompts_per_step: Optional[int] = None  # P, problems per step [4]
group_size: Optional[int] = None  # G, samples per problem [4]
temperature: Optional[float] = None  # sampling temperature; log-probs are taken at it too [0.7]
top_p: Optional[float] = None  # nucleus sampling mass [0.95]
max_new_tokens: Optional[int] = None  # completion cap while training [1536]
beta: Optional[float] = None  # KL penalty weight; 0 skips the reference pass [0.05]
kl_estimator: Optional[str] = None  # paper (Eq. 5) | k3 | k1 ['paper']
loss_normalisation: Optional[str] = None  # token_mean (paper) | sequence_mean (GRPO) | constant (Dr. GRPO) ['token_mean']
advantage_eps: Optional[float] = None  # added to the group std (Eq. 3) [0.0001]
max_grad_norm: Optional[float] = None  # gradient-norm clip [1.0]
weight_decay: Optional[float] = None  # AdamW weight decay [0.0]
lora_alpha: Optional[float] = None  # LoRA alpha, whatever the rank [32]
lora_dropout: Optional[float] = None  # LoRA dropout [0.0]
eval_every: Optional[int] = None  # evaluate every this many steps (and at 0 and the end) [10]
eval_problems: Optional[int] = None  # the first this many held-out problems [100]
eval_max_new_tokens: Optional[int] = None  # completion cap while evaluating [1536]
eval_batch_size: Optional[int] = None  # held-out problems per greedy batch [50]
device: Optional[str] = None  # the student's device (policy and reference) ['cpu']
teacher_device: Optional[str] = None  # the distillation teacher's device ['cpu']
prm_device: Optional[str] = None  # the process reward model's device ['cpu']
precision: Optional[str] = None  # fp32 | bf16 (autocast; trained weights stay fp32) ['fp32']
micro_batch_size: Optional[int] = None  # rows per forward/backward pass (unset: the whole batch) [None]
gradient_checkpointing: Optional[bool] = None  # recompute activations in the backward [False]
student: Optional[str] = None  # the policy's base model; None: the profile's world.student
teacher: Optional[str] = None  # the distillation teacher; None: the profile's world.teacher
prm: Optional[str] = None  # the process reward model; None: the profile's world.prm
problems: Optional[str] = None  # the training problems; None: the profile's world.problems
heldout: Optional[str] = None  # the held-out problems (unset: the mini world's problems/heldout.jsonl) [None]
prompt_template: Optional[str] = None  # the prompt around each problem (unset: the mini world's own files) [None]
problem_subsets: Optional[list[str]] = None  # dataset configs of `problems` to read (unset: the default one) [None]
out_dir: Optional[str] = None  # the cell folder; None: outputs/<profile>/cells/<cell name>

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch

from reward_density.data.answer_check import AnswerChecker
from reward_density.experiment import cell
from reward_density.experiment.config import notebook_settings
from reward_density.experiment.profiles import cell_config, find_profile, load_profile

# %%
# NBVAL_CHECK_OUTPUT
# The parameters cell above assigned every setting by name; those left at None come from the profile.
settings = {f.name: globals()[f.name] for f in notebook_settings() if globals()[f.name] is not None}
config = cell_config(load_profile(find_profile(profile)), regime, rank, seed, **settings)
print(f"cell {config.name} ({config.profile}): lr {config.learning_rate}, {config.steps} steps of "
      f"P={config.prompts_per_step} x G={config.group_size}, {config.precision} on {config.device}")

# %% [markdown]
# ## Inputs
#
# Everything is loaded before the first step, so a missing model or an unreadable problem file fails
# here rather than after minutes of training. The reward module is the only part that knows the regime.

# %%
torch.manual_seed(config.seed)
checker = AnswerChecker()
inputs = cell.load_inputs(config, checker)
policy = cell.make_policy(config, inputs.student)
writer = cell.CellWriter(config, extra={"hidden_size": inputs.student.config.hidden_size})
trainable = sum(p.numel() for p in policy.trainable_parameters())
print(f"{len(inputs.train)} training problems, {len(inputs.heldout)} held-out; "
      f"{trainable} trainable parameters ({'FullFT' if config.rank is None else f'LoRA r={config.rank}'})")

# %% [markdown]
# ## Training
#
# Each step samples G completions for P problems, turns the reward's deposits into advantages (per token
# when every token carries a deposit, return-to-go otherwise), and takes one step of the clipped GRPO loss
# with the KL penalty to the reference. Greedy pass@1 on the held-out set is measured before training,
# every `eval_every` steps and at the end.

# %%
cell.train(config, inputs, policy, writer)
checker.close()

# %%
# NBVAL_CHECK_OUTPUT
history = pd.DataFrame(writer.history)
evals = pd.DataFrame(writer.evals)
print(evals.round(4).to_string(index=False))
print(history[["step", "reward_mean", "advantage_std", "len_mean", "grad_norm"]].round(4).to_string(index=False))

# %%
fig, axes = plt.subplots(1, 3, figsize=(12, 3))
evals.plot(x="step", y="pass1", marker="o", ax=axes[0], legend=False, title="held-out greedy pass@1")
history.plot(x="step", y="reward_mean", ax=axes[1], legend=False, title="mean trajectory reward")
history.plot(x="step", y=["len_mean", "frac_truncated"], ax=axes[2], secondary_y="frac_truncated",
             title="completion length / truncated");

# %% [markdown]
# ## Summary
#
# `summary.json` is written last and atomically: its presence is what marks this cell as finished.

# %%
summary = writer.finish(config.device)
print(pd.Series(summary).to_string())

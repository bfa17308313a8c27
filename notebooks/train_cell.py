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
# (regime, rank, seed) with the parameters below (`params/<profile>.yaml` holds them) and the matrix
# runner collects the folders it writes.

# %% tags=["parameters"]
profile = "smoke"
regime = "outcome"  # outcome | process | distillation
rank = 1  # LoRA rank, or "full" for full fine-tuning
seed = 0
learning_rate = 3e-4
steps = 2
prompts_per_step = 2  # P
group_size = 2  # G
temperature = 0.7
top_p = 0.95
max_new_tokens = 16
beta = 0.05
kl_estimator = "paper"  # paper | k3 | k1
loss_normalisation = "token_mean"  # token_mean | sequence_mean | constant
eval_every = 1
eval_problems = 8
eval_max_new_tokens = 16
eval_batch_size = 8
lora_alpha = 32
lora_dropout = 0.0
weight_decay = 0.0
max_grad_norm = 1.0
advantage_eps = 1e-4
device = "cpu"
teacher_device = "cpu"
prm_device = "cpu"
precision = "fp32"  # fp32 | bf16 (bf16 autocast, trained weights kept in fp32)
micro_batch_size = 2  # rows per forward/backward pass
gradient_checkpointing = False
student = "outputs/smoke/world/student"
teacher = "outputs/smoke/world/teacher"
prm = "outputs/smoke/world/prm"
problems = "outputs/smoke/world/problems"
heldout = None
prompt_template = None  # MATH-schema datasets (paper world): the prompt around each problem
problem_subsets = None  # the dataset configs of `problems` to read
out_dir = "outputs/smoke/cells/outcome-r1-s0"

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch

from reward_density import cell
from reward_density.answer_check import AnswerChecker
from reward_density.params import REPO_ROOT, resolve_world_entry


def local(path):
    """Local paths are taken from the repository root wherever Jupyter started; hub ids pass through."""
    return None if path is None else resolve_world_entry(path, REPO_ROOT)


parameters = dict(
    profile=profile, regime=regime, rank=rank, seed=seed, learning_rate=learning_rate, steps=steps,
    prompts_per_step=prompts_per_step, group_size=group_size, temperature=temperature, top_p=top_p,
    max_new_tokens=max_new_tokens, beta=beta, kl_estimator=kl_estimator, loss_normalisation=loss_normalisation,
    eval_every=eval_every, eval_problems=eval_problems, eval_max_new_tokens=eval_max_new_tokens,
    eval_batch_size=eval_batch_size, lora_alpha=lora_alpha, lora_dropout=lora_dropout, weight_decay=weight_decay,
    max_grad_norm=max_grad_norm, advantage_eps=advantage_eps, device=device, teacher_device=teacher_device,
    prm_device=prm_device, precision=precision, micro_batch_size=micro_batch_size,
    gradient_checkpointing=gradient_checkpointing, student=local(student), teacher=local(teacher), prm=local(prm),
    problems=local(problems), heldout=local(heldout), prompt_template=prompt_template,
    problem_subsets=problem_subsets, out_dir=str(REPO_ROOT / out_dir),
)
config = cell.CellConfig.from_parameters(parameters)
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

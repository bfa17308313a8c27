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
regime: str = "outcome"  # the reward: outcome | process | distillation; or sft, the control
rank: Union[int, str, list] = 1  # LoRA rank, "full", or a list trained stacked (papermill: -y 'rank: [1, 2]')
seed: int = 0  # seeds the adapter initialisation, the problem order and the sampling
cells_dir: Optional[str] = None  # where each cell's folder goes; None: outputs/<profile>/cells
# Every setting below left at None takes the profile's value, or the schema default in [brackets]
# (reward_density.experiment.config.CellConfig).
learning_rate: Optional[Union[float, list]] = None  # AdamW learning rate (matrix.learning_rate of the arm; a list: one per rank); None: the profile's rate for each arm
steps: Optional[int] = None  # GRPO steps [100]
prompts_per_step: Optional[int] = None  # P, problems per step [4]
group_size: Optional[int] = None  # G, samples per problem [4]
temperature: Optional[float] = None  # sampling temperature; log-probs are taken at it too [0.7]
top_p: Optional[float] = None  # nucleus sampling mass [0.95]
max_new_tokens: Optional[int] = None  # completion cap while training [1536]
beta: Optional[float] = None  # KL penalty weight; 0 with track_kl off skips the reference pass [0.05]
track_kl: Optional[bool] = None  # record the KL to the reference every step, also at beta 0 (runs the reference pass) [True]
kl_estimator: Optional[str] = None  # paper (Eq. 5) | k3 | k1 ['paper']
loss_normalisation: Optional[str] = None  # token_mean (paper) | sequence_mean (GRPO) | constant (Dr. GRPO) ['token_mean']
advantage_eps: Optional[float] = None  # added to the group std (Eq. 3) [0.0001]
max_grad_norm: Optional[float] = None  # gradient-norm clip [1.0]
weight_decay: Optional[float] = None  # AdamW weight decay [0.0]
lr_schedule: Optional[str] = None  # constant (paper) | linear (TRL's): to 1/steps of it at the last step ['constant']
lora_alpha: Optional[float] = None  # LoRA alpha, whatever the rank [32]
lora_dropout: Optional[float] = None  # LoRA dropout [0.0]
sft_batch_size: Optional[int] = None  # solutions per step of the SFT control (unset: P x G) [None]
advantage_estimator: Optional[str] = None  # group: GRPO's (Eq. 3-4) | prefix_trie: T-SPMO's A(v|p) over each group's prefix trie, once per unique (prefix, token) ['group']
token_alpha: Optional[int] = None  # S-GRPO: the first this many tokens always enter the loss (set with token_k and token_p; unset: every token, GRPO) [None]
token_k: Optional[int] = None  # S-GRPO: at most this many tokens in the loss [None]
token_p: Optional[float] = None  # S-GRPO: each later token enters with this probability while there is room [None]
l2: Optional[float] = None  # T-SPMO's penalty lambda * sum ||W||^2 on the LoRA weights (none on FullFT) [0.0]
replay_successes: Optional[int] = None  # T-SPMO's replay: stored successes restarted per step (engine peft) [0]
replay_failures: Optional[int] = None  # T-SPMO's replay: stored failures restarted per step (engine peft) [0]
replay_threshold: Optional[float] = None  # T-SPMO's replay: a completion with at least this reward is a success [1.0]
answer_format: Optional[str] = None  # how an answer is read: boxed (math-verify on the \boxed{} answer) | last_integer (the completion's last integer: the multiplication task) ['boxed']
eval_every: Optional[int] = None  # evaluate every this many steps (and at 0 and the end) [10]
eval_problems: Optional[int] = None  # the first this many held-out problems (the SFT control: all its facts) [100]
curve_problems: Optional[int] = None  # the first this many of them, scored at every evaluation: the learning curve (none: all) [None]
eval_split: Optional[str] = None  # the mini world's split evaluated: heldout (the study) | dev (choosing settings) ['heldout']
dev_problems: Optional[int] = None  # also score the first this many dev problems at every evaluation after step 0, to choose each arm's step on dev (analysis: stopping.py; none: no dev) [None]
eval_max_new_tokens: Optional[int] = None  # completion cap while evaluating [1536]
eval_batch_size: Optional[int] = None  # held-out problems per greedy batch [50]
logged_completions: Optional[int] = None  # greedy completions of the first this many held-out problems kept at every evaluation (completions.jsonl) [16]
report_to: Optional[str] = None  # none | tensorboard: per-step metrics as event files in the cell folder, live (tensorboard --logdir outputs/<profile>/cells) ['none']
engine: Optional[str] = None  # peft: one cell per process, any model | stacked: a regime and seed's arms in one batched pass (Qwen3, fp32) ['peft']
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
control: Optional[str] = None  # the SFT control's problems (train.jsonl, heldout.jsonl with solutions) [None]
heldout: Optional[str] = None  # held-out set (unset: problems/<eval_split>.jsonl; MATH schema: its test split) [None]
prompt_template: Optional[str] = None  # the prompt around each problem (unset: the mini world's own files) [None]
problem_subsets: Optional[list[str]] = None  # dataset configs of `problems` to read (unset: the default one) [None]
base_answers: Optional[str] = None  # a folder of base evaluations computed once per world (unset: the cell's own) [None]

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch

from reward_density.analysis.explore import SPLIT_NAMES
from reward_density.analysis.tables import rounded
from reward_density.data.answer_check import make_checker
from reward_density.experiment import cell
from reward_density.experiment.baseline import base_evaluation
from reward_density.experiment.cell_folder import TRAINED_PARAMETERS
from reward_density.experiment.config import SFT, notebook_settings
from reward_density.experiment.profiles import find_profile, group_configs, load_profile

# %%
# NBVAL_CHECK_OUTPUT
# The parameters cell above assigned every setting by name; those left at None come from the profile.
settings = {f.name: globals()[f.name] for f in notebook_settings() if globals()[f.name] is not None}
ranks = rank if isinstance(rank, list) else [rank]
configs = group_configs(load_profile(find_profile(profile)), regime, ranks, seed, cells_dir=cells_dir, **settings)
cell.check_can_train(configs)
for config in configs:
    batch = f"{config.problems_per_step} solutions" if config.regime == SFT else \
        f"P={config.prompts_per_step} x G={config.group_size}"
    print(f"cell {config.name} ({config.profile}): lr {config.learning_rate}, {config.steps} steps of {batch}, "
          f"{config.precision} on {config.device}, engine {config.engine}")

# %% [markdown]
# ## Inputs
#
# Everything is loaded before the first step, so a missing model or an unreadable problem file fails
# here rather than after minutes of training. The reward module is the only part that knows the regime
# (the SFT control has none: it learns from the solutions of its problems). Every arm starts as the base
# model, so the step-0 evaluation is the base's, computed once per world and reused when the run provides it.

# %%
config = configs[0]
torch.manual_seed(config.seed)
checker = make_checker(config.answer_format)
inputs = cell.load_inputs(config, checker)
base = base_evaluation(config, inputs.student, inputs.tokenizer, inputs.heldout, checker)
policy = cell.make_policy(configs, inputs.student)
derived = [cell.derived_record(inputs.student, policy, arm) for arm in range(len(configs))]
writers = [cell.CellWriter(c, extra=record) for c, record in zip(configs, derived)]
print(f"{len(inputs.train)} training problems, {len(inputs.heldout)} held-out; base greedy pass@1 {base[0]:.3f}")
for c, record in zip(configs, derived):
    print(f"  {c.name}: {record[TRAINED_PARAMETERS]} trainable parameters "
          f"({'FullFT' if c.rank is None else f'LoRA r={c.rank}'})")

# %% [markdown]
# ## Training
#
# Each step samples G completions for P problems, turns the reward's deposits into advantages (per token
# when every token carries a deposit, return-to-go otherwise), and takes one step of the clipped GRPO loss
# with the KL penalty to the reference; the SFT control takes a supervised step on `sft_batch_size` solutions instead (unset: P x G).
# Arms trained together (engine `stacked`) share every batched pass but nothing else: each has its own
# weights, rewards, loss, gradient clip and learning rate. Greedy pass@1 is measured on every held-out problem
# before training and at the end, and on the first `curve_problems` of them every `eval_every` steps between:
# the learning curve (`pass1` in evals.csv) is read on those at every evaluation, so its points compare.

# %%
cell.train(configs, inputs, policy, writers, base)
checker.close()

# %%
# NBVAL_CHECK_OUTPUT
for writer in writers:
    history, evals = pd.DataFrame(writer.history), pd.DataFrame(writer.evals)
    columns = [c for c in ("step", "reward_mean", "advantage_std", "loss", "len_mean", "grad_norm") if c in history]
    print(writer.config.name)
    print(rounded(evals).to_string(index=False))
    print(rounded(history[columns]).to_string(index=False))

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
for writer in writers:
    evals, history = pd.DataFrame(writer.evals), pd.DataFrame(writer.history)
    axes[0].plot(evals["step"], evals["pass1"], marker="o", label=writer.config.name)
    axes[1].plot(history["step"], history["reward_mean" if "reward_mean" in history else "loss"], label=writer.config.name)
axes[0].set(title=f"{SPLIT_NAMES[writers[0].config.eval_split]} greedy pass@1", xlabel="step")
axes[1].set(title="mean trajectory reward (SFT: loss)", xlabel="step")
axes[0].legend(fontsize=7);

# %% [markdown]
# ## Summary
#
# Each cell's `summary.json` is written last and atomically: its presence is what marks the cell as finished.

# %%
summaries = pd.DataFrame([writer.finish(config.device) for writer in writers])
print(summaries.to_string(index=False))

"""Interactive exploration: cells log completions and live curves; the reward-debug and explore-a-cell notebooks
run on the smoke world and show what they promise."""
from __future__ import annotations

import dataclasses
import shutil

import nbformat
import pandas as pd
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from reward_density.analysis.explore import (
    cell_curves,
    check_counts,
    completions_over_training,
    learned_and_forgotten,
    problem_changes,
)
from reward_density.analysis.load import OneCell, load_cell
from reward_density.analysis.reward_debug import (
    cell_reward_configs,
    completion_table,
    logged_completions,
    reward_configs,
    token_table,
    trace_rewards,
    verdict_reason,
)
from reward_density.data.answer_check import LastIntegerChecker, Verdict
from reward_density.data.problems import Problem
from reward_density.experiment import cell_folder
from reward_density.experiment.cell import CellWriter
from reward_density.experiment.profiles import REPO_ROOT, cell_config, load_profile
from reward_density.grpo.deposits import Deposits
from reward_density.grpo.prefix_trie import prefix_advantages
from reward_density.grpo.sampler import SamplingConfig
from reward_density.grpo.step import StepConfig
from reward_density.grpo.text_rollout import rollout_from_text
from reward_density.grpo.token_selection import TokenSelection
from reward_density.run.cli import main
from reward_density.run.notebooks import execute_notebook

SMOKE = load_profile(REPO_ROOT / "params" / "smoke.yaml")


@pytest.fixture(scope="module")
def process_cells(smoke_project):
    """The smoke project with its process arms trained (finished cells with logged completions)."""
    assert main(["--profile", "smoke", "--root", str(smoke_project), "--stages", "baseline,cells",
                 "--cells", "process-*"]) == 0
    return smoke_project / "outputs" / "smoke" / "cells"


def outputs_text(notebook_path) -> str:
    """Every text and HTML output of an executed notebook, joined."""
    notebook = nbformat.read(notebook_path, as_version=4)
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            parts += [output.get("text", ""), data.get("text/plain", ""), data.get("text/html", "")]
    return "\n".join(map(str, parts))


# ------------------------------------------------------------------ what a cell writes while it trains


def test_a_cell_logs_its_greedy_completions_at_every_evaluation(process_cells):
    cell = load_cell(process_cells / "process-r1-s0")
    steps = sorted(cell.evals["step"])
    assert sorted(cell.completions["step"].unique()) == steps, "a logged evaluation is missing"
    per_step = cell.completions.groupby("step")["problem_id"].apply(list)
    first = cell.answers[cell.answers["step"] == 0]["problem_id"].tolist()
    assert all(ids == first[: len(ids)] for ids in per_step), "logged completions must be the first held-out problems"
    assert cell.completions["prompt"].str.startswith("Question:").all(), "each logged completion carries its prompt"
    assert "completion" not in cell.answers, "answers.csv stays one small row per problem: no completion text"


def test_a_cell_reports_its_curves_to_tensorboard(process_cells):
    events = EventAccumulator(str(process_cells / "process-rfull-s0"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/reward_mean", "train/kl_ref", "eval/pass1"} <= tags, f"tags written: {sorted(tags)}"
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]


def test_the_live_board_has_a_step_before_the_cell_finishes(tmp_path):
    config = cell_config(SMOKE, "outcome", 1, 0, out_dir=tmp_path / "cell", report_to="tensorboard")
    writer = CellWriter(config)
    writer.add_step({"step": 1, "loss": 0.25, "reward_mean": 0.5, "arms": 6})
    events = EventAccumulator(str(tmp_path / "cell"))
    events.Reload()  # the cell has not finished: summary.json is absent, the board is still open
    assert not cell_folder.is_finished(tmp_path / "cell")
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 0.25)]
    writer.board.close()


# ------------------------------------------------------------------ the library behind the notebooks


def test_a_rerun_cell_shows_only_its_own_curves_on_the_board(tmp_path):
    config = cell_config(SMOKE, "outcome", 1, 0, out_dir=tmp_path / "cell", report_to="tensorboard")
    CellWriter(config).add_step({"step": 1, "loss": 0.25})
    CellWriter(config).add_step({"step": 1, "loss": 0.5})  # the same cell run again by hand
    events = EventAccumulator(str(tmp_path / "cell"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 0.5)], "the first run's curve remained"


def test_a_rerun_stopped_before_its_first_step_leaves_none_of_the_earlier_runs_tables(tmp_path):
    config = cell_config(SMOKE, "outcome", 1, 0, out_dir=tmp_path / "cell")
    first = CellWriter(config)
    first.add_step({"step": 1, "loss": 0.25})
    first.add_eval(0, [{"problem_id": "a", "correct": 1, "length": 3, "truncated": False, "answered": True,
                        "verdict": "correct"}])
    (tmp_path / "cell" / cell_folder.MANIFEST).write_text("{}")
    CellWriter(config)  # the same cell run again by hand, stopped before it wrote anything of its own
    left = sorted(p.name for p in (tmp_path / "cell").iterdir() if not p.name.startswith("events.out"))
    assert left == [cell_folder.PARAMS], f"the earlier run's files stand beside the rerun's parameters: {left}"


def test_a_text_rollout_ends_each_completion_with_eos_unless_it_was_cut(tiny_tokenizer):
    problems = [Problem("a", "Problem: 1 + 2 = ?\n", "3"), Problem("b", "Problem: 2 + 2 = ?\n", "4")]
    rollout = rollout_from_text(tiny_tokenizer, problems, ["3", "4 4"], truncated=[False, True])
    lengths = rollout.completion_mask.sum(-1).tolist()
    ids = tiny_tokenizer(["3", "4 4"], add_special_tokens=False)["input_ids"]
    assert lengths == [len(ids[0]) + 1, len(ids[1])], "EOS closes a finished completion, not a truncated one"
    assert rollout.completion_ids[0, lengths[0] - 1] == tiny_tokenizer.eos_token_id
    with pytest.raises(ValueError, match="one completion per row"):
        rollout_from_text(tiny_tokenizer, problems, ["3"])
    with pytest.raises(ValueError, match=r"rows \[1\]: an empty completion cannot be truncated"):
        rollout_from_text(tiny_tokenizer, problems, ["3", ""], truncated=[False, True])  # no token to pack
    with pytest.raises(ValueError, match=r"groups starting at rows \[0\] hold different prompts"):
        rollout_from_text(tiny_tokenizer, problems, ["3", "4"], group_size=2)  # scored after one shared prompt


def last_token_reward(r) -> Deposits:
    """An outcome-shaped deposit: 1 on the last token of row 0, 0 on the last token of the others."""
    mask = r.completion_mask.bool()
    rewards = torch.zeros(mask.shape)
    last = mask.sum(-1) - 1
    rewards[0, last[0]] = 1.0
    deposit_mask = torch.zeros_like(mask)
    deposit_mask[torch.arange(len(mask)), last] = True
    return Deposits(rewards, deposit_mask, rewards.sum(-1))


class FirstRightChecker:
    def check(self, golds, completions):
        return [Verdict.CORRECT] + [Verdict.UNPARSABLE] * (len(completions) - 1)


def grpo_step(**method) -> StepConfig:
    return StepConfig(group_size=2, sampling=SamplingConfig(max_new_tokens=16), **method)


def test_each_deposit_sits_on_its_token_and_each_token_in_its_step(tiny_tokenizer):
    problems = [Problem("a", "Problem: 1 + 2 = ?\n", "3")] * 2
    rollout = rollout_from_text(tiny_tokenizer, problems, ["1 + 2\n= 3", "5"], group_size=2)
    trace = trace_rewards(rollout, {"outcome": last_token_reward}, FirstRightChecker(), grpo_step())
    table = token_table(tiny_tokenizer, trace, 0)
    assert table["outcome"].notna().tolist() == [False] * (len(table) - 1) + [True], "one deposit, on the last token"
    assert table["step"].iloc[0] == 1 and table["step"].max() == 2, "two reasoning steps (lines)"
    assert table["step"].iloc[-1] == 0, "the EOS token after the last step belongs to no step"
    assert table["outcome advantage"].iloc[0] > 0, "the rewarded completion's tokens get a positive advantage"
    summary = completion_table(trace, timeout_seconds=5)
    assert summary["steps"].tolist() == [2, 1] and summary["verdict"].tolist() == ["correct", "unparsable"]


def test_the_traced_weights_are_the_methods_loss_weights(tiny_tokenizer):
    problems = [Problem("a", "Problem: 1 + 2 = ?\n", "3")] * 2
    rollout = rollout_from_text(tiny_tokenizer, problems, ["1 + 2\n= 3", "1 + 5"], group_size=2)
    rollout = dataclasses.replace(rollout, sampler_logps=-0.5 * rollout.completion_mask)  # p = e^-0.5 per token
    rewards, checker = {"outcome": last_token_reward}, FirstRightChecker()

    tspmo = trace_rewards(rollout, rewards, checker, grpo_step(advantage_estimator="prefix_trie")).advantages
    trie, unique = prefix_advantages(rollout.completion_ids, rollout.completion_mask, torch.tensor([1.0, 0.0]), 2)
    expected = trie * torch.exp(torch.tensor(-0.5)) * rollout.completion_mask
    torch.testing.assert_close(tspmo["outcome"] * rollout.completion_mask, expected,
                               msg="T-SPMO's weight is its prefix-trie advantage times the token's probability")
    shared = rollout.completion_mask.bool() & ~unique
    assert shared.any() and (tspmo["outcome"][shared] == 0).all(), \
        "the shared prefix '1 + ' carries no T-SPMO weight, where GRPO's advantages weight it"

    selection = grpo_step(token_selection=TokenSelection(alpha=1, k=1, p=0.0))
    sgrpo = trace_rewards(rollout, rewards, checker, selection).advantages["outcome"]
    kept = sgrpo != 0
    assert kept.sum(-1).tolist() == [1, 1] and kept[:, 0].all(), "S-GRPO (alpha 1, k 1) weights only the first token"


@pytest.mark.parametrize("verdict, completion, expected", [
    (Verdict.CORRECT, "so \\boxed{7}", "the answer 7 equals the gold 7"),
    (Verdict.WRONG, "so \\boxed{8}", "the answer 8 does not equal the gold 7"),
    (Verdict.UNPARSABLE, "so 8", "no \\boxed{} answer"),
    (Verdict.UNPARSABLE, "so \\fbox{7}", "math-verify does not read the box {7}"),
    (Verdict.WRONG, "\\boxed{6} wait no \\boxed{7}", "2 boxed answers, the last 7: math-verify's reading of them"),
    (Verdict.TIMEOUT, "so \\boxed{x^x^x}", "longer than 5 s"),
])
def test_the_verdict_reason_says_why(verdict, completion, expected):
    assert expected in verdict_reason(verdict, completion, "7", timeout_seconds=5)


def test_learned_problems_come_first_and_forgotten_last():
    answers = pd.DataFrame({"step": [0, 0, 0, 5, 5, 5], "problem_id": ["a", "b", "c"] * 2,
                            "correct": [0, 1, 1, 1, 0, 1]})
    table = problem_changes(answers)
    assert table["problem_id"].tolist() == ["a", "c", "b"]
    assert table["change"].tolist() == [1, 0, -1]


def test_a_cell_still_training_compares_only_the_problems_its_last_evaluation_scored():
    # Step 5 scored only the first three problems (its curve problems); 003-005 must not count as forgotten.
    ids = [f"00{i}" for i in range(6)]
    answers = pd.DataFrame({"step": [0] * 6 + [5] * 3, "problem_id": ids + ids[:3],
                            "correct": [0, 1, 1, 1, 1, 1] + [1, 0, 1]})
    table = problem_changes(answers)
    assert table["problem_id"].tolist() == ["000", "002", "001"], table
    assert table["change"].tolist() == [1, 0, -1]


def test_the_learned_and_forgotten_lists_hold_only_changed_problems_and_none_in_both():
    changes = pd.DataFrame({"problem_id": ["a", "b", "c", "d"], "change": [1, 0, 0, -1]})
    learned, forgotten = learned_and_forgotten(changes, top=3)
    assert learned["problem_id"].tolist() == ["a"] and forgotten["problem_id"].tolist() == ["d"]


def test_a_count_below_its_minimum_is_named():
    with pytest.raises(ValueError, match="problems must be a whole number >= 1, got 0"):
        check_counts(at_least=1, problems=0, group_size=4)


def test_a_stacked_groups_folder_read_as_a_cell_names_its_arms_cell_folders(tmp_path):
    (tmp_path / "groups" / "process-s0").mkdir(parents=True)
    for arm in ("process-r1-s0", "process-rfull-s0", "outcome-r1-s0"):
        (tmp_path / "cells" / arm).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"this stacked group's arms are cell folders in .*cells: "
                                                r"process-r1-s0, process-rfull-s0$"):
        load_cell(tmp_path / "groups" / "process-s0")


@pytest.mark.parametrize("value", [-1, 2.5, True, "5"])
def test_a_count_that_is_not_a_whole_number_is_named(value):
    with pytest.raises(ValueError, match=f"top must be a whole number >= 0, got {value!r}"):
        check_counts(top=value, problems=4)


@pytest.mark.parametrize("params, title", [({"eval_split": "dev"}, "dev greedy pass@1"),
                                           ({"eval_split": "heldout"}, "held-out greedy pass@1"),
                                           ({}, "held-out greedy pass@1")])  # a cell from before the setting
def test_a_cells_curve_names_the_split_it_was_evaluated_on(params, title):
    evals = pd.DataFrame({"step": [0, 2], "pass1": [0.2, 0.4]})
    cell = OneCell("outcome-r1-lr0.001-s100", params, None, pd.DataFrame({"step": [1, 2]}), evals,
                   pd.DataFrame(), pd.DataFrame())
    assert cell_curves(cell).axes[0].get_title() == title


def test_completions_are_followed_per_problem_over_the_evaluations():
    logged = pd.DataFrame({"step": [0, 0, 10, 10], "problem_id": ["a", "b", "a", "b"],
                           "completion": ["x", "y", "x2", "y2"], "verdict": ["wrong", "correct"] * 2})
    table = completions_over_training(logged, problems=1)
    assert table.loc["a"].tolist() == ["[wrong] x", "[wrong] x2"] and list(table.columns) == [0, 10]


# ------------------------------------------------------------------ the notebooks on the smoke world


def test_the_reward_debug_notebook_samples_groups_and_shows_every_reward(smoke_project, tmp_path):
    out = tmp_path / "reward_debug.ipynb"
    execute_notebook(REPO_ROOT / "notebooks" / "reward_debug.py", out,
                     {"profile": "smoke", "root": str(smoke_project), "regime": "process", "problems": 2,
                      "group_size": 2})
    text = outputs_text(out)
    assert "4 completions sampled: 2 for each of 2 problems" in text
    for column in ("outcome reward", "process reward", "distillation reward", "process mean advantage", "why"):
        assert column in text, f"the completion table lacks {column!r}"
    assert "<span title=" in text, "the tokens were not shown coloured"


def test_the_reward_debug_notebook_scores_the_completions_a_cell_logged(process_cells, smoke_project, tmp_path):
    out = tmp_path / "reward_debug_cell.ipynb"
    execute_notebook(REPO_ROOT / "notebooks" / "reward_debug.py", out,
                     {"profile": "smoke", "root": str(smoke_project), "cell": str(process_cells / "process-rfull-s0")})
    text = outputs_text(out)
    assert "greedy completions logged by process-rfull-s0 at step 2" in text
    assert "process reward" in text and "mean advantage" not in text, "logged completions have no group"


def test_every_reward_is_built_for_a_profile_whose_matrix_lacks_some_regimes():
    profile = load_profile(REPO_ROOT / "params" / "mini_process_powered.yaml")
    assert tuple(profile.matrix.regimes) == ("process",), "the profile should train one regime only"
    configs = reward_configs(profile, 0, REPO_ROOT)
    assert {name: c.regime for name, c in configs.items()} == {r: r for r in ("outcome", "process", "distillation")}


def test_a_cells_logged_completions_are_scored_in_its_own_world_with_the_golds_it_was_evaluated_on(process_cells,
                                                                                                    tmp_path):
    folder = process_cells / "process-rfull-s0"
    recorded = load_cell(folder).params
    configs = cell_reward_configs(folder)
    assert {c.student for c in configs.values()} == {recorded["student"]}, "not the student the cell trained"
    assert configs["distillation"].teacher == recorded["teacher"] and configs["process"].prm == recorded["prm"]
    checker = LastIntegerChecker()  # the smoke world's golds are integers; the golds are read, not checked here
    step, problems, texts, _ = logged_completions(folder, checker)
    assert problems and all(p.answer for p in problems), "a logged problem lost its gold answer"
    moved = tmp_path / folder.name
    shutil.copytree(folder, moved)
    completions = moved / cell_folder.COMPLETIONS
    completions.write_text(completions.read_text().replace(f'"problem_id": "{problems[0].problem_id}"',
                                                            '"problem_id": "no-such-problem"'))
    with pytest.raises(ValueError, match=r"\['no-such-problem'\] are not in the held-out set"):
        logged_completions(moved, checker)


def test_the_explore_notebook_opens_a_finished_cell(process_cells, tmp_path):
    out = tmp_path / "explore_cell.ipynb"
    execute_notebook(REPO_ROOT / "notebooks" / "explore_cell.py", out, {"cell": str(process_cells / "process-r2-s0")})
    text = outputs_text(out)
    assert "process-r2-s0: regime process, rank 2" in text and "finished" in text
    assert "learned" in text and "forgotten" in text
    first = load_cell(process_cells / "process-r2-s0").completions.iloc[0]
    assert f"[{first['verdict']}]" in text, "the completions over training were not shown"

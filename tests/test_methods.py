"""GRPO against its token-selection variants: the same arms paired across studies, the tokens in the loss, and the
peak memory of a step."""
import dataclasses
import json

import nbformat
import pandas as pd
import pytest
import torch
from conftest import make_smoke_project
from test_analysis import N_PROBLEMS, write_cell

from reward_density.analysis.load import load_cells
from reward_density.analysis.methods import loss_tokens, method_accuracy, write_method_comparison
from reward_density.experiment.cell_folder import PARAMS, WORLD
from reward_density.experiment.profiles import REPO_ROOT, cell_config, find_profile, load_profile
from reward_density.experiment.step_memory import MIB, method_memory, peak_allocated, step_peak_memory
from reward_density.run.notebooks import execute_notebook


def method_study(root, finals: dict, tokens_in_loss: float | None = None):
    """An outcome study of r4 and FullFT over two seeds; finals: {arm rank: [problems solved per seed]}."""
    for rank, solved in finals.items():
        for seed, final in enumerate(solved):
            folder = write_cell(root, "outcome", rank, seed, final)
            history = pd.read_csv(folder / "history.csv")
            history["len_mean"] = 20.0
            if tokens_in_loss is not None:  # a GRPO history from before loss_tokens was logged has none
                history["loss_tokens"] = tokens_in_loss
            history.to_csv(folder / "history.csv", index=False)
    return load_cells(root)


@pytest.fixture
def studies(tmp_path):
    return {"GRPO": method_study(tmp_path / "grpo", {4: [5, 5], None: [6, 6]}),
            "T-SPMO": method_study(tmp_path / "tspmo", {4: [8, 8], None: [6, 6]}, tokens_in_loss=2.0)}


def test_each_method_is_paired_with_the_baseline_arm_by_arm(studies):
    frame = method_accuracy(studies, "outcome", margin=0.05).frame.set_index(["method", "arm"])
    assert frame.loc[("T-SPMO", "r4"), "estimate"] == pytest.approx(3 / N_PROBLEMS)
    assert frame.loc[("T-SPMO", "r4"), "ci_low"] < 3 / N_PROBLEMS < frame.loc[("T-SPMO", "r4"), "ci_high"]
    assert frame.loc[("T-SPMO", "full"), "estimate"] == pytest.approx(0.0)
    assert pd.isna(frame.loc[("GRPO", "r4"), "estimate"]), "the baseline is not compared with itself"
    assert frame.loc[("GRPO", "full"), "pass1"] == pytest.approx(6 / N_PROBLEMS)


def test_tokens_in_the_loss_are_counted_per_completion(studies):
    frame = loss_tokens(studies, "outcome").frame.set_index("method")
    assert frame.loc["GRPO", "loss_tokens"] == 20.0, "GRPO puts every completion token into the loss"
    assert frame.loc["T-SPMO", "loss_tokens"] == 2.0 and frame.loc["T-SPMO", "share"] == pytest.approx(0.1)


def test_a_replaying_methods_tokens_count_its_replayed_completions_too(tmp_path):
    cells = method_study(tmp_path / "replay", {4: [5, 5]}, tokens_in_loss=2.0)
    history = cells.history  # steps 1-2 replay 16 completions of 6 loss tokens (length 10) beside their 16
    replayed = history["step"] <= 2
    cells = dataclasses.replace(cells, history=history.assign(replayed=replayed.astype(int), completions=16.0,
        replay_completions=replayed * 16.0, replay_loss_tokens=6.0, replay_len_mean=10.0))
    row = loss_tokens({"T-SPMO + replay": cells}, "outcome").frame.iloc[0]
    # Per step: 4.0 tokens of 15 where it replayed (2 of 4 steps), 2.0 of 20 elsewhere.
    assert row["loss_tokens"] == pytest.approx(3.0) and row["len_mean"] == pytest.approx(17.5)
    assert row["share"] == pytest.approx((4 / 15 + 2 / 20) / 2)


def test_the_comparison_is_written_with_its_figures(studies, tmp_path):
    path = write_method_comparison(studies, tmp_path / "out", "outcome", margin=0.05)
    text = path.read_text()
    assert "GRPO vs T-SPMO" in text and "minus GRPO" in text and "Tokens in the loss" in text
    assert "recorded no world" in text, "the comparison says whether its studies read one world"
    for figure in ("method_accuracy.png", "method_curves.png"):
        assert (tmp_path / "out" / "figures" / figure).stat().st_size > 0


def test_the_worlds_compared_are_those_of_the_compared_regimes_cells(tmp_path):
    # The baseline study also ran process, whose cells read a PRM; its outcome cells, the ones compared, did not.
    write_cell(tmp_path / "grpo", "process", 4, 0, 5)
    folders = {"GRPO": tmp_path / "grpo", "T-SPMO": tmp_path / "tspmo"}
    method_study(folders["GRPO"], {4: [5, 5]})
    method_study(folders["T-SPMO"], {4: [8, 8]})
    for path in [path for folder in folders.values() for path in folder.rglob(PARAMS)]:
        params = json.loads(path.read_text())
        params[WORLD] = {"student": "s0", **({"prm": "p0"} if params["regime"] == "process" else {})}
        path.write_text(json.dumps(params))
    studies = {name: load_cells(folder) for name, folder in folders.items()}
    text = write_method_comparison(studies, tmp_path / "out", "outcome", margin=0.05).read_text()
    assert "read one world: student s0 (a hash" in text, f"the process cell's PRM entered the comparison: {text[:400]}"


def test_the_notebook_compares_the_studies_that_ran_and_names_the_rest(tmp_path):
    method_study(tmp_path / "outputs" / "grpo", {4: [5, 5], None: [6, 6]})
    method_study(tmp_path / "outputs" / "tspmo", {4: [8, 8], None: [6, 6]}, tokens_in_loss=2.0)
    out = tmp_path / "outputs" / "tspmo"
    execute_notebook(REPO_ROOT / "notebooks" / "method_comparison.py", tmp_path / "run.ipynb",
                     {"outputs_dir": str(out), "methods": {"GRPO": "grpo", "S-GRPO": "sgrpo", "T-SPMO": "tspmo"},
                      "memory_ranks": []})
    printed = "".join(o.get("text", "") for c in nbformat.read(tmp_path / "run.ipynb", 4).cells
                      for o in c.get("outputs", []))
    assert "S-GRPO: left out" in printed and "compared: GRPO, T-SPMO" in printed
    report = (out / "method_comparison.md").read_text()
    assert "GRPO vs T-SPMO" in report
    assert "Left out, no finished cells: S-GRPO (params/sgrpo.yaml)" in report, "the report hides a missing method"


def test_the_peak_counts_what_a_step_holds_at_once_not_what_it_allocates_in_all():
    def work():
        held = [torch.ones(MIB // 4) for _ in range(3)]  # 3 MiB alive together
        for _ in range(5):
            torch.ones(2 * MIB // 4)  # 2 MiB each, freed at once: 10 MiB allocated in all
        return len(held)

    result, peak = peak_allocated(work)
    assert result == 3
    assert 5 * MIB <= peak < 5.5 * MIB, f"peak {peak / MIB:.2f} MiB; expected the 3 held + one 2 MiB temporary"


def smoke_cell(smoke_project, rank, **settings):
    profile = load_profile(find_profile("smoke", smoke_project))
    return cell_config(profile, "outcome", rank, 0, root=smoke_project, **({"micro_batch_size": None} | settings))


def test_one_completion_at_a_time_holds_less_than_the_batched_step_and_token_selection_holds_as_much(smoke_project):
    batched = step_peak_memory(smoke_cell(smoke_project, 1))
    one_at_a_time = step_peak_memory(smoke_cell(smoke_project, 1, micro_batch_size=1))
    selected = step_peak_memory(smoke_cell(smoke_project, 1, token_alpha=1, token_k=2, token_p=0.5))
    assert selected["len_mean"] == batched["len_mean"], "the same seed samples the same completions"
    assert selected["loss_tokens"] < batched["loss_tokens"]
    assert one_at_a_time["peak_mib"] < 0.75 * batched["peak_mib"], (one_at_a_time, batched)
    assert selected["peak_mib"] == pytest.approx(batched["peak_mib"], rel=0.05), \
        "the exact gradient of a token subset still runs the backward through every token"


def test_every_method_and_the_per_completion_baseline_is_measured_per_arm(smoke_project):
    rows = method_memory({"GRPO": "smoke"}, "outcome", [1, "full"], root=smoke_project)
    assert [(r["method"], r["arm"]) for r in rows] == [
        ("GRPO", "r1"), ("GRPO", "full"), ("GRPO, one completion at a time", "r1"),
        ("GRPO, one completion at a time", "full")]
    assert all(r["peak_mib"] > 0 and r["completions"] == 4 for r in rows)


def test_a_fullft_arm_without_kl_penalty_still_tracks_its_kl(smoke_project):
    """T-SPMO's beta = 0 with the KL recorded: the peft FullFT arm keeps a reference copy to score it."""
    row = step_peak_memory(smoke_cell(smoke_project, None, beta=0.0, track_kl=True))
    assert row["peak_mib"] > 0


def test_the_measured_step_starts_with_no_gradients_held_so_its_own_count_on_either_device(smoke_project,
                                                                                          monkeypatch):
    """CUDA's peak statistic subtracts what was allocated before the step: gradients kept from the warm-up would
    leave a FullFT step's gradients out there, while the CPU profiler counts them."""
    from reward_density.experiment import cell, step_memory

    policies, held = [], []
    make_policy, measure = cell.make_policy, step_memory.peak_allocated

    def measured(fn, device):
        held.append(any(p.grad is not None for p in policies[0].parameters(0)))
        return measure(fn, device)

    monkeypatch.setattr(cell, "make_policy", lambda *a: policies.append(make_policy(*a)) or policies[-1])
    monkeypatch.setattr(step_memory, "peak_allocated", measured)
    row = step_peak_memory(smoke_cell(smoke_project, None))
    assert held == [False], "the warm-up's gradients were still held when the measured step began"
    gradients = sum(p.numel() * p.element_size() for p in policies[0].parameters(0))
    assert row["peak_mib"] * MIB > gradients, "a FullFT step's peak leaves out the gradients it allocates"


def test_the_notebook_measures_the_memory_of_the_methods_that_ran(tmp_path):
    study = make_smoke_project(tmp_path) / "outputs" / "smoke"  # its own root: fake cells stay out of the shared one
    method_study(study, {1: [5, 5], None: [6, 6]})
    execute_notebook(REPO_ROOT / "notebooks" / "method_comparison.py", tmp_path / "run.ipynb",
                     {"outputs_dir": str(study), "methods": {"GRPO": "smoke"}, "memory_ranks": [1]})
    memory = pd.read_csv(study / "method_memory.csv")
    assert memory["method"].tolist() == ["GRPO", "GRPO, one completion at a time"]
    assert "Peak memory of one step" in (study / "method_comparison.md").read_text()


def test_a_method_with_a_seed_more_keeps_its_own_seed_count_and_names_what_was_paired(tmp_path):
    grpo = method_study(tmp_path / "grpo", {4: [5, 5]})
    other = method_study(tmp_path / "other", {4: [6, 6, 1]})
    table = method_accuracy({"grpo": grpo, "other": other}, "outcome", margin=0.05)
    row = table.frame.set_index("method").loc["other"]
    assert row["n_seeds"] == 3 and row["n_seeds_paired"] == 2, row
    assert "| 90% CI (TOST) |" in table.markdown.splitlines()[0] and "| 2 × " in table.markdown, table.markdown



def test_no_method_with_finished_cells_is_a_clear_error_not_a_bare_stop_iteration():
    with pytest.raises(FileNotFoundError, match="no method's study has finished cells to compare"):
        method_accuracy({}, "outcome", margin=0.05)

"""The learning-rate sweep's choice: each arm's best final pass@1, among plateaued rates where the study needs one,
or its best pass@1 after step 0 for a study that stops each arm at its best dev step."""
import json

import pandas as pd
import pytest

from reward_density.analysis.load import load_cells
from reward_density.analysis.sweep import (
    SCORES,
    SHARE_NOTE,
    chosen_rates,
    read_sweep_table,
    sweep_table,
    write_sweep_report,
)
from reward_density.experiment.profiles import RATE_CRITERIA, REPO_ROOT
from reward_density.run.notebooks import execute_notebook

# pass@1 at steps 0, 3 (75% of the steps) and 4 (the end) of each arm and rate, the same for every seed.
PLATEAUED = {0: 0.3, 3: 0.58, 4: 0.60}  # 7% of its gain in the last quarter
CLIMBING = {0: 0.3, 3: 0.45, 4: 0.70}  # best final, but 62% of its gain came last
FLAT = {0: 0.3, 3: 0.3, 4: 0.3}
PEAKED = {0: 0.3, 3: 0.75, 4: 0.35}  # the best of all at step 3, then overfits
CURVES = {
    None: {1e-5: FLAT, 3e-5: CLIMBING, 1e-4: PLATEAUED},
    1: {1e-4: PLATEAUED, 1e-3: CLIMBING},
    2: {1e-4: PLATEAUED, 1e-3: CLIMBING},
}


def write_cell(outputs, regime, rank, seed, rate, curve):
    name = f"{regime}-r{rank or 'full'}-lr{rate:g}-s{seed}"
    folder = outputs / "cells" / name
    folder.mkdir(parents=True)
    pd.DataFrame([{"step": s, "loss": 0.1} for s in range(1, 5)]).to_csv(folder / "history.csv", index=False)
    pd.DataFrame([{"step": s, "pass1": p} for s, p in curve.items()]).to_csv(folder / "evals.csv", index=False)
    pd.DataFrame([{"step": s, "problem_id": "000", "correct": True} for s in curve]).to_csv(folder / "answers.csv",
                                                                                           index=False)
    (folder / "summary.json").write_text(json.dumps({
        "cell": name, "regime": regime, "rank": rank, "seed": seed, "learning_rate": rate, "steps": 4,
        "final_pass1": curve[4], "peak_pass1": max(curve.values())}))


def sweep(tmp_path, regimes=("outcome", "process"), curves=CURVES):
    for regime in regimes:
        for rank, by_rate in curves.items():
            for rate, curve in by_rate.items():
                for seed in (100, 101):
                    write_cell(tmp_path, regime, rank, seed, rate, curve)
    return load_cells(tmp_path)


def test_outcome_takes_the_best_plateaued_rate_of_each_arm(tmp_path):
    chosen = chosen_rates(sweep(tmp_path)).frame.set_index("regime")
    assert chosen.loc["outcome", "full"] == 1e-4, "FullFT's best final (3e-5) was still climbing"
    assert chosen.loc["outcome", "lora"] == 1e-4, "LoRA's best final (1e-3) was still climbing"
    assert chosen.loc["outcome", "ratio"] == 1.0


def test_process_takes_the_best_final_whatever_its_curve(tmp_path):
    chosen = chosen_rates(sweep(tmp_path)).frame.set_index("regime")
    assert (chosen.loc["process", "full"], chosen.loc["process", "lora"]) == (3e-5, 1e-3)


def test_without_a_plateaued_rate_the_best_final_is_taken_and_flagged(tmp_path):
    curves = {None: {3e-5: CLIMBING, 1e-5: FLAT}, 1: {1e-3: CLIMBING}}
    table = chosen_rates(sweep(tmp_path, ("distillation",), curves))
    row = table.frame.iloc[0]
    assert (row["full"], row["full_plateau"], row["lora"], row["lora_plateau"]) == (3e-5, False, 1e-3, False)
    assert "no rate plateaued" in table.markdown


def test_the_sweep_report_lists_every_arm_rate_and_its_late_share(tmp_path):
    path = write_sweep_report(sweep(tmp_path), tmp_path / "out", "test")
    text = path.read_text()
    assert "share of gain in last 25%" in text and "62%" in text and "7%" in text
    assert "Trained by (each cell's manifest.json): code no commit recorded (28 cells)" in text, "who trained them"
    assert "World read (each cell's params.json: a hash of each entry's files): not recorded (28 cells)." in text
    assert (tmp_path / "out" / "chosen_rates.csv").is_file()


def test_the_sweep_table_reads_in_the_designs_order_ranks_ascending_then_fullft_rates_ascending(tmp_path):
    curves = {16: {3e-4: PLATEAUED, 1e-4: PLATEAUED}, None: {3e-5: PLATEAUED, 1e-5: PLATEAUED}, 2: {1e-4: FLAT}}
    frame = sweep_table(sweep(tmp_path, ("distillation", "outcome"), curves)).frame
    assert list(frame["regime"]) == ["outcome"] * 5 + ["distillation"] * 5, "regimes out of the design's order"
    assert list(frame["arm"][:5]) == ["r2", "r16", "r16", "full", "full"], "ranks sorted as text, or FullFT not last"
    assert list(frame["learning_rate"][:5]) == [1e-4, 1e-4, 3e-4, 1e-5, 3e-5], "rates not ascending within an arm"


def test_the_dash_note_names_both_reasons_a_share_is_missing(tmp_path):
    once = {0: 0.3, 4: 0.6}  # gained, but evaluated only at its first and last step
    cells = sweep(tmp_path, ("outcome",), {None: {1e-5: once}, 1: {1e-4: FLAT}})
    text = write_sweep_report(cells, tmp_path / "out", "test").read_text()
    assert "| outcome | full | 1e-05 | 0.600 | 0.600 | 4 | – | 2 |" in text and "| outcome | r1 | 0.0001 |" in text
    assert "ended no higher than it began, or that was evaluated at no step between its first and last" in text


def test_each_ranks_own_best_rate_is_written_in_rank_order(tmp_path):
    curves = {None: {1e-5: PLATEAUED}, 16: {1e-4: PLATEAUED}, 2: {1e-4: PLATEAUED}, 1: {1e-4: PLATEAUED}}
    frame = chosen_rates(sweep(tmp_path, ("outcome",), curves)).frame
    assert [c for c in frame.columns if c.startswith("best_")] == ["best_r1", "best_r2", "best_r16"], (
        "ranks sorted as text")


def test_a_sweep_csv_read_back_renders_the_table_the_report_wrote_in_the_designs_order(tmp_path):
    curves = {16: {3e-4: PLATEAUED, 5e-5: FLAT}, None: {3e-5: PLATEAUED, 1e-5: FLAT}, 2: {1e-4: CLIMBING}}
    cells = sweep(tmp_path, ("distillation", "outcome"), curves)
    write_sweep_report(cells, tmp_path / "out", "test")
    written = tmp_path / "out" / "sweep.csv"
    pd.read_csv(written).iloc[::-1].to_csv(written, index=False)  # rows in any order, rates among them as text
    assert read_sweep_table(written).markdown == sweep_table(cells).markdown


@pytest.mark.parametrize("study", ["mini_sweep", "mini_sweep_stopping"])
def test_a_committed_sweep_report_shows_its_sweep_csv_as_the_code_renders_it(study):
    folder = REPO_ROOT / "outputs" / study
    table = read_sweep_table(folder / "sweep.csv")
    pd.testing.assert_frame_equal(pd.read_csv(folder / "sweep.csv"), table.frame, obj=f"{study}/sweep.csv's order")
    section = f"## Every arm at every rate\n\n{SHARE_NOTE}\n\n{table.markdown}"
    assert (folder / "sweep.md").read_text().endswith(section), (
        f"outputs/{study}/sweep.md's table is stale: rerun `./run_all.sh --profile {study} --stages analysis`")
    best = [c for c in pd.read_csv(folder / "chosen_rates.csv").columns if c.startswith("best_")]
    assert best == sorted(best, key=lambda column: int(column.removeprefix("best_r"))), "ranks sorted as text"


def test_a_curve_with_no_gain_shows_a_dash_for_its_share_not_nan(tmp_path):
    text = sweep_table(sweep(tmp_path, ("outcome",), {None: {1e-5: FLAT}, 1: {1e-4: PLATEAUED}})).markdown
    assert "| outcome | full | 1e-05 | 0.300 | 0.300 | 3 | – | 2 |" in text, text
    assert "nan" not in text


def test_choosing_by_the_best_step_takes_each_arms_best_peak_whatever_its_end(tmp_path):
    lora = {1e-4: PLATEAUED, 1e-3: PEAKED}
    curves = {None: {1e-5: PLATEAUED, 3e-5: PEAKED}, 1: lora, 2: lora}
    cells = sweep(tmp_path, ("outcome",), curves)
    by_final = chosen_rates(cells).frame.iloc[0]
    by_step = chosen_rates(cells, "best_step").frame.iloc[0]
    assert (by_final["full"], by_final["lora"]) == (1e-5, 1e-4), "by final pass@1 the plateaued rates win"
    assert (by_step["full"], by_step["lora"]) == (3e-5, 1e-3), "at each cell's best step the peaked rates win"
    assert by_step["lora_score"] == pytest.approx((0.75 + 0.75) / 2), "LoRA's score is the mean over its ranks"


def test_the_best_step_never_counts_step_zero(tmp_path):
    falling = {0: 0.9, 3: 0.4, 4: 0.2}  # the untrained model is its best
    curves = {None: {1e-5: falling, 3e-5: PLATEAUED}, 1: {1e-4: falling, 1e-3: PLATEAUED}}
    row = chosen_rates(sweep(tmp_path, ("process",), curves), "best_step").frame.iloc[0]
    assert (row["full"], row["lora"]) == (3e-5, 1e-3), "a rate was scored by its step-0 pass@1"


def test_an_unknown_criterion_is_an_error_that_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="unknown choose_rate_by 'peak'.*final, best_step"):
        chosen_rates(sweep(tmp_path), "peak")


def test_every_criterion_a_profile_accepts_has_a_score():
    assert set(SCORES) == set(RATE_CRITERIA)


def test_the_sweep_report_says_which_score_chose_the_rates(tmp_path):
    cells = sweep(tmp_path)
    by_final = write_sweep_report(cells, tmp_path / "final", "test").read_text()
    by_step = write_sweep_report(cells, tmp_path / "step", "test", "best_step").read_text()
    assert "FullFT rate (final pass@1)" in by_final and "plateaued" in by_final
    assert "FullFT rate (best pass@1 after step 0)" in by_step and "own best dev step" in by_step


def test_a_choice_made_on_part_of_the_grid_says_which_planned_cells_it_lacks(tmp_path):
    cells = sweep(tmp_path, regimes=("outcome",))
    planned = sorted(cells.summaries["cell"]) + ["outcome-r1-lr0.003-s100"]
    text = write_sweep_report(cells, tmp_path / "a", "tiny_sweep", planned=planned).read_text()
    assert "**Partial:** 1 of the 15 cells the profile plans have not finished (outcome-r1-lr0.003-s100)" in text, text
    whole = write_sweep_report(cells, tmp_path / "b", "tiny_sweep", planned=planned[:-1]).read_text()
    assert "Every one of the 14 cells the profile plans has finished." in whole


def test_the_sweep_notebook_chooses_and_reports_what_its_profile_planned(tmp_path):
    cells = sweep(tmp_path, regimes=("outcome",))
    planned = sorted(cells.summaries["cell"]) + ["outcome-r1-lr0.003-s100"]
    execute_notebook(REPO_ROOT / "notebooks" / "sweep_analysis.py", tmp_path / "sweep.ipynb",
                     {"profile": "tiny_sweep", "outputs_dir": str(tmp_path), "planned_cells": planned})
    report = (tmp_path / "sweep.md").read_text()
    assert report.startswith("# Learning-rate sweep (tiny_sweep)") and "**Partial:** 1 of the 15 cells" in report
    assert list(pd.read_csv(tmp_path / "chosen_rates.csv")["regime"]) == ["outcome"]


@pytest.mark.parametrize("split, said", [
    ("dev", "Evaluated on the world's dev problems, never on the study's held-out set."),
    ("heldout", "Evaluated on the heldout problems: a rate chosen on the held-out set is tuned to the study."),
    (None, "Some cells do not record the split they were scored on"),
])
def test_the_sweep_report_says_which_split_its_cells_were_scored_on(tmp_path, split, said):
    sweep(tmp_path / "study")
    if split is not None:
        for folder in (tmp_path / "study" / "cells").iterdir():
            (folder / "params.json").write_text(json.dumps({"eval_split": split}))
    text = write_sweep_report(load_cells(tmp_path / "study"), tmp_path / "out", "test").read_text()
    assert said in text, text[:400]


def test_a_sweep_of_the_sft_control_says_its_dev_split_holds_the_facts_its_verdicts_score(tmp_path):
    sweep(tmp_path / "study", regimes=("outcome", "sft"))
    for folder in (tmp_path / "study" / "cells").iterdir():
        (folder / "params.json").write_text(json.dumps({"eval_split": "dev"}))
    text = write_sweep_report(load_cells(tmp_path / "study"), tmp_path / "out", "test").read_text()
    assert "except the SFT control's: its dev split holds its held-out facts" in text, text[:600]

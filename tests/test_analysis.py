"""Analysis over synthetic cell folders: loading, tables, figures and the report."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from scipy import stats

from reward_density.analysis.dynamics import collapse_table, is_plateau, last_quarter_share, mean_curve, plateau_table
from reward_density.analysis.load import DamagedCell, arms, load_cells, regimes
from reward_density.analysis.plots import (
    FIGURES,
    VERDICT_COLORS,
    plot_equivalence,
    plot_pass1_vs_rank,
    plot_peak_advantage_std,
    plot_process_collapse,
)
from reward_density.analysis.report import completion_tokens, matrix_counts, seeds_phrase, write_report
from reward_density.analysis.stopping import answers_at_chosen_steps, chosen_steps, chosen_table
from reward_density.analysis.tables import (
    WORLDS,
    accuracy_table,
    compared_worlds_sentence,
    equivalence_table,
    frame_worlds,
    gain_table,
    rounded,
)

N_PROBLEMS = 10
BASE = 3  # problems the base model solves


def write_cell(outputs, regime, rank, seed, final, peak=None, adv_std=1.0, finished=True):
    """One cell folder: evals at steps 0, 2, 4 solving BASE, peak and final of N_PROBLEMS problems."""
    name = f"{regime}-r{rank if rank else 'full'}-s{seed}"
    folder = outputs / "cells" / name
    folder.mkdir(parents=True)
    solved = {0: BASE, 2: final if peak is None else peak, 4: final}
    (folder / "params.json").write_text(json.dumps(
        {"regime": regime, "rank": rank or "full", "seed": seed, "steps": 4, "student": {"hidden_size": 128}}
    ))
    extra = {"process/steps_mean": 3.0} if regime == "process" else {"outcome/correct": 0.5}
    pd.DataFrame(
        [{"step": s, "loss": 0.1, "reward_mean": 0.5, "advantage_std": adv_std, "frac_truncated": s / 10, **extra}
         for s in range(1, 5)]
    ).to_csv(folder / "history.csv", index=False)
    pd.DataFrame(
        [{"step": s, "pass1": k / N_PROBLEMS, "len_mean": 20.0, "frac_truncated": 0.0, "frac_answered": 1.0,
          "scored": N_PROBLEMS} for s, k in solved.items()]
    ).to_csv(folder / "evals.csv", index=False)
    pd.DataFrame([
        {"step": s, "problem_id": f"{i:03d}", "correct": i < k, "verdict": "correct" if i < k else "wrong",
         "length": 20, "answered": True, "truncated": False}
        for s, k in solved.items() for i in range(N_PROBLEMS)
    ]).to_csv(folder / "answers.csv", index=False)
    if finished:
        (folder / "summary.json").write_text(json.dumps({
            "cell": name, "regime": regime, "rank": rank, "seed": seed, "learning_rate": 1e-4, "steps": 4,
            "base_pass1": BASE / N_PROBLEMS, "final_pass1": final / N_PROBLEMS,
            "peak_pass1": max(solved.values()) / N_PROBLEMS, "peak_step": 2, "peak_advantage_std": adv_std,
            "wall_seconds": 1.0,
        }))
    return folder


# Problems solved at the end: {regime: {arm rank (None = FullFT): [seed 0, seed 1]}}.
FINAL = {
    "outcome": {1: [4, 6], 2: [5, 5], None: [6, 8]},
    "process": {1: [2, 4], 2: [3, 3], None: [1, 3]},
}
PROCESS_PEAK = 7


@pytest.fixture
def outputs(tmp_path):
    """2 regimes x ranks {1, 2} + FullFT x 2 seeds, and one unfinished folder."""
    for regime, by_rank in FINAL.items():
        for rank, finals in by_rank.items():
            for seed, final in enumerate(finals):
                peak = PROCESS_PEAK - seed if regime == "process" else None
                write_cell(tmp_path, regime, rank, seed, final, peak=peak, adv_std=9.0 if regime == "process" else 0.6)
    write_cell(tmp_path, "outcome", 4, 0, 9, finished=False)
    return tmp_path


def value(table, row, arm, column="mean"):
    frame = table.frame
    return frame.loc[(frame["row"] == row) & (frame["arm"] == arm), column].item()


def test_load_ignores_unfinished_cells(outputs):
    cells = load_cells(outputs)
    assert len(cells.summaries) == 12 and cells.unfinished == ("outcome-r4-s0",)
    assert set(cells.answers["cell"]) == set(cells.summaries["cell"])
    assert str(cells.summaries["rank"].dtype) == "Int64" and cells.summaries["rank"].isna().sum() == 4
    assert arms(cells) == ["r1", "r2", "full"] and regimes(cells) == ["outcome", "process"]
    assert set(cells.answers["correct"]) == {0, 1} and cells.answers["problem_id"].iloc[0] == "000"
    assert {"process/steps_mean", "outcome/correct"} <= set(cells.history.columns)


def _truncate(path, lines):
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:lines]))


def _blank_last_verdict(path):
    """The last answers row with its verdict left blank, as a line cut off mid-write reads."""
    frame = pd.read_csv(path, dtype={"problem_id": str}).astype({"correct": object})
    frame.loc[frame.index[-1], "correct"] = None
    frame.to_csv(path, index=False)


@pytest.mark.parametrize("damage, expected", [
    (lambda f: (f / "summary.json").write_text('{"regime": "outc'), r"summary\.json is not valid JSON"),
    (lambda f: (f / "summary.json").write_text("{}"), r"summary\.json lacks \['regime', 'seed'\]"),
    (lambda f: _truncate(f / "answers.csv", 25), r"answers\.csv holds \{0: 10, 2: 10, 4: 4\} answers per step"),
    (lambda f: (f / "answers.csv").write_text(""), r"answers\.csv does not parse as CSV"),
    (lambda f: _blank_last_verdict(f / "answers.csv"), r"answers\.csv has a verdict nan that is neither"),
    (lambda f: _truncate(f / "history.csv", 3), r"history\.csv has 2 rows, summary\.json says 4 steps"),
    (lambda f: (f / "evals.csv").unlink(), r"No such file.*evals\.csv"),
], ids=["summary-cut", "summary-empty", "answers-cut", "answers-empty", "verdict-blank", "history-cut",
        "evals-missing"])
def test_a_damaged_finished_cell_is_named_not_read(tmp_path, damage, expected):
    write_cell(tmp_path, "outcome", None, 0, 6)
    damage(write_cell(tmp_path, "outcome", 1, 0, 5))
    with pytest.raises(DamagedCell, match=expected) as error:
        load_cells(tmp_path)
    assert "outcome-r1-s0" in str(error.value) and "run the cells stage again" in str(error.value), \
        "the message should name the damaged cell and how to recompute it"


def test_the_studys_completion_length_is_its_rl_steps_mean_and_none_where_no_step_recorded_one(tmp_path):
    for seed, length in ((0, 10.0), (1, 20.0)):
        history = write_cell(tmp_path, "outcome", 1, seed, 5) / "history.csv"
        pd.read_csv(history).assign(len_mean=length).to_csv(history, index=False)
    write_cell(tmp_path, "sft", 1, 0, 5)  # a control cell: no completions sampled, no len_mean
    assert completion_tokens(load_cells(tmp_path)) == 15.0, "the mean over the RL cells' steps"
    write_cell(tmp_path / "control_only", "sft", 1, 0, 5)
    assert completion_tokens(load_cells(tmp_path / "control_only")) is None


def test_no_finished_cell_is_a_clear_error(tmp_path):
    write_cell(tmp_path, "outcome", 1, 0, 5, finished=False)
    with pytest.raises(FileNotFoundError, match="no finished cell"):
        load_cells(tmp_path)


def test_a_printed_value_that_rounds_to_zero_has_no_sign_and_integers_stay_integers():
    frame = pd.DataFrame({"step": [1, 2], "loss": [1e-7, -1e-7], "reward": [0.32924, -0.5]})
    printed = rounded(frame).to_string(index=False)
    assert "-0.0" not in printed, f"a loss of -1e-7 printed as -0.0, whose sign differs between CPUs:\n{printed}"
    assert rounded(frame)["step"].dtype == frame["step"].dtype and rounded(frame)["reward"].tolist() == [0.3292, -0.5]


def test_accuracy_table_means_and_sds(outputs):
    table = accuracy_table(load_cells(outputs))
    assert list(dict.fromkeys(table.frame["row"])) == ["outcome", "process (peak)", "process (end)"]
    assert value(table, "outcome", "r1") == pytest.approx(0.5)
    assert value(table, "outcome", "r1", "sd") == pytest.approx(np.std([0.4, 0.6], ddof=1))
    assert value(table, "outcome", "full") == pytest.approx(0.7)
    assert value(table, "outcome", "base") == pytest.approx(0.3) and value(table, "outcome", "base", "sd") == 0
    assert value(table, "process (end)", "r2") == pytest.approx(0.3)
    assert value(table, "outcome", "r2", "n") == 2
    assert "| outcome | 0.300 ± 0.000 | 0.500 ± 0.141 | 0.500 ± 0.000 | 0.700 ± 0.141 | 2 |" in table.markdown


def test_process_peak_row_is_the_max_over_evals(outputs):
    table = accuracy_table(load_cells(outputs))
    # Peaks are 7 and 6 of 10 at step 2, above both the base (3) and the finals.
    for arm in ("r1", "r2", "full"):
        assert value(table, "process (peak)", arm) == pytest.approx(0.65)
        assert value(table, "process (peak)", arm, "sd") == pytest.approx(np.std([0.7, 0.6], ddof=1))


def test_equivalence_table_pairs_final_answers(outputs):
    table = equivalence_table(load_cells(outputs), margin=0.05)
    frame = table.frame
    assert list(zip(frame["regime"], frame["arm"])) == [("outcome", "r1"), ("outcome", "r2"),
                                                        ("process", "r1"), ("process", "r2")]
    assert frame["n_pairs"].tolist() == [20] * 4
    outcome_r1 = frame.iloc[0]
    assert outcome_r1["estimate"] == pytest.approx(np.mean([4 - 6, 6 - 8]) / N_PROBLEMS)
    assert outcome_r1["ci_low"] <= outcome_r1["estimate"] <= outcome_r1["ci_high"]
    assert set(frame["verdict"]) <= {"equivalent", "different", "inconclusive"}
    assert frame.iloc[2]["estimate"] == pytest.approx(0.1)


def test_the_minimum_detectable_difference_is_at_the_level_of_the_test_behind_different(outputs):
    for confidence in (0.9, 0.95):
        frame = equivalence_table(load_cells(outputs), margin=0.05, confidence=confidence).frame
        alpha = 1 - confidence  # "different": the two-sided confidence interval excludes 0
        expected = (stats.t.ppf(1 - alpha / 2, frame["df"]) + stats.t.ppf(0.8, frame["df"])) * frame["se"]
        assert frame["mdd"].to_numpy() == pytest.approx(expected.to_numpy()), f"MDD not at level {alpha:.2f}"


def test_gain_table_pairs_each_cell_with_its_own_base(outputs):
    table = gain_table(load_cells(outputs))
    frame = table.frame.set_index(["regime", "arm"])
    full = frame.loc[("outcome", "full")]
    assert full["base"] == pytest.approx(BASE / N_PROBLEMS) and full["final"] == pytest.approx(0.7)
    assert full["gain"] == pytest.approx(np.mean([6 - BASE, 8 - BASE]) / N_PROBLEMS)
    # Two seeds that disagree (gains 3 and 5 of 10) leave the seed variance one degree of freedom: wide.
    assert full["ci_low"] < 0 < full["gain"] < full["ci_high"]
    assert frame.loc[("outcome", "r2"), "gain"] == pytest.approx(0.2)
    assert frame.loc[("process", "full"), "gain"] == pytest.approx(np.mean([1 - BASE, 3 - BASE]) / N_PROBLEMS)
    assert "| outcome | +0.200 [" in table.markdown, table.markdown


def test_report_and_every_figure_are_written_deterministically(outputs, tmp_path):
    cells = load_cells(outputs)
    out = tmp_path / "analysis"
    report = write_report(cells, out, margin=0.05, confidence=0.95, profile_name="smoke")
    names = ["accuracy.csv", "accuracy.md", "equivalence.csv", "rank_needed.csv", "capacity.csv", "gain.csv",
             "plateau.csv", "collapse.csv", "kl.csv", "worlds.csv", "report.md"]
    names += [f"figures/{f}.png" for f in ("equivalence", "rank_needed", *FIGURES)]
    first = {n: (out / n).read_bytes() for n in names}
    assert report == out / "report.md" and all(first.values())
    text = report.read_text()
    assert "Finished cells: 12 of 16" in text and "±0.05" in text and "d = 128" in text and "r2 = d/64" in text
    assert "figures/process_collapse.png" in text and "Final minus base" in text
    assert "## Power" in text and "min. detectable difference" in text and "## Plateau" in text
    assert "## The rank needed to match FullFT" in text and "| outcome | O(1) |" in text
    assert "figures/rank_needed.png" in text and "## The bits argument, tallied" in text
    assert "dev-chosen" not in text and not (out / "equivalence_chosen.csv").exists(), "no cell scored dev problems"
    assert not (out / "figures" / "rank_needed_chosen.png").exists()
    write_report(cells, out, margin=0.05, confidence=0.95, profile_name="smoke")
    assert {n: (out / n).read_bytes() for n in names} == first


def test_equivalence_figure_draws_each_verdict_in_its_colour_and_leaves_skipped_arms_out(tmp_path):
    row = {"estimate": 0.0, "ci_low": -0.02, "ci_high": 0.02, "tost_low": -0.01, "tost_high": 0.01}
    frame = pd.DataFrame([
        {"regime": "outcome", "arm": "r1", "verdict": "equivalent", **row},
        {"regime": "outcome", "arm": "r2", "verdict": "different", **row, "estimate": -0.3, "ci_low": -0.4},
        {"regime": "outcome", "arm": "r4", "verdict": "skipped"},
        {"regime": "process", "arm": "r1", "verdict": "inconclusive", **row},
        {"regime": "sft", "arm": "r1", "verdict": "skipped"},
    ])
    fig = plot_equivalence(frame, 0.05, tmp_path / "equivalence.png")
    assert (tmp_path / "equivalence.png").is_file()
    outcome, process = fig.axes  # sft has no tested arm: no panel
    assert [t.get_text() for t in outcome.get_yticklabels()] == ["r1 (equivalent)", "r2 (different)"]
    drawn = {to_hex(line.get_color()) for line in outcome.lines + process.lines if line.get_linewidth() == 4}
    assert drawn == {to_hex(VERDICT_COLORS[v]) for v in ("equivalent", "different", "inconclusive")}
    assert outcome.get_xlim()[0] <= -0.4 * 1.1 + 1e-9 and process.get_xlim() == pytest.approx((-0.075, 0.075))


def test_equivalence_figure_of_two_studies_draws_each_arm_once_per_study_with_the_studys_marker(tmp_path):
    row = {"regime": "outcome", "estimate": 0.0, "ci_low": -0.02, "ci_high": 0.02, "tost_low": -0.01, "tost_high": 0.01}
    first = pd.DataFrame([{**row, "arm": "r1", "verdict": "equivalent"}, {**row, "arm": "r2", "verdict": "different"}])
    second = pd.DataFrame([{**row, "arm": "r1", "verdict": "inconclusive", "ci_high": 0.3},
                           {**row, "arm": "r2", "verdict": "different"}])
    fig = plot_equivalence({"mini": first, "again": second}, 0.05, tmp_path / "both.png")
    (outcome,) = fig.axes
    assert [t.get_text() for t in outcome.get_yticklabels()] == ["r1", "r2"]
    estimates = [line for line in outcome.lines if line.get_marker() in ("o", "s") and len(line.get_ydata())]
    assert [(line.get_marker(), float(line.get_ydata()[0])) for line in estimates] == [
        ("o", -0.125), ("o", 0.875), ("s", 0.125), ("s", 1.125)], "each study's arms, one above the other"
    assert {text.get_text() for text in outcome.get_legend().get_texts()} == {"±0.05 margin", "mini", "again"}
    renderer = FigureCanvasAgg(fig).get_renderer()  # the saved figure is closed: draw it on a canvas of its own
    legend, panel = outcome.get_legend().get_window_extent(renderer), outcome.get_window_extent(renderer)
    assert legend.y1 <= panel.y0, "the studies' legend covers the panel's intervals"
    assert outcome.get_xlim()[1] >= 0.3, "the wider study's intervals stay in view"


def test_one_seed_without_fullft_still_reports(tmp_path):
    for rank in (1, 4):
        write_cell(tmp_path, "distillation", rank, 0, 5 + rank // 4)
    cells = load_cells(tmp_path)
    table = accuracy_table(cells)
    assert "0.500 (n=1)" in table.markdown and "full" not in table.frame["arm"].tolist()
    equivalence = equivalence_table(cells, margin=0.05)
    assert equivalence.frame["verdict"].tolist() == ["skipped", "skipped"]
    assert equivalence.frame["reason"].str.contains("no finished FullFT").all()
    report = write_report(cells, tmp_path / "analysis", margin=0.05, profile_name="tiny")
    assert "skipped: no finished FullFT" in report.read_text()
    assert all((tmp_path / "analysis" / "figures" / f"{f}.png").is_file() for f in FIGURES)


def test_the_pass1_figure_promises_an_sd_band_only_where_it_draws_one(tmp_path):
    for rank in (1, None):
        write_cell(tmp_path, "outcome", rank, 0, 5)
    figure = plot_pass1_vs_rank(load_cells(tmp_path), tmp_path / "pass1.png")
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert "FullFT" in labels and not any("sd" in label for label in labels if label != "LoRA"), labels


def test_fullft_without_shared_seed_is_skipped_with_reason(tmp_path):
    write_cell(tmp_path, "outcome", 1, 0, 5)
    write_cell(tmp_path, "outcome", None, 1, 5)
    frame = equivalence_table(load_cells(tmp_path), margin=0.05).frame
    assert frame["verdict"].tolist() == ["skipped"] and frame["reason"].item() == "no seed shared with FullFT"


def _keep_final_problems(folder, kept):
    """Rewrite a cell's answers so that its last evaluation scored only the problems kept."""
    answers = pd.read_csv(folder / "answers.csv", dtype={"problem_id": str})
    final = answers["step"] == answers["step"].max()
    answers[~final | answers["problem_id"].isin(kept)].to_csv(folder / "answers.csv", index=False)
    evals = pd.read_csv(folder / "evals.csv")
    evals.loc[evals["step"] == evals["step"].max(), "scored"] = len(kept)
    evals.to_csv(folder / "evals.csv", index=False)


def test_arms_whose_seeds_scored_disjoint_problems_are_skipped_with_reason_not_a_failed_report(tmp_path):
    problems = [f"{i:03d}" for i in range(N_PROBLEMS)]
    for seed in (0, 1):
        write_cell(tmp_path, "outcome", None, seed, 6)
        _keep_final_problems(write_cell(tmp_path, "outcome", 1, seed, 5), problems[:5] if seed else problems[5:])
    cells = load_cells(tmp_path)
    frame = equivalence_table(cells, margin=0.05).frame
    assert frame["verdict"].tolist() == ["skipped"] and "no problem answered in every shared seed" in frame["reason"][0]
    gains = gain_table(cells).frame.set_index("arm")
    assert "no problem answered in every shared seed" in gains.loc["r1", "reason"]


def test_a_rank_whose_cells_failed_in_one_regime_is_a_skipped_row_there_not_a_gap_in_its_grid(tmp_path):
    for seed in (0, 1):
        for rank in (1, 2, None):
            write_cell(tmp_path, "outcome", rank, seed, 6)
        for rank in (2, None):  # process r1 failed
            write_cell(tmp_path, "process", rank, seed, 6)
    frame = equivalence_table(load_cells(tmp_path), margin=0.05).frame.set_index(["regime", "rank"])
    assert frame.loc[("process", 1), "verdict"] == "skipped", \
        "a rank absent from one regime would let its needed rank be pinned across a rank never compared"
    assert frame.loc[("process", 1), "reason"] == "no answers for this LoRA arm"
    assert frame.loc[("process", 2), "verdict"] != "skipped"


def test_a_gain_is_its_tables_final_minus_its_base_when_seeds_scored_different_problems(tmp_path):
    problems = [f"{i:03d}" for i in range(N_PROBLEMS)]
    for seed, final in enumerate([6, 8]):
        _keep_final_problems(write_cell(tmp_path, "outcome", None, seed, final), problems[2:] if seed else problems)
    row = gain_table(load_cells(tmp_path)).frame.iloc[0]
    assert row["n_problems"] == N_PROBLEMS - 2
    assert row["final"] - row["base"] == pytest.approx(row["gain"]), "base and final averaged over other problems"


def test_one_training_run_per_arm_gets_no_interval_and_no_verdict(tmp_path):
    """A seed's problems alone say nothing of the next run's: with one seed there is no interval to claim."""
    write_cell(tmp_path, "outcome", 1, 0, 2)
    write_cell(tmp_path, "outcome", None, 0, 9)
    cells = load_cells(tmp_path)
    frame = equivalence_table(cells, margin=0.05).frame
    assert frame["verdict"].tolist() == ["skipped"], "a one-seed comparison claimed a verdict"
    assert frame["reason"].item() == "one seed shared with FullFT: no interval that holds for new training runs"
    gain = gain_table(cells)
    assert gain.frame["reason"].str.startswith("one seed").all() and gain.frame["ci_low"].isna().all()
    report = write_report(cells, tmp_path / "analysis", margin=0.05, profile_name="tiny").read_text()
    assert "skipped: one seed shared with FullFT" in report and "No LoRA arm was compared with FullFT" in report


@pytest.mark.parametrize("setup", [
    [("process", None, 0, 5)],
    [("outcome", 1, 0, 5), ("outcome", 8, 1, 6), ("process", None, 3, 4)],
    [("distillation", 2, 0, 5), ("distillation", None, 0, 5)],
], ids=["fullft-only", "regime-without-lora", "one-pair"])
def test_partial_matrices_still_report(tmp_path, setup):
    for cell in setup:
        write_cell(tmp_path, *cell)
    report = write_report(load_cells(tmp_path), tmp_path / "analysis", margin=0.05, profile_name="partial")
    assert report.is_file()
    assert all((tmp_path / "analysis" / "figures" / f"{f}.png").is_file() for f in FIGURES)


def test_a_report_of_part_of_the_profiles_matrix_names_the_planned_cells_that_have_not_finished(tmp_path):
    write_cell(tmp_path, "outcome", 1, 0, 5)
    write_cell(tmp_path, "outcome", None, 0, 6)
    cells = load_cells(tmp_path)
    planned = ["outcome-r1-s0", "outcome-rfull-s0", "process-r1-s0", "process-rfull-s0"]
    text = write_report(cells, tmp_path / "a", margin=0.05, profile_name="tiny", planned=planned).read_text()
    assert ("**Partial:** 2 of the 4 cells the profile plans have not finished (process-r1-s0, process-rfull-s0); "
            "every table below covers the finished cells only.") in text, text[:600]
    whole = write_report(cells, tmp_path / "b", margin=0.05, profile_name="tiny", planned=planned[:2]).read_text()
    assert "Every one of the 2 cells the profile plans has finished." in whole and "Partial" not in whole
    unknown = write_report(cells, tmp_path / "c", margin=0.05, profile_name="tiny").read_text()
    assert "plans" not in unknown, "without the profile's plan the report says nothing about it"


def test_the_report_says_which_code_packages_and_device_trained_its_cells_and_counts_each(tmp_path):
    for seed in (0, 1, 2):
        write_cell(tmp_path, "outcome", None, seed, 6)
    versions = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "peft": "0.21.2", "trl": "1.16.0", "numpy": "2"}
    for seed, dirty, device in ((0, False, "AMD EPYC (AVX-512), 2 torch threads"),
                                (1, True, "AMD EPYC (AVX2), 2 torch threads")):
        manifest = {"git": {"commit": "a" * 40, "dirty": dirty}, "versions": versions, "device": device}
        (tmp_path / "cells" / f"outcome-rfull-s{seed}" / "manifest.json").write_text(json.dumps(manifest))
    text = write_report(load_cells(tmp_path), tmp_path / "a", margin=0.05, profile_name="tiny").read_text()
    assert ("Trained by (each cell's manifest.json): code aaaaaaaaaaaa (1 cell), aaaaaaaaaaaa with uncommitted "
            "changes (1 cell), no commit recorded (1 cell); torch 2.13.0+cpu, transformers 5.24.0, peft 0.21.2, "
            "trl 1.16.0 (2 cells), no versions recorded (1 cell); on AMD EPYC (AVX-512), 2 torch threads (1 cell), "
            "AMD EPYC (AVX2), 2 torch threads (1 cell), no device recorded (1 cell).") in text, text[:900]


def test_the_report_says_which_world_its_cells_read_and_counts_each_when_they_differ(tmp_path):
    for seed in (0, 1, 2):
        write_cell(tmp_path, "outcome", None, seed, 6)
    for seed, student in ((0, "aaaa"), (1, "bbbb")):
        params = tmp_path / "cells" / f"outcome-rfull-s{seed}" / "params.json"
        record = {"problems": "cccc", "student": student}  # as the cell's CellWriter records it: keys sorted
        params.write_text(json.dumps(json.loads(params.read_text()) | {"world_fingerprints": record}))
    text = write_report(load_cells(tmp_path), tmp_path / "a", margin=0.05, profile_name="tiny").read_text()
    assert ("World read (each cell's params.json: a hash of each entry's files): student aaaa (1 cell), bbbb (1 cell); "
            "problems cccc (2 cells); not recorded (1 cell).") in text, "the student first:\n" + text[:1200]


def test_a_comparison_of_studies_says_whether_their_cells_read_one_world(tmp_path):
    def study(name, student):
        for seed in (0, 1):
            params = write_cell(tmp_path / name, "outcome", None, seed, 6) / "params.json"
            if student:
                record = {"problems": "cccc", "student": student}  # keys sorted, as params.json has them
                params.write_text(json.dumps(json.loads(params.read_text()) | {"world_fingerprints": record}))
        return load_cells(tmp_path / name)

    a, b, c, d = (study(name, student).worlds for name, student in (("a", "aaaa"), ("b", "aaaa"), ("c", "bbbb"),
                                                                     ("d", None)))
    assert compared_worlds_sentence({"A": a, "B": b}) == (
        "The compared studies' cells read one world: student aaaa, problems cccc (a hash of each entry's files).")
    assert compared_worlds_sentence({"A": a, "C": c}).startswith(
        "**The compared studies read different worlds**: student aaaa (A), bbbb (C). A difference paired")
    assert "whether the studies read one is not known" in compared_worlds_sentence({"D": d})


def test_a_study_none_of_whose_cells_recorded_a_world_leaves_one_world_not_known():
    recorded = {"outcome-r1-s0": {"student": "aaaa"}, "outcome-rfull-s0": {"student": "aaaa"}}
    unrecorded = {"outcome-r1-s0": {}, "outcome-rfull-s0": {}}
    assert compared_worlds_sentence({"A": recorded, "D": unrecorded}) == (
        "The cells of D recorded no world (they predate the record): whether the studies read one is not known."), (
        "one study's records alone cannot say that both read one world")


def test_an_entry_only_some_compared_studies_read_is_named_with_its_readers_not_as_shared():
    all_regimes = {"outcome-r1-s0": {"student": "aaaa"}, "process-r1-s0": {"prm": "pppp", "student": "aaaa"}}
    outcome_only = {"outcome-r1-s0": {"student": "aaaa"}}
    assert compared_worlds_sentence({"A": all_regimes, "B": outcome_only, "C": all_regimes}) == (
        "The compared studies' cells read one world: student aaaa; only A and C read prm pppp (a hash of each entry's "
        "files).")


def test_the_report_writes_each_cells_world_record_as_a_table_that_reads_back_as_recorded(tmp_path):
    for seed in (0, 1):
        write_cell(tmp_path, "outcome", None, seed, 6)
    params = tmp_path / "cells" / "outcome-rfull-s0" / "params.json"
    record = {"problems": "cccc", "student": "0123456789012345"}  # digits only: must not be read back as a number
    params.write_text(json.dumps(json.loads(params.read_text()) | {"world_fingerprints": record}))
    cells = load_cells(tmp_path)
    write_report(cells, tmp_path / "a", margin=0.05, profile_name="tiny")
    written = pd.read_csv(tmp_path / "a" / WORLDS, dtype=str, keep_default_na=False)
    assert frame_worlds(written) == cells.worlds == {"outcome-rfull-s0": record, "outcome-rfull-s1": {}}, (
        written.to_string())


def test_the_report_shows_the_benchmark_ratio_when_one_was_run_and_says_how_when_not(outputs, tmp_path):
    cells, out = load_cells(outputs), tmp_path / "analysis"

    def report_with(bench: dict | None) -> str:  # the report's text with this benchmark.json beside it (None: none)
        if bench is not None:
            (out / "benchmark.json").write_text(json.dumps(bench))
        return write_report(cells, out, margin=0.05, profile_name="smoke").read_text()

    text = report_with(None)
    assert "## Speed against TRL" in text and "Not measured for this study" in text and "--stages benchmark" in text
    bench = {"config": {"prompts": 4, "generations": 4, "max_new_tokens": 64, "hidden": 128, "layers": 3, "beta": 0.05,
                        "steps": 8, "warmup": 2},
             "environment": {"cpu": "Some CPU (AVX2)", "torch_threads": 1, "torch": "2.13.0", "transformers": "5",
                             "trl": "1", "commit": "0123456789abcdef"},
             "samples_per_cpu_second": {"ours (stacked)": 60.31, "TRL GRPOTrainer (one arm at a time)": 36.21},
             "ours_over_trl": 1.6656}
    text = report_with(bench)
    assert "Not measured" not in text, "a benchmark file in the folder must be reported"
    assert "| ours (stacked) | 60.3 |" in text and "| TRL GRPOTrainer (one arm at a time) | 36.2 |" in text
    assert "**1.67x**" in text and "Some CPU (AVX2)" in text and "commit 0123456789ab)" in text
    bench["environment"]["dirty"] = True
    assert "commit 0123456789ab with uncommitted changes)" in report_with(bench), \
        "a benchmark taken on a tree that differed from its commit must say so"
    bench["environment"]["tree"] = "fedcba9876543210"
    assert "commit 0123456789ab with uncommitted changes, files of git tree fedcba987654)" in report_with(bench), \
        "a benchmark that recorded its files' tree must name it, so the commit holding them can be found"
    assert "Where the stacked step's time goes" not in text, "a benchmark without phase timings shows none"
    bench["stacked_phase_wall_seconds"] = {"generate": 0.405, "reward": 0.001, "reference": 0.131, "train": 0.458}
    text = report_with(bench)
    assert "(wall-seconds, median): generate 0.405, reward 0.001, reference 0.131, train 0.458." in text
    assert "Where the stacked sampling's time goes" not in text, "a benchmark without a sampling profile shows none"
    bench["stacked_sampling_ms_per_decoding_step"] = {
        "decoding_steps": 64, "cpu_ms": 5.43, "profiled_ms": 6.08, "products_ms": 1.51, "attention_ms": 0.99,
        "other_aten_ms": 2.51, "outside_aten_ms": 1.07, "top_other_ops_ms": {"aten::sort": 0.67}}
    text = report_with(bench)
    assert ("5.43 CPU-ms per decoding step of every row (64 steps); under the profiler 6.08 ms: weight products 1.51, "
            "attention 0.99, other ATen operations 2.51, outside ATen (Python, the profiler) 1.07") in text
    assert "Against its compute floor" not in text, "a benchmark without a FLOP count shows no floor"
    bench["compute_floor"] = {"gflop_per_step": {"products": 35.12, "attention": 8.96},
                              "matmul_gflop_per_cpu_second": 208.4, "floor_cpu_seconds": 0.2116,
                              "step_over_floor": 4.31, "trl_over_floor": 9.52}
    text = report_with(bench)
    assert ("35.1 GFLOP of weight products and 9.0 of attention per step at 208 GFLOP per CPU-s (one thread, a large "
            "fp32 product) take 0.212 CPU-s; the step takes 4.3x that, TRL's arms 9.5x") in text


def test_a_regime_with_more_seeds_counts_its_own_in_the_matrix(outputs):
    for rank in (1, 2, None):
        write_cell(outputs, "outcome", rank, 2, 5)  # a third outcome seed; process keeps two
    counts = matrix_counts(load_cells(outputs))
    assert counts["seeds"] == {"outcome": 3, "process": 2}
    assert counts["matrix"] == 4 * (3 + 2), "regimes x arms (r1, r2, r4, full) x each regime's seeds"
    assert seeds_phrase(counts["seeds"]) == "{outcome 3, process 2}" and seeds_phrase({"a": 4, "b": 4}) == "4"


def write_dev(outputs, name, pass1_by_step):
    """A cell's dev evaluations (dev_evals.csv): {step: dev pass@1}."""
    rows = [{"step": step, "pass1": p, "scored": 5} for step, p in pass1_by_step.items()]
    pd.DataFrame(rows).to_csv(outputs / "cells" / name / "dev_evals.csv", index=False)


@pytest.fixture
def dev_chosen(outputs):
    """The process cells with dev curves: every r1 and r2 cell best at step 2 (its peak), FullFT's at step 4; outcome
    without any. Step 0's dev score is the highest of all, and the r2 cells tie steps 2 and 4."""
    for seed in (0, 1):
        write_dev(outputs, f"process-r1-s{seed}", {0: 0.9, 2: 0.6, 4: 0.4})
        write_dev(outputs, f"process-r2-s{seed}", {2: 0.5, 4: 0.5})
        write_dev(outputs, f"process-rfull-s{seed}", {2: 0.3, 4: 0.5})
    return outputs


def test_each_cell_stops_at_its_best_dev_step_after_step_0_the_earliest_of_ties(dev_chosen):
    chosen = chosen_steps(load_cells(dev_chosen)).set_index("cell")["step"]
    assert chosen.to_dict() == {**{f"process-r{r}-s{s}": 2 for r in (1, 2) for s in (0, 1)},
                                "process-rfull-s0": 4, "process-rfull-s1": 4}


def test_lora_and_fullft_are_compared_on_their_held_out_answers_at_their_chosen_steps(dev_chosen):
    cells = load_cells(dev_chosen)
    answers = answers_at_chosen_steps(cells)
    at_chosen = equivalence_table(cells, margin=0.05, answers=answers).frame
    assert list(zip(at_chosen["regime"], at_chosen["arm"])) == [("process", "r1"), ("process", "r2")]
    peaks, full_finals = [PROCESS_PEAK - seed for seed in (0, 1)], FINAL["process"][None]
    expected = np.mean([peak - full for peak, full in zip(peaks, full_finals)]) / N_PROBLEMS
    assert at_chosen.iloc[0]["estimate"] == pytest.approx(expected), "not the r1 peak against FullFT's final answers"
    table = chosen_table(cells, answers).frame.set_index("arm")
    assert table.loc["r1", "heldout_pass1_mean"] == pytest.approx(np.mean(peaks) / N_PROBLEMS)
    assert table.loc["full", "step_mean"] == 4 and table.loc["r2", "n_seeds"] == 2


def test_an_arm_with_one_seed_shows_its_chosen_step_without_an_sd(dev_chosen):
    cells = load_cells(dev_chosen)
    one_seed = cells.dev_evals[cells.dev_evals["seed"] == 0]
    cells = dataclasses.replace(cells, dev_evals=one_seed)
    markdown = chosen_table(cells, answers_at_chosen_steps(cells)).markdown
    assert "nan" not in markdown and "| process | r1 | 2 | 0.600 | 0.700 | 1 |" in markdown, markdown


def test_a_chosen_step_that_scored_only_the_curve_problems_is_a_clear_error(dev_chosen):
    answers = dev_chosen / "cells" / "process-r1-s0" / "answers.csv"
    frame = pd.read_csv(answers, dtype={"problem_id": str})
    frame[(frame["step"] != 2) | (frame["problem_id"] < "005")].to_csv(answers, index=False)
    evals = pd.read_csv(answers.with_name("evals.csv"))
    evals.loc[evals["step"] == 2, "scored"] = 5  # as the cell itself records it
    evals.to_csv(answers.with_name("evals.csv"), index=False)
    with pytest.raises(ValueError, match="process-r1-s0.*curve_problems unset"):
        answers_at_chosen_steps(load_cells(dev_chosen))


def test_the_report_adds_the_dev_chosen_comparison_when_cells_scored_dev_problems(dev_chosen, tmp_path):
    text = write_report(load_cells(dev_chosen), tmp_path / "analysis", margin=0.05).read_text()
    assert "## At each arm's dev-chosen step" in text and "| process | r1 | 2 ± 0 |" in text, text
    chosen = pd.read_csv(tmp_path / "analysis" / "equivalence_chosen.csv")
    assert chosen["arm"].tolist() == ["r1", "r2"]
    assert "The rank needed to match FullFT at those steps" in text
    assert pd.read_csv(tmp_path / "analysis" / "rank_needed_chosen.csv")["regime"].tolist() == ["process"]
    figure = tmp_path / "analysis" / "figures" / "rank_needed_chosen.png"
    assert "(figures/rank_needed_chosen.png)" in text and figure.is_file()
    assert set(chosen["verdict"]) <= {"equivalent", "different", "inconclusive"}


def test_an_arms_curve_averages_its_seeds_only_at_steps_every_seed_evaluated():
    evals = pd.DataFrame({"cell": ["s0"] * 4 + ["s1"] * 2, "step": [0, 100, 150, 200, 0, 100],
                          "pass1": [0.2, 0.5, 0.7, 0.8, 0.4, 0.6]})
    curve = mean_curve(evals)
    assert curve.index.tolist() == [0, 100], f"steps only seed s0 evaluated entered the mean: {curve.to_dict()}"
    assert curve.tolist() == pytest.approx([0.3, 0.55])


def test_the_plateau_of_an_arm_whose_seeds_ran_different_lengths_reads_their_common_steps(outputs):
    cells = load_cells(outputs)
    longer = cells.evals[(cells.evals["cell"] == "outcome-rfull-s0") & (cells.evals["step"] == 4)].assign(step=6)
    table = plateau_table(dataclasses.replace(cells, evals=pd.concat([cells.evals, longer])))
    full = table.frame.set_index(["regime", "arm"]).loc[("outcome", "full")]
    assert full["final_step"] == 4 and full["final"] == pytest.approx(0.7), "one seed's extra step was its final"


def test_the_collapse_table_leaves_out_a_cell_without_advantage_std_and_shows_no_base_as_a_dash(outputs):
    cells = load_cells(outputs)
    history = cells.history.copy()
    history.loc[history["cell"] == "process-r1-s0", "advantage_std"] = np.nan  # a cell from before the metric
    evals = cells.evals[(cells.evals["regime"] != "outcome") | (cells.evals["step"] > 0)]
    table = collapse_table(dataclasses.replace(cells, history=history, evals=evals))
    rows = {line.split(" | ")[0].strip("| "): line for line in table.markdown.splitlines()}
    assert rows["outcome"].split(" | ")[4] == "–", f"no base, yet a collapse verdict: {rows['outcome']}"
    assert rows["process"].split(" | ")[1:5] == ["1", "–", "0.650 (step 2)", "4"], rows["process"]


def test_the_peak_advantage_figure_leaves_out_a_regime_whose_steps_have_no_advantages(outputs, tmp_path):
    cells = load_cells(outputs)
    history = cells.history.copy()
    history.loc[history["regime"] == "process", "advantage_std"] = np.nan  # as the SFT control's steps record none
    figure = plot_peak_advantage_std(dataclasses.replace(cells, history=history), tmp_path / "peak.png")
    ticks = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    assert ticks == ["outcome"], f"a regime without advantages got a bar (its summary's 0): {ticks}"


def test_an_arms_curve_over_seeds_stops_where_one_of_its_seeds_stopped(outputs, tmp_path):
    cells = load_cells(outputs)
    evals = cells.evals[(cells.evals["cell"] != "process-r1-s1") | (cells.evals["step"] < 4)]  # seed 1 stopped early
    figure = plot_process_collapse(dataclasses.replace(cells, evals=evals), tmp_path / "collapse.png")
    [r1] = [line for line in figure.axes[0].get_lines() if line.get_label() == "r1"]
    assert list(r1.get_xdata()) == [0, 2], "seed 0 alone was drawn as the mean at step 4"


def test_the_last_quarter_is_read_between_the_first_and_last_evaluation_never_at_the_last():
    assert last_quarter_share(pd.Series([0.3, 0.5, 0.8], index=[0, 75, 100])) == (75, pytest.approx(0.6))
    step, share = last_quarter_share(pd.Series([0.3, 0.8], index=[0, 100]))
    assert step == 100 and np.isnan(share) and not is_plateau(share), "a curve with nothing between was a plateau"
    step, share = last_quarter_share(pd.Series([0.3, 0.4, 0.8], index=[0, 30, 100]))
    assert step == 30 and share == pytest.approx(0.8)
    assert last_quarter_share(pd.Series([0.0, 0.5, 0.9, 1.0], index=[0, 70, 80, 100]))[0] == 70, \
        "of two evaluations as near to 75%, the earlier: the window is never shorter than a quarter"

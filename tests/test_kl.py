"""KL to the reference at the end of training: per cell over its last steps, per arm over seeds."""
import numpy as np
import pandas as pd
import pytest
from test_analysis import N_PROBLEMS, write_cell

from reward_density.analysis.kl import final_kl, kl_table
from reward_density.analysis.kl_free import ablation_table, with_without_kl, write_kl_comparison
from reward_density.analysis.load import load_cells
from reward_density.analysis.plots import plot_kl_vs_rank


def with_kl(folder, values):
    """Give a cell's history the per-step kl_ref values (its 4 steps)."""
    history = pd.read_csv(folder / "history.csv")
    history["kl_ref"] = values
    history.to_csv(folder / "history.csv", index=False)


@pytest.fixture
def cells(tmp_path):
    for seed, kl_end in enumerate([0.02, 0.04]):
        with_kl(write_cell(tmp_path, "outcome", 1, seed, 5), [9.0, 9.0, 9.0, kl_end])
        with_kl(write_cell(tmp_path, "outcome", None, seed, 5), [0.0, 0.0, 0.0, 10 * kl_end])
    write_cell(tmp_path, "sft", 1, 0, 5)  # supervised: no KL recorded
    return load_cells(tmp_path)


def test_a_cells_kl_is_the_mean_over_its_last_tenth_of_steps(cells):
    per_cell = final_kl(cells).set_index(["arm", "seed"])["kl"]
    assert per_cell["r1", 0] == pytest.approx(0.02), "only step 4 of 4 is in the last 10%; earlier steps must not count"
    assert per_cell["full", 1] == pytest.approx(0.4)


def test_the_arm_kl_is_the_seed_mean_with_a_t_interval_and_cells_without_kl_are_left_out(cells):
    frame = kl_table(cells).frame.set_index(["regime", "arm"])
    assert set(frame.index) == {("outcome", "r1"), ("outcome", "full")}, "the SFT cell has no KL to report"
    row = frame.loc[("outcome", "r1")]
    half = 12.706 * np.std([0.02, 0.04], ddof=1) / np.sqrt(2)  # t(0.975, 1 df)
    assert row["kl"] == pytest.approx(0.03) and row["high"] - row["kl"] == pytest.approx(half, rel=1e-3)
    assert row["low"] == 0, f"the interval's lower end {row['low']} is a KL below 0, which no KL is"


def test_the_kl_figure_draws_the_tables_interval_at_the_level_asked_and_says_it(cells, tmp_path):
    figure = plot_kl_vs_rank(cells, tmp_path / "kl.png", confidence=0.9)
    assert (tmp_path / "kl.png").stat().st_size > 0
    [ax] = figure.axes
    assert ax.get_legend().get_title().get_text() == "mean, 90% interval over seeds"
    row = kl_table(cells, 0.9).frame.set_index("arm").loc["r1"]
    bar = ax.collections[0]  # LoRA's error bar, drawn first
    assert bar.get_segments()[0][:, 1] == pytest.approx([row["low"], row["high"]]), "not the 90% interval"


def study(root, finals: dict):
    """An outcome study of r4 and FullFT over two seeds; finals: {arm rank: [problems solved per seed]}."""
    for rank, solved in finals.items():
        for seed, final in enumerate(solved):
            with_kl(write_cell(root, "outcome", rank, seed, final), [0.01, 0.02, 0.03, 0.04])
    return load_cells(root)


def test_accuracy_is_paired_without_minus_with_the_penalty_per_arm(tmp_path):
    kept = study(tmp_path / "with", {4: [5, 5], None: [6, 6]})
    dropped = study(tmp_path / "without", {4: [5, 5], None: [2, 2]})
    frame = with_without_kl(kept, dropped, margin=0.05).frame.set_index("arm")
    assert frame.loc["r4", "estimate"] == pytest.approx(0.0) and frame.loc["full", "estimate"] == pytest.approx(-0.4)
    assert frame.loc["full", "verdict"] == "different"
    ablation = ablation_table(kept, dropped).frame
    full_without = ablation[(ablation["arm"] == "full") & (ablation["penalty"] == "without KL")].iloc[0]
    assert full_without["collapsed_seeds"] == 2, "a FullFT that ends below its base (3 of 10) has collapsed"
    path = write_kl_comparison(kept, dropped, tmp_path / "out", margin=0.05)
    assert "without − with" in path.read_text() and (tmp_path / "out" / "figures" / "kl_ablation.png").is_file()
    assert "recorded no world" in path.read_text(), "the comparison says whether both read one world"


def test_an_arm_run_both_ways_on_one_seed_is_a_skipped_row_with_its_reason_not_left_out(tmp_path):
    kept = study(tmp_path / "with", {4: [5, 5], None: [6]})
    dropped = study(tmp_path / "without", {4: [5, 5], None: [2]})
    table = with_without_kl(kept, dropped, margin=0.05)
    frame = table.frame.set_index("arm")
    assert frame.loc["full", "verdict"] == "skipped", "FullFT, the arm the paper's claim is about, was dropped"
    assert frame.loc["full", "reason"] == "one seed run both ways: no interval that holds for new training runs"
    assert frame.loc["r4", "verdict"] == "equivalent" and frame.loc["r4", "reason"] == ""
    assert "skipped: one seed run both ways" in table.markdown


def test_the_ablation_peak_is_taken_over_the_problems_both_studies_scored_at_every_evaluation(tmp_path):
    for seed in (0, 1):  # with KL: the curve's middle evaluation scores only the first 5 of 10 problems
        folder = write_cell(tmp_path / "with", "outcome", 4, seed, 4, peak=8)
        answers = pd.read_csv(folder / "answers.csv", dtype={"problem_id": str})
        answers[(answers["step"] != 2) | (answers["problem_id"] < "005")].to_csv(folder / "answers.csv", index=False)
        evals = pd.read_csv(folder / "evals.csv")
        evals.loc[evals["step"] == 2, ["pass1", "scored"]] = [1.0, 5]
        evals.to_csv(folder / "evals.csv", index=False)
        write_cell(tmp_path / "without", "outcome", 4, seed, 4, peak=8)  # without: all 10 at every evaluation
    kept, dropped = load_cells(tmp_path / "with"), load_cells(tmp_path / "without")
    table = ablation_table(kept, dropped, ablated=("r4",))
    peaks = table.frame.set_index("penalty")["peak"]
    # Over problems 000-004 the middle evaluation solves 5 of 5; over all 10 it would be 8 of 10.
    assert peaks["without KL"] == pytest.approx(1.0), "the peak must not read problems the other study never scored"
    assert peaks["with KL"] == pytest.approx(1.0)
    assert "peak pass@1 (5 problems)" in table.markdown, "the table must say how many problems its peak reads"


def test_the_kl_tables_means_are_over_the_rows_its_difference_pairs(tmp_path):
    kept = study(tmp_path / "with", {4: [5, 5]})
    dropped = study(tmp_path / "without", {4: [6, 6, 1]})  # a third seed the other study did not run
    row = with_without_kl(kept, dropped, margin=0.05).frame.iloc[0]
    assert row["without_kl"] - row["with_kl"] == pytest.approx(row["estimate"]), row


def test_the_ablations_peak_is_the_peak_of_training_not_the_base(tmp_path):
    kept = study(tmp_path / "with", {4: [5, 5], None: [5, 5]})
    collapsed = study(tmp_path / "without", {4: [5, 5], None: [1, 1]})  # below the base at every trained step
    frame = ablation_table(kept, collapsed).frame.set_index(["arm", "penalty"])
    assert frame.loc[("full", "without KL"), "peak"] == pytest.approx(1 / N_PROBLEMS), "the base was read as a peak"

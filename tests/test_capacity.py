"""The bits argument tallied on synthetic cells: deposits received against the bits each arm's parameters hold."""
import json

import pandas as pd
import pytest
from test_analysis import write_cell

from reward_density.analysis.capacity import arm_budgets, capacity_table, predicted_rank
from reward_density.analysis.load import load_cells
from reward_density.analysis.tables import equivalence_table
from reward_density.experiment import cell_folder
from reward_density.experiment.provenance import fingerprint

TRAINED = {1: 20, 2: 40, 16: 320, None: 1000}  # trained parameters by rank (None: FullFT)


def with_budget(folder, rank, deposits_per_completion):
    """A write_cell folder whose steps recorded their deposits and whose params.json its P, G and trained size."""
    history = pd.read_csv(folder / "history.csv")
    history["deposits_mean"] = deposits_per_completion
    history.to_csv(folder / "history.csv", index=False)
    params = json.loads((folder / "params.json").read_text())
    params |= {"prompts_per_step": 4, "group_size": 4, "derived": {"trained_parameters": TRAINED[rank]}}
    (folder / "params.json").write_text(json.dumps(params))


@pytest.fixture
def cells(tmp_path):
    """outcome (one deposit a completion) and process (three), ranks 1, 2 and 16 and FullFT, two seeds; 4 steps of
    16 completions."""
    for regime, deposits in (("process", 3.0), ("outcome", 1.0)):  # written densest first, shown sparsest first
        for rank in TRAINED:
            for seed in (0, 1):
                with_budget(write_cell(tmp_path, regime, rank, seed, 5), rank, deposits)
    return load_cells(tmp_path)


def test_each_arm_received_its_completions_times_its_deposits_and_holds_two_bits_a_parameter(cells):
    budgets = arm_budgets(cells).set_index(["regime", "arm"])
    assert budgets.loc[("outcome", "r1"), "deposits"] == 4 * 16 * 1.0
    assert budgets.loc[("process", "r2"), "deposits"] == 4 * 16 * 3.0
    assert budgets.loc[("outcome", "r2"), "capacity_bits"] == 80 and budgets.loc[("outcome", "r2"), "cells"] == 2
    assert budgets["holds"].to_dict() == {
        ("outcome", "r1"): False, ("outcome", "r2"): True, ("outcome", "r16"): True, ("outcome", "full"): True,
        ("process", "r1"): False, ("process", "r2"): False, ("process", "r16"): True, ("process", "full"): True}
    assert list(budgets.loc["outcome"].index) == ["r1", "r2", "r16", "full"], "ranks ascending, then FullFT"


def test_the_table_sets_the_rank_the_argument_predicts_beside_the_rank_the_verdicts_need(cells):
    table = capacity_table(cells, equivalence_table(cells, margin=0.05).frame)
    rows = table.markdown.splitlines()[2:]
    assert rows[0].startswith("| outcome | 1.0 | 64 | r1 40, r2 80, r16 640, full 2,000 | r2 |")  # 40 < 64 <= 80
    assert rows[1].startswith("| process | 3.0 | 192 | r1 40, r2 80, r16 640, full 2,000 | r16 |")


@pytest.mark.parametrize("holds, predicted", [([True, True], "r1 or less"), ([False, True], "r2"),
                                              ([False, False], "beyond r2")])
def test_the_predicted_rank_is_the_smallest_that_holds_what_it_received(holds, predicted):
    budgets = pd.DataFrame({"rank": pd.array([1, 2, None], dtype="Int64"), "holds": [*holds, True]})
    assert predicted_rank(budgets) == predicted, "FullFT (no rank) holds, but is not a rank the argument can name"


def with_control(folder, rank, world, bits):
    """An SFT control cell (write_cell's) that read world/control, whose manifest records the table's bits."""
    params = json.loads((folder / "params.json").read_text())
    params |= {"control": str(world / "control"), "derived": {"trained_parameters": TRAINED[rank]}}
    (folder / "params.json").write_text(json.dumps(params))
    world.mkdir(exist_ok=True)
    (world / "manifest.json").write_text(json.dumps({"components": {"control": {"facts": 9, "bits": bits}}}))


def test_the_sft_control_must_hold_its_tables_bits_which_its_worlds_manifest_records(tmp_path):
    for rank in (1, 2, None):
        with_control(write_cell(tmp_path, "sft", rank, 0, 5), rank, tmp_path / "world", bits=60)
    with_budget(write_cell(tmp_path, "outcome", 1, 0, 5), 1, 1.0)
    cells = load_cells(tmp_path)
    budgets = arm_budgets(cells).set_index(["regime", "arm"])
    assert budgets.loc[("sft", "r1"), "bits"] == 60 and not budgets.loc[("sft", "r1"), "holds"], "40 bits < 60"
    assert budgets.loc[("sft", "r2"), "holds"] and pd.isna(budgets.loc[("sft", "r2"), "deposits"]), "no deposits"
    assert budgets.loc[("outcome", "r1"), "bits"] == 64, "an RL cell's bits are its deposits, one each"
    rows = capacity_table(cells, equivalence_table(cells, margin=0.05).frame).markdown.splitlines()[2:]
    assert rows[1].startswith("| sft | – | 60 | r1 40, r2 80, full 2,000 | r2 |"), rows


def test_an_sft_control_cell_whose_world_is_gone_is_left_out_not_counted_as_zero(tmp_path):
    with_control(write_cell(tmp_path, "sft", 1, 0, 5), 1, tmp_path / "world", bits=60)
    (tmp_path / "world" / "manifest.json").unlink()
    assert arm_budgets(load_cells(tmp_path)).empty


def test_an_sft_control_cell_whose_table_was_rebuilt_since_is_left_out_not_given_the_new_tables_bits(tmp_path):
    folder = write_cell(tmp_path, "sft", 1, 0, 5)
    with_control(folder, 1, tmp_path / "world", bits=60)
    (tmp_path / "world" / "control").mkdir()
    (tmp_path / "world" / "control" / "table.json").write_text('{"facts": 9}')
    params = json.loads((folder / "params.json").read_text())
    params[cell_folder.WORLD] = {"control": fingerprint(tmp_path / "world" / "control")}
    (folder / "params.json").write_text(json.dumps(params))
    assert arm_budgets(load_cells(tmp_path)).loc[0, "bits"] == 60, "the table the cell read"
    (tmp_path / "world" / "control" / "table.json").write_text('{"facts": 12}')  # rebuilt with other settings
    assert arm_budgets(load_cells(tmp_path)).empty, "a rebuilt table's bits were credited to a cell that read the old"


def test_cells_that_recorded_no_deposits_are_named_as_such_not_counted_as_zero(tmp_path):
    write_cell(tmp_path, "outcome", 1, 0, 5)
    write_cell(tmp_path, "outcome", None, 0, 5)
    cells = load_cells(tmp_path)
    table = capacity_table(cells, equivalence_table(cells, margin=0.05).frame)
    assert table.frame.empty and table.markdown.startswith("No cell recorded its deposits and trained parameters")

"""One schema for a cell: CellConfig, which the notebook's parameters, the profiles and the runner all follow."""
from __future__ import annotations

from dataclasses import MISSING

import jupytext
import nbformat
import papermill
import pytest

from reward_density.experiment.cell import check_can_train, lr_factor
from reward_density.experiment.config import CellConfig, cell_name, notebook_settings, parameters_cell, parse_cell_name
from reward_density.experiment.profiles import REPO_ROOT, cell_config, find_profile, group_configs, load_profile
from reward_density.run.notebooks import NotebookFailed, execute_notebook

NOTEBOOK = REPO_ROOT / "notebooks" / "train_cell.py"


def parameters_source() -> str:
    notebook = jupytext.read(NOTEBOOK, fmt="py:percent")
    [cell] = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    return cell.source


def test_the_notebooks_parameters_cell_is_the_one_rendered_from_the_schema():
    assert parameters_source() == parameters_cell(), (
        "notebooks/train_cell.py's parameters cell drifted from CellConfig; replace it with the output of "
        "`python -m reward_density.experiment.config`")


def test_papermill_shows_a_type_for_every_notebook_parameter(tmp_path):
    ipynb = tmp_path / "train_cell.ipynb"
    notebook = jupytext.read(NOTEBOOK, fmt="py:percent")
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    jupytext.write(notebook, ipynb, fmt="ipynb")
    shown = papermill.inspect_notebook(str(ipynb))
    untyped = [name for name, p in shown.items() if p["inferred_type_name"] in ("None", "")]
    assert not untyped, f"papermill --help-notebook shows no type for {untyped}"
    expected = ["profile", "regime", "rank", "seed", "cells_dir"] + [f.name for f in notebook_settings()]
    assert list(shown) == expected
    assert (shown["steps"]["inferred_type_name"] == "Optional[int]"
            and shown["rank"]["inferred_type_name"] == "Union[int, str, list]")


def test_the_notebook_refuses_to_train_over_a_finished_cell_before_loading_anything(tmp_path):
    finished = tmp_path / "cells" / "outcome-r1-s0"
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text('{"steps": 2}')
    with pytest.raises(NotebookFailed, match="a finished cell is there, which training would replace"):
        execute_notebook(NOTEBOOK, tmp_path / "out.ipynb", {"profile": "smoke", "cells_dir": str(tmp_path / "cells")},
                         cwd=REPO_ROOT)
    assert (finished / "summary.json").read_text() == '{"steps": 2}', "the finished cell's results were replaced"
    assert sorted(p.name for p in finished.iterdir()) == ["summary.json"]


def test_arms_that_cannot_train_together_are_refused_before_anything_loads():
    configs = group_configs(load_profile(find_profile("smoke")), "outcome", [1, 2], 0, engine="peft")
    with pytest.raises(ValueError, match="several arms together need engine: stacked"):
        check_can_train(configs)


def test_every_setting_has_a_doc_a_check_and_a_section():
    for f in CellConfig.settings():
        assert f.metadata["doc"] and callable(f.metadata["check"]), f.name
    assert all(f.default is not MISSING for f in CellConfig.settings("cell")), (
        "a profile may leave out any cell setting")


def test_the_notebook_and_the_runner_build_the_same_config_for_a_cell(tmp_path):
    """The runner passes every value; a papermill user passes the arm alone: both get the profile's cell."""
    profile = load_profile(find_profile("mini"))
    from_runner = cell_config(profile, "outcome", None, 2,
                              learning_rate=profile.matrix.learning_rate_of("outcome", None))
    explicit = {f.name: v for f in notebook_settings() if (v := getattr(from_runner, f.name)) is not None}
    from_notebook = cell_config(load_profile(find_profile(str(profile.path))), "outcome", "full", 2, **explicit)
    assert from_notebook == from_runner == cell_config(profile, "outcome", "full", 2)
    assert (from_runner.learning_rate == profile.matrix.learning_rate_of("outcome", None)
            != profile.matrix.learning_rate_of("outcome", 1))


def test_a_cell_name_parses_back_to_its_regime_rank_and_seed_and_a_malformed_one_to_none():
    for regime, rank, seed in [("outcome", 4, 0), ("process", None, 12), ("distillation", 1, 3)]:
        assert parse_cell_name(cell_name(regime, rank, seed)) == (regime, rank, seed)
    assert cell_name("process", None, 2) == "process-rfull-s2"
    for bad in ("outcome", "outcome-r-s0", "outcome-rx-s0", "outcome-r4-sx", "outcome-r0-s1"):
        assert parse_cell_name(bad) is None, bad


def test_a_cells_params_file_gives_back_its_config():
    profile = load_profile(find_profile("mini"))
    for regime, rank in (("outcome", None), ("sft", 4)):
        config = cell_config(profile, regime, rank, 1)
        written = config.to_parameters() | {"derived": {"hidden_size": 128}}  # what params.json holds
        assert CellConfig.from_parameters(written) == config
    assert cell_config(profile, "sft", 1, 0).heldout_file.parent.name == "control", "the control is scored on its facts"


def test_a_cell_names_the_world_entries_its_regime_reads():
    profile = load_profile(find_profile("mini"))
    read = {regime: sorted(cell_config(profile, regime, 1, 0).world_inputs)
            for regime in ("outcome", "process", "distillation", "sft")}
    assert read == {"outcome": ["problems", "student"], "process": ["prm", "problems", "student"],
                    "distillation": ["problems", "student", "teacher"], "sft": ["control", "student"]}, read
    paper = cell_config(load_profile(find_profile("paper")), "outcome", 1, 0)
    assert paper.world_inputs["heldout"] == paper.heldout, "a held-out set of its own is read too"


def test_the_golden_training_notebooks_carry_the_schemas_parameters_cell():
    """A golden made before the schema grew fails inside nbval on a missing setting; this names the cause."""
    goldens = sorted((REPO_ROOT / "tests" / "golden").glob("*_train_*.ipynb"))
    assert goldens, "no golden training notebook found under tests/golden"
    for golden in goldens:
        notebook = nbformat.read(golden, as_version=4)
        cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
        assert cell.source.strip() == parameters_cell().strip(), (
            f"{golden.name} predates the cell schema: run ./run_all.sh goldens")


def test_a_linear_schedule_decays_the_rate_to_one_step_of_it_and_constant_keeps_it():
    profile = load_profile(REPO_ROOT / "params" / "smoke.yaml")
    linear = cell_config(profile, "outcome", 1, 0, lr_schedule="linear", steps=4)
    assert [lr_factor(step, linear) for step in (1, 2, 3, 4)] == [1.0, 0.75, 0.5, 0.25]
    constant = cell_config(profile, "outcome", 1, 0, steps=4)
    assert [lr_factor(step, constant) for step in (1, 4)] == [1.0, 1.0], "the paper's rate is constant"
    with pytest.raises(ValueError, match="lr_schedule = 'cosine'"):
        cell_config(profile, "outcome", 1, 0, lr_schedule="cosine")

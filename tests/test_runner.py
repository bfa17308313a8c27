"""The matrix runner on a fake training notebook: skip, filter, failures, parallel cells, leftovers, kill and resume."""
from __future__ import annotations

import json
import logging
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from reward_density.analysis.speed import speed_markdown
from reward_density.data.problems import Problem, write_problems
from reward_density.experiment.profiles import COMPARISONS, REPO_ROOT, cell_config, load_profile
from reward_density.experiment.provenance import (
    code_fingerprint,
    fingerprint,
    fingerprints,
    read_json,
    write_json_atomic,
)
from reward_density.run import cli, notebooks, stages
from reward_density.run.cli import _parser, check_build_world, check_notebook_sections, main
from reward_density.run.local import gpu_slots, run_matrix
from reward_density.run.lock import FolderInUse, exclusive, reading, replacing
from reward_density.run.matrix import StaleCells, cpu_count, select_cells, stop_signals_as_interrupt
from reward_density.run.notebooks import NotebookFailed
from reward_density.run.stages import benchmark_workload, run_stage, stage_benchmark
from reward_density.world.build import BUILD_PARAMETERS, component_keys, config_from_parameters

FIXTURES = Path(__file__).parent / "fixtures"
TRAIN = Path("notebooks/train_cell.py")


@pytest.fixture
def root(tmp_path, monkeypatch, tiny_model_dir) -> Path:
    """A project root with a 4-cell profile 'tiny' and the fake notebooks in place of the real ones."""
    monkeypatch.delenv("FAKE_FAIL", raising=False)
    monkeypatch.delenv("FAKE_SLEEP", raising=False)
    data = yaml.safe_load((REPO_ROOT / "params" / "smoke.yaml").read_text())
    data["profile"] = "tiny"
    # A world the runner's reachability check accepts, at the smoke paths (the fake notebooks never load it).
    world = tmp_path / "outputs" / "smoke" / "world"
    (world / "problems").mkdir(parents=True)
    (world / "problems" / "train.jsonl").write_text("{}\n" * 16)  # rows enough for a step's problems
    for name in ("student", "teacher", "prm"):
        shutil.copytree(tiny_model_dir, world / name)
    data["matrix"].update(regimes=["outcome", "process"], ranks=[1], seeds=[0])
    data["cell"]["engine"] = "peft"  # one cell per job; test_stacked_arms_run_as_one_job covers the other engine
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "notebooks").mkdir()
    shutil.copy(FIXTURES / "fake_cell.py", tmp_path / TRAIN)
    shutil.copy(FIXTURES / "fake_analysis.py", tmp_path / "notebooks" / "analysis.py")
    return tmp_path


def profile_of(root: Path):
    """The validated tiny profile."""
    return load_profile(root / "params" / "tiny.yaml")


def cell_dir(root: Path, name: str) -> Path:
    """A cell's output folder."""
    return root / "outputs" / "tiny" / "cells" / name


def test_cell_globs_select_cells_in_profile_order_and_any_glob_matching_none_or_an_empty_list_is_refused(root):
    profile = profile_of(root)
    assert [c.name for c in select_cells(profile, None)] == [
        "outcome-r1-s0", "outcome-rfull-s0", "process-r1-s0", "process-rfull-s0"]
    assert [c.name for c in select_cells(profile, "*-rfull-*")] == ["outcome-rfull-s0", "process-rfull-s0"]
    assert [c.name for c in select_cells(profile, "outcome-r1-*, process-*")] == [
        "outcome-r1-s0", "process-r1-s0", "process-rfull-s0"]
    with pytest.raises(ValueError, match="matches no cell of profile tiny"):
        select_cells(profile, "distillation-*")
    with pytest.raises(ValueError, match="procss-\\*, outcome-r3-s0 match no cell of profile tiny"):
        select_cells(profile, "outcome-*,procss-*, outcome-r3-s0")  # the other globs' cells are no excuse
    with pytest.raises(ValueError, match="names no glob"):
        select_cells(profile, " , ")
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells", "--cells", ""]) == 2
    assert not (root / "outputs" / "tiny" / "cells").exists(), "an empty --cells ran every cell"


def test_parallel_cells_run_then_skip(root, monkeypatch):
    # Long enough that the two cells overlap even when one kernel starts seconds after the other on a busy machine.
    monkeypatch.setenv("FAKE_SLEEP", "6")
    report = run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-*", jobs=2)
    assert report.ok and sorted(report.finished) == ["outcome-r1-s0", "outcome-rfull-s0"]
    lora, full = (cell_dir(root, name) for name in ("outcome-r1-s0", "outcome-rfull-s0"))
    spans = [read_json(folder / "summary.json") for folder in (lora, full)]
    assert max(s["started"] for s in spans) < min(s["ended"] for s in spans), "the two cells did not overlap"
    params = read_json(full / "params.json")
    assert params["rank"] == "full" and params["steps"] == 2
    assert params["cells_dir"] == str(full.parent) and params["cwd"] == str(root)
    assert params["base_answers"] == str(root / "outputs/tiny/baseline")
    assert params["student"] == str(root / "outputs/smoke/world/student")
    assert params["omp_num_threads"] == str(max(1, cpu_count() // 2))
    assert sorted(p.name for p in full.iterdir()) == ["cell.ipynb", "params.json", "run.log", "summary.json"]
    mtimes = {folder: (folder / "summary.json").stat().st_mtime_ns for folder in (lora, full)}
    rerun = run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-*", jobs=2)
    assert rerun.ok and rerun.finished == [] and rerun.skipped == ["outcome-r1-s0", "outcome-rfull-s0"]
    assert {folder: (folder / "summary.json").stat().st_mtime_ns for folder in (lora, full)} == mtimes


def test_a_finished_cell_trained_at_another_rate_stops_the_run_before_any_work_and_is_kept(root, capsys):
    assert run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-*").finished == ["outcome-r1-s0"]
    summary = cell_dir(root, "outcome-r1-s0") / "summary.json"
    before = summary.stat().st_mtime_ns
    path = root / "params" / "tiny.yaml"
    path.write_text(path.read_text().replace("lora: 0.0003", "lora: 0.001"))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells"]) == 2
    error = capsys.readouterr().err
    assert "outcome-r1-s0: learning_rate 0.0003 -> 0.001" in error, error
    assert "move or delete those cell folders" in error, error
    with pytest.raises(ValueError, match="1 finished cell"):  # any executor, not only the command line
        run_matrix(profile_of(root), root, TRAIN)
    assert summary.stat().st_mtime_ns == before, "the finished cell was touched"
    assert not cell_dir(root, "process-r1-s0").exists(), "a cell ran although the run was refused"


def test_a_run_that_analyses_refuses_a_stale_finished_cell_its_cells_filter_leaves_out(root, capsys):
    assert run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-*").finished == ["outcome-r1-s0"]
    path = root / "params" / "tiny.yaml"
    path.write_text(path.read_text().replace("lora: 0.0003", "lora: 0.001"))
    for stages_, cells in (("cells,analysis", ["--cells", "process-*"]), ("analysis", [])):
        capsys.readouterr()
        assert main(["--profile", "tiny", "--root", str(root), "--stages", stages_, *cells]) == 2, stages_
        error = capsys.readouterr().err
        assert "outcome-r1-s0: learning_rate 0.0003 -> 0.001" in error, error
    assert not cell_dir(root, "process-r1-s0").exists(), "a cell ran although the run was refused"
    assert not (root / "outputs" / "tiny" / "report.md").exists(), "the analysis read the stale cell"
    with pytest.raises(StaleCells, match="outcome-r1-s0"):  # the stage itself, called from anywhere
        stages.stage_analysis(profile_of(root), root)
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells", "--cells", "process-*"]) == 0, (
        "without the analysis, a run of other cells need not answer for this one")


def test_a_run_that_analyses_refuses_finished_cells_the_matrix_no_longer_plans(root, capsys):
    assert run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-*").finished == ["outcome-r1-s0"]
    path = root / "params" / "tiny.yaml"
    path.write_text(path.read_text().replace("- 0\n", "- 1\n", 1))  # the matrix's seeds: [0] -> [1]
    assert [c.seed for c in profile_of(root).cells()] == [1] * 4, "the edit should move the matrix to seed 1"
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells,analysis"]) == 2
    error = capsys.readouterr().err
    assert "not in the matrix" in error and "outcome-r1-s0" in error, error
    assert not cell_dir(root, "outcome-r1-s1").exists(), "a cell ran although the run was refused"
    with pytest.raises(StaleCells, match="outcome-r1-s0"):  # the stage itself, called from anywhere
        stages.stage_analysis(profile_of(root), root)
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells", "--cells", "process-*"]) == 0, (
        "without the analysis, a run of other cells need not answer for that one")


def test_a_finished_cell_whose_world_changed_since_stops_the_cells_stage_and_is_kept(root, capsys):
    assert run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-*").finished == ["outcome-r1-s0"]
    folder, world = cell_dir(root, "outcome-r1-s0"), root / "outputs" / "smoke" / "world"
    read = fingerprints(cell_config(profile_of(root), "outcome", 1, 0, root=root).world_inputs)
    params = read_json(folder / "params.json") | {"world_fingerprints": read}  # what the real notebook records
    (folder / "params.json").write_text(json.dumps(params))
    before = (folder / "summary.json").stat().st_mtime_ns
    with (world / "prm" / "config.json").open("a") as handle:  # an entry an outcome cell does not read
        handle.write("\n")
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells", "--cells", "outcome-r1-*"]) == 0
    with (world / "student" / "config.json").open("a") as handle:  # as a rebuilt world leaves it
        handle.write("\n")
    capsys.readouterr()
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells"]) == 2
    error = capsys.readouterr().err
    now = fingerprint(world / "student")
    assert f"outcome-r1-s0: world.student {read['student']!r} -> {now!r}" in error, error
    assert "a rebuilt world gives another" in error and "move or delete those cell folders" in error, error
    with pytest.raises(StaleCells, match="1 finished cell"):  # any executor, not only the command line
        run_matrix(profile_of(root), root, TRAIN)
    assert (folder / "summary.json").stat().st_mtime_ns == before, "the finished cell was touched"
    assert not cell_dir(root, "process-r1-s0").exists(), "a cell ran although the run was refused"


def test_a_held_out_set_given_or_taken_away_since_a_cell_finished_stops_the_cells_stage(root, capsys):
    assert run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-*").finished == ["outcome-r1-s0"]
    folder, world = cell_dir(root, "outcome-r1-s0"), root / "outputs" / "smoke" / "world"
    (world / "problems" / "heldout.jsonl").write_text("{}\n" * 8)  # the cells' eval_problems
    read = fingerprints(cell_config(profile_of(root), "outcome", 1, 0, root=root).world_inputs)
    params = read_json(folder / "params.json") | {"world_fingerprints": read}  # what the real notebook records
    (folder / "params.json").write_text(json.dumps(params))
    run = ["--profile", "tiny", "--root", str(root), "--stages", "cells", "--cells", "outcome-r1-*"]
    assert main(run) == 0, "a cell of an unchanged world was refused"
    path, heldout = root / "params" / "tiny.yaml", fingerprint(world / "problems" / "heldout.jsonl")
    data = yaml.safe_load(path.read_text())
    given = data | {"world": data["world"] | {"heldout": "outputs/smoke/world/problems/heldout.jsonl"}}
    path.write_text(yaml.safe_dump(given))
    capsys.readouterr()
    assert main(run) == 2
    assert f"outcome-r1-s0: world.heldout 'none' -> {heldout!r}" in capsys.readouterr().err
    (folder / "params.json").write_text(json.dumps(params | {"world_fingerprints": read | {"heldout": heldout}}))
    assert main(run) == 0, "the cell read the held-out set the profile gives"
    path.write_text(yaml.safe_dump(data))
    assert main(run) == 2
    assert f"outcome-r1-s0: world.heldout {heldout!r} -> 'none'" in capsys.readouterr().err


def built_world(root: Path) -> tuple[Path, dict, dict[str, str]]:
    """The tiny profile's world as its build leaves it (a manifest of the profile's settings and every component):
    its folder, the profile's build settings and the components' keys."""
    world, build = root / "outputs" / "smoke" / "world", profile_of(root).build_world
    config = config_from_parameters(**{k: v for k, v in build.items() if k in BUILD_PARAMETERS})
    for name in ("control", "tokenizer"):
        (world / name).mkdir()
        (world / name / "data.json").write_text("{}")
    keys = component_keys(config)
    write_json_atomic(world / "manifest.json", {"config": asdict(config),
                                                "components": {name: {"key": keys[name]} for name in keys}})
    return world, build, keys


def test_a_world_build_that_would_replace_what_finished_cells_read_is_refused_before_it_starts(root, monkeypatch,
                                                                                               capsys):
    world, build, keys = built_world(root)

    def finished(folder: Path, record: dict) -> None:
        folder.mkdir(parents=True)
        (folder / "params.json").write_text(json.dumps({"world_fingerprints": record}))
        (folder / "summary.json").write_text("{}")

    finished(cell_dir(root, "outcome-r1-s0"), {"student": fingerprint(world / "student"), "problems": "elsewhere"})
    finished(root / "outputs" / "other" / "cells" / "process-r1-s0", {"prm": fingerprint(world / "prm")})
    finished(root / "outputs" / "other" / "cells" / "outcome-r1-s1", {"student": "another world's"})
    built = []
    monkeypatch.setattr(stages, "run_stage", lambda *args: built.append(args))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "world"]) == 0 and len(built) == 1, (
        "an up-to-date world was refused")
    path = root / "params" / "tiny.yaml"
    path.write_text(path.read_text().replace(f"seed: {build['seed']}", f"seed: {build['seed'] + 1}", 1))
    capsys.readouterr()
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "world"]) == 2
    error = capsys.readouterr().err
    assert len(built) == 1, "the world was built although finished cells read it"
    assert (f"building the world in {world} would replace problems, control, tokenizer, student, teacher, prm (its "
            f"settings changed: seed {build['seed']} -> {build['seed'] + 1}), which 2 finished cell(s) read") in error
    assert f"{root / 'outputs' / 'tiny' / 'cells'}: 1 cell(s): outcome-r1-s0" in error, error
    assert f"{root / 'outputs' / 'other' / 'cells'}: 1 cell(s): process-r1-s0\n" in error, "another profile's cell"
    assert "move or delete their folders to rebuild" in error, error
    path.write_text(path.read_text().replace(f"seed: {build['seed'] + 1}", f"seed: {build['seed']}", 1))
    write_json_atomic(world / "manifest.json", read_json(world / "manifest.json") | {
        "components": {name: {"key": "an older builder's" if name == "prm" else keys[name]} for name in keys}})
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "world"]) == 2
    error = capsys.readouterr().err
    assert "would replace prm (its builder changed since it was built), which 1 finished cell(s)" in error, error
    assert "outcome-r1-s0" not in error, "a cell that did not read the PRM was named"


def test_a_refused_world_build_says_a_missing_component_folder_is_missing(root, monkeypatch, capsys):
    world, _, keys = built_world(root)
    folder = cell_dir(root, "process-r1-s0")
    folder.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps({"world_fingerprints": {"prm": fingerprint(world / "prm")}}))
    (folder / "summary.json").write_text("{}")
    shutil.rmtree(world / "teacher")
    write_json_atomic(world / "manifest.json", read_json(world / "manifest.json") | {
        "components": {name: {"key": "an older builder's" if name == "prm" else keys[name]} for name in keys}})
    monkeypatch.setattr(stages, "run_stage", lambda *args: pytest.fail("the world was built"))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "world"]) == 2
    error = capsys.readouterr().err
    assert ("would replace teacher, prm (its teacher folder is missing; its builder changed since it was built), "
            "which 1 finished cell(s)") in error, error


def test_a_world_another_run_is_reading_is_not_rebuilt_under_it_and_the_cells_stage_reads_it(root, monkeypatch,
                                                                                             capsys):
    world, build, _ = built_world(root)
    built = []
    monkeypatch.setattr(stages, "run_stage", lambda *args: built.append(args))
    world_stage = ["--profile", "tiny", "--root", str(root), "--stages", "world"]
    with reading(world):  # another run's baseline or cells
        assert main(world_stage) == 0 and len(built) == 1, "an up-to-date world was refused to its readers"
        path = root / "params" / "tiny.yaml"
        path.write_text(path.read_text().replace(f"seed: {build['seed']}", f"seed: {build['seed'] + 1}", 1))
        capsys.readouterr()
        assert main(world_stage) == 2 and len(built) == 1, "the world was rebuilt under a run reading it"
        assert f"{world} is being read by another run" in capsys.readouterr().err
    assert main(world_stage) == 0 and len(built) == 2, "the rebuild did not run once the reader was done"

    refused = []

    def cells_stage(*args):
        with pytest.raises(FolderInUse) as caught:
            with replacing(world, "a rebuild"):
                pass
        refused.append(caught.value)
        return types.SimpleNamespace(ok=True, counts={})

    monkeypatch.setattr(stages, "stage_cells", cells_stage)
    path.write_text(path.read_text().replace(f"seed: {build['seed'] + 1}", f"seed: {build['seed']}", 1))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells"]) == 0
    assert len(refused) == 1, "the cells stage ran without holding its world against a rebuild"


def test_a_run_that_builds_its_world_holds_it_against_a_rebuild_from_the_build_to_its_last_reading_stage(
        root, monkeypatch):
    world, refused = root / "outputs" / "smoke" / "world", []

    def another_runs_rebuild(*args):  # as another profile's world stage, at each point this run passes
        with pytest.raises(FolderInUse) as caught:
            with replacing(world, "a rebuild"):
                pass
        refused.append(caught.value)

    def cells_stage(*args):
        another_runs_rebuild()
        return types.SimpleNamespace(ok=True, counts={})

    monkeypatch.setattr(stages, "run_stage", lambda *args: None)
    monkeypatch.setattr(cli, "check_world", another_runs_rebuild)  # just after the world stage
    monkeypatch.setattr(stages, "stage_cells", cells_stage)
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "world,cells"]) == 0
    assert len(refused) == 2, "the world was free to rebuild between the world stage and the cells"
    with replacing(world, "a rebuild once the run is done"):
        pass


def test_a_finished_cell_with_a_damaged_params_file_is_named_and_kept(root, capsys):
    assert run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-*").finished == ["outcome-r1-s0"]
    (cell_dir(root, "outcome-r1-s0") / "params.json").write_text('{"regime": ')
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells"]) == 2
    error = capsys.readouterr().err
    assert "outcome-r1-s0/params.json is not valid JSON" in error and "move or delete the cell folder" in error, error
    assert (cell_dir(root, "outcome-r1-s0") / "summary.json").is_file(), "the finished cell was touched"


def test_stacked_arms_run_as_one_job_whose_notebook_and_log_are_the_groups(root, monkeypatch, capsys):
    path = root / "params" / "tiny.yaml"
    path.write_text(path.read_text().replace("engine: peft", "engine: stacked"))
    (cell_dir(root, "outcome-rfull-s0") / "summary.json").parent.mkdir(parents=True)
    (cell_dir(root, "outcome-rfull-s0") / "summary.json").write_text("{}")  # finished before: not rerun
    report = run_matrix(profile_of(root), root, TRAIN, jobs=2)
    assert report.ok and sorted(report.finished) == ["outcome-r1-s0", "process-r1-s0", "process-rfull-s0"]
    assert report.skipped == ["outcome-rfull-s0"]
    note = "note: 1 stacked group(s) train without some of their arms (outcome-s0: 1 of 2 arms)"
    assert note in capsys.readouterr().err, "an arm trained without its finished neighbour must be flagged"
    process = read_json(cell_dir(root, "process-r1-s0") / "params.json")
    assert process["arms"] == [1, "full"], "a regime and seed's unfinished arms train in one notebook run"
    assert read_json(cell_dir(root, "outcome-r1-s0") / "params.json")["arms"] == [1]
    group = root / "outputs" / "tiny" / "groups" / "process-s0"
    assert {"cell.ipynb", "run.log"} <= {p.name for p in group.iterdir()}


def test_a_groups_rerun_keeps_the_notebook_and_log_of_its_arms_that_finished(root, capsys):
    path = root / "params" / "tiny.yaml"
    data = yaml.safe_load(path.read_text())
    data["cell"]["engine"], data["matrix"]["ranks"] = "stacked", [1, 2]
    path.write_text(yaml.safe_dump(data))
    group = root / "outputs" / "tiny" / "groups" / "outcome-s0"
    group.mkdir(parents=True)
    (group / "run.log").write_text("the run that finished outcome-rfull-s0")
    cell_dir(root, "outcome-rfull-s0").mkdir(parents=True)
    (cell_dir(root, "outcome-rfull-s0") / "summary.json").write_text("{}")
    report = run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-*")
    assert sorted(report.finished) == ["outcome-r1-s0", "outcome-r2-s0"]
    [kept] = [p for p in group.parent.iterdir() if p.name.startswith("outcome-s0.earlier-")]
    assert (kept / "run.log").read_text() == "the run that finished outcome-rfull-s0", \
        "the only log of a finished arm was cleared with its group's folder"
    assert "finished: its notebook and log are kept in" in capsys.readouterr().err
    assert {"cell.ipynb", "run.log"} <= {p.name for p in group.iterdir()}, "the rerun writes its own notebook and log"


def test_each_concurrent_cell_gets_its_own_gpus(root, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "1")
    report = run_matrix(profile_of(root), root, TRAIN, gpus=["5", "7"])
    assert len(report.finished) == 4
    given = {name: read_json(cell_dir(root, name) / "params.json")["gpus"] for name in report.finished}
    assert set(given.values()) == {"5", "7"}, f"cells should run on GPU 5 or 7, two at once: {given}"


def test_gpu_list_is_split_into_one_slot_per_cell(capsys):
    smoke, paper = (load_profile(REPO_ROOT / "params" / f"{name}.yaml") for name in ("smoke", "paper"))
    assert gpu_slots("0,1,2", smoke) == ["0", "1", "2"]
    assert "puts its cells on the CPU" in capsys.readouterr().err, "a CPU profile given GPUs says it will not use them"
    assert gpu_slots("0,1,2,3,4", paper) == ["0,1", "2,3"], "paper cells put the teacher and PRM on cuda:1"
    error = capsys.readouterr().err
    assert "CPU" not in error, "a GPU profile's cells use the GPUs given"
    assert "GPU(s) 4 stay unused" in error, "a GPU left over says so"
    for bad, message in (("0,0", "distinct GPU indices"), ("a,b", "distinct GPU indices"), ("3", "on 2 GPUs")):
        with pytest.raises(ValueError, match=message):
            gpu_slots(bad, paper)


@pytest.mark.parametrize("options, message", [(["--gpus", ""], "distinct GPU indices"),
                                              (["--gpus", "0", "--executor", "local"], "cluster.gpus_per_node")])
def test_gpus_that_would_be_ignored_are_refused(root, capsys, options, message):
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells", *options]) == 2
    assert message in capsys.readouterr().err
    assert not (root / "outputs" / "tiny" / "cells").exists(), "a cell ran although the run was refused"


def test_failing_cell_does_not_stop_the_others(root, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "process-r1-*")
    report = run_matrix(profile_of(root), root, TRAIN, cells_filter="process-*", jobs=2)
    assert not report.ok and report.finished == ["process-rfull-s0"]
    [failure] = report.failed
    assert failure.name == "process-r1-s0"
    assert "RuntimeError: fake failure in process-r1-s0" in failure.error
    assert failure.notebook == cell_dir(root, "process-r1-s0") / "cell.ipynb" and failure.notebook.is_file()
    assert "fake failure" in failure.log.read_text()
    assert not (cell_dir(root, "process-r1-s0") / "summary.json").exists()


def test_leftover_folder_is_cleared_and_rerun(root):
    leftover = cell_dir(root, "outcome-r1-s0")
    leftover.mkdir(parents=True)
    (leftover / "junk.txt").write_text("from a killed run")
    report = run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-s0")
    assert report.finished == ["outcome-r1-s0"]
    assert not (leftover / "junk.txt").exists() and (leftover / "summary.json").is_file()


def test_run_stage_failure_names_notebook_and_error(root, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "*")
    output = root / "stage" / "out.ipynb"
    with pytest.raises(NotebookFailed) as caught:
        run_stage(root / TRAIN, output, {"cells_dir": str(root / "stage")}, root)
    message = str(caught.value)
    assert "train_cell.py" in message and str(output) in message and "RuntimeError: fake failure" in message
    assert output.is_file() and sorted(p.name for p in output.parent.iterdir()) == ["out.ipynb", "outcome-r1-s0"]


@pytest.mark.parametrize("name, notebook, choose_rate_by", [("mini_sweep", "sweep_analysis.py", "final"),
                                                          ("mini_sweep_stopping", "sweep_analysis.py", "best_step"),
                                                          ("mini", "analysis.py", None)])
def test_only_a_sweeps_analysis_is_told_how_to_choose_its_rates(tmp_path, monkeypatch, name, notebook,
                                                                 choose_rate_by):
    stages_run = []
    monkeypatch.setattr(stages, "run_stage",
                        lambda path, output, parameters, root: stages_run.append((path, parameters)))
    profile = load_profile(REPO_ROOT / "params" / f"{name}.yaml")
    stages.stage_analysis(profile, tmp_path)
    (path, parameters), *comparisons = stages_run
    assert path.name == notebook and parameters.get("choose_rate_by") == choose_rate_by, parameters
    assert parameters["planned_cells"] == [cell.name for cell in profile.cells()], "the report says what it covers"
    assert not comparisons


def test_cli_bad_profile_exits_2_before_any_work(root, capsys):
    (root / "params" / "tiny.yaml").write_text(
        (root / "params" / "tiny.yaml").read_text().replace("- 1\n", "- 0\n", 1))
    assert main(["--profile", "tiny", "--root", str(root)]) == 2
    assert "tiny.yaml: matrix.ranks[0] = 0: expected a positive integer" in capsys.readouterr().err
    assert not (root / "outputs" / "tiny").exists()


def test_a_world_with_fewer_held_out_problems_than_the_cells_score_is_refused_before_the_baseline(root, capsys):
    heldout = root / "outputs" / "smoke" / "world" / "problems" / "heldout.jsonl"
    heldout.write_text("{}\n" * 3)
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "baseline,cells"]) == 2
    error = capsys.readouterr().err
    assert f"{heldout} holds 3 problems, and the outcome cells ask for 8" in error, error
    ran = [p.name for p in (root / "outputs" / "tiny").iterdir() if p.name in ("baseline", "cells")]
    assert not ran, f"{ran} ran on a world too small for them"


def test_a_profile_section_a_stage_notebook_does_not_take_is_refused_before_any_work(root, capsys):
    data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
    data["kl_bound"] = {"out_dir": "outputs/tiny/kl_bound", "epoch": 1}  # a typo of epochs
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    shutil.copy(REPO_ROOT / "notebooks" / "kl_bound.py", root / "notebooks" / "kl_bound.py")
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "kl_bound"]) == 2
    error = capsys.readouterr().err
    assert "tiny.yaml: kl_bound.epoch: unknown key; the parameters of notebooks/kl_bound.py: out_dir, seeds, epochs" \
        in error, error
    assert not (root / "outputs" / "tiny" / "kl_bound").exists(), "the stage ran on its defaults"


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO_ROOT / "params").glob("*.yaml")))
def test_every_shipped_profile_passes_its_stage_notebooks_only_their_parameters_and_reads_its_worlds_answers(name):
    profile = load_profile(REPO_ROOT / "params" / f"{name}.yaml")
    check_notebook_sections(profile, REPO_ROOT, ["world", "kl_bound"])
    check_build_world(profile)


@pytest.mark.parametrize("setting, value, said", [
    ("seed", "0", "build_world: world setting seed must be an integer, as the preset's 0; got '0'"),
    ("size", "hueg", "build_world: unknown world size 'hueg'"),
    ("overrides", {"student": {"hidden": "96"}}, "build_world: world setting student.hidden must be an integer"),
    ("overrides", {"student": {"hidden": True}}, "build_world: world setting student.hidden must be an integer"),
])
def test_a_bad_build_world_setting_is_named_before_any_stage_runs(root, capsys, setting, value, said):
    data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
    data["build_world"][setting] = value
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "world"]) == 2
    error = capsys.readouterr().err
    assert f"tiny.yaml: {said}" in error, error


def test_a_mini_world_read_as_math_data_is_named_before_any_stage_runs(root, capsys):
    data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
    data["data"] = {"prompt_template": "Solve: {problem}"}
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    problems = root / "outputs" / "smoke" / "world" / "problems" / "train.jsonl"
    problems.write_text('{"problem_id": "p0", "prompt": "1 + 1 =", "answer": "2"}\n')
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "baseline"]) == 2
    error = capsys.readouterr().err
    assert "is a mini-world problems folder (train.jsonl of prompts), which data.prompt_template would read as a " \
           "MATH-schema dataset" in error, error


def test_a_profile_that_checks_answers_in_another_format_than_its_worlds_task_is_refused(root, capsys):
    data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
    data["build_world"]["size"] = "smoke_mult"  # last-integer answers; the profile keeps the boxed default
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "analysis"]) == 2
    error = capsys.readouterr().err
    assert "cell.answer_format = 'boxed', but the world it builds (MultiplicationTask) states its answers as " \
           "'last_integer': set cell.answer_format: last_integer" in error, error


def test_a_ctrl_c_while_the_command_line_loads_says_so_in_one_line(monkeypatch, capsys):
    loading = types.ModuleType("reward_density.run.cli")

    def interrupted(name: str):
        if name == "main":  # `from .cli import main`: a Ctrl-C that lands while the imports (seconds) run
            raise KeyboardInterrupt
        raise AttributeError(name)

    loading.__getattr__ = interrupted
    monkeypatch.setitem(sys.modules, "reward_density.run.cli", loading)
    try:
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_module("reward_density.run", run_name="__main__")
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C escaped the command line as a KeyboardInterrupt traceback")
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted before the run started\n"


def test_cli_missing_stage_notebook(root, capsys):
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "world"]) == 1
    assert "notebooks/build_world.py does not exist" in capsys.readouterr().err
    record = run_records(root)[-1]
    assert list(record["stages"]) == ["world"], "a stage that fails is timed and recorded too"
    assert record["outcome"] == "failed"


def run_records(root: Path) -> list[dict]:
    """The tiny profile's stage-time records, one per run."""
    return [json.loads(line) for line in (root / "outputs" / "tiny" / "runs.jsonl").read_text().splitlines()]


def test_each_run_appends_its_stage_times_with_the_machine_and_the_code(root, capsys):
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells,analysis", "--jobs", "2"]) == 0
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells,kl_bound"]) == 0
    first, second = run_records(root)
    assert list(first["stages"]) == ["cells", "analysis"], "the stages run, in order"
    assert first["cells"] == {"finished": 4, "skipped": 0, "failed": 0} and first["jobs"] == 2
    assert first["outcome"] == second["outcome"] == "finished"
    assert second["cells"] == {"finished": 0, "skipped": 4, "failed": 0}, "the rerun skipped every cell"
    assert list(second["stages"]) == ["cells"], "a profile without a KL bound has no such stage to time"
    cells = first["stages"]["cells"]
    assert cells["cpu_seconds"] > 1.0, f"four cell processes' CPU time must be counted: {cells}"
    stages_wall = sum(stage["wall_seconds"] for stage in first["stages"].values())
    assert first["wall_seconds"] >= stages_wall - 0.2, "the run's wall time holds its stages' (each rounded)"
    assert first["git"]["commit"] and first["device"] and first["versions"]["torch"], "the code and machine"
    assert re.search(r"^cells: \d+ s wall, \d+ s CPU", capsys.readouterr().err, re.M), "each stage prints its time"


def test_the_analysis_stage_runs_its_notebook_with_the_profiles_settings_and_planned_cells(root, capsys):
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "analysis"]) == 0
    outputs = root / "outputs" / "tiny"
    report = read_json(outputs / "report.md")
    assert report == {"profile": "tiny", "outputs_dir": str(outputs), "equivalence_margin": 0.05,
                      "confidence": 0.95, "finished": [],
                      "planned_cells": ["outcome-r1-s0", "outcome-rfull-s0", "process-r1-s0", "process-rfull-s0"]}
    assert str(outputs / "report.md") in capsys.readouterr().err


def summaries(root: Path) -> dict[str, int]:
    """Cell name -> summary.json mtime, for every finished cell."""
    return {p.parent.name: p.stat().st_mtime_ns for p in (root / "outputs/tiny/cells").glob("*/summary.json")}


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_run_stopped_by_a_signal_keeps_its_finished_cells_and_a_rerun_finishes_the_rest(root, stop):
    env = {**os.environ, "FAKE_SLEEP": "2"}
    command = [sys.executable, "-m", "reward_density.run", "--profile", "tiny", "--root", str(root),
               "--stages", "cells"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not summaries(root) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    process.send_signal(stop)
    try:
        assert process.wait(timeout=20) == 130, f"the runner died of {stop.name} instead of stopping its cells"
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"the runner ignored {stop.name}")
    first = summaries(root)
    assert list(first) == ["outcome-r1-s0"], process.stderr.read().decode()
    assert run_records(root)[-1]["outcome"] == "interrupted", "the runs log must say the run was stopped"
    for folder in (root / "outputs/tiny/cells").iterdir():
        assert not (folder / "summary.json").exists() or (folder / "params.json").exists()
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells", "--jobs", "2"]) == 0
    after = summaries(root)
    assert sorted(after) == ["outcome-r1-s0", "outcome-rfull-s0", "process-r1-s0", "process-rfull-s0"]
    assert after["outcome-r1-s0"] == first["outcome-r1-s0"]


def test_a_signal_during_a_stage_other_than_the_cells_stops_the_run_as_ctrl_c_does_and_is_recorded(root, monkeypatch):
    def stopped(*args):  # as SIGTERM or a closed terminal reaching the runner in the middle of the analysis
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(stages, "stage_analysis", stopped)
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "analysis"]) == 130
    assert run_records(root)[-1]["outcome"] == "interrupted", "the runs log must say the run was stopped"


def test_a_hangup_a_run_was_told_to_ignore_stays_ignored_while_it_runs_its_cells():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it
    try:
        with stop_signals_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, "nohup's ignore was replaced"
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_second_run_of_a_profile_is_refused_while_one_is_in_progress_and_its_cells_are_kept(root, capsys):
    assert run_matrix(profile_of(root), root, TRAIN, cells_filter="outcome-r1-*").finished == ["outcome-r1-s0"]
    running = cell_dir(root, "outcome-r1-s0")
    (running / "summary.json").unlink()  # as a cell the first run is still training
    before = {path.name: path.stat().st_mtime_ns for path in running.iterdir()}
    with exclusive(root / "outputs" / "tiny", "the first run"):
        assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells"]) == 2
        error = capsys.readouterr().err
        assert main(["--profile", "tiny", "--root", str(root), "--stages", "analysis"]) == 0, \
            "an analysis may read a run in progress"
    assert f"is in use by pid {os.getpid()}" in error and "a run of profile tiny cannot start" in error, error
    assert {path.name: path.stat().st_mtime_ns for path in running.iterdir()} == before, \
        "the second run touched the first run's cell"
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells"]) == 0, "the first run is over"


def test_a_world_build_waits_for_another_build_of_that_world(tmp_path, capsys):
    held, order = threading.Event(), []

    def first() -> None:
        with exclusive(tmp_path, "the first build"):
            held.set()
            time.sleep(0.3)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait()
    with exclusive(tmp_path, "the second build", wait=True):
        order.append("second starts")
    thread.join()
    assert order == ["first done", "second starts"]
    assert "the second build: waiting for pid" in capsys.readouterr().err


def test_the_kl_bound_stage_runs_its_notebook_once_per_parameters(root, capsys):
    data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
    data["kl_bound"] = {"out_dir": "outputs/tiny/kl_bound", "seeds": 1, "epochs": 1, "ranks": [1, 2]}
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    shutil.copy(REPO_ROOT / "notebooks" / "kl_bound.py", root / "notebooks" / "kl_bound.py")
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "kl_bound"]) == 0
    table = (root / "outputs/tiny/kl_bound/kl_bound.csv").read_text()
    assert table.count("\n") == 3, "one row per seed and rank"
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "kl_bound"]) == 0
    assert "holds these results already; skipped" in capsys.readouterr().err
    notebook = root / "notebooks" / "kl_bound.py"
    notebook.write_text(notebook.read_text() + "\nprint('a changed notebook')\n")
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "kl_bound"]) == 0
    assert "skipped" not in capsys.readouterr().err, "a changed notebook was taken for the one that wrote the results"


def test_the_kl_bound_stage_of_a_profile_without_one_says_it_has_nothing_to_do(root, capsys):
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "kl_bound"]) == 0
    assert "kl_bound: profile tiny has no kl_bound section; nothing to do" in capsys.readouterr().err


def test_the_committed_kl_bound_results_are_keyed_to_todays_code_so_a_fresh_clone_keeps_them():
    committed = read_json(REPO_ROOT / "outputs" / "mini" / "kl_bound" / stages.KEY_FILE)
    assert committed == stages.kl_bound_key(load_profile(REPO_ROOT / "params" / "mini.yaml"), REPO_ROOT), (
        "outputs/mini/kl_bound was computed for other code or parameters: ./run_all.sh would redo it and overwrite "
        "the committed results; rerun `./run_all.sh --stages kl_bound` and commit its outputs")


def test_rewrapping_the_experiments_code_does_not_redo_its_results(tmp_path):
    source = "def f(x):\n    return x + 1  # one\n"
    (tmp_path / "a.py").write_text(source)
    (tmp_path / "b.py").write_text("def f(x):\n    return (\n        x + 1\n    )\n")
    (tmp_path / "c.py").write_text(source.replace("+ 1", "+ 2"))
    fingerprints = [code_fingerprint(tmp_path / name) for name in ("a.py", "b.py", "c.py")]
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]


FAKE_BASELINE = '''# %% tags=["parameters"]
out_dir = ""

# %%
from pathlib import Path
runs = Path(out_dir) / "runs.txt"
runs.parent.mkdir(parents=True, exist_ok=True)
runs.write_text((runs.read_text() if runs.exists() else "") + "run\\n")
'''


def test_the_baseline_is_measured_once_per_world_and_evaluation_settings(root):
    (root / "notebooks" / "capability_baseline.py").write_text(FAKE_BASELINE)
    runs = root / "outputs" / "tiny" / "baseline" / "runs.txt"

    def baseline(**cell) -> int:
        data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
        data["cell"].update(cell)
        (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
        assert main(["--profile", "tiny", "--root", str(root), "--stages", "baseline"]) == 0
        return runs.read_text().count("run")

    assert baseline() == 1
    assert baseline(beta=0.0, lora_alpha=8) == 1, "settings the base evaluation does not read must not re-measure it"
    assert baseline(eval_max_new_tokens=9) == 2, "a base evaluation setting changed"
    (root / "outputs" / "smoke" / "world" / "problems" / "heldout.jsonl").write_text("{}\n" * 8)  # eval_problems
    assert baseline() == 3, "a rebuilt world (its held-out problems changed) is measured anew"
    assert baseline() == 3
    (runs.parent / "key.json").write_text("{")
    assert baseline() == 4, "a damaged key cannot say what was measured, so the baseline is measured anew"
    assert baseline() == 4
    data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
    data["baseline"] = {"batch_size": 64}
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    assert baseline() == 4, "the default batch, written out, is the same measurement"
    data["baseline"] = {"batch_size": 8}
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
    assert baseline() == 5, "another batch draws other samples"


@pytest.mark.parametrize("stage, section, key, values", [("baseline", "cell", "eval_max_new_tokens", (16, 9)),
                                                         ("kl_bound", "kl_bound", "seeds", (1, 2))])
def test_a_keyed_stage_that_fails_on_a_rerun_is_redone_rather_than_kept_under_its_old_key(root, monkeypatch, stage,
                                                                                          section, key, values):
    runs, failing = [], []

    def run_stage(notebook, output, parameters, root_):
        runs.append(parameters)
        if failing:  # as a notebook that rewrote some of its results, then raised
            raise NotebookFailed(Path(notebook), Path(output), "AssertionError")

    monkeypatch.setattr(stages, "run_stage", run_stage)
    shutil.copy(REPO_ROOT / "notebooks" / "kl_bound.py", root / "notebooks" / "kl_bound.py")  # in the stage's key
    data = yaml.safe_load((root / "params" / "tiny.yaml").read_text())
    data["kl_bound"] = {"out_dir": "outputs/tiny/kl_bound"}

    def run(value) -> int:
        data[section][key] = value
        (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(data))
        return main(["--profile", "tiny", "--root", str(root), "--stages", stage])

    assert run(values[0]) == 0 and len(runs) == 1
    failing.append(True)
    assert run(values[1]) == 1 and len(runs) == 2
    failing.clear()
    assert run(values[0]) == 0 and len(runs) == 3, "the failed run's partial results passed for the first run's"


FAKE_METHODS = '''# %% tags=["parameters"]
outputs_dir = ""
methods = {}

# %%
import json
from pathlib import Path
(Path(outputs_dir) / "method_comparison.md").write_text(json.dumps(methods))
'''


def test_the_analysis_stage_compares_the_methods_a_profile_names(root):
    (root / "notebooks" / "method_comparison.py").write_text(FAKE_METHODS)
    profile = root / "params" / "tiny.yaml"
    data = yaml.safe_load(profile.read_text())
    data["analysis"]["methods"] = {"GRPO": "smoke", "T-SPMO": "tiny"}
    profile.write_text(yaml.safe_dump(data))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "analysis"]) == 0
    outputs = root / "outputs" / "tiny"
    assert read_json(outputs / "method_comparison.md") == {"GRPO": "smoke", "T-SPMO": "tiny"}
    assert "methods" not in read_json(outputs / "report.md"), "the main analysis does not receive the comparison's key"


@pytest.fixture
def stage_calls(monkeypatch) -> list[tuple[str, dict]]:
    """The stage notebooks called (name, parameters), none of them run."""
    calls = []
    monkeypatch.setattr(stages, "run_stage",
                        lambda path, output, parameters, root: calls.append((path.name, parameters)))
    return calls


def test_a_replication_is_analysed_as_a_study_then_set_beside_the_study_it_replicates(tmp_path, stage_calls):
    stages.stage_analysis(load_profile(REPO_ROOT / "params" / "mini_world1.yaml"), tmp_path)
    (study, parameters), (comparison, compared) = stage_calls
    assert study == "analysis.py"
    assert set(parameters) == {"profile", "outputs_dir", "equivalence_margin", "confidence", "planned_cells"}
    assert comparison == "replication.py"
    assert (compared["replicates"], compared["replicates_dir"]) == ("mini", str(tmp_path / "outputs" / "mini"))
    assert compared["outputs_dir"] == str(tmp_path / "outputs" / "mini_world1")


@pytest.mark.parametrize("key, value", [("compare_with", "mini_typo"), ("replicates", "mini_typo"),
                                        ("methods", {"GRPO": "mini_typo", "T-SPMO": "tiny"})])
def test_a_study_to_compare_with_that_has_no_outputs_stops_the_run_before_training(root, capsys, key, value):
    path = root / "params" / "tiny.yaml"
    data = yaml.safe_load(path.read_text())
    data["analysis"][key] = value
    path.write_text(yaml.safe_dump(data))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells,analysis"]) == 2
    error = capsys.readouterr().err
    assert "'mini_typo'" in error and "run that study first" in error, error
    assert not (root / "outputs" / "tiny" / "cells").exists(), "cells trained for an analysis that cannot run"


def test_a_method_study_before_the_last_runs_before_the_methods_after_it_have_outputs(root):
    path = root / "params" / "tiny.yaml"
    data = yaml.safe_load(path.read_text())
    data["analysis"]["methods"] = {"GRPO": "tiny", "T-SPMO": "not_run_yet"}  # `papers` runs tiny first
    path.write_text(yaml.safe_dump(data))
    assert main(["--profile", "tiny", "--root", str(root), "--stages", "cells,analysis"]) == 0


def test_the_kl_comparison_reads_the_study_with_kl_under_the_runs_root(tmp_path, stage_calls):
    stages.stage_analysis(load_profile(REPO_ROOT / "params" / "mini_klfree.yaml"), tmp_path)
    (study, _), (comparison, compared) = stage_calls
    assert (study, comparison) == ("analysis.py", "kl_comparison.py")
    assert (compared["compare_with"], compared["compare_with_dir"]) == ("mini", str(tmp_path / "outputs" / "mini")), \
        "under --root the comparison read the checkout's outputs/mini"


def test_papers_runs_every_comparison_after_the_studies_it_reads():
    """`./run_all.sh papers`: the profile that writes a comparison (compare_with, or the last of its methods)
    comes after every study the comparison reads, and every such profile is in the list."""
    line = next(l for l in (REPO_ROOT / "run_all.sh").read_text().splitlines() if l.startswith("PAPERS=("))
    papers = line[len("PAPERS=("):line.index(")")].split()
    assert papers[0] == "mini", "the default study runs first: every comparison reads it"
    for index, name in enumerate(papers):
        analysis = load_profile(REPO_ROOT / "params" / f"{name}.yaml").analysis
        methods = list((analysis.get("methods") or {}).values())
        read = [analysis.get("compare_with")] + (methods if methods[-1:] == [name] else [])
        missing = [other for other in read if other and other not in papers[: index + 1]]
        assert not missing, f"{name} compares with {missing}, which `papers` does not run before it"
    comparing = {path.stem for path in (REPO_ROOT / "params").glob("*.yaml")
                 if any(load_profile(path).analysis[key] for key in COMPARISONS)}
    assert comparing <= set(papers), f"profiles with a comparison left out of `papers`: {comparing - set(papers)}"


def test_the_benchmark_stage_is_opt_in_and_writes_where_the_analysis_reads(root):
    stages = _parser().parse_args(["--profile", "tiny"]).stages
    assert "benchmark" not in stages, "the study's default runs no benchmark"
    named = _parser().parse_args(["--profile", "tiny", "--stages", "analysis,benchmark"]).stages
    assert named == ["benchmark", "analysis"], "the benchmark runs before the analysis that reports it"
    world = root / "outputs" / "smoke" / "world"
    write_problems(world / "problems" / "train.jsonl", [Problem(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(4)])
    stage_benchmark(profile_of(root), root, ("--steps", "1", "--warmup", "0", "--max-new-tokens", "4", "--ranks",
                                             "1,full"))
    outputs = root / "outputs" / "tiny"
    written = read_json(outputs / "benchmark.json")
    assert written["model"]["timed"] == "outputs/smoke/world/student", "the study's own student, named from root"
    assert written["config"]["max_new_tokens"] == 4 and written["environment"]["commit"], "config and commit recorded"
    assert f"**{written['ours_over_trl']:.2f}x**" in speed_markdown(outputs)
    timed = f"completions {written['completion_tokens_mean']:.1f} tokens long on average in the timed steps, against "
    assert timed + "31.7 over the study's training" in speed_markdown(outputs, 31.7)
    write_json_atomic(outputs / "benchmark.json", {k: v for k, v in written.items() if k != "completion_tokens_mean"})
    assert "on average in the profiled rollout (at the base weights)" in speed_markdown(outputs), \
        "a benchmark from before the timed steps' length was recorded names what its length is of"
    (outputs / "benchmark.json").write_text('{"config": ')
    with pytest.raises(ValueError, match=r"benchmark\.json is not valid JSON"):
        speed_markdown(outputs)


def test_the_benchmark_stage_times_a_random_stand_in_where_the_study_has_no_built_student_saying_so(root, capsys):
    assert benchmark_workload(profile_of(root), root)[::2] == ("--student", "--problems")
    (root / "outputs" / "smoke" / "world" / "student" / "config.json").unlink()
    assert benchmark_workload(profile_of(root), root) == ()
    assert "not a built model folder" in capsys.readouterr().err


@pytest.mark.parametrize("stages, said", [("cells,fo", "unknown stage(s) ['fo']"), (" , ", "no stage given")])
def test_a_stage_list_naming_no_known_stage_is_refused_saying_which(stages, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["--profile", "tiny", "--stages", stages])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and said in error and "choose from world, baseline, cells" in error, error


def test_a_notebook_runs_in_a_kernel_whose_traffic_is_encrypted_where_the_installed_packages_can(tmp_path, capfd):
    source = tmp_path / "answer.py"
    source.write_text("# %%\nprint(6 * 7)\n")
    notebooks.execute_notebook(source, tmp_path / "answer.ipynb", {})
    printed = json.loads((tmp_path / "answer.ipynb").read_text())["cells"][0]["outputs"][0]["text"]
    assert "".join(printed) == "42\n"
    error = capfd.readouterr().err
    if notebooks.kernel_config():  # pyzmq with CurveZMQ and jupyter_client 8.10+, as the set-up installs them
        assert "without encryption" not in error, f"the kernel ran unencrypted:\n{error}"


def test_a_notebooks_logged_output_keeps_what_it_printed_and_drops_its_displays_bare_reprs(tmp_path, caplog):
    source = tmp_path / "displays.py"
    source.write_text("# %%\nfrom IPython.display import Markdown, display\n"
                      "display(Markdown('**a table**'))\nprint('<b>printed</b>')\n")
    with caplog.at_level(logging.INFO, logger="papermill"):
        notebooks.execute_notebook(source, tmp_path / "displays.ipynb", {}, log_output=True)
    logged = [record.getMessage() for record in caplog.records if record.name == "papermill"]
    assert "<b>printed</b>\n" in logged, f"a printed line must reach the log: {logged}"
    assert not any("IPython.core.display" in line for line in logged), f"a bare repr reached the log: {logged}"
    kept = json.loads((tmp_path / "displays.ipynb").read_text())["cells"][0]["outputs"][0]
    assert "".join(kept["data"]["text/markdown"]) == "**a table**", "the display itself must stay in the notebook"


def test_a_kernel_that_never_answers_is_started_again_and_other_errors_are_not_retried(tmp_path, monkeypatch):
    calls = []

    def flaky_papermill(notebook, output, *args):
        calls.append(notebook)
        if len(calls) == 1:
            raise RuntimeError("Kernel didn't respond in 60 seconds")
        Path(output).write_text("{}")

    monkeypatch.setattr(notebooks, "_papermill", flaky_papermill)
    output = tmp_path / "out" / "cell.ipynb"
    notebooks.execute_notebook(FIXTURES / "fake_cell.py", output, {})
    assert len(calls) == 2 and output.is_file(), "a kernel start that timed out must be retried once, then succeed"

    def broken_papermill(notebook, output, *args):
        calls.append(notebook)
        raise RuntimeError("something else")

    calls.clear()
    monkeypatch.setattr(notebooks, "_papermill", broken_papermill)
    with pytest.raises(RuntimeError, match="something else"):
        notebooks.execute_notebook(FIXTURES / "fake_cell.py", output, {})
    assert len(calls) == 1, "an error other than a silent kernel start must not run the notebook again"
    assert not list(output.parent.glob(".fake_cell-*")), "the converted temporary notebook must be removed"

"""The smoke study end to end through the runner: real notebooks, a real (tiny) world, kill and resume."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from reward_density.experiment.profiles import REPO_ROOT, load_profile
from reward_density.run.cli import main

SMOKE = load_profile(REPO_ROOT / "params" / "smoke.yaml")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A project root whose notebooks and params are the real ones, with its own outputs/."""
    root = tmp_path_factory.mktemp("project")
    for name in ("notebooks", "params"):
        (root / name).symlink_to(REPO_ROOT / name)
    assert main(["--profile", "smoke", "--root", str(root), "--stages", "world,baseline"]) == 0
    return root


def summaries(root: Path) -> dict[str, int]:
    """Cell name -> summary.json mtime, for every finished smoke cell."""
    return {p.parent.name: p.stat().st_mtime_ns for p in (root / "outputs/smoke/cells").glob("*/summary.json")}


def test_the_capability_baseline_compares_student_and_teacher(root):
    table = pd.read_csv(root / "outputs/smoke/baseline/capability.csv")
    assert list(table["model"]) == ["student", "teacher"]
    assert {"pass@1", "pass@4", "pass@8", "exploration_gap", "mean_length"} <= set(table.columns)
    assert (root / "outputs/smoke/baseline/capability.png").is_file()


def test_the_baseline_evaluates_the_base_of_the_projects_own_world(root):
    saved = [json.loads(path.read_text()) for path in (root / "outputs/smoke/baseline").glob("base-*.json")]
    assert saved, "the baseline stage saved no base evaluation"
    for evaluation in saved:
        assert Path(evaluation["student"]).is_relative_to(root), f"evaluated {evaluation['student']}, not {root}'s"


def test_a_killed_run_resumes_without_rerunning_finished_cells(root):
    command = [sys.executable, "-m", "reward_density.run", "--profile", "smoke", "--root", str(root),
               "--stages", "cells"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(summaries(root)) < 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # the hardest kill: no cleanup runs anywhere
    process.wait()
    before = summaries(root)
    assert 2 <= len(before) < len(SMOKE.cells()), f"the kill should land mid-run, {len(before)} cells were done"
    for folder in (root / "outputs/smoke/cells").iterdir():
        if (folder / "summary.json").exists():
            assert {"params.json", "history.csv", "evals.csv", "answers.csv", "manifest.json"} <= {
                p.name for p in folder.iterdir()}, f"{folder.name} looks finished but misses files"

    assert main(["--profile", "smoke", "--root", str(root), "--stages", "cells,analysis"]) == 0
    after = summaries(root)
    assert set(after) == {cell.name for cell in SMOKE.cells()}
    assert {name: after[name] for name in before} == before, "a finished cell was run again"


def test_the_analysis_of_the_smoke_study_writes_its_tables_and_report(root):
    outputs = root / "outputs/smoke"
    if not (outputs / "report.md").exists():
        pytest.skip("needs the run of the previous test")
    accuracy = pd.read_csv(outputs / "accuracy.csv")
    assert set(accuracy["regime"]) >= {"outcome", "distillation"}
    assert (outputs / "analysis.ipynb").is_file() and (outputs / "figures").is_dir()
    planned = len(SMOKE.cells())
    assert f"Every one of the {planned} cells the profile plans has finished." in (outputs / "report.md").read_text()
    cell = outputs / "cells" / "process-r1-s0"
    history = pd.read_csv(cell / "history.csv")
    assert list(history["step"]) == list(range(1, SMOKE.cell["steps"] + 1))
    assert "process/steps_mean" in history.columns
    assert (outputs / "groups" / "process-s0" / "cell.ipynb").is_file(), "the smoke profile trains its arms stacked"


def test_a_rerun_group_reproduces_its_numbers_bit_for_bit(root):
    cells = root / "outputs/smoke/cells"
    group = sorted(cells.glob("outcome-*-s0"))
    if not group or not all((folder / "summary.json").exists() for folder in group):
        pytest.skip("needs the run of the resume test")

    def numbers(folder: Path) -> dict[str, pd.DataFrame]:  # everything but wall-clock timings
        frames = {name: pd.read_csv(folder / name) for name in ("history.csv", "evals.csv", "answers.csv")}
        return {name: f[[c for c in f.columns if "seconds" not in c]] for name, f in frames.items()}

    first = {folder.name: numbers(folder) for folder in group}
    for folder in group:
        (folder / "summary.json").unlink()  # unfinished: the runner clears and reruns it
    assert main(["--profile", "smoke", "--root", str(root), "--stages", "cells", "--cells", "outcome-*-s0"]) == 0
    for folder in group:
        for name, frame in numbers(folder).items():
            pd.testing.assert_frame_equal(frame, first[folder.name][name], check_exact=True,
                                          obj=f"{folder.name}/{name} on a second run with the same seed")


def test_each_cell_records_the_world_it_read_and_a_rerun_after_a_rebuild_refuses_the_cells_that_read_it(root, capsys):
    cells = root / "outputs/smoke/cells"
    if not all((cells / cell.name / "summary.json").exists() for cell in SMOKE.cells()):
        pytest.skip("needs the run of the resume test")
    recorded = {folder.name: json.loads((folder / "params.json").read_text())["world_fingerprints"]
                for folder in cells.iterdir()}
    assert {name: sorted(read) for name, read in recorded.items() if name.endswith("-r1-s0")} == {
        "outcome-r1-s0": ["problems", "student"], "process-r1-s0": ["prm", "problems", "student"],
        "distillation-r1-s0": ["problems", "student", "teacher"], "sft-r1-s0": ["control", "student"]}
    prm, before = root / "outputs/smoke/world/prm/config.json", summaries(root)
    original = prm.read_text()
    try:
        prm.write_text(original + "\n")  # the PRM as another build would leave it
        capsys.readouterr()
        assert main(["--profile", "smoke", "--root", str(root), "--stages", "cells"]) == 2
        error = capsys.readouterr().err
    finally:
        prm.write_text(original)
    stale = sorted(line.split(":")[0].strip() for line in error.splitlines() if "world.prm" in line)
    assert stale == [cell.name for cell in SMOKE.cells() if cell.regime == "process"], error
    assert "3 finished cell(s)" in error, error
    assert summaries(root) == before, "a finished cell was touched"

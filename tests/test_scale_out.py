"""Scale-out through submitit: real smoke cells through the local executor, failures, Ctrl-C, a fake Slurm."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from reward_density.experiment import cell_folder
from reward_density.experiment.profiles import REPO_ROOT, load_profile
from reward_density.run.cli import main
from reward_density.run.matrix import Job, job_spec
from reward_density.run.notebooks import FAILURE_PREFIX
from reward_density.run.slurm import (
    IN_FLIGHT,
    JobsInFlight,
    check_no_jobs_in_flight,
    make_executor,
    profile_executor,
    submit_matrix,
    submitit_dir,
)
from reward_density.run.stage_times import RUN_LOG

SMOKE = load_profile(REPO_ROOT / "params" / "smoke.yaml")
TWO_CELLS = "outcome-r1-s0,distillation-rfull-s0"
FINISHED_CELL_FILES = {"params.json", "history.csv", "evals.csv", "answers.csv", "manifest.json", "summary.json",
                       "cell.ipynb", "run.log"}
LOCAL_SETTINGS = {"timeout_min": 10, "slurm_partition": "ignored-locally", "slurm_array_parallelism": 4}

PARAMETERS_CELL = '''# %% tags=["parameters"]
cells_dir = ""
regime = ""
rank = 1
seed = 0

# %%
import pathlib

folders = [pathlib.Path(cells_dir, f"{regime}-r{r}-s{seed}") for r in (rank if isinstance(rank, list) else [rank])]
'''
SUMMARY_NOTEBOOK = PARAMETERS_CELL + '''
# %%
import json

for folder in folders:
    (folder / "summary.json").write_text(json.dumps({"regime": regime}))
'''
FAILING_NOTEBOOK = PARAMETERS_CELL + '''
# %%
if regime == "process":
    raise ValueError("boom from the test notebook")
print("finished without a summary")
'''
SLOW_NOTEBOOK = PARAMETERS_CELL + '''
# %%
import os
import time

(folders[0] / "kernel.pid").write_text(str(os.getpid()))
time.sleep(300)
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A project root whose notebooks and params are the real ones, with its own outputs/ and smoke world."""
    root = tmp_path_factory.mktemp("project")
    for name in ("notebooks", "params"):
        (root / name).symlink_to(REPO_ROOT / name)
    assert main(["--profile", "smoke", "--root", str(root), "--stages", "world"]) == 0
    return root


@pytest.fixture(scope="module")
def submitted(root):
    """Two real smoke cells submitted through submitit's local executor: (report, seconds)."""
    executor = make_executor("local", submitit_dir(SMOKE, root), LOCAL_SETTINGS)
    start = time.monotonic()
    report = submit_matrix(SMOKE, root, Path("notebooks/train_cell.py"), TWO_CELLS, executor, poll_seconds=0.5)
    return report, time.monotonic() - start


def summaries(root: Path) -> dict[str, int]:
    """Cell name -> summary.json mtime, for every finished smoke cell."""
    return {p.parent.name: p.stat().st_mtime_ns for p in (root / "outputs/smoke/cells").glob("*/summary.json")}


def write_notebook(folder: Path, text: str) -> Path:
    """A py:percent notebook source in folder."""
    path = folder / "notebook.py"
    path.write_text(text)
    return path


def test_cells_submitted_through_the_local_executor_finish_with_the_runners_parameters(root, submitted):
    report, seconds = submitted
    assert not report.failed, f"cells failed: {report.failed}"
    assert sorted(report.finished) == sorted(TWO_CELLS.split(",")), f"finished: {report.finished}"
    assert report.skipped == [], f"nothing was finished before, yet skipped: {report.skipped}"
    print(f"two smoke cells through the local executor: {seconds:.1f} s")
    for name in TWO_CELLS.split(","):
        folder = root / "outputs/smoke/cells" / name
        missing = FINISHED_CELL_FILES - {p.name for p in folder.iterdir()}
        assert not missing, f"{name} is reported finished but misses {missing}"
        cell = next(cell for cell in SMOKE.cells() if cell.name == name)
        recorded = json.loads((folder / "params.json").read_text())
        expected = job_spec(Job((cell,)), SMOKE, root, root / "notebooks/train_cell.py")["parameters"]
        expected = {k: v for k, v in expected.items() if k not in ("profile", "cells_dir", "base_answers")}
        differing = {key: (recorded.get(key), value) for key, value in expected.items() if recorded.get(key) != value}
        assert not differing, f"{name} ran with other parameters than the local runner gives: {differing}"
        log = (folder / "run.log").read_text()
        assert f"{name}: job " in log, f"run.log of {name} lacks the job's own output:\n{log[:2000]}"
    assert list(submitit_dir(SMOKE, root).glob("*_log.out")), "submitit wrote no job logs under outputs/smoke/submitit"


def test_the_analysis_picks_up_the_cells_computed_by_jobs(root, submitted):
    assert main(["--profile", "smoke", "--root", str(root), "--stages", "analysis"]) == 0
    accuracy = pd.read_csv(root / "outputs/smoke/accuracy.csv")
    arms = set(zip(accuracy["regime"], accuracy["arm"]))
    assert {("outcome", "r1"), ("distillation", "full")} <= arms, f"the analysis missed a job's cell: {arms}"


class NoSubmissions:
    """An executor that fails the test if anything is submitted."""

    folder = Path("/nonexistent")
    parameters: dict = {}

    def map_array(self, *args, **kwargs):
        raise AssertionError("submit_matrix submitted a job for cells that were all finished")

    submit = batch = map_array


def test_a_second_submission_skips_finished_cells_without_submitting_a_job(root, submitted):
    before = summaries(root)
    report = submit_matrix(SMOKE, root, Path("notebooks/train_cell.py"), TWO_CELLS, NoSubmissions())
    assert sorted(report.skipped) == sorted(TWO_CELLS.split(",")), f"skipped: {report.skipped}"
    assert report.finished == [] and report.failed == [], f"a finished cell was run again: {report}"
    assert summaries(root) == before, "a finished cell's summary.json changed"


def test_a_failing_notebook_and_a_missing_summary_are_reported_not_raised(tmp_path):
    notebook = write_notebook(tmp_path, FAILING_NOTEBOOK)
    executor = make_executor("local", submitit_dir(SMOKE, tmp_path), LOCAL_SETTINGS)
    report = submit_matrix(SMOKE, tmp_path, notebook, "process-r1-s0,outcome-r1-s0", executor, poll_seconds=0.5)
    assert report.finished == [], f"cells without summary.json were reported finished: {report.finished}"
    failures = {failure.name: failure for failure in report.failed}
    assert set(failures) == {"process-r1-s0", "outcome-r1-s0"}, f"failures: {report.failed}"

    raised = failures["process-r1-s0"]
    assert "ValueError: boom from the test notebook" in raised.error, f"unhelpful error: {raised.error!r}"
    assert "boom from the test notebook" in raised.notebook.read_text(), "the executed notebook lacks the error"
    log = raised.log.read_text()
    assert f"{FAILURE_PREFIX}cell " in log and "ValueError" in log, f"run.log lacks the failure:\n{log}"
    assert not (raised.log.parent / cell_folder.SUMMARY).exists(), "a failed cell has a done marker"

    silent = failures["outcome-r1-s0"]
    assert cell_folder.SUMMARY in silent.error and "without writing" in silent.error, f"error: {silent.error!r}"
    assert "finished without a summary" in silent.log.read_text(), "run.log lacks the notebook's output"


def test_jobs_a_killed_runner_left_running_are_named_and_their_cells_kept_not_submitted_twice(tmp_path):
    # submitit's jobs outlive a runner killed with SIGKILL; a rerun that cleared their folders would race them.
    notebook = write_notebook(tmp_path, FAILING_NOTEBOOK)
    executor = make_executor("local", submitit_dir(SMOKE, tmp_path), LOCAL_SETTINGS)
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the earlier run's job
    try:
        in_flight = Path(executor.folder) / IN_FLIGHT
        in_flight.parent.mkdir(parents=True, exist_ok=True)
        in_flight.write_text(json.dumps({"outcome-r1-s0": str(left.pid)}))
        running = tmp_path / "outputs/smoke/cells/outcome-r1-s0"
        running.mkdir(parents=True)
        (running / "events.out").write_text("the running job's")
        with pytest.raises(JobsInFlight, match=rf"outcome-r1-s0 \(job {left.pid}\)"):
            submit_matrix(SMOKE, tmp_path, notebook, "outcome-r1-s0", executor, poll_seconds=0.5)
        assert (running / "events.out").is_file(), "the running job's cell folder was cleared"
    finally:
        left.kill()
        left.wait()
    check_no_jobs_in_flight(executor)  # the job ended: the record goes, and a rerun may submit the cell again
    assert not in_flight.exists()


def process_gone(pid: int) -> bool:
    """Whether a process has exited (a zombie counts as exited)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def test_ctrl_c_while_waiting_cancels_the_running_jobs_and_reraises(tmp_path):
    notebook = write_notebook(tmp_path, SLOW_NOTEBOOK)
    executor = make_executor("local", submitit_dir(SMOKE, tmp_path), LOCAL_SETTINGS)
    pid_file = tmp_path / "outputs/smoke/cells/outcome-r1-s0/kernel.pid"

    def interrupt_once_running():
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    # A shell that starts the suite in the background makes it ignore SIGINT; Ctrl-C is what is tested here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_running, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            submit_matrix(SMOKE, tmp_path, notebook, "outcome-r1-s0", executor, poll_seconds=0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert pid_file.exists(), "the interrupt came before the notebook ran"
    kernel = int(pid_file.read_text())
    deadline = time.monotonic() + 15
    while not process_gone(kernel) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_gone(kernel), f"the notebook's kernel {kernel} still runs after Ctrl-C"
    assert not (pid_file.parent / cell_folder.SUMMARY).exists(), "a cancelled cell has a done marker"


FAKE_SBATCH = '''#!{python}
"""sbatch: run every task of the array now, detached, with the variables Slurm sets; print the job id."""
import os, re, subprocess, sys
script = sys.argv[-1]
text = open(script).read()
array = re.search(r"#SBATCH --array=0-(\\d+)", text)
job = str(4000 + os.getpid() % 1000)
with open(os.environ["FAKE_SLURM_CALLS"], "a") as calls:
    calls.write(f"sbatch {{script}}\\n")
for index in range(int(array.group(1)) + 1 if array else 1):
    env = dict(os.environ, SLURM_JOB_ID=f"{{job}}{{index}}", SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=str(index),
               SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1", SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURM_CPUS_PER_TASK="1")
    subprocess.Popen(["bash", script], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
print(f"Submitted batch job {{job}}")
'''
FAKE_SRUN = '''#!{python}
"""srun: drop the options, send output to the --output/--error files, run the command."""
import os, sys
args, files = sys.argv[1:], {{"--output": os.devnull, "--error": os.devnull}}
while args and args[0].startswith("--"):
    option = args.pop(0)
    if option in files:
        files[option] = args.pop(0)
def fill(path):
    job, task = os.environ["SLURM_ARRAY_JOB_ID"], os.environ["SLURM_ARRAY_TASK_ID"]
    return path.replace("%A", job).replace("%a", task).replace("%t", "0")
os.dup2(os.open(fill(files["--output"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND), 1)
os.dup2(os.open(fill(files["--error"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
os.execvp(args[0], args)
'''
FAKE_SACCT = '''#!{python}
print("JobID|State|NodeList")
'''


def test_the_slurm_path_submits_one_job_array_with_the_settings(tmp_path, monkeypatch):
    bin_dir = tmp_path / "fake-slurm-bin"
    bin_dir.mkdir()
    for name, text in {"sbatch": FAKE_SBATCH, "srun": FAKE_SRUN, "sacct": FAKE_SACCT, "scancel": FAKE_SACCT}.items():
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "slurm-calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_CALLS", str(calls))
    notebook = write_notebook(tmp_path, SUMMARY_NOTEBOOK)
    settings = {"timeout_min": 30, "slurm_partition": "gpu-test", "slurm_array_parallelism": 1, "cpus_per_task": 1,
                "gpus_per_node": 0, "mem_gb": 8}
    executor = make_executor("slurm", submitit_dir(SMOKE, tmp_path), settings)

    report = submit_matrix(SMOKE, tmp_path, notebook, "outcome-r1-s0,process-rfull-s0", executor, poll_seconds=0.5)

    assert not report.failed, f"jobs failed: {report.failed}"
    assert sorted(report.finished) == ["outcome-r1-s0", "process-rfull-s0"], f"finished: {report.finished}"
    sbatch_calls = calls.read_text().splitlines()
    assert len(sbatch_calls) == 1, f"expected one sbatch call for the whole array, got {sbatch_calls}"
    script = Path(sbatch_calls[0].split(" ", 1)[1]).read_text()
    for line in ("#SBATCH --array=0-1%1", "#SBATCH --partition=gpu-test", "#SBATCH --time=30", "#SBATCH --mem=8GB",
                 "#SBATCH --cpus-per-task=1"):
        assert line in script, f"the sbatch script lacks {line!r}:\n{script}"
    summary = json.loads((tmp_path / "outputs/smoke/cells/process-rfull-s0/summary.json").read_text())
    assert summary == {"regime": "process"}, f"the job ran another cell's parameters: {summary}"


def test_make_executor_names_the_kinds_and_requires_a_timeout(tmp_path):
    with pytest.raises(ValueError, match="slurm, local"):
        make_executor("ray", tmp_path, {"timeout_min": 10})
    with pytest.raises(ValueError, match="timeout_min"):
        make_executor("local", tmp_path, {})
    with pytest.raises(NameError, match="partitoin"):  # a misspelt Slurm setting fails even locally
        make_executor("local", tmp_path, {"timeout_min": 10, "slurm_partitoin": "gpu"})


def test_the_runner_cli_sends_cells_to_the_executor_named_on_the_command_line(root, submitted, capsys):
    name = TWO_CELLS.split(",")[0]
    (root / "outputs/smoke/cells" / name / "summary.json").unlink()  # unfinished again
    command = ["--profile", "smoke", "--root", str(root), "--cells", TWO_CELLS, "--executor", "local",
               "--stages", "cells"]
    assert main(command) == 0
    err = capsys.readouterr().err
    assert f"{name}: job " in err and "1 finished cell(s) skipped" in err, err
    assert (root / "outputs/smoke/cells" / name / "summary.json").is_file()
    record = json.loads((root / "outputs/smoke" / RUN_LOG).read_text().splitlines()[-1])
    assert record["executor"] == "local", "the runs log must say which executor ran the cells"


def test_an_executor_whose_nodes_have_fewer_gpus_than_a_cell_addresses_is_refused(tmp_path):
    paper = load_profile(REPO_ROOT / "params" / "paper.yaml")  # student on cuda:0, teacher and PRM on cuda:1
    said = r"places a cell on 2 GPUs \(its cell devices\), but its cluster.gpus_per_node is 1"
    with pytest.raises(ValueError, match=said):
        profile_executor("local", dataclasses.replace(paper, cluster={**paper.cluster, "gpus_per_node": 1}), tmp_path)


def test_an_executor_without_cluster_settings_is_refused_before_any_work(tmp_path, capsys):
    data = yaml.safe_load((REPO_ROOT / "params" / "smoke.yaml").read_text())
    del data["cluster"]
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "smoke.yaml").write_text(yaml.safe_dump(data))
    assert main(["--profile", "smoke", "--root", str(tmp_path), "--executor", "local"]) == 2
    assert "has no `cluster` section" in capsys.readouterr().err
    assert not (tmp_path / "outputs").exists()

"""Scale the matrix out beyond one machine: the unfinished cells of a profile as one submitit job array.

Why submitit: Slurm job arrays are what most university and lab clusters run. submitit is a small
pure-Python library (from Meta) that pickles a function call, submits it with sbatch and hands back its
result or its exception; its local executor runs the same pickled call in subprocesses, so this code
path is tested without a cluster. Ray would need a running Ray cluster and is a much heavier dependency.

Each job runs `run_cell_job`: the training notebook of one cell, executed exactly as the local runner's
cell process does it (same parameters, same folder, same summary.json done marker), so a cell computed
either way is identical and the two resume each other's work. submitit's own files (pickles, job logs)
go under outputs/<profile>/submitit/; each cell's folder still gets cell.ipynb and run.log
(under `engine: stacked`, each group's folder, groups/<regime>-s<seed>/).

    executor = make_executor("slurm", submitit_dir(profile, root),
                             {"timeout_min": 240, "slurm_partition": "gpu", "gpus_per_node": 1})
    report = submit_matrix(profile, root, root / "notebooks/train_cell.py", "outcome-*", executor)

Settings are submitit's AutoExecutor parameter names: shared ones unprefixed (timeout_min, mem_gb,
cpus_per_task, gpus_per_node, name, ...), Slurm-only ones prefixed (slurm_partition, slurm_account,
slurm_qos, slurm_array_parallelism, slurm_setup, slurm_additional_parameters, ...). The local executor
ignores the slurm_* ones (still checking their names) and the resources it cannot enforce.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import submitit
from submitit.core.utils import FailedJobError
from submitit.local.local import LocalJob
from tqdm import tqdm

from ..experiment import cell_folder
from ..experiment.profiles import Profile
from ..experiment.provenance import read_json, write_json_atomic
from .local import cuda_indices, gpus_per_cell
from .matrix import (
    STOP_GRACE_SECONDS,
    Job,
    RunReport,
    cpu_count,
    job_spec,
    outcome_of,
    pending_jobs,
    prepare,
    progress_bar,
    record,
    stop_signals_as_interrupt,
)
from .notebooks import execute_cell, existing_notebook

KINDS = ("slurm", "local")
IN_FLIGHT = "in_flight.json"  # under submitit_dir: the jobs a runner waits for; left behind when it was killed
REQUIRED_SETTINGS = ("timeout_min",)
POLL_SECONDS = 2.0
_TRACE_RULE = "-" * 22  # submitit's FailedJobError: "...trace:\n<rule>\n<traceback>\n<rule>\nYou can check..."


def submitit_dir(profile: Profile, root: Path) -> Path:
    """Where submitit keeps its pickles and job logs for a profile."""
    return profile.outputs_dir(root) / "submitit"


def make_executor(kind: str, folder: Path, settings: dict[str, Any]) -> submitit.Executor:
    """A submitit executor for Slurm ("slurm") or for subprocesses on this machine ("local").

    settings: AutoExecutor parameters (see the module docstring); timeout_min is required because
    submitit's defaults kill a job after 2 (local) or 5 (Slurm) minutes.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown executor kind {kind!r}; choose from {', '.join(KINDS)}")
    missing = [key for key in REQUIRED_SETTINGS if key not in settings]
    if missing:
        raise ValueError(f"executor settings miss {', '.join(missing)} (submitit's default timeout is minutes)")
    executor = submitit.AutoExecutor(folder=Path(folder), cluster=kind)
    executor.update_parameters(**settings)
    return executor


def profile_executor(kind: str, profile: Profile, root: Path) -> submitit.Executor:
    """The executor of a profile's `cluster` settings, built (and its settings checked) before any work."""
    if not profile.cluster:
        raise ValueError(f"--executor {kind}: profile {profile.name} has no `cluster` section of executor settings")
    needed, given = gpus_per_cell(profile), profile.cluster.get("gpus_per_node", 0)
    if cuda_indices(profile) and given < needed:  # else every job fails on its first missing device, after queueing
        raise ValueError(f"--executor {kind}: profile {profile.name} places a cell on {needed} GPUs (its cell "
                         f"devices), but its cluster.gpus_per_node is {given}")
    if cuda_indices(profile) and kind == "local":
        print("note: --executor local starts every job at once on the GPUs this machine shows; --gpus runs them "
              "a GPU group at a time", file=sys.stderr)
    try:
        return make_executor(kind, submitit_dir(profile, root), profile.cluster)
    except Exception as exc:  # submitit: NameError for an unknown setting, RuntimeError without srun
        raise ValueError(f"--executor {kind} with {profile.path} cluster settings: "
                         f"{type(exc).__name__}: {exc}") from exc


class JobsInFlight(RuntimeError):
    """An earlier runner of the profile was killed while its jobs ran, and some of them still run."""


def _job_running(cluster: str, folder: Path, job_id: str) -> bool:
    """Whether a job an earlier runner submitted still runs: a local job is its controller's process; a Slurm job
    is asked of Slurm (sacct), and counts as running when Slurm cannot tell."""
    if cluster == "local":
        try:
            os.kill(int(job_id), 0)
        except (ProcessLookupError, ValueError):
            return False
        except PermissionError:  # another user's process took the number: not ours, but cannot be told apart
            return True
        return True
    return not submitit.SlurmJob(folder=folder, job_id=job_id).done(force_check=True)


def check_no_jobs_in_flight(executor: submitit.Executor) -> None:
    """A JobsInFlight naming the jobs an earlier, killed runner left running (a rerun would clear their folders and
    submit them twice); the record is dropped once none runs."""
    path = Path(executor.folder) / IN_FLIGHT
    if not path.is_file():
        return
    recorded = read_json(path)
    running = {name: job_id for name, job_id in recorded.items()
               if _job_running(executor.cluster, Path(executor.folder), job_id)}
    if running:
        raise JobsInFlight(
            f"jobs an earlier run of this profile submitted still run, and its runner is gone: "
            f"{', '.join(f'{name} (job {job_id})' for name, job_id in running.items())}. Wait for them or cancel "
            f"them (Slurm: scancel {' '.join(running.values())}), then run again; if they are not yours or no "
            f"longer run, delete {path}")
    path.unlink()


class _Tee(io.TextIOBase):
    """A text stream writing to several streams."""

    def __init__(self, *streams: IO[str]):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def _also_logged_to(log: IO[str]) -> Iterator[None]:
    """Within the block, stdout, stderr and INFO logging (papermill's cell outputs) also go to log."""
    out, err = _Tee(sys.stdout, log), _Tee(sys.stderr, log)
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        root_logger.removeHandler(handler)
        root_logger.setLevel(level)
        out.flush()


def run_cell_job(spec: dict[str, Any]) -> str:
    """Job entry (runs inside a submitit job): execute one job's notebook; returns the job's name.

    spec: a job spec (run/matrix.py) plus the CPU threads to use. The runner cleared the job's folders
    when it submitted it. A failing notebook raises RuntimeError, so submitit records the job as failed;
    its log is the job's run.log (and the submitit job log).
    """
    name = spec["name"]
    folder = Path(spec["output"]).parent
    folder.mkdir(parents=True, exist_ok=True)
    threads = os.environ.get("SLURM_CPUS_PER_TASK") or str(spec["threads"])
    os.environ.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false")
    with open(folder / cell_folder.LOG, "a") as log, _also_logged_to(log):
        print(f"{name}: job {os.environ.get('SLURM_JOB_ID') or os.environ.get('SUBMITIT_LOCAL_JOB_ID')} "
              f"on {os.uname().nodename}, {threads} thread(s)", flush=True)
        failure = execute_cell(spec)
        if failure is not None:
            error = " | ".join(line.strip() for line in failure.error.splitlines() if line.strip())  # one line
            raise RuntimeError(f"job {name}: the notebook failed: {error} (executed notebook: {failure.output})")
    return name


def _exception_line(text: str) -> str:
    """The last line of the job's traceback inside a submitit FailedJobError (its 'Type: message')."""
    start, end = text.find(f"\n{_TRACE_RULE}\n"), text.rfind(f"\n{_TRACE_RULE}\nYou can check")
    trace = text[start + len(_TRACE_RULE) + 2:end] if 0 <= start < end else text
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    return lines[-1] if lines else text.strip()[:300]


def _failure_reason(job: submitit.Job) -> str | None:
    """None when the job ended well, else a short description of what went wrong (like the local runner's)."""
    exception = job.exception()
    if exception is None:
        return None
    if isinstance(exception, FailedJobError):
        return _exception_line(str(exception))
    # no result at all: killed, cancelled, timed out, out of memory, node failure
    return f"job {job.job_id} ended without a result (state {job.state}); submitit log: {job.paths.stderr}"


def _cancel(jobs: list[tuple[Job, submitit.Job]]) -> None:
    """Cancel the jobs not done yet; wait (briefly) for local ones to be gone, so a rerun starts clean."""
    pending = [job for _, job in jobs if not job.done()]
    for job in pending:
        with contextlib.suppress(Exception):  # best effort: the job may end meanwhile
            job.cancel(check=False)
    local = [job for job in pending if isinstance(job, LocalJob)]
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while any(not job.done() for job in local) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pending:
        tqdm.write(f"cancelled {len(pending)} job(s): {', '.join(job.job_id for job in pending)}", file=sys.stderr)


def submit_matrix(
    profile: Profile,
    root: Path,
    notebook: Path,
    cells_filter: str | None,
    executor: submitit.Executor,
    poll_seconds: float = POLL_SECONDS,
) -> RunReport:
    """Submit every selected, unfinished cell as one job array and wait; failures are collected, not raised.

    Ctrl-C (or SIGTERM, SIGHUP) while waiting cancels the jobs not done yet and re-raises: rerunning resumes.
    """
    root = Path(root).resolve()
    notebook = existing_notebook(root / notebook, "cells")
    pending, report = pending_jobs(profile, root, cells_filter)
    if not pending:
        return report
    check_no_jobs_in_flight(executor)
    folders = [prepare(job, profile, root) for job in pending]  # before submitting: no job sees a leftover
    threads = executor.parameters.get("cpus_per_task") or max(1, cpu_count() // len(pending))
    specs = [job_spec(job, profile, root, notebook) | {"threads": threads} for job in pending]
    jobs: list[tuple[Job, submitit.Job]] = []
    in_flight = Path(executor.folder) / IN_FLIGHT
    bar = progress_bar(profile, report, pending)
    try:
        with stop_signals_as_interrupt():
            jobs = list(zip(pending, executor.map_array(run_cell_job, specs)))
            write_json_atomic(in_flight, {job.name: submitted.job_id for job, submitted in jobs})
            tqdm.write(f"submitted {len(jobs)} job(s) to {executor.folder}:", file=sys.stderr)
            for job, submitted in jobs:
                tqdm.write(f"  {job.name}: job {submitted.job_id}", file=sys.stderr)
            started = time.monotonic()
            waiting = list(zip(jobs, folders))
            while waiting:
                time.sleep(poll_seconds)
                for item in [item for item in waiting if item[0][1].done()]:
                    waiting.remove(item)
                    (job, submitted), folder = item
                    outcome = outcome_of(job, profile, root, _failure_reason(submitted))
                    record(report, bar, folder, outcome,
                           f"after {time.monotonic() - started:.1f} s (job {submitted.job_id})")
    except BaseException:
        _cancel(jobs)
        raise
    finally:
        in_flight.unlink(missing_ok=True)  # waited for or cancelled: no job of this run is left to run
        bar.close()
    return report

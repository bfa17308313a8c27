"""Scale the matrix out beyond one machine: the unfinished cells of a profile as one submitit job array.

Why submitit: Slurm job arrays are what most university and lab clusters run. submitit is a small
pure-Python library (from Meta) that pickles a function call, submits it with sbatch and hands back its
result or its exception; its local executor runs the same pickled call in subprocesses, so this code
path is tested without a cluster. Ray would need a running Ray cluster and is a much heavier dependency.

Each job runs `run_cell_job`: the training notebook of one cell, executed exactly as the local runner's
cell process does it (same parameters, same folder, same summary.json done marker), so a cell computed
either way is identical and the two resume each other's work. submitit's own files (pickles, job logs)
go under outputs/<profile>/submitit/; each cell's folder still gets cell.ipynb and run.log.

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
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import submitit
from submitit.core.utils import FailedJobError
from submitit.local.local import LocalJob
from tqdm import tqdm

from .notebook_exec import NotebookFailed, execute_notebook
from .params import Cell, Profile
from .runner import (
    DONE_MARKER,
    FAILURE_PREFIX,
    STOP_GRACE_SECONDS,
    CellFailure,
    RunReport,
    _existing_notebook,
    _sigterm_as_interrupt,
    cells_dir,
    cpu_count,
    is_finished,
    select_cells,
)

KINDS = ("slurm", "local")
REQUIRED_SETTINGS = ("timeout_min",)
POLL_SECONDS = 2.0
_TRACE_RULE = "-" * 22  # submitit's FailedJobError: "...trace:\n<rule>\n<traceback>\n<rule>\nYou can check..."


def submitit_dir(profile: Profile, root: Path) -> Path:
    """Where submitit keeps its pickles and job logs for a profile."""
    return Path(root) / "outputs" / profile.name / "submitit"


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
    """Job entry (runs inside a submitit job): execute one cell's notebook; returns the cell name.

    spec: name, notebook, output, parameters, cwd and threads, as built by submit_matrix. A cell already
    finished (e.g. a requeued job) is left alone. A failing notebook raises RuntimeError, so submitit
    records the job as failed; its log is the cell's run.log (and the submitit job log).
    """
    name = spec["name"]
    folder = Path(spec["parameters"]["out_dir"])
    if is_finished(folder):
        print(f"{name}: already finished; left alone", flush=True)
        return name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    threads = os.environ.get("SLURM_CPUS_PER_TASK") or str(spec["threads"])
    os.environ.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false")
    with open(folder / "run.log", "a") as log, _also_logged_to(log):
        print(f"{name}: job {os.environ.get('SLURM_JOB_ID') or os.environ.get('SUBMITIT_LOCAL_JOB_ID')} "
              f"on {os.uname().nodename}, {threads} thread(s)", flush=True)
        try:
            execute_notebook(Path(spec["notebook"]), Path(spec["output"]), spec["parameters"],
                             cwd=Path(spec["cwd"]), log_output=True)
        except NotebookFailed as exc:
            print(f"{FAILURE_PREFIX}{exc.error}", file=sys.stderr, flush=True)
            error = " | ".join(line.strip() for line in exc.error.splitlines() if line.strip())  # one line
            raise RuntimeError(f"cell {name}: the notebook failed: {error} (executed notebook: {exc.output})") from exc
    return name


def _job_spec(cell: Cell, profile: Profile, root: Path, notebook: Path, threads: int) -> dict[str, Any]:
    """What run_cell_job needs for one cell: plain data, so it pickles anywhere."""
    folder = cells_dir(profile, root) / cell.name
    return {
        "name": cell.name,
        "notebook": str(notebook),
        "output": str(folder / "cell.ipynb"),
        "parameters": cell.parameters(profile, folder, root),
        "cwd": str(root),
        "threads": threads,
    }


def _exception_line(text: str) -> str:
    """The last line of the job's traceback inside a submitit FailedJobError (its 'Type: message')."""
    start, end = text.find(f"\n{_TRACE_RULE}\n"), text.rfind(f"\n{_TRACE_RULE}\nYou can check")
    trace = text[start + len(_TRACE_RULE) + 2:end] if 0 <= start < end else text
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    return lines[-1] if lines else text.strip()[:300]


def _failure_reason(job: submitit.Job, folder: Path) -> str | None:
    """None when the cell finished, else a short description of what went wrong (like runner's)."""
    exception = job.exception()
    if exception is None:
        return None if is_finished(folder) else f"the notebook finished without writing {DONE_MARKER}"
    if isinstance(exception, FailedJobError):
        return _exception_line(str(exception))
    # no result at all: killed, cancelled, timed out, out of memory, node failure
    return f"job {job.job_id} ended without a result (state {job.state}); submitit log: {job.paths.stderr}"


def _cancel(jobs: list[tuple[Cell, submitit.Job]]) -> None:
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

    Ctrl-C (or SIGTERM) while waiting cancels the jobs not done yet and re-raises: rerunning resumes.
    """
    root = Path(root).resolve()
    notebook = _existing_notebook(root / notebook, "cells")
    report = RunReport()
    pending: list[Cell] = []
    for cell in select_cells(profile, cells_filter):
        folder = cells_dir(profile, root) / cell.name
        if is_finished(folder):
            report.skipped.append(cell.name)
            continue
        if folder.exists():
            shutil.rmtree(folder)  # the leftover of a killed or failed run
        pending.append(cell)
    if report.skipped:
        tqdm.write(f"{len(report.skipped)} finished cell(s) skipped", file=sys.stderr)
    if not pending:
        return report
    threads = executor.parameters.get("cpus_per_task") or max(1, cpu_count() // len(pending))
    specs = [_job_spec(cell, profile, root, notebook, threads) for cell in pending]
    jobs: list[tuple[Cell, submitit.Job]] = []
    bar = tqdm(total=len(report.skipped) + len(pending), initial=len(report.skipped), desc=profile.name,
               unit="cell", file=sys.stderr, dynamic_ncols=True)
    try:
        with _sigterm_as_interrupt():
            jobs = list(zip(pending, executor.map_array(run_cell_job, specs)))
            tqdm.write(f"submitted {len(jobs)} cell(s) to {executor.folder}:", file=sys.stderr)
            for cell, job in jobs:
                tqdm.write(f"  {cell.name}: job {job.job_id}", file=sys.stderr)
            started = time.monotonic()
            waiting = list(jobs)
            while waiting:
                time.sleep(poll_seconds)
                for cell, job in [item for item in waiting if item[1].done()]:
                    waiting.remove((cell, job))
                    _record(cell, job, cells_dir(profile, root) / cell.name, time.monotonic() - started, report, bar)
    except BaseException:
        _cancel(jobs)
        raise
    finally:
        bar.close()
    return report


def _record(cell: Cell, job: submitit.Job, folder: Path, seconds: float, report: RunReport, bar: tqdm) -> None:
    """Add a done job to the report and print its one-line outcome."""
    reason = _failure_reason(job, folder)
    if reason is None:
        report.finished.append(cell.name)
        message = f"{cell.name}: done after {seconds:.1f} s (job {job.job_id})"
    else:
        failure = CellFailure(cell.name, reason, folder / "cell.ipynb", folder / "run.log")
        report.failed.append(failure)
        message = f"{cell.name}: FAILED after {seconds:.1f} s (job {job.job_id}): {reason} (log: {failure.log})"
    bar.set_postfix(done=len(report.finished), failed=len(report.failed), skipped=len(report.skipped), refresh=False)
    bar.update(1)
    tqdm.write(message, file=sys.stderr)

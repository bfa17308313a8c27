"""The matrix on this machine: every unfinished cell in its own process, up to `jobs` (or GPU slots) at once.

Each cell runs the training notebook in a process of its own (cell_process.py; parallel papermill
kernels in threads race on ports), writing cell.ipynb and run.log into its folder beside what the
notebook writes (a stacked group's job: into groups/<regime>-s<seed>/). With GPU slots, each cell process sees
only its own GPUs (CUDA_VISIBLE_DEVICES): one GPU per cell, or a group when the profile places the teacher or the
PRM on a second device.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..experiment import cell_folder
from ..experiment.profiles import Profile
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
from .notebooks import FAILURE_PREFIX, existing_notebook

POLL_SECONDS = 0.2


@dataclass
class _Running:
    """A cell whose process is running."""

    job: Job
    folder: Path
    process: subprocess.Popen
    log: IO[str]
    started: float
    gpus: str | None  # the CUDA_VISIBLE_DEVICES it was given


def cell_env(jobs: int, gpus: str | None = None) -> dict[str, str]:
    """The environment of a cell process: the CPUs shared out between the parallel cells, and its GPUs."""
    threads = str(max(1, cpu_count() // jobs))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def cuda_indices(profile: Profile) -> list[int]:
    """The cuda index of each of a cell's devices that is a GPU (the student's, the teacher's, the PRM's)."""
    devices = [profile.cell[key] for key in ("device", "teacher_device", "prm_device")]
    return [int(m.group(1) or 0) for d in devices if (m := re.fullmatch(r"cuda(?::(\d+))?", d))]


def gpus_per_cell(profile: Profile) -> int:
    """How many GPUs one cell addresses: 1 + the highest cuda index among its devices (1 on a CPU profile)."""
    return max(cuda_indices(profile), default=0) + 1


def gpu_slots(gpus: str, profile: Profile) -> list[str]:
    """The GPU list split into one CUDA_VISIBLE_DEVICES value per concurrent cell, e.g. '0,1,2,3' -> ['0,1', '2,3']."""
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {gpus!r}: expected distinct GPU indices separated by commas, e.g. 0,1,2,3")
    if not cuda_indices(profile):
        print(f"note: profile {profile.name} puts its cells on the CPU (cell.device); --gpus {gpus} only sets how many "
              "run at once", file=sys.stderr)
    size = gpus_per_cell(profile)
    if len(ids) < size:
        raise ValueError(f"--gpus {gpus!r}: profile {profile.name} places a cell on {size} GPUs (its cell devices)")
    if len(ids) % size:
        print(f"note: --gpus {gpus}: a cell takes {size} GPUs, so GPU(s) {','.join(ids[len(ids) - len(ids) % size:])} "
              "stay unused", file=sys.stderr)
    return [",".join(ids[i : i + size]) for i in range(0, len(ids) - size + 1, size)]


def _launch(job: Job, profile: Profile, root: Path, notebook: Path, env: dict[str, str]) -> _Running:
    """Clear the job's folders and start its process."""
    spec = job_spec(job, profile, root, notebook) | {"parent_pid": os.getpid()}
    folder = prepare(job, profile, root)
    log = open(folder / cell_folder.LOG, "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "reward_density.run.cell_process", json.dumps(spec)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=root,
        start_new_session=True,  # Ctrl-C reaches the runner only; it stops the cells itself
    )
    return _Running(job, folder, process, log, time.monotonic(), env.get("CUDA_VISIBLE_DEVICES"))


def _failure_reason(running: _Running) -> str | None:
    """None when the process ended well, else a short description of what went wrong."""
    code = running.process.returncode
    if code == 0:
        return None
    lines = [line.strip() for line in (running.folder / cell_folder.LOG).read_text(errors="replace").splitlines()]
    for line in reversed(lines):
        if line.startswith(FAILURE_PREFIX):
            return line[len(FAILURE_PREFIX):]
    last = next((line for line in reversed(lines) if line), "")
    return f"exit status {code}" + (f"; last log line: {last[:300]}" if last else "")


def _stop(running: list[_Running]) -> None:
    """Terminate the cell processes (SIGTERM, then SIGKILL after a grace period)."""
    for item in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(item.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for item in running:
        try:
            item.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(item.process.pid, signal.SIGKILL)
            item.process.wait()
        item.log.close()


def run_matrix(
    profile: Profile, root: Path, notebook: Path, cells_filter: str | None = None, jobs: int = 1,
    gpus: list[str] | None = None,
) -> RunReport:
    """Run every selected, unfinished cell, up to `jobs` processes at once; failures are collected, not raised.

    gpus: one CUDA_VISIBLE_DEVICES value per concurrent cell (gpu_slots); it sets the number of jobs.
    """
    jobs = len(gpus) if gpus else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    root = Path(root).resolve()
    notebook = existing_notebook(root / notebook, "cells")
    pending, report = pending_jobs(profile, root, cells_filter)
    free_slots: list[str | None] = list(gpus) if gpus else [None] * jobs
    running: list[_Running] = []
    bar = progress_bar(profile, report, pending)
    try:
        with stop_signals_as_interrupt():
            while pending or running:
                while pending and free_slots:
                    env = cell_env(jobs, free_slots.pop(0))
                    running.append(_launch(pending.pop(0), profile, root, notebook, env))
                time.sleep(POLL_SECONDS)
                for item in [item for item in running if item.process.poll() is not None]:
                    running.remove(item)
                    free_slots.append(item.gpus)
                    item.log.close()
                    outcome = outcome_of(item.job, profile, root, _failure_reason(item))
                    record(report, bar, item.folder, outcome, f"after {time.monotonic() - item.started:.1f} s")
    finally:
        _stop(running)
        bar.close()
    return report


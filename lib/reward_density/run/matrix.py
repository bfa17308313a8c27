"""What the two executors (local.py, slurm.py) share: which cells to run, each cell's spec, the report.

A cell is finished when its folder holds summary.json (experiment/cell_folder.py): finished cells are
skipped; a folder without it is the leftover of a killed or failed run, cleared and rerun.
"""
from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..experiment import cell_folder
from ..experiment.profiles import MatrixCell, Profile, cell_config

STOP_GRACE_SECONDS = 10.0  # how long a stopped cell may take to clean up before it is killed


@dataclass
class CellFailure:
    """A cell that did not finish: its name, a short error, its executed notebook and its log."""

    name: str
    error: str
    notebook: Path
    log: Path


@dataclass
class RunReport:
    """What an executor did with each selected cell."""

    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[CellFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no cell failed."""
        return not self.failed


def select_cells(profile: Profile, cells_filter: str | None) -> list[MatrixCell]:
    """The profile's cells whose names match any of the comma-separated globs (all when None)."""
    cells = profile.cells()
    if not cells_filter:
        return cells
    globs = [glob.strip() for glob in cells_filter.split(",") if glob.strip()]
    selected = [cell for cell in cells if any(fnmatch.fnmatchcase(cell.name, glob) for glob in globs)]
    if not selected:
        raise ValueError(
            f"--cells {cells_filter!r} matches no cell of profile {profile.name} "
            f"(names look like {cells[0].name}, {cells[-1].name})"
        )
    return selected


def pending_cells(profile: Profile, root: Path, cells_filter: str | None) -> tuple[list[MatrixCell], RunReport]:
    """The selected cells still to run, and a report that lists the finished ones as skipped."""
    report, pending = RunReport(), []
    for cell in select_cells(profile, cells_filter):
        if cell_folder.is_finished(profile.cells_dir(root) / cell.name):
            report.skipped.append(cell.name)
        else:
            pending.append(cell)
    if report.skipped:
        tqdm.write(f"{len(report.skipped)} finished cell(s) skipped", file=sys.stderr)
    return pending, report


def fresh_folder(folder: Path) -> Path:
    """An empty cell folder: the leftover of a killed or failed run is cleared."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def cell_spec(cell: MatrixCell, profile: Profile, root: Path, notebook: Path) -> dict[str, Any]:
    """What running one cell needs, as plain data (it crosses process and machine boundaries)."""
    folder = profile.cells_dir(root) / cell.name
    config = cell_config(profile, cell.regime, cell.rank, cell.seed, learning_rate=cell.learning_rate,
                         out_dir=folder, root=root)
    return {
        "name": cell.name,
        "notebook": str(notebook),
        "output": str(folder / cell_folder.NOTEBOOK),
        # Every value explicit, so the executed notebook shows them; the profile (by path) fills nothing.
        "parameters": config.to_parameters() | {"profile": str(profile.path)},
        "cwd": str(root),
    }


def progress_bar(profile: Profile, report: RunReport, pending: int) -> tqdm:
    """A bar over every selected cell, the skipped ones counted as done."""
    return tqdm(total=len(report.skipped) + pending, initial=len(report.skipped), desc=profile.name, unit="cell",
                file=sys.stderr, dynamic_ncols=True)


def record(report: RunReport, bar: tqdm, name: str, folder: Path, reason: str | None, took: str) -> None:
    """Add a cell that ended to the report (reason None: it finished) and print its one-line outcome."""
    if reason is None:
        report.finished.append(name)
        message = f"{name}: done {took}"
    else:
        failure = CellFailure(name, reason, folder / cell_folder.NOTEBOOK, folder / cell_folder.LOG)
        report.failed.append(failure)
        message = f"{name}: FAILED {took}: {reason} (log: {failure.log})"
    bar.set_postfix(done=len(report.finished), failed=len(report.failed), skipped=len(report.skipped), refresh=False)
    bar.update(1)
    tqdm.write(message, file=sys.stderr)


def cpu_count() -> int:
    """CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like Ctrl-C (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

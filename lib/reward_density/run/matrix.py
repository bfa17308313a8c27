"""What the two executors (local.py, slurm.py) share: which cells to run, in which jobs, each job's spec,
the report.

A cell is finished when its folder holds summary.json (experiment/cell_folder.py): finished cells are
skipped; a folder without it is the leftover of a killed or failed run, cleared and rerun. A job is one
notebook run: one cell (engine peft), or the unfinished arms of one regime and seed trained side by side
(engine stacked), whose notebook and log go to outputs/<profile>/groups/<regime>-s<seed>/.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..experiment import cell_folder
from ..experiment.config import CellConfig, rank_label
from ..experiment.profiles import MatrixCell, Profile, cell_config
from ..experiment.provenance import fingerprint, read_json

STOP_GRACE_SECONDS = 10.0  # how long a stopped cell may take to clean up before it is killed
STOP_SIGNALS = ("SIGTERM", "SIGHUP")  # besides Ctrl-C, the signals that stop a run cleanly
# What a finished cell's params.json must still agree with the profile on: what it trained and scored. Paths
# (world, run) may move with the repository, and report_to only chooses where live curves go.
COMPARED_SETTINGS = tuple(f.name for f in CellConfig.settings("matrix", "cell", "data") if f.name != "report_to")


class StaleCells(ValueError):
    """Finished cells that ran with settings, or on a world, that the profile no longer gives."""


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

    @property
    def counts(self) -> dict[str, int]:
        """How many cells finished, were skipped and failed."""
        return {"finished": len(self.finished), "skipped": len(self.skipped), "failed": len(self.failed)}


@dataclass(frozen=True)
class Job:
    """Cells trained in one notebook run."""

    cells: tuple[MatrixCell, ...]

    @property
    def name(self) -> str:
        first = self.cells[0]
        return first.name if len(self.cells) == 1 else f"{first.regime}-s{first.seed}"

    def folder(self, profile: Profile, root: Path) -> Path:
        """Where the job's executed notebook and log go: the cell's folder, or the group's."""
        if len(self.cells) == 1:
            return profile.cells_dir(root) / self.cells[0].name
        return profile.outputs_dir(root) / "groups" / self.name


def select_cells(profile: Profile, cells_filter: str | None) -> list[MatrixCell]:
    """The profile's cells whose names match any of the comma-separated globs (all when None); refuse a filter
    naming no glob, and each glob that matches no cell (a typo would silently leave its cells out)."""
    cells = profile.cells()
    if cells_filter is None:
        return cells
    globs = [glob.strip() for glob in cells_filter.split(",") if glob.strip()]
    if not globs:
        raise ValueError(f"--cells {cells_filter!r} names no glob; leave --cells out to run every cell")
    unmatched = [glob for glob in globs if not any(fnmatch.fnmatchcase(cell.name, glob) for cell in cells)]
    if unmatched:
        raise ValueError(
            f"--cells {cells_filter!r}: {', '.join(unmatched)} {'matches' if len(unmatched) == 1 else 'match'} no "
            f"cell of profile {profile.name} (names look like {cells[0].name}, {cells[-1].name})"
        )
    return [cell for cell in cells if any(fnmatch.fnmatchcase(cell.name, glob) for glob in globs)]


def changed_settings(profile: Profile, cell: MatrixCell, root: Path,
                     fingerprint_of: Callable[[str | None], str] | None = None) -> dict[str, tuple[Any, Any]]:
    """The settings a finished cell ran with that the profile now gives otherwise: {name: (then, now)}; with
    fingerprint_of (provenance.fingerprint), also the world entries it read that have changed since, an entry it
    read and no longer reads, or the reverse, included (a world.heldout set or removed). A setting its params.json
    does not record (one added to the schema since) is not compared, nor the world of a cell that recorded none."""
    params = profile.cells_dir(root) / cell.name / cell_folder.PARAMS
    try:
        recorded = read_json(params) if params.is_file() else {}
    except ValueError as error:
        raise ValueError(f"{error}; move or delete the cell folder {params.parent} to rerun the cell") from error
    config = cell_config(profile, cell.regime, cell.rank, cell.seed, learning_rate=cell.learning_rate, root=root)
    now = config.to_parameters()
    now = json.loads(json.dumps({name: now[name] for name in COMPARED_SETTINGS}))  # tuples as JSON lists
    changed = {name: (recorded[name], value) for name, value in now.items()
               if name in recorded and recorded[name] != value}
    then = recorded.get(cell_folder.WORLD) or {}
    if fingerprint_of is not None and then:
        # Every entry a cell reads is recorded (config.world_inputs), so one missing on either side was not read.
        inputs, absent = config.world_inputs, fingerprint_of(None)
        world = {name: fingerprint_of(inputs.get(name)) for name in then | inputs}  # then's order, new ones after
        changed |= {f"world.{name}": (then.get(name, absent), value) for name, value in world.items()
                    if value != then.get(name, absent)}
    return changed


def changes_text(changed: dict[str, tuple[Any, Any]]) -> str:
    """Settings that changed, {name: (then, now)}, as "name then -> now, ..."."""
    return ", ".join(f"{name} {then!r} -> {now!r}" for name, (then, now) in changed.items())


def cells_reading(root: Path, world_dir: Path, entries: list[str]) -> dict[Path, list[str]]:
    """The finished cells, of any profile under root/outputs, whose params.json says they read one of these entries
    of world_dir as it is now (the same hash of its files): each cells folder with its cells' names."""
    now = {entry: fingerprint(world_dir / entry) for entry in entries if (world_dir / entry).exists()}
    readers: dict[Path, list[str]] = {}
    for folder in sorted((root / "outputs").glob("*/cells/*")) if now else []:
        if not cell_folder.is_finished(folder):
            continue
        try:
            record = read_json(folder / cell_folder.PARAMS).get(cell_folder.WORLD) or {}
        except (OSError, ValueError):  # a damaged cell: its own run and the analysis name it
            continue
        if any(record.get(entry) == value for entry, value in now.items()):
            readers.setdefault(folder.parent, []).append(folder.name)
    return readers


def check_finished_cells(profile: Profile, root: Path, cells: list[MatrixCell], world: bool = True) -> None:
    """Refuse to run when a finished cell was trained with settings the profile no longer gives, or (world true) on
    a world that has changed since: skipping it would report stale results, rerunning it would delete them, so the
    user decides."""
    finished = [cell for cell in cells if cell_folder.is_finished(profile.cells_dir(root) / cell.name)]
    fingerprint_of = functools.cache(fingerprint) if world else None  # each entry hashed once, however many cells
    stale = {cell.name: changed for cell in finished
             if (changed := changed_settings(profile, cell, root, fingerprint_of))}
    if stale:
        lines = [f"  {name}: {changes_text(changed)}" for name, changed in stale.items()]
        rebuilt = any(k.startswith("world.") for changed in stale.values() for k in changed)
        raise StaleCells(
            f"{len(stale)} finished cell(s) under {profile.cells_dir(root)} ran with settings {profile.path} no "
            "longer gives, or on a world that has changed since (then -> now):\n" + "\n".join(lines[:10])
            + ("\n  ..." if len(lines) > 10 else "")
            + ("\n(world.<entry> is a hash of the entry's files: a rebuilt world gives another)" if rebuilt else "")
            + "\nmove or delete those cell folders to rerun them, or restore the profile's settings (and the world "
              "they read: for a world the profile builds, its build_world settings) to analyse them")


def check_no_unplanned_cells(profile: Profile, root: Path) -> None:
    """Refuse to analyse when cells/ holds finished cells the profile does not plan (seeds or ranks taken out of
    it, say): the analysis reads every finished cell, and the stale check can compare only the planned ones."""
    planned, cells_dir = {cell.name for cell in profile.cells()}, profile.cells_dir(root)
    unplanned = sorted(folder.name for folder in cells_dir.iterdir() if folder.name not in planned
                       and cell_folder.is_finished(folder)) if cells_dir.is_dir() else []
    if unplanned:
        raise StaleCells(f"{len(unplanned)} finished cell(s) under {cells_dir} are not in the matrix of {profile.path} "
                         f"({', '.join(unplanned[:6])}{', ...' if len(unplanned) > 6 else ''}), and the analysis "
                         "reads every finished cell: move those folders elsewhere, or put them back in the matrix")


def pending_jobs(profile: Profile, root: Path, cells_filter: str | None) -> tuple[list[Job], RunReport]:
    """The selected, unfinished cells in jobs, and a report that lists the finished ones as skipped.

    With engine stacked, the unfinished arms of one regime and seed form one job; otherwise each cell does.
    Raises StaleCells when a finished cell ran with settings, or on a world, the profile no longer gives.
    """
    cells = select_cells(profile, cells_filter)
    check_finished_cells(profile, root, cells)
    report, pending = RunReport(), []
    for cell in cells:
        if cell_folder.is_finished(profile.cells_dir(root) / cell.name):
            report.skipped.append(cell.name)
        else:
            pending.append(cell)
    if report.skipped:
        tqdm.write(f"{len(report.skipped)} finished cell(s) skipped", file=sys.stderr)
    if profile.cell["engine"] != "stacked":
        return [Job((cell,)) for cell in pending], report
    groups: dict[tuple[str, int], list[MatrixCell]] = {}
    for cell in pending:
        groups.setdefault((cell.regime, cell.seed), []).append(cell)
    if partial := _partial_groups(profile, groups):
        tqdm.write(f"note: {len(partial)} stacked group(s) train without some of their arms ({', '.join(partial[:4])}"
                   f"{', ...' if len(partial) > 4 else ''}): an arm's numbers depend, to rounding, on the arms trained "
                   "beside it, and RL carries that further, so these arms reproduce a run of their whole group "
                   "statistically, not bit for bit (README, Reproducibility)", file=sys.stderr)
    return [Job(tuple(cells)) for cells in groups.values()], report


def _partial_groups(profile: Profile, groups: dict[tuple[str, int], list[MatrixCell]]) -> list[str]:
    """The regime-seed groups about to train only some of their arms (the others finished, or not selected by
    --cells), each as 'outcome-s0: 1 of 6 arms'."""
    planned = Counter((cell.regime, cell.seed) for cell in profile.cells())
    return [f"{regime}-s{seed}: {len(cells)} of {planned[regime, seed]} arms"
            for (regime, seed), cells in groups.items() if len(cells) < planned[regime, seed]]


def fresh_folder(folder: Path) -> Path:
    """An empty folder: the leftover of a killed or failed run is cleared."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def prepare(job: Job, profile: Profile, root: Path) -> Path:
    """Clear the leftovers of the job's cells and return its (fresh) folder. A group's folder that holds the
    notebook and log of arms that finished (the group's earlier run) is kept, renamed, not cleared."""
    for cell in job.cells:
        fresh_folder(profile.cells_dir(root) / cell.name)
    folder = job.folder(profile, root)
    finished = _finished_neighbours(job, profile, root)
    if finished and folder.exists():
        kept = folder.with_name(f"{folder.name}.earlier-{time.strftime('%Y%m%dT%H%M%S')}")
        folder.rename(kept)
        tqdm.write(f"{folder.name}'s earlier run, whose arms {', '.join(finished)} finished: its notebook and log "
                   f"are kept in {kept}", file=sys.stderr)
    return fresh_folder(folder)


def _finished_neighbours(job: Job, profile: Profile, root: Path) -> list[str]:
    """The finished arms of a group job's regime and seed that it does not train (none for a one-cell job)."""
    if len(job.cells) == 1:
        return []
    first, names = job.cells[0], {cell.name for cell in job.cells}
    return [cell.name for cell in profile.cells()
            if (cell.regime, cell.seed) == (first.regime, first.seed) and cell.name not in names
            and cell_folder.is_finished(profile.cells_dir(root) / cell.name)]


def base_answers_dir(profile: Profile, root: Path) -> Path:
    """Where the base model's evaluations of a profile are kept (computed once per world, reused by every cell)."""
    return profile.outputs_dir(root) / "baseline"


def job_spec(job: Job, profile: Profile, root: Path, notebook: Path) -> dict[str, Any]:
    """What running one job needs, as plain data (it crosses process and machine boundaries)."""
    first = job.cells[0]
    config = cell_config(profile, first.regime, first.rank, first.seed, learning_rate=first.learning_rate, root=root)
    # Every value explicit, so the executed notebook shows them: the shared settings, each arm's rank and rate.
    shared = {k: v for k, v in config.to_parameters().items() if k not in ("rank", "learning_rate", "out_dir")}
    ranks = [rank_label(cell.rank) for cell in job.cells]
    rates = [cell.learning_rate for cell in job.cells]
    return {
        "name": job.name,
        "notebook": str(notebook),
        "output": str(job.folder(profile, root) / cell_folder.NOTEBOOK),
        "parameters": shared | {
            "profile": str(profile.path), "rank": ranks[0] if len(ranks) == 1 else ranks,
            "learning_rate": rates[0] if len(rates) == 1 else rates,
            "cells_dir": str(profile.cells_dir(root)), "base_answers": str(base_answers_dir(profile, root)),
        },
        "cwd": str(root),
    }


def outcome_of(job: Job, profile: Profile, root: Path, reason: str | None) -> dict[str, str | None]:
    """Each cell of an ended job and why it did not finish (None: it did)."""
    return {cell.name: None if cell_folder.is_finished(profile.cells_dir(root) / cell.name)
            else reason or f"the notebook finished without writing {cell_folder.SUMMARY}" for cell in job.cells}


def progress_bar(profile: Profile, report: RunReport, jobs: list[Job]) -> tqdm:
    """A bar over every selected cell, the skipped ones counted as done."""
    total = len(report.skipped) + sum(len(job.cells) for job in jobs)
    return tqdm(total=total, initial=len(report.skipped), desc=profile.name, unit="cell", file=sys.stderr,
                dynamic_ncols=True)


def record(report: RunReport, bar: tqdm, folder: Path, outcome: dict[str, str | None], took: str) -> None:
    """Add the cells of an ended job to the report (reason None: finished) and print their outcome."""
    for name, reason in outcome.items():
        if reason is None:
            report.finished.append(name)
            message = f"{name}: done {took}"
        else:
            failure = CellFailure(name, reason, folder / cell_folder.NOTEBOOK, folder / cell_folder.LOG)
            report.failed.append(failure)
            message = f"{name}: FAILED {took}: {reason} (log: {failure.log})"
        bar.set_postfix(done=len(report.finished), failed=len(report.failed), skipped=len(report.skipped),
                        refresh=False)
        bar.update(1)
        tqdm.write(message, file=sys.stderr)


def cpu_count() -> int:
    """CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt like Ctrl-C (main thread only).

    SIGHUP is what a closed terminal or SSH session sends: handled, the runner stops its cells or cancels
    its jobs instead of dying and leaving them running. A signal already ignored (nohup) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    stops = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]  # Windows has no SIGHUP
    previous = {signum: signal.getsignal(signum) for signum in stops}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

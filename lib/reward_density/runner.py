"""The matrix runner: world building, every training cell of a profile, then the analysis.

Each cell runs the training notebook in its own process (`python -m reward_density.runner --one-cell`;
parallel papermill kernels in threads race on ports) and writes into
`<root>/outputs/<profile>/cells/<cell name>/`: cell.ipynb (the executed notebook), run.log (the
process's stdout/stderr) and whatever the notebook writes. `summary.json`, written last and atomically
by the notebook (never by the runner), marks a finished cell: finished cells are skipped, and a folder
without it is the leftover of a killed or failed run, cleared and rerun.

    python -m reward_density.runner --profile mini [--cells 'outcome-*,*-rfull-*'] [--jobs 2 | --gpus 0,1]
        [--executor slurm|local] [--root DIR] [--stages world,cells,analysis]

With --gpus, each cell process sees only its own GPUs (CUDA_VISIBLE_DEVICES): one GPU per cell, or a
group of GPUs when the profile places the teacher or the PRM on a second device (cuda:1 within the cell).
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from .notebook_exec import NotebookFailed, execute_notebook
from .params import REPO_ROOT, Cell, Profile, find_profile, load_profile, resolve_world_entry
from .reachability import WorldUnreachable, check_world

STAGES = ("world", "baseline", "cells", "analysis")
DONE_MARKER = "summary.json"
FAILURE_PREFIX = "CELL FAILED: "
STOP_GRACE_SECONDS = 10.0
POLL_SECONDS = 0.2


@dataclass
class CellFailure:
    """A cell that did not finish: its name, a short error, its executed notebook and its log."""

    name: str
    error: str
    notebook: Path
    log: Path


@dataclass
class RunReport:
    """What run_matrix did with each selected cell."""

    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[CellFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no cell failed."""
        return not self.failed


@dataclass
class _Running:
    """A cell whose process is running."""

    cell: Cell
    folder: Path
    process: subprocess.Popen
    log: IO[str]
    started: float
    gpus: str | None  # the CUDA_VISIBLE_DEVICES it was given


def cells_dir(profile: Profile, root: Path) -> Path:
    """Where the cells of a profile live."""
    return root / "outputs" / profile.name / "cells"


def is_finished(folder: Path) -> bool:
    """Whether a cell folder holds its done marker."""
    return (folder / DONE_MARKER).is_file()


def select_cells(profile: Profile, cells_filter: str | None) -> list[Cell]:
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


def cpu_count() -> int:
    """CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cell_env(jobs: int, gpus: str | None = None) -> dict[str, str]:
    """The environment of a cell process: the CPUs shared out between the parallel cells, and its GPUs."""
    threads = str(max(1, cpu_count() // jobs))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def gpus_per_cell(profile: Profile) -> int:
    """How many GPUs one cell addresses: 1 + the highest cuda index among its devices (1 on a CPU profile)."""
    devices = [profile.cell[key] for key in ("device", "teacher_device", "prm_device")]
    indices = [int(m.group(1) or 0) for d in devices if (m := re.fullmatch(r"cuda(?::(\d+))?", d))]
    return max(indices, default=0) + 1


def gpu_slots(gpus: str, profile: Profile) -> list[str]:
    """The GPU list split into one CUDA_VISIBLE_DEVICES value per concurrent cell, e.g. '0,1,2,3' -> ['0,1', '2,3']."""
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {gpus!r}: expected distinct GPU indices separated by commas, e.g. 0,1,2,3")
    size = gpus_per_cell(profile)
    if len(ids) < size:
        raise ValueError(f"--gpus {gpus!r}: profile {profile.name} places a cell on {size} GPUs (its cell devices)")
    return [",".join(ids[i : i + size]) for i in range(0, len(ids) - size + 1, size)]


def _launch(cell: Cell, profile: Profile, root: Path, notebook: Path, env: dict[str, str]) -> _Running:
    """Clear the cell folder and start the cell's process."""
    folder = cells_dir(profile, root) / cell.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    spec = {
        "notebook": str(notebook),
        "output": str(folder / "cell.ipynb"),
        "parameters": cell.parameters(profile, folder, root),
        "cwd": str(root),
        "parent_pid": os.getpid(),
    }
    log = open(folder / "run.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "reward_density.runner", "--one-cell", json.dumps(spec)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=root,
        start_new_session=True,  # Ctrl-C reaches the runner only; it stops the cells itself
    )
    return _Running(cell, folder, process, log, time.monotonic(), env.get("CUDA_VISIBLE_DEVICES"))


def _failure_reason(running: _Running) -> str | None:
    """None when the cell finished, else a short description of what went wrong."""
    code = running.process.returncode
    if code == 0 and is_finished(running.folder):
        return None
    if code == 0:
        return f"the notebook finished without writing {DONE_MARKER}"
    lines = [line.strip() for line in (running.folder / "run.log").read_text(errors="replace").splitlines()]
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


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
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


def _record(running: _Running, report: RunReport, bar: tqdm) -> None:
    """Add a finished process to the report and print its one-line outcome."""
    running.log.close()
    seconds = time.monotonic() - running.started
    reason = _failure_reason(running)
    name = running.cell.name
    if reason is None:
        report.finished.append(name)
        message = f"{name}: done in {seconds:.1f} s"
    else:
        failure = CellFailure(name, reason, running.folder / "cell.ipynb", running.folder / "run.log")
        report.failed.append(failure)
        message = f"{name}: FAILED after {seconds:.1f} s: {reason} (log: {failure.log})"
    bar.set_postfix(done=len(report.finished), failed=len(report.failed), skipped=len(report.skipped), refresh=False)
    bar.update(1)
    tqdm.write(message, file=sys.stderr)


def run_matrix(
    profile: Profile, root: Path, notebook: Path, cells_filter: str | None = None, jobs: int = 1,
    gpus: list[str] | None = None,
) -> RunReport:
    """Run every selected, unfinished cell, up to `jobs` at once; failures are collected, not raised.

    gpus: one CUDA_VISIBLE_DEVICES value per concurrent cell (gpu_slots); it sets the number of jobs.
    """
    jobs = len(gpus) if gpus else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    root = Path(root).resolve()
    notebook = _existing_notebook(root / notebook, "cells")
    report = RunReport()
    pending: list[Cell] = []
    for cell in select_cells(profile, cells_filter):
        if is_finished(cells_dir(profile, root) / cell.name):
            report.skipped.append(cell.name)
        else:
            pending.append(cell)
    if report.skipped:
        tqdm.write(f"{len(report.skipped)} finished cell(s) skipped", file=sys.stderr)
    free_slots: list[str | None] = list(gpus) if gpus else [None] * jobs
    running: list[_Running] = []
    bar = tqdm(total=len(report.skipped) + len(pending), initial=len(report.skipped), desc=profile.name,
               unit="cell", file=sys.stderr, dynamic_ncols=True)
    try:
        with _sigterm_as_interrupt():
            while pending or running:
                while pending and free_slots:
                    env = cell_env(jobs, free_slots.pop(0))
                    running.append(_launch(pending.pop(0), profile, root, notebook, env))
                time.sleep(POLL_SECONDS)
                for item in [item for item in running if item.process.poll() is not None]:
                    running.remove(item)
                    free_slots.append(item.gpus)
                    _record(item, report, bar)
    finally:
        _stop(running)
        bar.close()
    return report


def _existing_notebook(notebook: Path, stage: str) -> Path:
    """The notebook path, or a FileNotFoundError saying which stage needs it."""
    if not notebook.is_file():
        raise FileNotFoundError(f"stage {stage}: notebook {notebook} does not exist")
    return notebook


def run_stage(notebook: Path, output: Path, parameters: dict[str, Any], root: Path) -> None:
    """Execute a one-off notebook (world building, analysis) in this process, with root as cwd."""
    notebook = _existing_notebook(Path(notebook), Path(notebook).stem)
    execute_notebook(notebook, Path(output), parameters, cwd=Path(root), log_output=True)


def analysis_parameters(profile: Profile, root: Path) -> dict[str, Any]:
    """The analysis notebook's parameters."""
    return {"profile": profile.name, "outputs_dir": str(root / "outputs" / profile.name), **profile.analysis}


def _stage_world(profile: Profile, root: Path) -> None:
    """Build the world when the profile says how; the notebook skips components that are up to date."""
    if profile.build_world is None:
        print(f"world: profile {profile.name} has no build_world; using {profile.world}", file=sys.stderr)
        return
    parameters = {**profile.build_world, "out_dir": str(root / profile.build_world["out_dir"])}
    output = Path(parameters["out_dir"]) / "build_world.ipynb"
    print(f"world: notebooks/build_world.py -> {output}", file=sys.stderr)
    run_stage(root / "notebooks" / "build_world.py", output, parameters, root)


def _stage_baseline(profile: Profile, root: Path) -> None:
    """Student vs teacher capability (paper Table 2), once per profile: skipped when its table exists."""
    out = root / "outputs" / profile.name / "baseline"
    if (out / "capability.csv").exists():
        print(f"baseline: {out / 'capability.csv'} exists; skipped", file=sys.stderr)
        return
    world = {k: resolve_world_entry(v, root) for k, v in profile.world.items() if k != "prm"}
    settings = {k: profile.cell[k] for k in ("temperature", "top_p", "max_new_tokens", "device", "teacher_device",
                                             "precision")}
    parameters = {**world, **settings, **profile.data, "out_dir": str(out)}
    print(f"baseline: notebooks/capability_baseline.py -> {out}", file=sys.stderr)
    run_stage(root / "notebooks" / "capability_baseline.py", out / "capability_baseline.ipynb", parameters, root)


def _executor(kind: str, profile: Profile, root: Path) -> Any:
    """The submitit executor of `--executor`, built (and its settings checked) before any work."""
    from .scale_out import make_executor, submitit_dir  # deferred: only scale-out runs need submitit

    if not profile.cluster:
        raise ValueError(f"--executor {kind}: profile {profile.name} has no `cluster` section of executor settings")
    try:
        return make_executor(kind, submitit_dir(profile, root), profile.cluster)
    except Exception as exc:  # submitit: NameError for an unknown setting, RuntimeError without srun
        raise ValueError(f"--executor {kind} with {profile.path} cluster settings: {type(exc).__name__}: {exc}") from exc


def _stage_cells(profile: Profile, root: Path, args: argparse.Namespace) -> RunReport:
    """Run the matrix (here, or as submitit jobs) and print its failures."""
    notebook = root / "notebooks" / "train_cell.py"
    if args.executor is not None:
        from .scale_out import submit_matrix

        report = submit_matrix(profile, root, notebook, args.cells, args.executor)
    else:
        if args.gpu_slots:
            print(f"cells: {len(args.gpu_slots)} at once, on GPUs {' | '.join(args.gpu_slots)}", file=sys.stderr)
        report = run_matrix(profile, root, notebook, args.cells, args.jobs, args.gpu_slots)
    print(f"cells: {len(report.finished)} finished, {len(report.skipped)} skipped, {len(report.failed)} failed",
          file=sys.stderr)
    for failure in report.failed:
        print(f"  FAILED {failure.name}: {failure.error}\n    notebook: {failure.notebook}\n    log: {failure.log}",
              file=sys.stderr)
    return report


def _stage_analysis(profile: Profile, root: Path) -> None:
    """Run the analysis on whatever cells are finished."""
    output = root / "outputs" / profile.name / "analysis.ipynb"
    run_stage(root / "notebooks" / "analysis.py", output, analysis_parameters(profile, root), root)
    print(f"analysis: {output}\nreport: {root / 'outputs' / profile.name / 'report.md'}", file=sys.stderr)


def _parse_stages(text: str) -> list[str]:
    """The comma-separated stages, validated, in their natural order."""
    stages = [stage.strip() for stage in text.split(",") if stage.strip()]
    unknown = [stage for stage in stages if stage not in STAGES]
    if unknown or not stages:
        raise argparse.ArgumentTypeError(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    return [stage for stage in STAGES if stage in stages]


def _parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(prog="python -m reward_density.runner", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", help="profile name (params/<name>.yaml under --root) or a YAML path")
    parser.add_argument("--cells", default=None, help="comma-separated globs on cell names, e.g. 'outcome-*,*-rfull-*'")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at once (default 1)")
    parser.add_argument("--gpus", default=None,
                        help="GPU indices, e.g. 0,1,2,3: one cell per GPU (or per group of GPUs when the profile "
                             "uses cuda:1 too) at once; replaces --jobs")
    parser.add_argument("--executor", choices=("slurm", "local"), default=None,
                        help="submit the cells as a submitit job array (Slurm, or local subprocesses) with the "
                             "profile's `cluster` settings, instead of running them here")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=f"project root (default {REPO_ROOT})")
    parser.add_argument("--stages", type=_parse_stages, default=list(STAGES), help="default: " + ",".join(STAGES))
    parser.add_argument("--one-cell", metavar="SPEC_JSON", help=argparse.SUPPRESS)
    return parser


def _exit_with_parent(parent_pid: int) -> None:
    """Exit this cell process when the runner that started it is gone (its kernel then follows)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)  # the graceful path: kernel shut down, temp files removed
    time.sleep(STOP_GRACE_SECONDS)
    os._exit(143)


def _run_one_cell(spec_json: str) -> int:
    """Child-process entry: execute one cell's notebook; 0 on success, 1 with FAILURE_PREFIX on failure."""
    spec = json.loads(spec_json)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # so cleanup code runs
    threading.Thread(target=_exit_with_parent, args=(spec["parent_pid"],), daemon=True).start()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        execute_notebook(Path(spec["notebook"]), Path(spec["output"]), spec["parameters"],
                         cwd=Path(spec["cwd"]), log_output=True)
    except NotebookFailed as exc:
        print(f"{FAILURE_PREFIX}{exc.error}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry: validate the profile, then run the stages; 2 on a bad profile, 1 on any failure."""
    args = _parser().parse_args(argv)
    if args.one_cell:
        return _run_one_cell(args.one_cell)
    if not args.profile:
        _parser().error("--profile is required")
    root = args.root.resolve()
    try:
        profile = load_profile(find_profile(args.profile, root))
        if "cells" in args.stages:
            select_cells(profile, args.cells)
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        args.gpu_slots = gpu_slots(args.gpus, profile) if args.gpus else None
        args.executor = _executor(args.executor, profile, root) if args.executor else None
    except ValueError as exc:  # ProfileError included
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    papermill_log = logging.getLogger("papermill")
    papermill_log.setLevel(logging.INFO)  # the stage notebooks' own output (world-building progress)
    papermill_log.addFilter(lambda record: not record.getMessage().startswith(("Executing Cell", "Ending Cell")))
    try:
        return _run_stages(profile, root, args)
    except KeyboardInterrupt:
        print("interrupted: running cells were stopped; rerun to resume", file=sys.stderr)
        return 130


def _run_stages(profile: Profile, root: Path, args: argparse.Namespace) -> int:
    """Run the chosen stages in order; the analysis runs even when some cells failed."""
    ok = True
    try:
        if "world" in args.stages:
            _stage_world(profile, root)
        if {"baseline", "cells"} & set(args.stages):
            check_world({k: resolve_world_entry(v, root) for k, v in profile.world.items()}, profile.data)
        if "baseline" in args.stages:
            _stage_baseline(profile, root)
        if "cells" in args.stages:
            ok = _stage_cells(profile, root, args).ok
        if "analysis" in args.stages:
            _stage_analysis(profile, root)
    except WorldUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotebookFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

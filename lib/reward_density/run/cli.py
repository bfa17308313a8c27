"""The study's command line: world building, every training cell of a profile, then the analysis.

    python -m reward_density.run --profile mini [--cells 'outcome-*,*-rfull-*'] [--jobs 2 | --gpus 0,1]
        [--executor slurm|local] [--root DIR] [--stages world,baseline,cells,benchmark,analysis,kl_bound]

Cells write into `<root>/outputs/<profile>/cells/<cell name>/`; finished cells are skipped, leftovers of
killed or failed runs are cleared and rerun (run/matrix.py), so a second run measuring or training a profile is
refused while one is in progress (run/lock.py). With --gpus, each cell process sees only its own GPUs: one GPU
per cell, or a group when the profile places the teacher or the PRM on cuda:1.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
from pathlib import Path

from submitit.core.utils import FailedJobError  # sbatch refused the job array

from ..experiment.baseline import base_configs
from ..experiment.config import SFT
from ..experiment.profiles import (
    REPO_ROOT,
    MatrixCell,
    Profile,
    ProfileError,
    find_profile,
    load_profile,
    resolve_world_entry,
)
from ..world.build import config_of_build
from .local import gpu_slots
from .lock import FolderInUse, exclusive
from .matrix import (
    StaleCells,
    base_answers_dir,
    check_finished_cells,
    check_no_unplanned_cells,
    select_cells,
    stop_signals_as_interrupt,
)
from .notebooks import NotebookFailed, notebook_parameters
from .reachability import WorldTooSmall, WorldUnreachable, check_problem_counts, check_world
from .slurm import JobsInFlight, profile_executor
from .stage_times import RUN_LOG, StageTimes

# The stages' order; stages.py itself is imported only to run them: it loads the model code (seconds), which a
# usage or profile error need not wait for.
STAGES = ("world", "baseline", "cells", "benchmark", "analysis", "kl_bound")
DEFAULT_STAGES = tuple(stage for stage in STAGES if stage != "benchmark")  # its minute and a half is not the study's
# The profile sections passed whole to a stage's notebook as its parameters: (section, stage, notebook).
NOTEBOOK_SECTIONS = (("build_world", "world", "build_world.py"), ("kl_bound", "kl_bound", "kl_bound.py"))


def _parse_stages(text: str) -> list[str]:
    """The comma-separated stages, validated, in their natural order."""
    stages = [stage.strip() for stage in text.split(",") if stage.strip()]
    unknown = [stage for stage in stages if stage not in STAGES]
    if unknown or not stages:
        given = f"unknown stage(s) {unknown}" if unknown else "no stage given"
        raise argparse.ArgumentTypeError(f"{given}; choose from {', '.join(STAGES)}")
    return [stage for stage in STAGES if stage in stages]


def _parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(prog="python -m reward_density.run", description=__doc__.split("\n")[0])
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
    parser.add_argument("--stages", type=_parse_stages, default=list(DEFAULT_STAGES),
                        help=f"any of {','.join(STAGES)} (default: {','.join(DEFAULT_STAGES)})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI entry: validate the profile, then run the stages; 2 when the run cannot start (a bad profile, a held lock,
    stale cells, an unreachable world), 1 on any failure after, 130 on an interrupt."""
    args = _parser().parse_args(argv)
    if not args.profile:
        _parser().error("--profile is required")
    root = args.root.resolve()
    try:
        profile = load_profile(find_profile(args.profile, root))
        check_notebook_sections(profile, root, args.stages)
        check_build_world(profile)
        # Before the world stage, which may rebuild the world: the cells stage compares the world itself.
        check_finished_cells(profile, root, cells_to_check(profile, args.stages, args.cells), world=False)
        if "analysis" in args.stages:
            check_no_unplanned_cells(profile, root)
            check_compared_studies(profile, root)
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        if args.gpus is not None and args.executor:
            raise ValueError("--gpus places cells run here; under --executor the profile's cluster settings place "
                             "them (cluster.gpus_per_node)")
        slots = gpu_slots(args.gpus, profile) if args.gpus is not None else None  # '' is refused, not ignored
        executor = profile_executor(args.executor, profile, root) if args.executor else None
    except ValueError as exc:  # ProfileError included
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    papermill_log = logging.getLogger("papermill")
    papermill_log.setLevel(logging.INFO)  # the stage notebooks' own output (world-building progress)
    papermill_log.addFilter(lambda record: not record.getMessage().startswith(("Executing Cell", "Ending Cell")))
    try:
        with _study_lock(profile, root, args.stages), stop_signals_as_interrupt():  # every stage, as Ctrl-C
            return _run_stages(profile, root, args.stages, args.cells, args.jobs, slots, executor)
    except FolderInUse as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: running cells were stopped; rerun to resume", file=sys.stderr)
        return 130


def check_notebook_sections(profile: Profile, root: Path, stages: list[str]) -> None:
    """A section passed to a stage's notebook names only that notebook's parameters: papermill would merely warn
    of another, and the stage run on its defaults. A missing notebook is the stage's to report."""
    for section, stage, notebook in NOTEBOOK_SECTIONS:
        source, given = root / "notebooks" / notebook, getattr(profile, section)
        if stage not in stages or not given or not source.is_file():
            continue
        allowed = notebook_parameters(source)
        unknown = [key for key in given if key not in allowed]
        if unknown:
            raise ProfileError(f"{profile.path}: {section}.{unknown[0]}: unknown key; the parameters of "
                               f"notebooks/{notebook}: {', '.join(allowed)}")


def check_compared_studies(profile: Profile, root: Path) -> None:
    """The studies the analysis sets this one beside (analysis.compare_with, replicates, methods) have outputs to
    read, checked before any cell trains: a misspelled name failed only at the analysis, after the training."""
    analysis, methods = profile.analysis, profile.analysis["methods"] or {}
    named = {f"analysis.{key}": analysis[key] for key in ("compare_with", "replicates") if analysis[key]}
    if list(methods.values())[-1:] == [profile.name]:  # the last of the methods writes their comparison
        named |= {f"analysis.methods.{label}": name for label, name in methods.items()}
    for key, name in named.items():
        outputs = root / "outputs" / name
        if name != profile.name and not outputs.is_dir():
            raise ProfileError(f"{profile.path}: {key} = {name!r}, but {outputs} does not exist: run that study "
                               "first, or correct the name")


def check_build_world(profile: Profile) -> None:
    """The build_world section describes a world (a bad setting named before any stage runs), and the cells read
    answers in the format of its task: a multiplication world checked for \\boxed{} answers would score its
    last-integer answers as math-verify happens to read them."""
    if not profile.build_world:
        return
    try:
        task = config_of_build(profile.build_world).task
    except ValueError as error:
        raise ProfileError(f"{profile.path}: build_world: {error}") from error
    if profile.cell["answer_format"] != task.answer_format:
        raise ProfileError(f"{profile.path}: cell.answer_format = {profile.cell['answer_format']!r}, but the world "
                           f"it builds ({type(task).__name__}) states its answers as {task.answer_format!r}: set "
                           f"cell.answer_format: {task.answer_format}")


def cells_to_check(profile: Profile, stages: list[str], cells_filter: str | None) -> list[MatrixCell]:
    """The cells whose settings a run must find unchanged: every cell when the analysis reads them all, else the
    cells the cells stage selects (none without it). The --cells globs are validated whatever the stages."""
    selected = select_cells(profile, cells_filter)
    if "analysis" in stages:
        return profile.cells()
    return selected if "cells" in stages else []


def _study_lock(profile: Profile, root: Path, stages: list[str]) -> contextlib.AbstractContextManager:
    """The profile's lock for a run that measures or trains; an analysis alone may read a run in progress."""
    if not {"baseline", "cells"} & set(stages):
        return contextlib.nullcontext()
    return exclusive(profile.outputs_dir(root), f"a run of profile {profile.name}")


def _run_stages(profile: Profile, root: Path, stages: list[str], cells_filter: str | None, jobs: int,
                slots: list[str] | None, executor) -> int:
    """Run the chosen stages in order, timed; the analysis runs even when some cells failed."""
    from .stages import (
        reading_world,
        stage_analysis,
        stage_baseline,
        stage_benchmark,
        stage_cells,
        stage_kl_bound,
        stage_world,
    )

    ok, timed, cells, outcome = True, StageTimes(), None, "failed"
    reads_world = bool({"baseline", "cells"} & set(stages))
    try:
        with contextlib.ExitStack() as world_read:  # no other run rebuilds the world while these stages read it
            if "world" in stages:
                with timed("world"):
                    stage_world(profile, root, then_read=world_read if reads_world else None)
            elif reads_world:
                world_read.enter_context(reading_world(profile, root))
            if reads_world:
                read = {k: v for k, v in profile.world.items() if k != "control" or SFT in profile.matrix.regimes}
                check_world({k: resolve_world_entry(v, root) for k, v in read.items()}, profile.data)
                check_problem_counts(base_configs(profile, base_answers_dir(profile, root), root))
            if "baseline" in stages:
                with timed("baseline"):
                    stage_baseline(profile, root)
            if "cells" in stages:
                with timed("cells"):
                    cells = stage_cells(profile, root, cells_filter, jobs, slots, executor)
                ok = cells.ok
        if "benchmark" in stages:
            with timed("benchmark"):
                stage_benchmark(profile, root)
        if "analysis" in stages:
            with timed("analysis"):
                stage_analysis(profile, root)
        if "kl_bound" in stages and profile.kl_bound is None:  # nothing to time
            print(f"kl_bound: profile {profile.name} has no kl_bound section; nothing to do", file=sys.stderr)
        elif "kl_bound" in stages:
            with timed("kl_bound"):
                stage_kl_bound(profile, root)
        outcome = "finished" if ok else "failed"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    except (WorldUnreachable, WorldTooSmall, StaleCells, JobsInFlight) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotebookFailed, subprocess.CalledProcessError, FailedJobError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if timed.stages:  # a run stopped before any stage (an unreachable world) leaves no trace
            where = getattr(executor, "cluster", type(executor).__name__) if executor else "here"  # slurm, local
            timed.append_to(profile.outputs_dir(root) / RUN_LOG, profile=profile.name, outcome=outcome,
                            executor=where, jobs=None if executor else len(slots) if slots else jobs,
                            cells=cells.counts if cells else None)
    return 0 if ok else 1

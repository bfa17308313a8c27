"""The stages of a study, in order: world building, capability baseline, the cells, the analysis.

World building, baseline and analysis are notebooks run once per profile in this process; the cells go
to an executor (local.py or slurm.py).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import submitit

from ..experiment.profiles import Profile, resolve_world_entry
from .local import run_matrix
from .matrix import RunReport
from .notebooks import execute_notebook, existing_notebook
from .slurm import submit_matrix

STAGES = ("world", "baseline", "cells", "analysis")


def run_stage(notebook: Path, output: Path, parameters: dict[str, Any], root: Path) -> None:
    """Execute a one-off notebook (world building, analysis) in this process, with root as cwd."""
    notebook = existing_notebook(Path(notebook), Path(notebook).stem)
    execute_notebook(notebook, Path(output), parameters, cwd=Path(root), log_output=True)


def analysis_parameters(profile: Profile, root: Path) -> dict[str, Any]:
    """The analysis notebook's parameters."""
    return {"profile": profile.name, "outputs_dir": str(root / "outputs" / profile.name), **profile.analysis}


def stage_world(profile: Profile, root: Path) -> None:
    """Build the world when the profile says how; the notebook skips components that are up to date."""
    if profile.build_world is None:
        print(f"world: profile {profile.name} has no build_world; using {profile.world}", file=sys.stderr)
        return
    parameters = {**profile.build_world, "out_dir": str(root / profile.build_world["out_dir"])}
    output = Path(parameters["out_dir"]) / "build_world.ipynb"
    print(f"world: notebooks/build_world.py -> {output}", file=sys.stderr)
    run_stage(root / "notebooks" / "build_world.py", output, parameters, root)


def stage_baseline(profile: Profile, root: Path) -> None:
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


def stage_cells(
    profile: Profile, root: Path, cells_filter: str | None, jobs: int = 1, gpu_slots: list[str] | None = None,
    executor: submitit.Executor | None = None,
) -> RunReport:
    """Run the matrix (here, or as submitit jobs when an executor is given) and print its failures."""
    notebook = root / "notebooks" / "train_cell.py"
    if executor is not None:
        report = submit_matrix(profile, root, notebook, cells_filter, executor)
    else:
        if gpu_slots:
            print(f"cells: {len(gpu_slots)} at once, on GPUs {' | '.join(gpu_slots)}", file=sys.stderr)
        report = run_matrix(profile, root, notebook, cells_filter, jobs, gpu_slots)
    print(f"cells: {len(report.finished)} finished, {len(report.skipped)} skipped, {len(report.failed)} failed",
          file=sys.stderr)
    for failure in report.failed:
        print(f"  FAILED {failure.name}: {failure.error}\n    notebook: {failure.notebook}\n    log: {failure.log}",
              file=sys.stderr)
    return report


def stage_analysis(profile: Profile, root: Path) -> None:
    """Run the analysis on whatever cells are finished."""
    output = root / "outputs" / profile.name / "analysis.ipynb"
    run_stage(root / "notebooks" / "analysis.py", output, analysis_parameters(profile, root), root)
    print(f"analysis: {output}\nreport: {root / 'outputs' / profile.name / 'report.md'}", file=sys.stderr)



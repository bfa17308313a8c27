"""The stages of a study, in order: world building, capability baseline, the cells, the speed benchmark
against TRL (only when asked for), the analysis, and the KL bound of the KL-free seed paper on Optdigits.

World building, baseline, analysis and the KL bound are notebooks run once per profile in this process; the
cells go to an executor (local.py or slurm.py).
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import submitit

from ..analysis.speed import BENCHMARK_FILE
from ..data.problem_sets import TRAIN_FILE
from ..data.sources import MODEL_CONFIG
from ..experiment import kl_bound
from ..experiment.baseline import base_configs, base_eval_key
from ..experiment.profiles import BASELINE_DEFAULTS, STUDY_SETTINGS, Profile, resolve_world_entry
from ..experiment.provenance import code_fingerprint, fingerprints, read_json, write_json_atomic
from ..world.build import (
    COMPONENTS,
    WorldConfig,
    changed_build_settings,
    config_of_build,
    stale_components,
)
from .local import run_matrix
from .lock import exclusive, reading, replacing
from .matrix import (
    RunReport,
    StaleCells,
    base_answers_dir,
    cells_reading,
    changes_text,
    check_finished_cells,
    check_no_unplanned_cells,
)
from .notebooks import execute_notebook, existing_notebook
from .slurm import submit_matrix

KEY_FILE = "key.json"  # what a stage folder measured (world fingerprints, settings, code): rerun when it differs
BASELINE_BATCH = BASELINE_DEFAULTS["batch_size"]  # the capability baseline's problems per sampling batch, by default


def run_stage(notebook: Path, output: Path, parameters: dict[str, Any], root: Path) -> None:
    """Execute a one-off notebook (world building, analysis) in this process, with root as cwd."""
    notebook = existing_notebook(Path(notebook), Path(notebook).stem)
    execute_notebook(notebook, Path(output), parameters, cwd=Path(root), log_output=True)


def analysis_parameters(profile: Profile, root: Path) -> dict[str, Any]:
    """The analysis notebook's parameters."""
    settings = {key: profile.analysis[key] for key in STUDY_SETTINGS}
    return {"profile": profile.name, "outputs_dir": str(profile.outputs_dir(root)), **settings}


def stage_world(profile: Profile, root: Path, then_read: contextlib.ExitStack | None = None) -> None:
    """Build the world when the profile says how; the notebook skips components that are up to date. With then_read,
    the world's read lock (reading_world) is taken into it before the build lock goes, so that no other run can
    rebuild the world between this build and the stages that read it."""
    if profile.build_world is None:
        print(f"world: profile {profile.name} has no build_world; using {profile.world}", file=sys.stderr)
        return
    parameters = {**profile.build_world, "out_dir": str(root / profile.build_world["out_dir"])}
    output = Path(parameters["out_dir"]) / "build_world.ipynb"
    with exclusive(output.parent, "the world build", wait=True):  # profiles may share a world
        replaced = check_rebuild_keeps_cells(parameters, root)
        with replacing(output.parent, "the world build") if replaced else contextlib.nullcontext():
            print(f"world: notebooks/build_world.py -> {output}", file=sys.stderr)
            run_stage(root / "notebooks" / "build_world.py", output, parameters, root)
        if then_read is not None:  # after replacing's lock is dropped: the two would conflict in one process too
            then_read.enter_context(reading(output.parent))


def reading_world(profile: Profile, root: Path) -> contextlib.AbstractContextManager:
    """The stages that read a world the profile builds (baseline, cells) hold this: no other run rebuilds it
    meanwhile."""
    world = root / profile.build_world["out_dir"] if profile.build_world else None
    return reading(world) if world is not None and world.is_dir() else contextlib.nullcontext()


def check_rebuild_keeps_cells(parameters: dict[str, Any], root: Path) -> list[str]:
    """The world components a build with these parameters would replace (none for a first build); refuse
    (StaleCells) to replace any that finished cells, of this profile or another sharing the world, read as they are
    now: the rebuild would leave their results without their world."""
    world_dir = Path(parameters["out_dir"])
    if not (world_dir / "manifest.json").is_file():
        return []
    try:
        config = config_of_build(parameters)
    except ValueError:  # a bad setting: the build notebook names it
        return []
    replaced = list(COMPONENTS) if parameters.get("force") else stale_components(config, world_dir)
    readers = cells_reading(root, world_dir, replaced)
    if not readers:
        return replaced
    lines = [f"  {folder}: {len(names)} cell(s): {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"
             for folder, names in readers.items()]
    raise StaleCells(
        f"building the world in {world_dir} would replace {', '.join(replaced)} "
        f"({_rebuild_reason(parameters, config, world_dir, replaced)}), which "
        f"{sum(map(len, readers.values()))} finished cell(s) read as they are now:\n" + "\n".join(lines) +
        "\nthose cells would be left without the world they ran on (the cells stage refuses them): move or delete "
        "their folders to rebuild, restore the build_world settings that built it (its manifest.json), or give "
        "this profile a build_world.out_dir of its own")


def _rebuild_reason(parameters: dict[str, Any], config: WorldConfig, world_dir: Path, replaced: list[str]) -> str:
    """Why a world build would replace components: forced, settings changed (then -> now), folders missing, or a
    new builder."""
    if parameters.get("force"):
        return "force is set"
    if changed := changed_build_settings(config, world_dir):
        return f"its settings changed: {changes_text(changed)}"
    missing = [name for name in replaced if not (world_dir / name).is_dir()]
    reasons = [f"its {', '.join(missing)} folder{'s are' if len(missing) > 1 else ' is'} missing"] if missing else []
    if len(missing) < len(replaced):
        reasons.append("its builder changed since it was built")
    return "; ".join(reasons)


BASELINE_SETTINGS = ("temperature", "top_p", "max_new_tokens", "device", "teacher_device", "precision")


def _holds_key(out: Path, key: dict) -> bool:
    """Whether a stage's folder records this key; a damaged key file says no (the stage runs again)."""
    if not (out / KEY_FILE).is_file():
        return False
    try:
        return read_json(out / KEY_FILE) == key
    except ValueError as error:
        print(f"note: {error}; running the stage again", file=sys.stderr)
        return False


def _run_keyed(notebook: Path, output: Path, parameters: dict[str, Any], root: Path, key: dict) -> None:
    """Run a keyed stage's notebook into output's folder, then record its key there; the old key goes first, so that
    a run that fails after rewriting some results leaves them keyed to nothing (the next run redoes them)."""
    (output.parent / KEY_FILE).unlink(missing_ok=True)
    run_stage(notebook, output, parameters, root)
    write_json_atomic(output.parent / KEY_FILE, key)


def stage_baseline(profile: Profile, root: Path) -> None:
    """Student vs teacher capability (paper Table 2) and the base's greedy evaluations, once per world: skipped
    when the baseline folder holds the key of this world and these settings (a rebuilt world is measured anew)."""
    out = base_answers_dir(profile, root)
    world = {k: resolve_world_entry(v, root) for k, v in profile.world.items() if k != "prm"}
    settings = {k: profile.cell[k] for k in BASELINE_SETTINGS}
    # The base evaluations' own keys carry every setting they depend on (and nothing else): changing, say, a
    # learning rate or beta must not re-measure the base model.
    evaluations = [base_eval_key(config) for config in base_configs(profile, out, root)]
    key = {"world": fingerprints(world), "settings": settings, "data": profile.data,
           "base_evaluations": evaluations}
    batch = profile.baseline["batch_size"]
    if batch != BASELINE_BATCH:  # in the key only where it differs: keys written before it was a setting hold
        key["batch_size"] = batch
    if _holds_key(out, key):
        print(f"baseline: {out} measured this world already; skipped", file=sys.stderr)
        return
    parameters = {**{k: v for k, v in world.items() if k != "control"}, **settings, **profile.data, "out_dir": str(out),
                  "profile": str(profile.path), "root": str(root), "batch_size": batch,
                  "answer_format": profile.cell["answer_format"]}  # in the key through the base evaluations
    print(f"baseline: notebooks/capability_baseline.py -> {out}", file=sys.stderr)
    _run_keyed(root / "notebooks" / "capability_baseline.py", out / "capability_baseline.ipynb", parameters, root, key)


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
    print("cells: " + ", ".join(f"{count} {outcome}" for outcome, count in report.counts.items()), file=sys.stderr)
    for failure in report.failed:
        print(f"  FAILED {failure.name}: {failure.error}\n    notebook: {failure.notebook}\n    log: {failure.log}",
              file=sys.stderr)
    return report


def stage_benchmark(profile: Profile, root: Path, options: tuple[str, ...] = ()) -> None:
    """Our GRPO step against TRL's GRPOTrainer (tools/benchmark.py, the mini study's settings unless options say
    otherwise) on the study's own student and training prompts, in a process of its own, into the study's outputs
    folder, where the analysis reports it."""
    out = profile.outputs_dir(root) / BENCHMARK_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"benchmark: python -m reward_density.tools.benchmark -> {out}", file=sys.stderr)
    with reading_world(profile, root):  # no other run rebuilds the student meanwhile
        subprocess.run([sys.executable, "-m", "reward_density.tools.benchmark", *benchmark_workload(profile, root),
                        *options, "--out", str(out)], check=True, cwd=root)


def benchmark_workload(profile: Profile, root: Path) -> tuple[str, ...]:
    """The benchmark's --student and --problems, relative to root where they lie under it (as the report names
    them): the profile's own, where they are a built model folder and a mini-world problems folder; else none, and
    the benchmark times a random Qwen3 of the mini student's shape."""
    student, problems = (Path(resolve_world_entry(profile.world[key], root)) for key in ("student", "problems"))
    if (student / MODEL_CONFIG).is_file() and (problems / TRAIN_FILE).is_file():
        return "--student", _under(student, root), "--problems", _under(problems, root)
    print(f"benchmark: {student} is not a built model folder or {problems} holds no {TRAIN_FILE}; timing a random "
          "Qwen3 of the mini student's shape instead", file=sys.stderr)
    return ()


def _under(path: Path, root: Path) -> str:
    """path relative to root where it lies under it, else as it is."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def stage_analysis(profile: Profile, root: Path) -> None:
    """Run the analysis on whatever cells are finished (a learning-rate sweep's own analysis for a sweep), then the
    with/without-KL, method or replication comparison when the profile names the studies to compare with; refuse
    (StaleCells) when a finished cell, selected by --cells or not, ran with settings the profile no longer gives, or
    is not in its matrix."""
    check_finished_cells(profile, root, profile.cells(), world=False)
    check_no_unplanned_cells(profile, root)
    outputs, planned = profile.outputs_dir(root), [cell.name for cell in profile.cells()]
    if profile.matrix.sweeps_rates:
        notebook, written = "sweep_analysis.py", "sweep.md"
        parameters = {"profile": profile.name, "outputs_dir": str(outputs),
                      "choose_rate_by": profile.analysis["choose_rate_by"], "planned_cells": planned}
    else:
        notebook, written = "analysis.py", "report.md"
        parameters = {**analysis_parameters(profile, root), "planned_cells": planned}
    output = outputs / notebook.replace(".py", ".ipynb")
    run_stage(root / "notebooks" / notebook, output, parameters, root)
    print(f"analysis: {output}\nreport: {outputs / written}", file=sys.stderr)
    if profile.analysis["compare_with"]:  # a study that differs from another only in beta
        output = outputs / "kl_comparison.ipynb"
        run_stage(root / "notebooks" / "kl_comparison.py", output,
                  {**analysis_parameters(profile, root), "compare_with": profile.analysis["compare_with"],
                   "compare_with_dir": str(root / "outputs" / profile.analysis["compare_with"])}, root)
        print(f"comparison: {output}\nreport: {outputs / 'kl_comparison.md'}", file=sys.stderr)
    methods = profile.analysis["methods"] or {}
    if list(methods.values())[-1:] == [profile.name]:  # the last of the methods compared writes the comparison
        output = outputs / "method_comparison.ipynb"
        run_stage(root / "notebooks" / "method_comparison.py", output,
                  {**analysis_parameters(profile, root), "methods": profile.analysis["methods"]}, root)
        print(f"comparison: {output}\nreport: {outputs / 'method_comparison.md'}", file=sys.stderr)
    original = profile.analysis["replicates"]
    if original:  # the same study run again elsewhere (another world, fresh seeds)
        output = outputs / "replication.ipynb"
        run_stage(root / "notebooks" / "replication.py", output,
                  {"profile": profile.name, "outputs_dir": str(outputs), "replicates": original,
                   "replicates_dir": str(root / "outputs" / original),
                   "equivalence_margin": profile.analysis["equivalence_margin"]}, root)
        print(f"comparison: {output}\nreport: {outputs / 'replication.md'}", file=sys.stderr)


def stage_kl_bound(profile: Profile, root: Path) -> None:
    """Theorem 1 on Optdigits (notebooks/kl_bound.py) for a profile that asks for it; skipped when its folder
    holds the key of these parameters and this version of the experiment's code and notebook."""
    notebook = existing_notebook(kl_bound_notebook(root), "kl_bound")  # in the key: a clear error before it is read
    out, key = root / profile.kl_bound["out_dir"], kl_bound_key(profile, root)
    if _holds_key(out, key):
        print(f"kl_bound: {out} holds these results already; skipped", file=sys.stderr)
        return
    print(f"kl_bound: notebooks/kl_bound.py -> {out}", file=sys.stderr)
    _run_keyed(notebook, out / "kl_bound.ipynb", {**profile.kl_bound, "out_dir": str(out)},
               root, key)


def kl_bound_key(profile: Profile, root: Path) -> dict[str, Any]:
    """What the KL-bound results depend on: the profile's parameters, the experiment's code and the notebook that
    runs it (its defaults fill the parameters the profile leaves out, and it writes the table), as parsed, so that
    rewrapping or commenting them does not redo them."""
    return {"parameters": profile.kl_bound, "code": code_fingerprint(Path(kl_bound.__file__)),
            "notebook": code_fingerprint(kl_bound_notebook(root))}


def kl_bound_notebook(root: Path) -> Path:
    """The notebook the kl_bound stage runs."""
    return root / "notebooks" / "kl_bound.py"

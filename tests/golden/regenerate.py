"""Re-execute the golden notebooks of the smoke profile (run after changing a notebook or what it prints).

    ./run_all.sh goldens   # this script under the AVX2 kernel pin that `./run_all.sh test` checks them with

nbval (`./run_all.sh test`) re-runs each golden notebook and compares the cells marked
`# NBVAL_CHECK_OUTPUT`. Paths are relative to the repository root, so the goldens run from any checkout;
the cells write under outputs/golden/ (git-ignored), which each run starts without: the training notebook refuses
to train over a finished cell.
"""
import shutil
from pathlib import Path

from reward_density.experiment.profiles import REPO_ROOT
from reward_density.run.notebooks import execute_notebook
from reward_density.world.build import build_world, world_config

HERE = Path(__file__).resolve().parent
WORLD = "outputs/smoke/world"
OUTPUTS = "outputs/golden"
# Two arms side by side (the stacked engine), single arms, and the SFT control.
GOLDEN_CELLS = ("outcome", [1, "full"]), ("process", 2), ("distillation", "full"), ("sft", [1, 2])


def goldens() -> list[tuple[str, str, dict]]:
    """(golden file, notebook source, parameters), in the order nbval runs them (alphabetical)."""
    runs = [("01_build_world.ipynb", "build_world.py", {"size": "smoke", "out_dir": WORLD}),
            ("02_capability_baseline.ipynb", "capability_baseline.py",
             {**{k: f"{WORLD}/{k}" for k in ("student", "teacher", "problems")}, "out_dir": f"{OUTPUTS}/baseline",
              "ks": [1, 2, 4], "max_new_tokens": 16, "batch_size": 8, "profile": "smoke"})]
    # A training cell is picked by profile and arm; the smoke profile gives the rest (and the world's paths).
    runs += [(f"{3 + i:02d}_train_{regime}_{_label(rank)}.ipynb", "train_cell.py",
              {"profile": "smoke", "regime": regime, "rank": rank, "seed": 0, "cells_dir": f"{OUTPUTS}/cells"})
             for i, (regime, rank) in enumerate(GOLDEN_CELLS)]
    runs.append((f"{3 + len(GOLDEN_CELLS):02d}_analysis.ipynb", "analysis.py",
                 {"profile": "smoke", "outputs_dir": OUTPUTS}))
    return runs


def clear_outputs() -> None:
    """Remove what an earlier run of the goldens wrote."""
    shutil.rmtree(REPO_ROOT / OUTPUTS, ignore_errors=True)


def _label(rank) -> str:
    """r1, rfull, or r1-rfull for arms trained side by side."""
    return "-".join(f"r{r}" for r in (rank if isinstance(rank, list) else [rank]))


if __name__ == "__main__":
    build_world(world_config("smoke"), REPO_ROOT / WORLD)
    clear_outputs()
    for golden, source, parameters in goldens():
        print(f"{source} -> {golden}")
        execute_notebook(REPO_ROOT / "notebooks" / source, HERE / golden, parameters, cwd=REPO_ROOT)

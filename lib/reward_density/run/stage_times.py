"""How long each stage of a study run took: a line on stderr as each ends, and one JSON line per run appended to
the profile's outputs folder (runs.jsonl, not in git) with the CPU, the cells run at once and the code."""
from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..experiment.provenance import code_state, cpu_model, manifest

RUN_LOG = "runs.jsonl"


def cpu_seconds() -> float:
    """CPU-seconds of this process and of its finished children: cell processes, notebook kernels and, through
    the kernels, the world's build workers. Cells run elsewhere (a Slurm array) are not counted."""
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(usage.ru_utime + usage.ru_stime for usage in used)


class StageTimes:
    """Wall- and CPU-seconds of the stages of one run, in the order they ran."""

    def __init__(self) -> None:
        self.started = datetime.now(timezone.utc)
        self.start = time.monotonic()
        self.stages: dict[str, dict[str, float]] = {}
        self.code = code_state()  # a run is hours long: what it ran is the code it started with

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        """Time the stage run inside the block, even one that fails or is interrupted, and print its time."""
        wall, cpu = time.monotonic(), cpu_seconds()
        try:
            yield
        finally:
            spent = {"wall_seconds": round(time.monotonic() - wall, 1), "cpu_seconds": round(cpu_seconds() - cpu, 1)}
            self.stages[stage] = spent
            print(f"{stage}: {_duration(spent['wall_seconds'])} wall, {_duration(spent['cpu_seconds'])} CPU "
                  f"({cpu_model()})", file=sys.stderr)

    def append_to(self, path: Path, **extra: Any) -> None:
        """Add this run's record (stages, total wall time, the code it started with, the machine, extra) to path."""
        record = {"started": self.started.isoformat(timespec="seconds"), "stages": self.stages,
                  "wall_seconds": round(time.monotonic() - self.start, 1), **manifest("cpu", self.code, **extra)}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as handle:
                handle.write(json.dumps(record, default=str) + "\n")
        except OSError as exc:  # the stages' own results are written already: a log that cannot be kept loses none
            print(f"warning: the stage times were not recorded: {exc}", file=sys.stderr)
            return
        print(f"stage times: {path}", file=sys.stderr)


def _duration(seconds: float) -> str:
    """'42 s' under a minute, else '6.4 min'."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"

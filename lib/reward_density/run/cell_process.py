"""The process that runs one cell for the local runner (local.py): `python -m reward_density.run.cell_process SPEC`.

It imports only the notebook machinery, so starting it costs little; it exits when the runner that
started it is gone, and a failure is printed with FAILURE_PREFIX for the runner to read back from run.log.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time

from .notebooks import execute_cell

GRACE_SECONDS = 10.0  # after the runner is gone: time for the graceful exit (kernel shut down, temp files removed)


def _exit_with_parent(parent_pid: int) -> None:
    """Exit this cell process when the runner that started it is gone (its kernel then follows)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(143)


def main(spec_json: str) -> int:
    """Execute one cell's notebook; 0 on success, 1 after printing the failure."""
    spec = json.loads(spec_json)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # so cleanup code runs
    threading.Thread(target=_exit_with_parent, args=(spec["parent_pid"],), daemon=True).start()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    return 0 if execute_cell(spec) is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""One runner per study folder at a time, one build per world folder, and no rebuild of a world being read.

A second runner of the same profile would take the first one's running cells for the leftovers of a killed run and
clear them; two runs building one world would write the same files; a rebuild would change a world under the cells
training on it. Each lock is an flock on a file in the folder: the operating system drops it when its process ends,
however it ends, so no stale lock outlives a crash.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

LOCK_FILE = ".run.lock"  # holds the current holder's pid, host and start time
READERS_FILE = ".readers.lock"  # shared by the runs reading a world, exclusive to one replacing it


class FolderInUse(ValueError):
    """Another process holds the folder's lock."""


@contextmanager
def exclusive(folder: Path, what: str, *, wait: bool = False) -> Iterator[None]:
    """Hold folder's lock for the block. Held elsewhere: raise FolderInUse naming the holder, or wait for it."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a+") as handle:
        if not _try_lock(handle, folder):
            if not wait:
                raise FolderInUse(f"{folder} is in use by {_holder(handle)}, so {what} cannot start; wait for that "
                                  "run to finish, or stop it")
            print(f"{what}: waiting for {_holder(handle)}, which holds {folder}", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {since}")
        handle.flush()
        yield


@contextmanager
def reading(folder: Path) -> Iterator[None]:
    """Read folder (a world) for the block, beside any other reader; waits while a rebuild replaces it."""
    with open(folder / READERS_FILE, "a+") as handle:
        if not _try_lock(handle, folder, fcntl.LOCK_SH | fcntl.LOCK_NB):
            print(f"waiting for another run's rebuild of {folder}", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_SH)
        yield


@contextmanager
def replacing(folder: Path, what: str) -> Iterator[None]:
    """Replace what folder holds in the block; raise FolderInUse while another run reads it."""
    with open(folder / READERS_FILE, "a+") as handle:
        if not _try_lock(handle, folder, fcntl.LOCK_EX | fcntl.LOCK_NB):
            raise FolderInUse(f"{folder} is being read by another run (its capability baseline or cells), so {what} "
                              "cannot replace it now; wait for that run to finish, or stop it")
        yield


def _try_lock(handle, folder: Path, operation: int = fcntl.LOCK_EX | fcntl.LOCK_NB) -> bool:
    """Take the lock (without waiting, by default): False when another process holds it. A file system without
    flock (some cluster file systems) is noted and treated as unlocked."""
    try:
        fcntl.flock(handle, operation)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        print(f"note: {folder}: cannot lock ({error.strerror}); two runs on it would not be stopped", file=sys.stderr)
    return True


def _holder(handle) -> str:
    """What the lock file says about its holder."""
    handle.seek(0)
    return handle.read().strip() or "another process"

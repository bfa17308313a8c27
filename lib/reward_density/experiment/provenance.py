"""What produced a result: git commit and dirty flag, package versions, device, wall time."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("torch", "transformers", "peft", "trl", "math-verify", "tokenizers", "numpy", "datasets", "papermill",
            "pandas")


def git_state(cwd: Path | None = None) -> dict[str, Any]:
    """The commit checked out and whether tracked files differ from it (None outside a git checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide the numbers."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_description(device: str | torch.device = "cpu") -> str:
    """A human-readable name of the device the run used."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} torch threads"


def manifest(device: str | torch.device = "cpu", **extra: Any) -> dict[str, Any]:
    """Git state, versions, device and python, plus whatever the caller adds (params, timings)."""
    return {
        "git": git_state(Path(__file__).resolve().parent),
        "versions": package_versions(),
        "python": platform.python_version(),
        "device": device_description(device),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),  # the GPUs the runner gave this cell
        **extra,
    }


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to a temp file in the same folder, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        json.dump(payload, handle, indent=2, sort_keys=True, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, path)

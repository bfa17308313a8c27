"""What produced a result: git commit, dirty flag and working tree, package versions, device, wall time."""
from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import secrets
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("torch", "transformers", "peft", "trl", "math-verify", "tokenizers", "numpy", "datasets", "papermill",
            "pandas")


def _git(cwd: Path | str | None, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


CODE_ROOT = Path(__file__).resolve().parents[3]  # the checkout the library was loaded from (lib/reward_density/...)


def git_state(cwd: Path | None = None, root: Path | None = None) -> dict[str, Any]:
    """The commit checked out and whether the files other than outputs/ differ from it: a tracked one changed, or a
    new one git does not ignore (None outside a git checkout, or in one whose top is not root, when given: a copy
    of the code unpacked inside another repository would record that repository's commit)."""
    # The code, not the results: a study rewrites committed outputs (a baseline, a report) as it runs, and a run on
    # clean code must not call itself dirty because an earlier stage or run wrote them.
    code = (":(top)", ":(top,exclude)outputs")
    try:
        if root is not None and Path(_git(cwd, "rev-parse", "--show-toplevel")).resolve() != Path(root).resolve():
            return {"commit": None, "dirty": None}
        return {"commit": _git(cwd, "rev-parse", "HEAD"),
                "dirty": bool(_git(cwd, "status", "--porcelain", "--untracked-files=normal", "--", *code))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def working_tree(cwd: Path | None = None) -> str | None:
    """The git tree id of the checkout's files as they stand, tracked or not (ignored ones left out); None outside a
    git checkout.

    It names the code even where .git lags the files (a copy of the working tree that carries an older .git, as the
    device machines get): a commit whose tree it is, `git log --format='%H %T'`, holds exactly these files. The
    checkout is left as it was: its index and its object store untouched.
    """
    try:
        root = _git(cwd, "rev-parse", "--show-toplevel")
        objects, index = map(Path, _git(cwd, "rev-parse", "--path-format=absolute", "--git-path", "objects",
                                        "--git-path", "index").splitlines())
        with tempfile.TemporaryDirectory() as scratch:
            copy, scratch_objects = Path(scratch) / "index", Path(scratch) / "objects"
            if index.exists():
                shutil.copyfile(index, copy)  # its file stamps spare hashing the files that did not change
            # New blobs and trees go to a scratch object store that reads the checkout's own as an alternate.
            scratch_objects.mkdir()
            env = {**os.environ, "GIT_INDEX_FILE": str(copy), "GIT_OBJECT_DIRECTORY": str(scratch_objects),
                   "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects)}
            _git(root, "add", "--all", env=env)
            return _git(root, "write-tree", env=env)
    except (OSError, subprocess.CalledProcessError):
        return None


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
    if device.type == "mps":
        return f"Apple GPU (mps) beside {cpu_model()}"
    threads = torch.get_num_threads()
    return f"{cpu_model()}, {threads} torch thread{'s' * (threads > 1)}"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and its widest vector instructions."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name or platform.machine()} ({vector})"


def code_state() -> dict[str, Any]:
    """The code a run loaded: git state, package versions and python. Take it when the run starts: a commit made
    or a package installed while a run goes on is not the code that ran."""
    return {"git": git_state(CODE_ROOT, root=CODE_ROOT), "versions": package_versions(),
            "python": platform.python_version()}


def manifest(device: str | torch.device = "cpu", code: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The code (code_state(), read now unless given), device and kernels, plus whatever the caller adds (params,
    timings)."""
    return {
        **(code_state() if code is None else code),
        "device": device_description(device),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),  # the GPUs the runner gave this cell
        # The kernels' instruction set decides the rounding (run_all.sh pins it for cross-CPU reproducibility).
        "cpu_kernels": {"aten": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": os.environ.get("MKL_CBWR"),
                        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"), "threads": torch.get_num_threads()},
        **extra,
    }


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to a temp file in the same folder, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Opened with "x" rather than by tempfile, whose files are private (0600): the result gets the umask's
    # permissions, as every other file a run writes, and stays readable to whoever shares the outputs.
    temp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        with open(temp, "x") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)  # gone once replaced; half written when the dump failed


def read_json(path: Path) -> Any:
    """A JSON file this project wrote; a ValueError that names the file when it no longer parses."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): damaged after it was written") from error


def code_fingerprint(module: Path) -> str:
    """A hash of a Python file's syntax tree: its code and docstrings, not its layout or comments."""
    return hashlib.sha256(ast.dump(ast.parse(Path(module).read_text())).encode()).hexdigest()[:16]


def fingerprint(source: str | Path | None) -> str:
    """What identifies a model or dataset: a hash of a local file's or folder's contents, else the hub id."""
    if source is None:
        return "none"
    path = Path(source).expanduser()
    if not path.exists():
        return str(source)
    digest = hashlib.sha256()
    for file in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        digest.update(str(file.relative_to(path if path.is_dir() else path.parent)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def fingerprints(sources: dict[str, str]) -> dict[str, str]:
    """The fingerprint of each named model or dataset."""
    return {name: fingerprint(source) for name, source in sources.items()}

"""JupyterLab on the study: every py:percent notebook in notebooks/ opens as a notebook (jupytext's contents
manager and Lab extension) and saves back to its .py file.

    python -m reward_density.tools.lab [--port N] [--no-browser]        (what `./run_all.sh lab` runs)

The settings it adds go to the app-wide overrides of the environment's Lab (its own
`share/jupyter/lab/settings`): Lab's default viewer for Python files, "Jupytext Notebook", so a double-click
opens `notebooks/train_cell.py` as cells rather than as text; and no fetching of Jupyter news (offline).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..experiment.profiles import REPO_ROOT
from ..run.notebooks import encrypts_kernels

OVERRIDES = {
    "@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"python": "Jupytext Notebook"}},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},  # offline
}
START_PAGE = "/lab/tree/notebooks"


def settings_dir() -> Path:
    """Where this environment's JupyterLab reads its app-wide setting overrides."""
    return Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings"


def write_overrides(folder: Path) -> Path:
    """Merge OVERRIDES into folder/overrides.json, keeping whatever else it holds; return its path."""
    path = Path(folder) / "overrides.json"
    try:
        current = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error}); fix or delete it") from None
    for plugin, values in OVERRIDES.items():
        current[plugin] = {**current.get(plugin, {}), **values}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2) + "\n")
    return path


def lab_command(root: Path = REPO_ROOT, *, port: int | None = None, token: str | None = None,
                open_browser: bool = True, settings: Path | None = None) -> list[str]:
    """The command that serves JupyterLab on root, on the loopback interface whatever Jupyter's own configuration
    says (a container's often listens on every interface), opening on notebooks/ (token None: Jupyter makes one)."""
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}", f"--LabApp.default_url={START_PAGE}",
               "--ServerApp.ip=127.0.0.1"]
    if port is not None:
        command += [f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if token is not None:
        command.append(f"--IdentityProvider.token={token}")
    if not open_browser:
        command.append("--no-browser")
    if settings is not None:
        command.append(f"--LabApp.app_settings_dir={settings}")
    if _server_encrypts_kernels():
        command.append("--MappingKernelManager.transport_encryption=auto")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # containers often run as root; Jupyter refuses that unless told
    return command


def _server_encrypts_kernels() -> bool:
    """Whether the installed Jupyter server can start its kernels with CurveZMQ keys (run/notebooks.py)."""
    try:
        from jupyter_server.services.kernels.kernelmanager import MappingKernelManager
    except ImportError:  # not installed yet: `./run_all.sh lab` installs it before it builds the command
        return False
    return encrypts_kernels(MappingKernelManager)


def tcp_port(value: str) -> int:
    """A port number from the command line, 1-65535 (argparse's type)."""
    port = int(value) if value.isdigit() else 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port (1-65535)")
    return port


def main(argv: Sequence[str] | None = None) -> None:
    """Write the default-viewer override, then become JupyterLab (exec: a signal to this process reaches it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=tcp_port, default=None,
                        help="serve on this port (default: Jupyter's, 8888 or the next free)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser (print the URL only)")
    args = parser.parse_args(argv)
    print(f"[lab] Python files open as notebooks: {write_overrides(settings_dir())}", flush=True)
    command = lab_command(port=args.port, open_browser=not args.no_browser)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()

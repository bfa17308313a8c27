"""Run one jupytext py:percent notebook with papermill (papermill cannot read .py sources itself)."""
from __future__ import annotations

import ast
import logging
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import jupytext
import nbformat
import papermill
import zmq
from jupyter_client import KernelManager
from nbclient.exceptions import DeadKernelError
from papermill.exceptions import PapermillExecutionError
from traitlets.config import Config

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
FAILURE_PREFIX = "CELL FAILED: "  # starts the line a failed cell prints (its log's way to tell why)
# A kernel that never answered its first request ran nothing, so it is started again: kernels started at once
# race (papermill issue #239), and on CI's 2 cores one of two stayed silent for the whole 60-second wait
# while the other ran its notebook in 3 s.
KERNEL_START_ATTEMPTS = 3
KERNEL_START_FAILURES = ("Kernel didn't respond in", "Kernel died before replying to kernel_info")
# The text form of a display that has none of its own (IPython's Markdown and Image, a matplotlib figure), which
# papermill's log_output would put on the console as a line that says nothing. A printed line ends in a newline,
# so it never matches.
BARE_REPR = re.compile(r"<[\w.]+ object(?: at 0x[0-9a-fA-F]+)?>|<Figure size [\d.x]+ with \d+ Axes>")


def not_a_bare_repr(record: logging.LogRecord) -> bool:
    """A logging filter: keeps a log line unless it is a display's bare repr (BARE_REPR)."""
    return BARE_REPR.fullmatch(record.getMessage()) is None


def encrypts_kernels(manager: type) -> bool:
    """Whether this kernel manager class (jupyter_client 8.10+, jupyter_server) can give kernels CurveZMQ keys, and
    pyzmq can use them. A kernel talks to its runner over loopback TCP, and ipykernel 7 warns at every start that
    this traffic is not encrypted; transport_encryption 'auto' encrypts it for a kernel that declares it can."""
    return bool(zmq.has("curve") and manager.class_traits().get("transport_encryption"))


def kernel_config() -> Config:
    """The headless kernels' manager settings: CurveZMQ keys where encrypts_kernels(KernelManager), else none."""
    if encrypts_kernels(KernelManager):
        return Config({"KernelManager": {"transport_encryption": "auto"}})
    return Config()


class NotebookFailed(RuntimeError):
    """A notebook raised (or its kernel died); the executed notebook with the error is at `output`."""

    def __init__(self, source: Path, output: Path, error: str):
        super().__init__(f"{source} failed: {error} (executed notebook: {output})")
        self.source = source
        self.output = output
        self.error = error


def existing_notebook(notebook: Path, stage: str) -> Path:
    """The notebook path, or a FileNotFoundError saying which stage needs it."""
    if not Path(notebook).is_file():
        raise FileNotFoundError(f"stage {stage}: notebook {notebook} does not exist")
    return Path(notebook)


def read_source(source: Path) -> nbformat.NotebookNode:
    """A py:percent source as a notebook bound to the python3 kernel."""
    if not source.is_file():
        raise FileNotFoundError(f"notebook source {source} does not exist")
    notebook = jupytext.read(source, fmt="py:percent")
    notebook.metadata["kernelspec"] = dict(KERNELSPEC)
    notebook.metadata.setdefault("language_info", {"name": "python"})
    return notebook


def notebook_parameters(source: Path) -> list[str]:
    """The names a py:percent notebook's `parameters` cell assigns: the only ones papermill can set."""
    cells = [cell for cell in read_source(Path(source)).cells if "parameters" in cell.metadata.get("tags", [])]
    statements = ast.parse(cells[0].source).body if cells else []
    targets = [t for node in statements for t in getattr(node, "targets", [getattr(node, "target", None)])]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def convert(source: Path, dest: Path) -> Path:
    """Write a py:percent source as an .ipynb (what papermill reads)."""
    jupytext.write(read_source(Path(source)), dest, fmt="ipynb")
    return Path(dest)


def _describe(exc: PapermillExecutionError | DeadKernelError) -> str:
    """A one-line description of the failing cell's error."""
    if isinstance(exc, PapermillExecutionError):
        return f"cell {exc.exec_count}: {exc.ename}: {exc.evalue}"
    return f"the kernel died: {exc}"


def execute_notebook(
    source: Path,
    output: Path,
    parameters: dict[str, Any],
    cwd: Path | None = None,
    log_output: bool = False,
) -> None:
    """Execute a py:percent notebook with parameters; the executed notebook lands at output, even on failure."""
    source, output = Path(source), Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".ipynb", dir=output.parent)
    os.close(handle)
    try:
        convert(source, Path(temp_name))
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            try:
                _papermill(Path(temp_name), output, parameters, cwd, log_output)
                break
            except RuntimeError as exc:
                if not str(exc).startswith(KERNEL_START_FAILURES) or attempt == KERNEL_START_ATTEMPTS:
                    raise
                print(f"{source}: {exc}; starting a new kernel (attempt {attempt + 1} of {KERNEL_START_ATTEMPTS})",
                      file=sys.stderr, flush=True)
    except (PapermillExecutionError, DeadKernelError) as exc:
        raise NotebookFailed(source, output, _describe(exc)) from exc
    finally:
        Path(temp_name).unlink(missing_ok=True)


def _papermill(notebook: Path, output: Path, parameters: dict[str, Any], cwd: Path | None, log_output: bool) -> None:
    """One papermill execution of an .ipynb in a fresh kernel."""
    logging.getLogger("papermill").addFilter(not_a_bare_repr)  # once: a logger keeps one copy of a filter
    papermill.execute_notebook(
        str(notebook),
        str(output),
        parameters=parameters,
        kernel_name="python3",
        cwd=str(cwd) if cwd is not None else None,
        progress_bar=False,
        log_output=log_output,
        request_save_on_cell_execute=True,
        # Every output has arrived when the last cell ends; a graceful shutdown would wait 2.5 s
        # for a kernel that has spawned a process (the math-verify worker) before killing it anyway.
        shutdown_kernel="immediate",
        config=kernel_config(),
    )


def execute_cell(spec: dict[str, Any]) -> NotebookFailed | None:
    """Execute one cell's notebook from its spec (run/matrix.py); a failure is also printed after FAILURE_PREFIX."""
    try:
        execute_notebook(Path(spec["notebook"]), Path(spec["output"]), spec["parameters"], cwd=Path(spec["cwd"]),
                         log_output=True)
    except NotebookFailed as exc:
        print(f"{FAILURE_PREFIX}{exc.error}", file=sys.stderr, flush=True)
        return exc
    return None

"""The study in JupyterLab, for real: a Jupyter server on a loopback port serves every notebooks/*.py as a
notebook (jupytext), a kernel it starts runs the reward-debug notebook, and headless Chromium renders one."""
from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

from reward_density.experiment.profiles import REPO_ROOT
from reward_density.run.notebooks import encrypts_kernels
from reward_density.tools.lab import OVERRIDES, lab_command, write_overrides
from reward_density.tools.lab import main as lab_main

NOTEBOOKS = sorted(p.name for p in (REPO_ROOT / "notebooks").glob("*.py"))
START_SECONDS = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Lab:
    """A running JupyterLab server: its base URL, token, log file, and a JSON client of its REST API."""

    def __init__(self, url: str, token: str, process: subprocess.Popen, log: Path) -> None:
        self.url, self.token, self.process, self.log = url, token, process, log

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> dict:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = response.read()
        return json.loads(payload) if payload else {}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`./run_all.sh lab`'s server (tools/lab.py's command) on a free loopback port, with a token."""
    settings = write_overrides(tmp_path_factory.mktemp("lab-settings")).parent
    port, token = free_port(), secrets.token_hex(16)
    log_path = tmp_path_factory.mktemp("lab-log") / "lab.log"
    workspaces = tmp_path_factory.mktemp("lab-workspaces")  # the tabs the tests open stay out of the user's Lab
    command = lab_command(REPO_ROOT, port=port, token=token, open_browser=False, settings=settings)
    with open(log_path, "w") as log:
        process = subprocess.Popen([*command, f"--LabApp.workspaces_dir={workspaces}"], stdout=log,
                                   stderr=subprocess.STDOUT)
        server = Lab(f"http://127.0.0.1:{port}", token, process, log_path)
        deadline = time.time() + START_SECONDS
        while True:
            try:
                server.api("/api/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.time() > deadline:
                    process.kill()
                    pytest.fail(f"JupyterLab did not start in {START_SECONDS} s; "
                                f"its log: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
        yield server
        process.terminate()
        process.wait(timeout=30)


def test_the_lab_settings_open_python_files_as_notebooks(tmp_path):
    (tmp_path / "overrides.json").write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "dark"}}))
    written = json.loads(write_overrides(tmp_path).read_text())
    assert written["@jupyterlab/docmanager-extension:plugin"] == OVERRIDES["@jupyterlab/docmanager-extension:plugin"]
    assert written["@jupyterlab/apputils-extension:themes"] == {"theme": "dark"}, "other overrides are kept"
    (tmp_path / "overrides.json").write_text("{not json")
    with pytest.raises(ValueError, match="overrides.json: not valid JSON"):
        write_overrides(tmp_path)


@pytest.mark.parametrize("port", ["70000", "0", "abc", "-1"])
def test_a_port_that_is_not_one_stops_the_lab_before_it_starts(port, capsys):
    with pytest.raises(SystemExit) as stopped:
        lab_main(["--port", port])
    assert stopped.value.code == 2 and "is not a TCP port (1-65535)" in capsys.readouterr().err


@pytest.mark.parametrize("port", [None, 8890])
def test_the_lab_listens_on_the_loopback_interface_with_or_without_a_port(port):
    assert "--ServerApp.ip=127.0.0.1" in lab_command(REPO_ROOT, port=port), \
        "without the pin, a Jupyter configuration listening on every interface would expose the lab and its token"


def test_the_server_refuses_a_request_without_its_token(lab):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{lab.url}/api/contents/notebooks", timeout=30)
    assert refused.value.code == 403


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_notebook_is_served_as_a_notebook(lab, name):
    model = lab.api(f"/api/contents/notebooks/{name}?type=notebook&content=1")
    assert model["type"] == "notebook", (
        f"{name} is served as {model['type']}: jupytext's contents manager is not active")
    cells = model["content"]["cells"]
    assert any(c["cell_type"] == "markdown" for c in cells) and any(c["cell_type"] == "code" for c in cells)
    assert any("parameters" in c["metadata"].get("tags", []) for c in cells), f"{name} lost its parameters cell"


async def _execute(lab: Lab, kernel_id: str, sources: list[str]) -> list[dict]:
    """Run each source in the kernel over its websocket (the Jupyter messaging protocol); every output message."""
    from tornado.websocket import websocket_connect

    url = f"{lab.url.replace('http', 'ws')}/api/kernels/{kernel_id}/channels?token={lab.token}"
    socket_ = await websocket_connect(url)
    session, outputs = uuid.uuid4().hex, []
    for source in sources:
        msg_id = uuid.uuid4().hex
        socket_.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": source, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))
        # The reply comes on the shell channel and the outputs on iopub, in no set order between them: a cell is
        # done when both its reply and iopub's "idle" for it have arrived (on a busy machine outputs came after).
        replied = idle = False
        while not (replied and idle):
            message = json.loads(await asyncio.wait_for(socket_.read_message(), timeout=300))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["header"]["msg_type"]
            if kind in ("stream", "display_data", "execute_result", "error"):
                outputs.append(message)
            idle = idle or (kind == "status" and message["content"]["execution_state"] == "idle")
            if kind == "execute_reply":
                content = message["content"]
                if content["status"] != "ok":
                    raise AssertionError(f"cell failed in the server's kernel: {content.get('ename')}: "
                                         f"{content.get('evalue')}\n{source[:300]}")
                replied = True
    socket_.close()
    return outputs


def test_the_reward_debug_notebook_runs_in_a_kernel_the_server_started(lab, smoke_project):
    notebook = lab.api("/api/contents/notebooks/reward_debug.py?type=notebook&content=1")["content"]
    sources = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            sources.append(cell["source"])
            if "parameters" in cell["metadata"].get("tags", []):  # what papermill would inject
                sources.append(f"root = {str(smoke_project)!r}\nproblems = 1\ngroup_size = 2\nshow = 1")
    session = lab.api("/api/sessions", "POST", {"path": "notebooks/reward_debug.py", "type": "notebook",
                                                "name": "reward_debug.py", "kernel": {"name": "python3"}})
    try:
        outputs = asyncio.run(_execute(lab, session["kernel"]["id"], sources))
    finally:
        lab.api(f"/api/sessions/{session['id']}", "DELETE")
    text = "\n".join(m["content"].get("text", "") + json.dumps(m["content"].get("data", {})) for m in outputs)
    assert "2 completions sampled: 2 for each of 1 problems" in text
    assert "process reward" in text and "<span title=" in text
    if encrypts_kernels(MappingKernelManager):  # jupyter_server, jupyter_client and pyzmq as the set-up installs them
        assert "without encryption" not in lab.log.read_text(), "the server's kernel ran unencrypted"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="Chromium is not installed (Debian: apt-get install chromium chromium-driver)")
def test_jupyterlab_renders_a_study_notebook_in_headless_chromium(lab, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(f"{lab.url}/lab/tree/notebooks/reward_debug.py?token={lab.token}")
        heading = WebDriverWait(driver, 120).until(
            expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, ".jp-Notebook .jp-MarkdownCell h1")))
        assert "Inside the rewards" in heading.text, f"the notebook's title rendered as {heading.text!r}"
        WebDriverWait(driver, 60).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell")) >= 2,
            "the notebook's code cells did not render")
        driver.save_screenshot(str(tmp_path / "lab.png"))
    finally:
        driver.quit()

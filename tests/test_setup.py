"""The set-up files agree with each other: conda mirrors pip, CI calls the README's test command."""
import os
import re
import subprocess
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def requirement_names(requirements):
    return {re.split(r"[\[<>=!~ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_environment_yml_mirrors_every_pip_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = requirement_names(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted |= requirement_names(extra)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_block = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = requirement_names(r for r in pip_block if not r.startswith("-e"))
    assert wanted == listed, (
        f"only in pyproject: {sorted(wanted - listed)}; only in environment.yml: {sorted(listed - wanted)}")


def test_ci_runs_the_readme_test_command():
    command = re.search(r"\*\*Test command:\*\* `([^`]+)`", (ROOT / "README.md").read_text()).group(1)
    assert command in (ROOT / ".ci" / "run").read_text(), f".ci/run does not call {command!r}"


def test_the_board_of_a_profile_that_does_not_exist_is_refused_with_the_profiles_there_are():
    done = subprocess.run([str(ROOT / "run_all.sh"), "board", "minii"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, f"TensorBoard would serve an empty board for a mistyped profile: {done.stderr}"
    assert "no profile params/minii.yaml" in done.stderr and " mini " in done.stderr, done.stderr


def test_the_board_of_a_profile_file_that_does_not_exist_names_that_file():
    done = subprocess.run([str(ROOT / "run_all.sh"), "board", "elsewhere/mini.yaml"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "no profile file elsewhere/mini.yaml" in done.stderr, \
        f"a missing profile file is reported as a missing params/ profile: {done.stderr}"


def test_papers_refuses_a_profile_of_its_own_which_would_replace_every_papers():
    done = subprocess.run([str(ROOT / "run_all.sh"), "papers", "--jobs", "1", "--profile", "smoke"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--profile cannot be given" in done.stderr, done.stderr


def test_papers_stops_at_a_profile_that_fails_and_says_where_and_how_to_resume(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "profiles.log"
    # A stand-in interpreter: `-c import torch` succeeds; a study run logs its profile and fails on mini_klfree.
    (venv / "bin" / "python").write_text(f"""#!/usr/bin/env bash
[ "$1" = -c ] && exit 0
profile="$(echo "$@" | sed 's/.*--profile \\([^ ]*\\).*/\\1/')"  # the last --profile given wins
echo "$profile" >> {log}
[ "$profile" = mini_klfree ] && exit 1
exit 0
""")
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".reward-density-installed").touch()  # set-up done: no install
    done = subprocess.run([str(ROOT / "run_all.sh"), "papers"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "VENV": str(venv)})
    assert done.returncode == 1
    assert log.read_text().split() == ["mini", "mini_klfree"], "the profiles after a failed one must not run"
    assert "papers: stopped after profile mini_klfree (exit 1)" in done.stderr, done.stderr

"""The set-up files agree with each other: conda mirrors pip, CI calls the README's test command."""
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

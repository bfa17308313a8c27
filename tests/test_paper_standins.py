"""The paper profile end to end on CPU, with local stand-ins of its models and datasets (no network).

The stand-ins have the paper world's architectures and file layouts: a Qwen3 student and teacher sharing
one tokenizer, a Mistral PRM with its own tokenizer and step tag, hendrycks_math-style subject configs and
a MATH-500-style held-out file. Only sizes change; precision (bf16 autocast), micro-batching, activation
checkpointing, the prompt template and the loaders are the paper profile's own.
"""
import json
import urllib.error
from pathlib import Path

import pandas as pd
import pytest
import yaml

from reward_density.experiment.profiles import REPO_ROOT, load_profile
from reward_density.run import reachability
from reward_density.run.cli import main
from reward_density.run.lock import LOCK_FILE
from reward_density.tools.stand_ins import MATH_SUBJECTS, build_paper_stand_ins

CELLS = "process-r256-s0,distillation-rfull-s0,outcome-r1-s0"
SHRUNK = {"steps": 2, "eval_every": 1, "eval_problems": 4, "eval_batch_size": 4, "max_new_tokens": 24,
          "eval_max_new_tokens": 24, "device": "cpu", "teacher_device": "cpu", "prm_device": "cpu"}


def paper_profile_on(world: dict[str, str], folder) -> dict:
    """params/paper.yaml with the world swapped for the stand-ins and the sizes shrunk for a CPU."""
    data = yaml.safe_load((REPO_ROOT / "params" / "paper.yaml").read_text())
    data["world"] = world
    data["data"]["problem_subsets"] = list(MATH_SUBJECTS)
    data["cell"].update(SHRUNK)
    (folder / "params").mkdir(exist_ok=True)
    (folder / "params" / "paper.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return data


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A project root with the real notebooks and a paper profile pointing at freshly built stand-ins."""
    root = tmp_path_factory.mktemp("paper")
    (root / "notebooks").symlink_to(REPO_ROOT / "notebooks")
    paper_profile_on(build_paper_stand_ins(root / "stand_ins"), root)
    return root


def test_the_paper_profile_keeps_its_gpu_settings_on_the_stand_ins(root):
    profile = load_profile(root / "params" / "paper.yaml")
    assert profile.cell["precision"] == "bf16" and profile.cell["gradient_checkpointing"]
    assert profile.cell["micro_batch_size"] < profile.cell["prompts_per_step"] * profile.cell["group_size"]


def test_paper_profile_cells_run_end_to_end_on_the_stand_ins(root):
    code = main(["--profile", "paper", "--root", str(root), "--cells", CELLS, "--jobs", "2"])
    assert code == 0, f"the paper run failed; see {root}/outputs/paper/cells/*/run.log"
    cells = root / "outputs" / "paper" / "cells"
    for name in CELLS.split(","):
        folder = cells / name
        assert (folder / "summary.json").is_file(), f"{name} did not finish"
        params = json.loads((folder / "params.json").read_text())
        assert params["precision"] == "bf16" and params["micro_batch_size"] == 4
        assert params["prompt_template"].count("{problem}") == 1
        history = pd.read_csv(folder / "history.csv")
        assert list(history["step"]) == [1, 2] and history["loss"].notna().all()
        answers = pd.read_csv(folder / "answers.csv")
        # The held-out set is MATH-500's first usable problems: test/algebra/1.json has an unparsable gold.
        assert sorted(set(answers["problem_id"])) == [f"test/algebra/{i}.json" for i in (0, 2, 3, 4)]
    process = pd.read_csv(cells / "process-r256-s0" / "history.csv")
    assert "process/steps_mean" in process.columns, "the PRM did not score the student's steps"
    baseline = pd.read_csv(root / "outputs" / "paper" / "baseline" / "capability.csv")
    assert list(baseline["model"]) == ["student", "teacher"]
    accuracy = pd.read_csv(root / "outputs" / "paper" / "accuracy.csv")
    assert set(accuracy["regime"]) == {"outcome", "process", "distillation"}


def test_an_unreachable_model_or_dataset_stops_the_run_before_any_cell(root, tmp_path, capsys):
    data = yaml.safe_load((root / "params" / "paper.yaml").read_text())
    data["world"]["prm"] = "peiyi9979/math-shepherd-mistral-7b-prm"  # the hub is offline in the tests
    data["world"]["heldout"] = str(tmp_path / "no-such-MATH-500")
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "paper.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "notebooks").symlink_to(REPO_ROOT / "notebooks")
    assert main(["--profile", "paper", "--root", str(tmp_path), "--stages", "baseline,cells"]) == 2
    error = capsys.readouterr().err
    assert "world.prm = 'peiyi9979/math-shepherd-mistral-7b-prm'" in error, error
    assert "world.heldout" in error and "no-such-MATH-500" in error, error
    assert "(read as a hub id; a local folder is written ./peiyi9979/math-shepherd-mistral-7b-prm)" in error, error
    assert error.count("read as a hub id") == 1, "a local path is not read as a hub id"
    written = [path for path in (tmp_path / "outputs").rglob("*") if path.is_file() and path.name != LOCK_FILE]
    assert not written, f"work started although the world cannot be reached: {written}"


def cache_model(cache: Path, repo_id: str) -> None:
    """A hub model's config in a Hugging Face cache laid out as the hub's downloads leave it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")


@pytest.mark.parametrize("hub", ["does not answer", "answers", "offline mode"])
def test_a_hub_that_does_not_answer_is_said_at_once_and_no_hub_id_is_tried(hub, monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", hub == "offline mode")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    probes = []

    def probe(request, timeout):
        probes.append(request.full_url)
        if hub == "does not answer":
            raise urllib.error.URLError("[Errno -2] Name or service not known")
        raise urllib.error.HTTPError(request.full_url, 401, "Unauthorized", {}, None)  # it answered

    tried = []
    monkeypatch.setattr(reachability.urllib.request, "urlopen", probe)
    monkeypatch.setattr(reachability, "_model_problem", lambda key, source: tried.append(key))
    monkeypatch.setattr(reachability, "_dataset_problem", lambda key, source, data: tried.append(key))
    world = {"student": "Qwen/Qwen3-1.7B-Base", "teacher": str(tmp_path / "teacher"), "prm": "peiyi9979/prm",
             "problems": "EleutherAI/hendrycks_math"}
    if hub != "does not answer":
        reachability.check_world(world, {})
        assert tried == list(world), "every entry is tried where the hub answers or the cache is read"
        assert len(probes) == (hub == "answers"), "offline mode asks the hub nothing"
        return
    with pytest.raises(reachability.WorldUnreachable) as caught:
        reachability.check_world(world, {})
    message = str(caught.value)
    assert tried == ["teacher"], "a hub id was tried although the hub did not answer, or a local path was not"
    endpoint = huggingface_hub.constants.ENDPOINT
    assert (f"world.student = 'Qwen/Qwen3-1.7B-Base': the hub ({endpoint}) does not answer: URLError"
            in message and "world.problems = 'EleutherAI/hendrycks_math'" in message), message
    assert "and the local cache lacks it" in message and "teacher" not in message, message
    assert "HF_HUB_OFFLINE=1 has the loaders look in their own caches" in message, message
    assert len(probes) == 1


def test_where_the_hub_does_not_answer_a_world_in_the_local_cache_runs_with_a_note(monkeypatch, tmp_path, capsys):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))

    def no_route(request, timeout):
        raise urllib.error.URLError("no route")

    monkeypatch.setattr(reachability.urllib.request, "urlopen", no_route)
    tried = []
    monkeypatch.setattr(reachability, "_model_problem", lambda key, source: tried.append(key))
    world = {"student": "Qwen/Qwen3-1.7B-Base", "teacher": "Qwen/Qwen3-8B", "prm": str(tmp_path / "prm")}
    for repo_id in ("Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-8B"):
        cache_model(tmp_path / "cache", repo_id)
    reachability.check_world(world, {})
    assert tried == ["prm"], "a cached hub id was tried against a hub that does not answer"
    note = capsys.readouterr().err
    assert "student, teacher read from the local cache: set HF_HUB_OFFLINE=1" in note, note


def test_a_missing_sft_control_folder_is_named_before_any_cell(tmp_path):
    (tmp_path / "problems").mkdir()
    (tmp_path / "problems" / "train.jsonl").touch()
    world = {"problems": str(tmp_path / "problems"), "control": str(tmp_path / "no-control")}
    with pytest.raises(reachability.WorldUnreachable) as caught:
        reachability.check_world(world, {})
    assert f"world.control = '{tmp_path / 'no-control'}'" in str(caught.value), str(caught.value)
    assert "world.problems" not in str(caught.value), "a folder holding train.jsonl was reported unreachable"

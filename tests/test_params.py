"""Profiles: the shipped ones load and expand; every invalid one fails before any work, naming file and key."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from reward_density.params import REPO_ROOT, Cell, ProfileError, find_profile, load_profile, resolve_world_entry

SMOKE = yaml.safe_load((REPO_ROOT / "params" / "smoke.yaml").read_text())


def write_profile(folder: Path, data, name: str = "tiny") -> Path:
    """Write a profile (a mapping, or raw text) as folder/<name>.yaml."""
    path = folder / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def tiny(**changes) -> dict:
    """The smoke profile renamed 'tiny', with dotted-key changes applied (value None deletes the key)."""
    data = copy.deepcopy(SMOKE)
    data["profile"] = "tiny"
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node[key]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return data


def error_of(tmp_path: Path, data) -> str:
    """The ProfileError message of loading this profile."""
    path = write_profile(tmp_path, data)
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    return message


@pytest.mark.parametrize("name, cells", [("mini", 54), ("smoke", 9), ("paper", 54)])
def test_shipped_profiles_load(name, cells):
    profile = load_profile(find_profile(name))
    assert profile.name == name
    names = [cell.name for cell in profile.cells()]
    assert len(names) == len(set(names)) == cells


def test_mini_order_and_names():
    cells = load_profile(find_profile("mini")).cells()
    assert [c.name for c in cells[:7]] == [
        "outcome-r1-s0", "outcome-r1-s1", "outcome-r1-s2", "outcome-r2-s0", "outcome-r2-s1", "outcome-r2-s2",
        "outcome-r4-s0",
    ]
    assert [c.name for c in cells[15:18]] == ["outcome-rfull-s0", "outcome-rfull-s1", "outcome-rfull-s2"]
    assert cells[18].name == "process-r1-s0" and cells[-1].name == "distillation-rfull-s2"
    assert {c.learning_rate for c in cells if c.rank is None} == {1.0e-4}
    assert {c.learning_rate for c in cells if c.rank is not None} == {3.0e-4}


def test_ranks_sorted_ascending_then_full(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(matrix__ranks=[4, 1], matrix__regimes=["process"])))
    assert [c.name for c in profile.cells()] == ["process-r1-s0", "process-r4-s0", "process-rfull-s0"]


def test_cell_parameters(tmp_path):
    profile = load_profile(find_profile("smoke"))
    full = Cell("process", None, 0, 3.0e-5)
    params = full.parameters(profile, tmp_path / "cell", root=tmp_path)
    assert params["rank"] == "full" and params["regime"] == "process" and params["learning_rate"] == 3.0e-5
    assert params["out_dir"] == str(tmp_path / "cell") and params["profile"] == "smoke"
    assert params["student"] == str(tmp_path / "outputs/smoke/world/student")
    assert {k: params[k] for k in profile.cell} == profile.cell
    paper = load_profile(find_profile("paper"))
    params = Cell("outcome", 4, 1, 3.0e-5).parameters(paper, tmp_path, root=tmp_path)
    assert params["student"] == "Qwen/Qwen3-1.7B-Base" and params["heldout"] == "HuggingFaceH4/MATH-500"
    assert params["rank"] == 4


def test_world_entry_rule(tmp_path):
    (tmp_path / "local" / "model").mkdir(parents=True)
    assert resolve_world_entry("Qwen/Qwen3-8B", tmp_path) == "Qwen/Qwen3-8B"
    assert resolve_world_entry("local/model", tmp_path) == str(tmp_path / "local/model")
    assert resolve_world_entry("./x", tmp_path) == str(tmp_path / "x")
    assert resolve_world_entry("outputs/w/student", tmp_path) == str(tmp_path / "outputs/w/student")
    assert resolve_world_entry("/abs/path", tmp_path) == "/abs/path"


@pytest.mark.parametrize(
    "changes, key, expected",
    [
        ({"extra": 1}, "extra: unknown key", "allowed keys in the profile: profile, world"),
        ({"matrix__rank": [1]}, "matrix.rank: unknown key", "regimes, ranks, full_ft, seeds, learning_rate"),
        ({"cell__lr": 0.1}, "cell.lr: unknown key", "allowed keys in cell: steps"),
        ({"world__tokenizer": "x"}, "world.tokenizer: unknown key", "student, teacher, prm, problems, heldout"),
        ({"cell__steps": None}, "cell.steps: missing key", "required in cell"),
        ({"analysis": None}, "analysis: missing key", "required in the profile"),
        ({"matrix__ranks": [1, 0]}, "matrix.ranks[1] = 0", "a positive integer"),
        ({"matrix__ranks": [-2]}, "matrix.ranks[0] = -2", "a positive integer"),
        ({"matrix__ranks": ["4"]}, "matrix.ranks[0] = '4'", "a positive integer"),
        ({"matrix__ranks": [True]}, "matrix.ranks[0] = True", "a positive integer"),
        ({"matrix__ranks": [1.5]}, "matrix.ranks[0] = 1.5", "a positive integer"),
        ({"matrix__ranks": [2, 2]}, "matrix.ranks[1] = 2", "unique"),
        ({"matrix__ranks": []}, "matrix.ranks = []", "a non-empty list"),
        ({"matrix__seeds": [-1]}, "matrix.seeds[0] = -1", "a non-negative integer"),
        ({"matrix__regimes": ["outcome", "dense"]}, "matrix.regimes[1] = 'dense'", "outcome, process, distillation"),
        ({"matrix__full_ft": "yes"}, "matrix.full_ft = 'yes'", "true or false"),
        ({"matrix__learning_rate": {"lora": 3.0e-4}}, "matrix.learning_rate.full: missing key", "lora, full"),
        ({"matrix__full_ft": False}, "matrix.learning_rate.full", "matrix.full_ft is false"),
        ({"matrix__learning_rate__lora": "3e-4"}, "matrix.learning_rate.lora = '3e-4'", "write it with a dot"),
        ({"matrix__learning_rate__full": 0}, "matrix.learning_rate.full = 0", "a positive number"),
        ({"cell__steps": True}, "cell.steps = True", "a positive integer"),
        ({"cell__group_size": 1}, "cell.group_size = 1", "an integer >= 2"),
        ({"cell__top_p": 1.5}, "cell.top_p = 1.5", "(0, 1]"),
        ({"cell__lora_dropout": 1.0}, "cell.lora_dropout = 1.0", "[0, 1)"),
        ({"cell__kl_estimator": "k2"}, "cell.kl_estimator = 'k2'", "one of paper, k3, k1"),
        ({"cell__loss_normalisation": "sum"}, "cell.loss_normalisation = 'sum'", "token_mean, sequence_mean"),
        ({"analysis__confidence": 1}, "analysis.confidence = 1", "(0, 1)"),
        ({"world__student": ""}, "world.student = ''", "a non-empty string"),
        ({"build_world": [1]}, "build_world = [1]", "a mapping"),
        ({"cell": [1]}, "cell = [1]", "a mapping with keys steps"),
        ({"profile": "mini"}, "profile = 'mini'", "the file's stem 'tiny'"),
        ({"cell__precision": "fp16"}, "cell.precision = 'fp16'", "one of fp32, bf16"),
        ({"cell__micro_batch_size": 0}, "cell.micro_batch_size = 0", "a positive integer"),
        ({"cell__gradient_checkpointing": "no"}, "cell.gradient_checkpointing = 'no'", "true or false"),
        ({"data": {"prompt_template": "Solve {question}"}}, "data.prompt_template", "{problem} exactly once"),
        ({"data": {"problem_subsets": ["algebra"]}}, "data.prompt_template: missing key", "required in data"),
        ({"data": {"prompt_template": "{problem}", "subjects": []}}, "data.subjects: unknown key", "problem_subsets"),
        ({"data": {"prompt_template": "{problem}", "problem_subsets": []}}, "data.problem_subsets = []", "non-empty"),
        ({"cluster": {"mem_gb": 8}}, "cluster.timeout_min: missing key", "required in cluster"),
        ({"cluster": {"timeout_min": 0.5}}, "cluster.timeout_min = 0.5", "a positive integer"),
    ],
)
def test_invalid_profile_names_key_and_expectation(tmp_path, changes, key, expected):
    message = error_of(tmp_path, tiny(**changes))
    assert key in message and expected in message, message


def test_paper_world_without_build_world_is_valid(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(build_world=None)))
    assert profile.build_world is None


def test_malformed_yaml_names_the_file(tmp_path):
    message = error_of(tmp_path, "profile: tiny\nmatrix: [1, 2\n")
    assert "not valid YAML" in message


def test_empty_file(tmp_path):
    assert "expected a mapping with keys profile, world" in error_of(tmp_path, "")


def test_unknown_profile_lists_known(tmp_path):
    (tmp_path / "params").mkdir()
    write_profile(tmp_path / "params", tiny())
    with pytest.raises(ProfileError, match="no such profile file.*profiles in .*: tiny"):
        find_profile("nope", tmp_path)
    assert find_profile("tiny", tmp_path) == tmp_path / "params" / "tiny.yaml"

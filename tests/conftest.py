"""Shared fixtures: stand-ins built once per test session in a temporary folder."""
import os

# Nothing in the suite may reach a model hub; huggingface_hub and datasets read these at import.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

import pytest  # noqa: E402
from golden.regenerate import clear_outputs  # noqa: E402

from reward_density.experiment.profiles import REPO_ROOT  # noqa: E402
from reward_density.tools.stand_ins import build_qwen3, build_tokenizer  # noqa: E402
from reward_density.world.build import build_world, world_config  # noqa: E402

SMOKE_WORLD = REPO_ROOT / "outputs" / "smoke" / "world"


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A saved random tiny Qwen3 student with its tokenizer, loadable by from_pretrained."""
    folder = tmp_path_factory.mktemp("student")
    build_qwen3(len(tiny_tokenizer), seed=0).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


def make_smoke_project(root):
    """root laid out as a project: the real notebooks and params, and the repository's smoke world (built if
    missing) under outputs/smoke/world."""
    build_world(world_config("smoke"), SMOKE_WORLD, log=lambda line: None)  # skipped when up to date
    for name in ("notebooks", "params"):
        (root / name).symlink_to(REPO_ROOT / name)
    (root / "outputs" / "smoke").mkdir(parents=True)
    (root / "outputs" / "smoke" / "world").symlink_to(SMOKE_WORLD)
    return root


@pytest.fixture(scope="session")
def smoke_project(tmp_path_factory):
    """A project root with the real notebooks and params and the repository's smoke world, shared by the session."""
    return make_smoke_project(tmp_path_factory.mktemp("smoke-project"))


def pytest_collection_finish(session):
    """Build the smoke world (outputs/smoke/world) first: the golden notebooks read it (seconds; skipped if current).
    Clear what an earlier run of the goldens wrote, whose finished cells the training notebook would not replace."""
    if any(str(item.path).endswith(".ipynb") for item in session.items):
        build_world(world_config("smoke"), SMOKE_WORLD, log=lambda line: None)
        clear_outputs()

"""Shared fixtures: stand-ins built once per test session in a temporary folder."""
import pytest

from tiny_models import build_qwen3, build_tokenizer


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

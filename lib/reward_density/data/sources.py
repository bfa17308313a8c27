"""Loading models and tokenizers from a local folder or a hub id, with errors that name the problem."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

MODEL_CONFIG = "config.json"  # what every save_pretrained model folder holds


DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow")  # a file's name, never a hub id


def looks_local(source: str) -> bool:
    """Whether source has a path's form no hub id has ('name' or 'owner/name'): it starts with '.', '/' or '~', holds
    more than one '/', or names a data file."""
    return source.startswith((".", "/", "~")) or source.count("/") > 1 or source.endswith(DATA_FILE_SUFFIXES)


def is_local(source: str) -> bool:
    """Whether a model or dataset source names a local path (path-like, or existing) rather than a hub id."""
    return looks_local(source) or Path(source).expanduser().exists()


def _source(name_or_path: str | Path, what: str, required_file: str) -> str:
    """A path-like source must be a folder holding required_file; anything else is taken as a hub id."""
    source = str(name_or_path)
    folder = Path(source).expanduser()
    if is_local(source):
        if not folder.is_dir():
            raise FileNotFoundError(f"{what} folder not found: {folder}")
        if not (folder / required_file).exists():
            raise FileNotFoundError(f"{what} folder {folder} has no {required_file} (not a save_pretrained folder)")
        return str(folder)
    return source


def load_causal_lm(
    name_or_path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    what: str = "model",
) -> torch.nn.Module:
    """A causal LM from a save_pretrained folder or hub id, on device, in dtype."""
    model = AutoModelForCausalLM.from_pretrained(_source(name_or_path, what, MODEL_CONFIG), dtype=dtype)
    return model.to(device)


def load_config(name_or_path: str | Path, what: str = "model") -> PretrainedConfig:
    """A model's config alone (cheap: the reachability check before a run)."""
    return AutoConfig.from_pretrained(_source(name_or_path, what, MODEL_CONFIG))


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    """A tokenizer that can end completions (has EOS) and pad batches (pad falls back to EOS)."""
    tokenizer = AutoTokenizer.from_pretrained(_source(name_or_path, "tokenizer", "tokenizer_config.json"))
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer at {name_or_path} has no EOS token: completions could never end")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer

"""Loading models and tokenizers from a local folder or a hub id, with errors that name the problem."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def _check_source(name_or_path: str | Path, what: str) -> str:
    """A path-like source must be an existing folder; anything else is treated as a hub id."""
    source = str(name_or_path)
    looks_local = source.startswith((".", "/", "~")) or Path(source).expanduser().exists()
    if looks_local:
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"{what} folder not found: {folder}")
        if not (folder / "config.json").exists() and what != "tokenizer":
            raise FileNotFoundError(f"{what} folder {folder} has no config.json (not a save_pretrained folder)")
        return str(folder)
    return source


def load_causal_lm(
    name_or_path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", what: str = "model"
) -> torch.nn.Module:
    """A causal LM from a save_pretrained folder or hub id, on device, in dtype."""
    source = _check_source(name_or_path, what)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return model.to(device)


def load_tokenizer(name_or_path: str | Path):
    """A tokenizer that can end completions (has EOS) and pad batches (pad falls back to EOS)."""
    tokenizer = AutoTokenizer.from_pretrained(_check_source(name_or_path, "tokenizer"))
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer at {name_or_path} has no EOS token: completions could never end")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer

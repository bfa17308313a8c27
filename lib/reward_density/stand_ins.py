"""Small local stand-ins (no downloads): a byte-level BPE tokenizer and random tiny Qwen3 models."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIALS = ["<pad>", "<eos>"]
CORPUS = [
    f"Problem: {a} + {b} = ?\nStep 1: {a} + {b} = {a + b}\nAnswer: \\boxed{{{a + b}}}\n"
    for a in range(0, 100, 7)
    for b in range(3, 90, 11)
]


def build_tokenizer(folder: Path, vocab_size: int = 160) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on arithmetic traces, saved and loaded back from folder."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")
    tokenizer.save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def build_qwen3(
    vocab_size: int, seed: int, hidden: int = 32, layers: int = 2, max_position_embeddings: int = 256
) -> Qwen3ForCausalLM:
    """A random Qwen3ForCausalLM small enough for CPU runs (hidden must be a multiple of 4)."""
    if hidden % 4:
        raise ValueError(f"hidden must be a multiple of 4 (4 attention heads), got {hidden}")
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(config).eval()

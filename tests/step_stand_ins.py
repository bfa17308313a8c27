"""Small local stand-ins for the student tokenizer and the PRM (no downloads)."""
from __future__ import annotations

import random

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast

EOS, PAD = "<|endoftext|>", "<pad>"
# Qwen2's pre-tokenizer pattern: lets punctuation swallow the newlines after it (".\n\n").
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
OPS = ["+", "-", "×", "÷"]


def trace_line(rng: random.Random, k: int) -> str:
    """One arithmetic step such as 'Step 3: 12 + 7 = 19'."""
    a, b, op = rng.randint(0, 99), rng.randint(1, 99), rng.choice(OPS)
    value = {"+": a + b, "-": a - b, "×": a * b, "÷": round(a / b, 2)}[op]
    form = rng.choice(["Step {k}: {a} {op} {b} = {v}", "{a} {op} {b} = {v}.", "So we get {v}.", "√{a} ≈ {v}"])
    return form.format(k=k, a=a, op=op, b=b, v=value)


def trace(rng: random.Random, lines: int) -> str:
    """A clean arithmetic trace, one step per line, ending with the answer."""
    body = "\n".join(trace_line(rng, k + 1) for k in range(lines))
    return body + f"\nThe answer is \\boxed{{{rng.randint(0, 999)}}}.\n"


def messy_completion(rng: random.Random) -> str:
    """A trace with the awkward cases: leading/blank/whitespace-only lines, no final newline, etc."""
    parts = []
    if rng.random() < 0.3:
        parts.append("\n" * rng.randint(1, 3))
    for k in range(rng.randint(0, 12)):
        parts.append(rng.choice(["", " ", "  ", "\t"]) + trace_line(rng, k + 1) + rng.choice(["", " ", ".", " \t"]))
        parts.append(rng.choice(["\n", "\n", "\n\n", "\n \n", "\n\n\n", " \n"]))
    if rng.random() < 0.5:
        parts.append(f"The answer is {rng.randint(0, 99)}")  # trailing text without a newline
    elif parts and rng.random() < 0.5:
        parts[-1] = ""  # the last step ends right before EOS
    return "".join(parts)


def student_tokenizer(pattern: str | None = None, vocab_size: int = 800) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on arithmetic traces; with no pattern, merges cross newlines freely."""
    rng = random.Random(0)
    corpus = [trace(rng, rng.randint(2, 8)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pattern is None:
        tok.pre_tokenizer = byte_level
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, clean_up_tokenization_spaces=False
    )


def prm_tokenizer() -> PreTrainedTokenizerFast:
    """A sentencepiece-style (Metaspace) BPE with a BOS, like Math-Shepherd's; knows '▁ки', '▁+', '▁-'."""
    rng = random.Random(1)
    corpus = []
    for _ in range(2000):
        steps = [trace_line(rng, k + 1) + " ки" for k in range(rng.randint(1, 6))]
        corpus.append(f"What is {rng.randint(0, 99)} + {rng.randint(0, 99)}? " + "\n".join(steps))
        corpus.append("+ - + -")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Newlines stand alone, as in Mistral's sentencepiece (<0x0A>), so the tag never merges with them.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Metaspace(prepend_scheme="first")]
    )
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus, trainer)
    bos = [("<s>", tok.token_to_id("<s>"))]
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=bos)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", clean_up_tokenization_spaces=False
    )


def tiny_prm(vocab_size: int, layers: int = 2, max_positions: int = 256, seed: int = 0) -> MistralForCausalLM:
    """A random MistralForCausalLM small enough for CPU tests."""
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=max_positions,
        sliding_window=None,
    )
    return MistralForCausalLM(config).eval()

"""The mini world's tokenizers, trained locally: the student's byte-level BPE, the PRM's sentencepiece-style one."""
from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

STUDENT_SPECIALS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>"}
PRM_SPECIALS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
STEP_TAG, GOOD_TOKEN, BAD_TOKEN = " ки", "+", "-"  # Math-Shepherd's interface


def build_student_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with digits split one by one (as Qwen's), a BOS added in front, EOS to stop."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    specials = list(STUDENT_SPECIALS.values())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    bos = STUDENT_SPECIALS["bos_token"]
    bpe.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bpe.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, clean_up_tokenization_spaces=False, **STUDENT_SPECIALS)


def build_prm_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A sentencepiece-style (Metaspace) BPE like Mistral's, knowing the step tag and the +/- tokens.

    Texts carrying step tags in the corpus teach it the tag token; every printable ASCII character but the
    whitespace beyond space and newline is in the alphabet: every character the task writes (a rarer byte a
    student samples is the unknown token).
    """
    bpe = Tokenizer(models.BPE(unk_token=PRM_SPECIALS["unk_token"]))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", "isolated"),  # newlines stand alone, so the tag never merges with them
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Metaspace(prepend_scheme="first"),
        ]
    )
    bpe.decoder = decoders.Metaspace()
    alphabet = sorted(set(string.printable.strip()) | set(STEP_TAG.strip()) | {"▁", "\n"})
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(PRM_SPECIALS.values()), initial_alphabet=alphabet,
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    bos = PRM_SPECIALS["bos_token"]
    bpe.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bpe.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, clean_up_tokenization_spaces=False, **PRM_SPECIALS)

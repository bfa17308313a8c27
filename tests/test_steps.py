"""Step segmentation and step-end tokens, against a byte-level BPE that merges across newlines."""
from __future__ import annotations

import random

import pytest
from step_stand_ins import QWEN_PATTERN, messy_completion, student_tokenizer

from reward_density.data.steps import Step, split_steps, step_end_tokens


@pytest.fixture(scope="module", params=["free-merges", "qwen-pattern"])
def tok(request):
    """Byte-level BPE: merging freely across newlines, or under Qwen2's pre-tokenizer pattern."""
    return student_tokenizer(None if request.param == "free-merges" else QWEN_PATTERN)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character-to-byte map, inverted (the ByteLevel alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


BYTES = _byte_decoder()


def token_bytes(tok, token_id: int) -> bytes:
    """The bytes a byte-level token stands for (none for special tokens)."""
    if token_id in tok.all_special_ids:
        return b""
    return bytes(BYTES[ch] for ch in tok.convert_ids_to_tokens(token_id))


def oracle_end_tokens(tok, ids: list[int], text: str, steps: list[Step]) -> list[int]:
    """Independent answer: the token holding the last byte of each step's last character."""
    ends, total = [], 0
    for i in ids:
        total += len(token_bytes(tok, i))
        ends.append(total)
    out = []
    for step in steps:
        last_byte = len(text[: step.end].encode()) - 1
        out.append(next(t for t, e in enumerate(ends) if e > last_byte))
    return out


def is_merged_newline(piece: str) -> bool:
    """A token holding a newline together with some other character."""
    return "\n" in piece and piece.strip("\n") != ""


def test_split_steps_skips_blank_pieces_and_spans_end_at_last_non_whitespace():
    text = "\n\n  Step 1: 2 + 2 = 4  \n \t\n\nStep 2: done.\t\nlast"
    steps = split_steps(text)
    assert [s.text for s in steps] == ["Step 1: 2 + 2 = 4", "Step 2: done.", "last"], f"wrong steps: {steps}"
    for s in steps:
        assert text[s.start : s.end] == s.text, f"span {s.start}:{s.end} does not hold {s.text!r}"
    assert split_steps("") == [] and split_steps("\n \n\t\n") == [], "blank text must have no steps"


def test_split_steps_spans_match_text_on_messy_completions():
    rng = random.Random(3)
    for _ in range(300):
        text = messy_completion(rng)
        steps = split_steps(text)
        non_blank = [line for line in text.split("\n") if line.strip()]
        assert len(steps) == len(non_blank), f"{len(steps)} steps for {len(non_blank)} non-blank lines in {text!r}"
        for s in steps:
            assert text[s.start : s.end] == s.text, f"span does not hold the step text in {text!r}"
            assert not text[s.end - 1].isspace() and "\n" not in s.text, f"bad step boundary {s} in {text!r}"


def test_tokenizer_really_merges_newlines_with_other_characters(tok):
    merged = [t for t in range(len(tok)) if is_merged_newline(tok.decode([t]))]
    assert merged, "the stand-in tokenizer has no token joining a newline to other characters"


def test_every_step_end_lands_on_token_holding_the_steps_last_character(tok):
    rng = random.Random(0)
    step_ends_on_merged = 0
    for _ in range(400):
        completion = messy_completion(rng)
        ids = tok.encode(completion) + ([tok.eos_token_id] if rng.random() < 0.7 else [])
        text = tok.decode(ids, skip_special_tokens=True)
        assert text == completion, "byte-level BPE failed to round-trip the completion"
        steps = split_steps(text)
        ends = step_end_tokens(tok, ids, text, steps)
        expected = oracle_end_tokens(tok, ids, text, steps)
        assert ends == expected, f"step ends {ends} != token of each step's last char {expected} in {text!r}"
        assert all(ids[t] not in tok.all_special_ids for t in ends), f"a step end sits on a special token in {text!r}"
        step_ends_on_merged += sum(is_merged_newline(tok.decode([ids[t]])) for t in ends)
    assert step_ends_on_merged > 0, "no step ended on a token that merges a newline: the test proves too little"


def test_step_ending_right_before_eos_and_padding_ends_on_its_own_token(tok):
    text = "Step 1: 12 + 7 = 19\nThe answer is 19"
    ids = tok.encode(text) + [tok.eos_token_id, tok.pad_token_id, tok.pad_token_id]
    ends = step_end_tokens(tok, ids, text, split_steps(text))
    n = len(tok.encode(text))
    assert ends[-1] == n - 1, f"the last step should end on token {n - 1} (before EOS), got {ends[-1]}"
    assert all(t < n for t in ends), "a step end landed on EOS or padding"


def test_character_split_across_byte_tokens_ends_on_the_token_completing_it(tok):
    text = "a ≈\nb"
    byte_chars = {b: ch for ch, b in BYTES.items()}
    single_byte_ids = [tok.convert_tokens_to_ids(byte_chars[b]) for b in text.encode()]
    assert tok.decode(single_byte_ids) == text, "could not spell the text one byte per token"
    ends = step_end_tokens(tok, single_byte_ids, text, split_steps(text))
    assert ends == [4, 6], f"'≈' spans tokens 2..4 and 'b' is token 6; got step ends {ends}"


def test_step_end_tokens_rejects_text_that_is_not_the_decode(tok):
    ids = tok.encode("Step 1: 1 + 1 = 2\n")
    with pytest.raises(ValueError, match="decode"):
        step_end_tokens(tok, ids, "Step 1: 1 + 1 = 3\n", split_steps("Step 1: 1 + 1 = 3\n"))


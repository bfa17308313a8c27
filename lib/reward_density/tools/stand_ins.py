"""Small local stand-ins (no downloads): tokenizers, random tiny models and MATH-schema files."""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from ..data.answer_check import last_boxed
from ..world.architectures import ModelSpec, new_mistral, new_qwen3
from ..world.tokenizers import STEP_TAG, build_prm_tokenizer, build_student_tokenizer

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


# ------------------------------------------------------------------------------------ the paper world

MATH_SUBJECTS = ("algebra", "geometry")  # two subject configs are enough to exercise `problem_subsets`


def _math_row(rng: random.Random, index: int) -> dict[str, str]:
    """A MATH-schema row with LaTeX in problem and solution, its gold in the last \\boxed{}."""
    a, b, c = rng.randint(1, 9), rng.randint(2, 9), rng.randint(1, 20)
    problem = f"Simplify $\\frac{{{a}}}{{{b}}} + {c}$. Express your answer as a common fraction."
    steps = [f"We write ${c} = \\frac{{{c * b}}}{{{b}}}$.", f"So the sum is $\\frac{{{a + c * b}}}{{{b}}}$."]
    solution = " ".join(steps) + f" The answer is $\\boxed{{\\frac{{{a + c * b}}}{{{b}}}}}$."
    return {"problem": problem, "level": f"Level {1 + index % 5}", "type": "Algebra", "solution": solution}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_math_stand_ins(folder: Path, rows_per_subject: int = 12, heldout_rows: int = 10, seed: int = 0) -> dict:
    """Local copies in the layouts of EleutherAI/hendrycks_math (subject configs declared in README.md,
    train/test splits) and HuggingFaceH4/MATH-500 (test.jsonl with answer and unique_id columns).

    One training row has no boxed answer and one held-out gold does not parse, as in real data.
    """
    rng = random.Random(seed)
    math_dir, heldout_dir = folder / "hendrycks_math", folder / "MATH-500"
    configs = []
    for subject in MATH_SUBJECTS:
        for split in ("train", "test"):
            rows = [_math_row(rng, i) for i in range(rows_per_subject)]
            _write_jsonl(math_dir / subject / f"{split}.jsonl", rows)
        files = "\n".join(f"  - split: {s}\n    path: {subject}/{s}.jsonl" for s in ("train", "test"))
        configs.append(f"- config_name: {subject}\n  data_files:\n{files}")
    first = math_dir / MATH_SUBJECTS[0] / "train.jsonl"
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    rows[0]["solution"] = "No boxed answer in this solution."
    _write_jsonl(first, rows)
    (math_dir / "README.md").write_text("---\nconfigs:\n" + "\n".join(configs) + "\n---\n")

    heldout = []
    for i in range(heldout_rows):
        row = _math_row(rng, i)
        row.update(answer=last_boxed(row["solution"]), subject="Algebra", unique_id=f"test/algebra/{i}.json")
        heldout.append(row)
    heldout[1]["answer"] = "}{"  # math-verify cannot parse it: the loader must drop it, not crash later
    _write_jsonl(heldout_dir / "test.jsonl", heldout)
    return {"problems": str(math_dir), "heldout": str(heldout_dir)}


def build_paper_stand_ins(folder: Path, seed: int = 0) -> dict[str, str]:
    """Random tiny models and MATH-schema files with the paper world's architectures and file layouts.

    A Qwen3 student (tied embeddings, as Qwen3-1.7B-Base) and a larger Qwen3 teacher sharing its
    tokenizer; a Mistral PRM with its own sentencepiece-style tokenizer carrying the step tag and the
    +/- tokens (as math-shepherd-mistral-7b-prm). Returns the world entries of a profile.
    """
    folder = Path(folder)
    world = write_math_stand_ins(folder, seed=seed)
    rng = random.Random(seed)
    texts = [_math_row(rng, i)["solution"] for i in range(200)]
    tokenizer = build_student_tokenizer(texts, vocab_size=300)
    for name, spec, tied, offset in (("student", ModelSpec(32, 2, 512), True, 0),
                                     ("teacher", ModelSpec(48, 2, 512), False, 1)):
        new_qwen3(spec, tokenizer, seed + offset, tie_word_embeddings=tied).save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
        world[name] = str(folder / name)
    tagged = [text.replace(". ", "." + STEP_TAG + "\n") + STEP_TAG + " + -" for text in texts]
    prm_tokenizer = build_prm_tokenizer(tagged, vocab_size=300)
    new_mistral(ModelSpec(32, 2, 1024), prm_tokenizer, seed + 2).save_pretrained(folder / "prm")
    prm_tokenizer.save_pretrained(folder / "prm")
    world["prm"] = str(folder / "prm")
    return world

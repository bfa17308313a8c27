"""A problem the policy answers: the prompt it sees and the gold answer the outcome check uses."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    """One prompt and its gold answer (a bare answer such as '18' or '2\\sqrt{113}', unboxed).

    question: the bare problem text a PRM is shown (Math-Shepherd saw questions, not prompt templates);
    empty when the prompt is the question itself, as in the mini world.
    solution: a correct completion, for supervised training (the SFT control); empty when none is known.
    prefix: the start of a completion already written at the end of the prompt (T-SPMO's replay restarts inside
    a stored completion); the rewards score it together with what is sampled after it. Empty in every problem file.
    """

    problem_id: str
    prompt: str
    answer: str
    question: str = ""
    solution: str = ""
    prefix: str = ""


def write_problems(path: Path, problems: Sequence[Problem], extra: Sequence[dict] | None = None) -> None:
    """One JSON object per line: problem_id, prompt, answer, and any extra fields per problem."""
    extra = extra or [{} for _ in problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for problem, more in zip(problems, extra, strict=True):
            record = {k: v for k, v in asdict(problem).items() if k not in ("question", "solution", "prefix") or v}
            handle.write(json.dumps({**record, **more}) + "\n")


def read_problems(path: Path) -> list[Problem]:
    """Problems from a jsonl file written by write_problems (extra fields are ignored)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"problem file not found: {path}")
    problems = []
    with open(path) as handle:
        for line_number, line in enumerate(handle, 1):
            try:
                row = json.loads(line)
                problems.append(Problem(str(row["problem_id"]), row["prompt"], str(row["answer"]),
                                        row.get("question", ""), row.get("solution", "")))
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{line_number}: not a problem record ({error!r})") from error
            if not isinstance(row["prompt"], str) or row["answer"] in (None, "") or isinstance(row["answer"], bool):
                raise ValueError(f"{path}:{line_number}: problem {row['problem_id']!r} needs a text prompt and a gold "
                                 f"answer; got prompt {row['prompt']!r}, answer {row['answer']!r}")
    return problems

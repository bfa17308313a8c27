"""A problem the policy answers: the prompt it sees and the gold answer the outcome check uses."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One prompt and its gold answer (a bare answer such as '18' or '2\\sqrt{113}', unboxed)."""

    problem_id: str
    prompt: str
    answer: str

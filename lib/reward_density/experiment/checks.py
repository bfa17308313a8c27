"""Value checkers shared by the cell schema (config.py) and the profile validator (profiles.py).

Each checker returns the value when it is acceptable and raises `InvalidValue(expected)` otherwise;
the caller adds where the value came from (a profile file and key, or a notebook parameter).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

Checker = Callable[[Any], Any]
DEVICE_TYPES = ("cpu", "cuda", "mps")  # where a cell's models may run


class InvalidValue(ValueError):
    """Raised by a checker; the message says what was expected."""


def is_int(value: Any) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any, expected: str) -> int | float:
    """The value itself when it is a number, else InvalidValue (with a hint for YAML's '3e-4 is a string' trap)."""
    if is_int(value) or isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:
            expected += " (YAML reads this as a string: write it with a dot and a signed exponent, e.g. 3.0e-4)"
    raise InvalidValue(expected)


def positive_int(value: Any) -> int:
    """A positive integer (bool excluded)."""
    if not is_int(value) or value <= 0:
        raise InvalidValue("a positive integer")
    return value


def non_negative_int(value: Any) -> int:
    """A non-negative integer (bool excluded)."""
    if not is_int(value) or value < 0:
        raise InvalidValue("a non-negative integer")
    return value


SEED_LIMIT = 2**32  # a cell seeds each step with seed * 1,000,003 + step, which must fit torch's 64-bit seed


def seed_number(value: Any) -> int:
    """A seed: an integer from 0 to 2**32 - 1 (bool excluded)."""
    if not is_int(value) or not 0 <= value < SEED_LIMIT:
        raise InvalidValue(f"an integer from 0 to {SEED_LIMIT - 1} (a seed)")
    return value


def int_at_least_two(value: Any) -> int:
    """An integer >= 2 (a group needs two samples to have a spread)."""
    if not is_int(value) or value < 2:
        raise InvalidValue("an integer >= 2")
    return value


def _bounded(expected: str, accept: Callable[[int | float], bool]) -> Checker:
    """A checker for finite numbers that `accept` admits."""

    def check(value: Any) -> int | float:
        number = _number(value, expected)
        if not math.isfinite(number):  # YAML's .inf and .nan pass every comparison a range needs, or fail them all
            raise InvalidValue(f"{expected}, finite")
        if not accept(number):
            raise InvalidValue(expected)
        return number

    check.__doc__ = f"{expected[0].upper()}{expected[1:]}."
    return check


positive_number = _bounded("a positive number", lambda x: x > 0)
non_negative_number = _bounded("a number >= 0", lambda x: x >= 0)
top_p_number = _bounded("a number in (0, 1]", lambda x: 0 < x <= 1)
dropout_number = _bounded("a number in [0, 1)", lambda x: 0 <= x < 1)
probability = _bounded("a probability in [0, 1]", lambda x: 0 <= x <= 1)
open_unit_number = _bounded("a number in (0, 1)", lambda x: 0 < x < 1)
any_number = _bounded("a number", lambda x: True)


def boolean(value: Any) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise InvalidValue("true or false")
    return value


def non_empty_string(value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidValue("a non-empty string")
    return value


def torch_device(value: Any) -> str:
    """A torch device a cell's models may run on: cpu, cuda, cuda:<index> or mps (whether this machine has it is
    the cell's to find out: a profile is validated where its cells may not run)."""
    expected = f"a torch device of type {', '.join(DEVICE_TYPES)} (e.g. cpu, cuda:1)"
    if not isinstance(value, str):
        raise InvalidValue(expected)
    try:
        device = torch.device(value)
    except RuntimeError:
        raise InvalidValue(expected) from None
    if device.type not in DEVICE_TYPES:
        raise InvalidValue(expected)
    return value


def string_list(value: Any) -> list[str]:
    """A non-empty list of non-empty strings."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise InvalidValue("a non-empty list of non-empty strings")
    return value


def label_mapping(value: Any) -> dict[str, str]:
    """A mapping of at least two labels to non-empty strings (e.g. method names to profiles)."""
    if not isinstance(value, dict) or len(value) < 2 or not all(
            isinstance(k, str) and k.strip() and isinstance(v, str) and v.strip() for k, v in value.items()):
        raise InvalidValue("a mapping of at least two names to non-empty strings")
    return value


def prompt_template(value: Any) -> str:
    """A string holding the placeholder {problem} exactly once."""
    if not isinstance(value, str) or value.count("{problem}") != 1:
        raise InvalidValue("a string with the placeholder {problem} exactly once")
    return value


def one_of(*choices: str) -> Checker:
    """A checker accepting exactly one of the given strings."""

    def check(value: Any) -> str:
        if value not in choices:
            raise InvalidValue(f"one of {', '.join(choices)}")
        return value

    return check


def optional(checker: Checker) -> Checker:
    """The checker, or None."""

    def check(value: Any) -> Any:
        if value is None:
            return None
        try:
            return checker(value)
        except InvalidValue as exc:
            raise InvalidValue(f"{exc} or null") from None

    return check

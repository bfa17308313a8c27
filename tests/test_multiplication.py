"""The multiplication task of the token-selection papers: its traces, its last-integer answers, and its world."""
from __future__ import annotations

import json
import random

import pytest

from reward_density.data.answer_check import LastIntegerChecker, Verdict, last_number, make_checker
from reward_density.data.problems import read_problems
from reward_density.world.build import build_world, world_config
from reward_density.world.multiplication import MultiplicationTask, Product


def test_a_clean_trace_works_by_place_value_and_ends_with_the_product():
    trace = MultiplicationTask().clean_trace(Product(347, 6))
    assert trace.split("\n") == ["300*6=1800", "40*6=240", "7*6=42", "1800+240+42=2082", "Answer: 2082"]
    assert last_number(trace) == 347 * 6
    assert MultiplicationTask().clean_trace(Product(305, 2)).split("\n")[:2] == ["300*2=600", "5*2=10"], "no 0*2 step"


def test_the_base_habit_is_the_first_partial_product_and_a_slip_is_carried_into_the_sum():
    rng = random.Random(0)
    assert MultiplicationTask(p_direct=1.0).realistic_trace(rng, Product(347, 6)) == "Answer: 1800"
    slipped = MultiplicationTask(p_direct=0.0, p_slip=1.0).realistic_trace(rng, Product(347, 6)).split("\n")
    parts = [int(line.split("=")[1]) for line in slipped[:3]]
    assert parts != [1800, 240, 42] and last_number(slipped[-1]) == sum(parts) != 2082


def test_splits_are_distinct_disjoint_products_and_too_many_is_an_error():
    splits = MultiplicationTask().splits({"heldout": 50, "train": 200}, seed=3)
    seen = [p.text for split in splits.values() for p in split]
    assert len(seen) == len(set(seen)) == 250 and all(2 <= p.b <= 9 and 100 <= p.a for p in splits["train"])
    with pytest.raises(ValueError, match="7200 distinct products"):
        MultiplicationTask().splits({"train": 8000}, seed=0)


@pytest.mark.parametrize("completion, verdict", [
    ("347*6\nAnswer: 1692", Verdict.CORRECT),
    ("the product is 1,692.", Verdict.CORRECT),  # a comma between thousands removed, as the paper does
    ("1692 or maybe 1693", Verdict.WRONG),  # the last integer counts
    ("no number here", Verdict.UNPARSABLE),
    ("between 1600-1692", Verdict.CORRECT),  # a dash after a digit is no minus sign
    ("1692.0", Verdict.CORRECT),
    ("about 1691.5", Verdict.WRONG),  # a decimal is no integer: its fraction's digits are not the answer
    ("about 1692.5", Verdict.WRONG),  # nor is its whole part the answer
    ("1692, 5.1692", Verdict.WRONG),
])
def test_the_answer_is_the_last_number(completion, verdict):
    assert LastIntegerChecker().check(["1692"], [completion]) == [verdict]


def test_a_negative_last_integer_keeps_its_sign():
    assert LastIntegerChecker().check(["-5", "-5"], ["so x = -5.", "so x = 5"]) == [Verdict.CORRECT, Verdict.WRONG]


def test_only_a_comma_between_thousands_is_removed():
    assert LastIntegerChecker().check(["-3", "1234567"], ["x = 5,-3", "1,234,567"]) == [Verdict.CORRECT] * 2
    assert last_number("12,34") == 34, "a comma not followed by three digits separates two numbers"
    assert last_number("5,1234") == 1234, "nor does one followed by four"


def test_a_gold_that_is_not_an_integer_and_an_unknown_format_are_refused():
    with pytest.raises(ValueError, match="not integers"):
        LastIntegerChecker().check(["3/4"], ["3"])
    with pytest.raises(ValueError, match="not integers"):  # golds read commas as answers do: "1,2" is no 12
        LastIntegerChecker().check(["1,2"], ["12"])
    assert LastIntegerChecker().check([" 1,692 "], ["1692"]) == [Verdict.CORRECT]
    with pytest.raises(ValueError, match="unknown answer format 'latex'"):
        make_checker("latex")


def test_a_multiplication_world_builds_with_its_own_answer_format(tmp_path):
    world = build_world(world_config("smoke_mult"), tmp_path, log=lambda line: None)
    assert world["components"]["problems"]["example"].endswith(
        f"Answer: {last_number(world['components']['problems']['example'])}")
    first = json.loads((tmp_path / "problems" / "heldout.jsonl").read_text().splitlines()[0])
    a, b = map(int, first["expression"].split("*"))
    assert (first["answer"] == str(a * b)
            and "\\boxed" not in read_problems(tmp_path / "problems" / "heldout.jsonl")[0].solution)
    assert (tmp_path / "student" / "config.json").is_file() and (tmp_path / "prm" / "config.json").is_file()

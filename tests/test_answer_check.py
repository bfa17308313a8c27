"""The answer checker: math-verify in a worker process, each item bounded by a timeout."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from reward_density.data import answer_check
from reward_density.data.answer_check import AnswerChecker, Verdict, wrap_gold

# 9^(9^9) has ~370 million digits; sympy tries to evaluate it and runs for minutes.
PATHOLOGICAL = r"\boxed{9^{9^{9}}}"


@pytest.fixture(scope="module")
def checker():
    with AnswerChecker(timeout_seconds=5.0) as checker:
        yield checker


def test_wrap_gold_boxes_bare_answers_and_leaves_boxed_ones_alone():
    assert wrap_gold("18") == r"\boxed{18}", "a bare gold was not wrapped in \\boxed{}"
    assert wrap_gold(r"2\sqrt{113}") == r"\boxed{2\sqrt{113}}", "a LaTeX gold was not wrapped in \\boxed{}"
    assert wrap_gold(r"$\boxed{7}$") == r"$\boxed{7}$", "a gold that already has \\boxed was wrapped again"


@pytest.mark.parametrize("text, answered", [
    (r"so the answer is \boxed{18}.", True),
    (r"so the answer is \boxed 18", True),  # math-verify reads this too
    (r"so the answer is \fbox{18}.", True),  # a box, though math-verify reads an \fbox only inside $...$
    ("so the answer is 18.", False),
    (r"so the answer is \boxed{1", False),  # cut off inside its box: no answer to read
    (r"the answer is \boxed{}.", False),  # an empty box holds no answer
    (r"the answer is \boxed{ }.", False),
])
def test_an_answer_counts_as_given_where_a_non_empty_box_holds_one(text, answered):
    assert AnswerChecker.has_answer(text) is answered, f"has_answer({text!r})"


def test_unwrapped_latex_gold_misparses_which_is_why_golds_are_wrapped():
    from math_verify import parse

    parsed = parse(r"2\sqrt{113}", parsing_timeout=None)
    assert [str(p) for p in parsed] == ["2", "2"], (
        f"math-verify now parses an unwrapped 2\\sqrt{{113}} as {parsed}; wrap_gold may no longer be needed"
    )


def test_boxed_irrational_answer_verifies_and_a_prefix_of_it_does_not(checker):
    gold = r"2\sqrt{113}"
    completions = [r"The length is \boxed{2\sqrt{113}}.", r"\boxed{\sqrt{452}}", r"\boxed{2}"]
    verdicts = checker.check([gold] * 3, completions)
    assert verdicts == [Verdict.CORRECT, Verdict.CORRECT, Verdict.WRONG], (
        f"against gold {gold}: expected the exact and the equivalent answer correct and \\boxed{{2}} wrong, "
        f"got {verdicts}"
    )


def test_bare_numeric_gold_verifies_once_wrapped(checker):
    verdicts = checker.check(["18", "18"], [r"\boxed{18}", r"\boxed{17}"])
    assert verdicts == [Verdict.CORRECT, Verdict.WRONG], f"bare gold 18 was not checked right: {verdicts}"


@pytest.mark.parametrize("text, verdict", [
    ("\\boxed{12} wait no \\boxed{13}", Verdict.WRONG),  # boxes close together: one set of answers {12, 13}
    ("\\boxed{12}\nfoo\n\\boxed{13}", Verdict.WRONG),
    ("The answer is \\boxed{12}.\nLet me check: 5+7=12.\nSo the answer is \\boxed{13}.", Verdict.CORRECT),
    ("\\boxed{12}\n\nfoo bar baz\n\n\\boxed{13}", Verdict.CORRECT),
    ("\\boxed{12}\n\n\\boxed{13}", Verdict.WRONG),  # not a matter of distance: math-verify's patterns decide
    ("\\boxed{12}\n\nfoo\n\n\\boxed{13}", Verdict.WRONG),
    ("The answer is \\boxed{12}. Wait, let me recheck: the answer is \\boxed{13}", Verdict.WRONG),
])
def test_several_boxes_are_graded_as_math_verify_groups_them(checker, text, verdict):
    # What the README says of math-verify's reading of several boxes; a math-verify upgrade that changes it fails here.
    assert checker.check(["13"], [text]) == [verdict]


def test_unparsable_completions_are_unparsable_not_wrong(checker):
    completions = ["I don't know", "", r"\boxed{}", r"\boxed{17}"]
    verdicts = checker.check(["18"] * 4, completions)
    assert verdicts == [Verdict.UNPARSABLE] * 3 + [Verdict.WRONG], (
        f"completions without an answer must be unparsable and a wrong answer wrong, got {verdicts}"
    )


def test_gold_that_does_not_parse_raises_naming_it_and_the_checker_stays_usable(checker):
    with pytest.raises(ValueError, match=r"'\}'"):
        checker.check(["18", "}"], [r"\boxed{18}", r"\boxed{18}"])
    with pytest.raises(ValueError, match="cannot parse"):
        checker.check([""], [r"\boxed{18}"])
    assert checker.check(["18"], [r"\boxed{18}"]) == [Verdict.CORRECT], "the checker broke after a bad gold"


def test_golds_and_completions_of_different_lengths_are_refused(checker):
    with pytest.raises(ValueError, match="2 golds but 1 completions"):
        checker.check(["1", "2"], [r"\boxed{1}"])


def test_pathological_answer_times_out_and_later_items_are_still_checked(checker, monkeypatch):
    monkeypatch.setattr(checker, "timeout_seconds", 1.0)
    completions = [r"\boxed{18}", PATHOLOGICAL, r"\boxed{18}", r"\boxed{17}", "no idea"]
    start = time.monotonic()
    verdicts = checker.check(["18"] * len(completions), completions)
    elapsed = time.monotonic() - start
    expected = [Verdict.CORRECT, Verdict.TIMEOUT, Verdict.CORRECT, Verdict.WRONG, Verdict.UNPARSABLE]
    assert verdicts == expected, f"expected {expected} around a hanging item, got {verdicts}"
    # Unbounded, this verify ran past 300 s; bounded, it costs 1 s plus a worker restart (~1-2 s).
    # The generous limit keeps a busy CI machine from flaking while still proving the bound.
    assert elapsed < 60.0, f"a 1 s timeout took {elapsed:.1f}s to return"
    assert ("18", PATHOLOGICAL) not in checker._verdicts, "a timeout says more about the machine: not remembered"


def test_a_full_verdict_cache_starts_over_without_losing_the_verdicts_of_the_batch_that_filled_it(checker,
                                                                                                monkeypatch):
    monkeypatch.setattr(answer_check, "_VERDICT_CACHE_SIZE", 1)
    golds, completions = ["1", "2"], [r"\boxed{1}", r"\boxed{3}"]
    assert checker.check(golds, completions) == [Verdict.CORRECT, Verdict.WRONG]
    assert checker.check(golds + ["4"], completions + [r"\boxed{4}"]) == [Verdict.CORRECT, Verdict.WRONG,
                                                                            Verdict.CORRECT]


def test_a_gold_that_outlasts_the_per_item_timeout_gets_a_long_parse_before_it_is_called_unparsable():
    with AnswerChecker(timeout_seconds=1e-4) as slow_machine:  # every gold's parse "hangs" at first
        assert slow_machine.unparsable_golds(["3", r"\frac{1}{2}"]) == [], "a slow parse dropped a valid gold"


def test_check_works_from_a_thread(checker):
    result = {}

    def run():
        try:
            result["verdicts"] = checker.check(["18", "5"], [r"\boxed{18}", r"\boxed{6}"])
        except BaseException as error:  # noqa: BLE001 - surfaced by the assertion below
            result["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert "error" not in result, f"check raised off the main thread: {result.get('error')!r}"
    assert result.get("verdicts") == [Verdict.CORRECT, Verdict.WRONG], f"wrong verdicts from a thread: {result}"


def test_check_works_from_a_thread_pool_with_concurrent_calls(checker):
    answers = [str(k) for k in range(8)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(checker.check, [a], [rf"\boxed{{{a}}}"]) for a in answers]
        results = [future.result(timeout=60) for future in futures]
    assert results == [[Verdict.CORRECT]] * len(answers), f"concurrent calls from a pool got {results}"


def test_closed_checker_restarts_its_worker_on_next_use():
    with AnswerChecker(timeout_seconds=5.0) as checker:
        assert checker.check(["1"], [r"\boxed{1}"]) == [Verdict.CORRECT], "fresh checker failed"
        checker.close()
        assert checker.check(["1"], [r"\boxed{1}"]) == [Verdict.CORRECT], "checker failed after close()"

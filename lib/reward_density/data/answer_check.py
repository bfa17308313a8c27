"""Answer checking with math-verify in a worker process, each item bounded by a timeout."""
from __future__ import annotations

import logging
import multiprocessing as mp
import re
import threading
from collections.abc import Sequence
from decimal import Decimal
from enum import Enum

# Start-up imports sympy and math-verify's grammars; it is not charged to any item.
_STARTUP_SECONDS = 120.0
_GOLD_SECONDS = 120.0  # a gold that outlasts the per-item timeout gets this long before it counts as hanging
_GOLD_CACHE_SIZE = 4096
_VERDICT_CACHE_SIZE = 200_000  # (gold, completion) pairs kept before the cache starts over


class Verdict(str, Enum):
    """Outcome of checking one completion against its gold answer."""

    CORRECT = "correct"
    WRONG = "wrong"
    UNPARSABLE = "unparsable"  # no answer could be extracted from the completion (or the parser crashed on it)
    TIMEOUT = "timeout"


def wrap_gold(gold: str) -> str:
    """Wrap a gold answer in \\boxed{} unless it already has one (math-verify's LaTeX parser needs it)."""
    return gold if "\\boxed" in gold else f"\\boxed{{{gold}}}"


_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _braced(text: str, start: int) -> str | None:
    """The content of the brace group opening at text[start] ('{'), or None if it never closes."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == "\\":  # an escaped character, e.g. \{ or \}, never opens or closes a group
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} or \\fbox{...} (or brace-less `\\boxed 5`) in text, or None."""
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        return _braced(stripped, 0)
    if stripped == rest:  # neither a brace nor a space follows: not a boxed answer
        return None
    answer = re.match(r"[^\s$]*", stripped).group().rstrip(".,;")  # the sentence goes on, not the answer
    return answer or None


def count_boxes(text: str) -> int:
    """How many \\boxed or \\fbox commands the text holds."""
    return len(_BOX.findall(text))


_NUMBER = re.compile(r"(?:(?<!\d)-)?\d+(?:\.\d+)?")  # a minus right after a digit is a dash ("1600-1692")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # "1,692": a comma inside a number; "5,-3" keeps its comma
_INTEGER = re.compile(r"-?\d+")


def last_number(text: str) -> Decimal | None:
    """The text's last number, once the commas between thousands are removed: "1,692." and "1692.0" equal 1692, and
    "3.5" is no integer (the token-selection papers strip every comma and read the last digit run: 1234 and 5)."""
    found = _NUMBER.findall(_THOUSANDS.sub("", text))
    return Decimal(found[-1]) if found else None


def _plain(gold: str) -> str:
    """A gold answer without its surrounding space and the commas between its thousands."""
    return _THOUSANDS.sub("", gold.strip())


def _worker_main(conn) -> None:
    """Worker loop: one reply per entry, a bool per gold of ("golds", ...), a verdict per pair of ("items", ...)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # silences "timeout is disabled" warnings
    from math_verify import parse, verify

    def parse_gold(gold: str) -> list:
        if gold not in golds:
            if len(golds) >= _GOLD_CACHE_SIZE:
                golds.clear()
            try:
                golds[gold] = parse(wrap_gold(gold), parsing_timeout=None)
            except Exception:
                golds[gold] = []
        return golds[gold]

    def check(gold: str, completion: str) -> str:
        try:
            answer = parse(completion, parsing_timeout=None, raise_on_error=True)
            if not answer:
                return Verdict.UNPARSABLE.value
            # verify keeps raise_on_error=False: it tries every (gold, answer) pair and an error in
            # one pair must not hide a match in another.
            ok = verify(parse_gold(gold), answer, timeout_seconds=None)
            return (Verdict.CORRECT if ok else Verdict.WRONG).value
        except Exception:
            return Verdict.UNPARSABLE.value

    golds: dict[str, list] = {}
    check("1", "\\boxed{1}")  # warm up lazy imports so the first timed item is not charged for them
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        kind, payload = message
        for entry in payload:
            conn.send(_reading(parse_gold(entry)) if kind == "golds" else check(*entry))


# How math-verify reads a gold: not at all, only as its text (a malformed `\frac{1}{`, but also a repeating
# decimal `0.\overline{3}`: an answer then matches only written the same way), or as mathematics.
UNREAD, TEXT_ONLY, READ = 0, 1, 2


def _reading(parsed: list) -> int:
    """UNREAD, TEXT_ONLY or READ for math-verify's parse of a gold."""
    if not parsed:
        return UNREAD
    return TEXT_ONLY if all(isinstance(item, str) for item in parsed) else READ


class AnswerChecker:
    """Checks completions against gold answers with math-verify, in one persistent worker process.

    The worker is spawned, so a script using this needs the `if __name__ == "__main__":` guard.
    """

    def __init__(self, timeout_seconds: float = 5.0) -> None:
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()  # one batch at a time on the worker's pipe
        self._verdicts: dict[tuple[str, str], Verdict] = {}
        self._process = None
        self._conn = None

    @staticmethod
    def has_answer(text: str) -> bool:
        """Whether a completion puts an answer in a box: a closed, non-empty \\boxed{} or \\fbox{}, or a brace-less
        `\\boxed 5` (last_boxed). A box counts whether or not math-verify reads it (an \\fbox only inside $...$)."""
        boxed = last_boxed(text)
        return boxed is not None and boxed.strip() != ""

    def check(self, golds: Sequence[str], completions: Sequence[str]) -> list[Verdict]:
        """Verdict for each (gold, completion) pair; raises ValueError if a gold does not parse.

        Verdicts are remembered per exact (gold, completion) pair (greedy evaluations repeat most
        completions); a timeout is not, since it says more about the machine than about the answer.
        """
        if len(golds) != len(completions):
            raise ValueError(f"{len(golds)} golds but {len(completions)} completions")
        items = list(zip(golds, completions))
        with self._lock:
            self._check_golds(list(dict.fromkeys(golds)))
            todo = list(dict.fromkeys(item for item in items if item not in self._verdicts))
            verdicts: list[Verdict] = []
            while len(verdicts) < len(todo):
                replies, failure = self._request("items", todo[len(verdicts):])
                verdicts += [Verdict(reply) for reply in replies]
                if failure is not None:  # the worker was lost on the next item; resume after it
                    verdicts.append(failure)
            fresh = dict(zip(todo, verdicts))
            result = [fresh[item] if item in fresh else self._verdicts[item] for item in items]  # before any clear
            if len(self._verdicts) > _VERDICT_CACHE_SIZE:
                self._verdicts.clear()
            self._verdicts.update((item, v) for item, v in fresh.items() if v is not Verdict.TIMEOUT)
            return result

    def close(self) -> None:
        """Stop the worker (a later check starts a new one)."""
        with self._lock:
            self._kill()  # the worker holds no state worth a graceful exit

    def __enter__(self) -> AnswerChecker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def unparsable_golds(self, golds: Sequence[str]) -> list[str]:
        """The distinct golds math-verify cannot parse (or that hang or crash its parser), in order; no raising."""
        with self._lock:
            return self._unparsable_golds(list(dict.fromkeys(golds)))

    def text_only_golds(self, golds: Sequence[str]) -> list[str]:
        """The distinct golds math-verify reads only as their text, in order: an answer matches one only when written
        the same way."""
        distinct = list(dict.fromkeys(golds))
        with self._lock:
            return [gold for gold, reading in zip(distinct, self._gold_readings(distinct)) if reading == TEXT_ONLY]

    def _check_golds(self, golds: list[str]) -> None:
        # Before any completion is checked, so a bad gold costs no finished work.
        bad = self._unparsable_golds(golds)
        if bad:
            raise ValueError(
                "math-verify cannot parse these gold answers (or hung or crashed on them; a data bug, not a wrong "
                f"answer): {bad!r}"
            )

    def _unparsable_golds(self, golds: list[str]) -> list[str]:
        return [gold for gold, reading in zip(golds, self._gold_readings(golds)) if reading == UNREAD]

    def _gold_readings(self, golds: list[str]) -> list[int]:
        """How math-verify reads each gold (_reading); UNREAD where it hung or crashed on one."""
        readings: list[int] = []
        while len(readings) < len(golds):
            replies, failure = self._request("golds", golds[len(readings):])
            readings += replies
            if failure is not None:  # the worker was lost on this gold; resume after it
                gold, reading = golds[len(readings)], UNREAD
                if failure is Verdict.TIMEOUT:  # a slow parse on a busy machine must not drop a problem
                    replies, failure = self._request("golds", [gold], _GOLD_SECONDS)
                    reading = replies[0] if failure is None else UNREAD
                readings.append(reading)
        return readings

    def _request(self, kind: str, payload: list, timeout_seconds: float | None = None) -> tuple[list, Verdict | None]:
        """Send a batch; return the replies received and, if the worker hung (each entry may take timeout_seconds,
        the checker's own by default) or died on the next entry, how."""
        timeout_seconds = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        conn = self._ensure_worker()
        replies = []
        try:
            conn.send((kind, payload))
            for _ in payload:
                if not conn.poll(timeout_seconds):
                    self._kill()
                    return replies, Verdict.TIMEOUT
                replies.append(conn.recv())
        except (EOFError, OSError):  # the worker crashed (e.g. out of memory) on this entry
            self._kill()
            return replies, Verdict.UNPARSABLE
        except BaseException:  # e.g. KeyboardInterrupt: unread replies must not reach the next call
            self._kill()
            raise
        return replies, None

    def _ensure_worker(self):
        if self._process is not None and not self._process.is_alive():
            self._kill()  # died while idle (e.g. killed by the OOM killer)
        if self._process is None:
            # spawn, not fork: the parent holds torch threads.
            context = mp.get_context("spawn")
            conn, child_conn = context.Pipe()
            # daemon: multiprocessing terminates it at interpreter exit.
            process = context.Process(target=_worker_main, args=(child_conn,), daemon=True, name="answer-check")
            process.start()
            child_conn.close()
            self._process, self._conn = process, conn
            try:
                ready = conn.poll(_STARTUP_SECONDS) and conn.recv() == "ready"
            except (EOFError, OSError):
                ready = False
            if not ready:
                self._kill()
                raise RuntimeError(
                    "the math-verify worker did not start (a script needs the `if __name__ == \"__main__\":` guard)"
                )
        return self._conn

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._conn.close()
        self._process = self._conn = None


class LastIntegerChecker:
    """The answer is the completion's last number (last_number), correct where it equals the integer gold: the
    multiplication task's rule (as in "Token-Efficient RL for LLM Reasoning"). Exact and instant, so no worker and
    no timeout."""

    timeout_seconds = 0.0

    @staticmethod
    def has_answer(text: str) -> bool:
        """Whether a completion holds a number to read."""
        return last_number(text) is not None

    def check(self, golds: Sequence[str], completions: Sequence[str]) -> list[Verdict]:
        """Verdict for each (gold, completion) pair; raises ValueError if a gold is not an integer."""
        if len(golds) != len(completions):
            raise ValueError(f"{len(golds)} golds but {len(completions)} completions")
        bad = self.unparsable_golds(golds)
        if bad:
            raise ValueError(f"these gold answers are not integers (a data bug, not a wrong answer): {bad!r}")
        answers = [last_number(text) for text in completions]
        return [Verdict.UNPARSABLE if answer is None
                else Verdict.CORRECT if answer == int(_plain(gold)) else Verdict.WRONG
                for gold, answer in zip(golds, answers)]

    def unparsable_golds(self, golds: Sequence[str]) -> list[str]:
        """The distinct golds that are not integers (commas only between thousands, as answers read), in order."""
        return [gold for gold in dict.fromkeys(golds) if not _INTEGER.fullmatch(_plain(gold))]

    @staticmethod
    def text_only_golds(golds: Sequence[str]) -> list[str]:
        """None: an integer gold is read as a number or not at all (the AnswerChecker interface)."""
        return []

    def close(self) -> None:
        """Nothing to stop (the AnswerChecker interface)."""

    def __enter__(self) -> LastIntegerChecker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


Checker = AnswerChecker | LastIntegerChecker  # what make_checker returns: one answer format's checker
CHECKERS: dict[str, type[Checker]] = {"boxed": AnswerChecker, "last_integer": LastIntegerChecker}
ANSWER_FORMATS = tuple(CHECKERS)


def checker_class(answer_format: str) -> type[Checker]:
    """The checker class of a task's answer format (its has_answer needs no instance)."""
    if answer_format not in CHECKERS:
        raise ValueError(f"unknown answer format {answer_format!r}; expected one of {ANSWER_FORMATS}")
    return CHECKERS[answer_format]


def make_checker(answer_format: str) -> Checker:
    """The checker of a task's answer format: math-verify on a \\boxed{} answer, or the last integer."""
    return checker_class(answer_format)()

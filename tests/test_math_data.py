"""MATH data: gold extraction, loading from local files and folders, hub failures, unparsable golds."""
from __future__ import annotations

import dataclasses
import json
import time

import datasets
import huggingface_hub.constants
import pytest

from reward_density.data.answer_check import AnswerChecker, Verdict, last_boxed
from reward_density.data.math_data import (
    DataUnavailable,
    MathLoadReport,
    drop_unparsable,
    gold_answer,
    load_math_problems,
)
from reward_density.data.problem_sets import heldout_problems
from reward_density.data.problems import Problem

TEMPLATE = "Solve, and put the answer in \\boxed{}.\n{problem}\nAnswer:"

MATH_ROWS = [
    {"problem": r"Compute $\frac{1}{2}+0$.", "level": "Level 1", "type": "Algebra",
     "solution": r"It is $\boxed{\frac{1}{2}}$."},
    {"problem": "What is $9 \\cdot 2$?", "level": "Level 1", "type": "Algebra",
     "solution": r"First $\boxed{17}$ is wrong; in fact $\fbox{18}$."},
    {"problem": "No boxed answer here.", "level": "Level 2", "type": "Algebra",
     "solution": "The answer is 3."},
    {"problem": r"Find $x$ with $\{x\}=0$.", "level": "Level 3", "type": "Algebra",
     "solution": r"So $x = \boxed{2\sqrt{113}}$."},
]

MATH500_ROWS = [
    {"problem": "How many?", "solution": r"... so \boxed{7}.", "answer": "8",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    {"problem": "Which?", "solution": r"... \boxed{\text{(C)}}", "answer": r"\text{(C)}",
     "subject": "Geometry", "level": 2, "unique_id": "test/geometry/5.json"},
]


@pytest.fixture(autouse=True)
def offline_and_private_cache(tmp_path, monkeypatch):
    """No test touches the network or the user's datasets cache (datasets reads both settings at import)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_rows(path, rows):
    """Rows as .jsonl, .json (an array) or .parquet, by the path's suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        write_jsonl(path, rows)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"$\boxed{1}$ then $\boxed{2}$", "2"),
        (r"the answer is \fbox{18}", "18"),
        (r"first \boxed{1}, finally \fbox{\sqrt{2}}", r"\sqrt{2}"),
        (r"the answer is $\boxed 5$.", "5"),
        (r"the answer is \boxed 5.", "5"),
        (r"the answer is \boxed 3.5, so", "3.5"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{\left\{ x \right.}", r"\left\{ x \right."),
        (r"\boxed5", None),
        (r"\boxed{\frac{1}{2}", None),
        (r"\boxed{1} and then \boxed{2", None),
        ("the answer is 3", None),
        (r"\boxeddot{3}", None),
    ],
    ids=["nested", "last-of-several", "fbox", "fbox-after-boxed", "brace-less",
         "brace-less-then-a-full-stop", "brace-less-decimal-then-a-comma", "escaped-braces",
         "an-unmatched-escaped-brace", "no-space-no-brace",
         "unclosed", "last-unclosed", "none", "not-a-box-command"],
)
def test_last_boxed_takes_the_brace_matched_content_of_the_last_box(text, expected):
    assert last_boxed(text) == expected, f"last_boxed({text!r}) = {last_boxed(text)!r}, expected {expected!r}"


def test_gold_answer_prefers_the_answer_column_over_the_solution():
    row = {"solution": r"\boxed{7}", "answer": "8"}
    assert gold_answer(row) == "8", "the `answer` column did not win over the solution's boxed answer"
    assert gold_answer({"solution": r"\boxed{7}", "answer": ""}) == "7", "an empty `answer` did not fall back"
    assert gold_answer({"solution": r"\boxed{7}"}) == "7", "without `answer` the solution's boxed answer was not used"
    assert gold_answer({"solution": "no box"}) is None, "a row without any gold got one"
    assert gold_answer({"solution": r"\boxed{ }"}) is None, "an empty boxed answer was taken for a gold"


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_local_math_file_gives_problems_with_boxed_golds_and_counts_the_rows_without(tmp_path, suffix):
    path = write_rows(tmp_path / f"math_train{suffix}", MATH_ROWS)
    problems, report = load_math_problems(str(path), "train", TEMPLATE)
    assert [p.answer for p in problems] == [r"\frac{1}{2}", "18", r"2\sqrt{113}"], (
        f"wrong golds from {suffix}: {[p.answer for p in problems]}"
    )
    assert [p.problem_id for p in problems] == ["default/train/0", "default/train/1", "default/train/3"], (
        f"ids must be default/<split>/<row index>, stable across skipped rows: {[p.problem_id for p in problems]}"
    )
    assert report == MathLoadReport(str(path), "train", rows=4, kept=3, no_gold=1, unparsable=0), (
        f"wrong report: {report}"
    )
    assert "4 rows" in report.describe() and "1 without a gold" in report.describe(), report.describe()


def test_held_out_problem_ids_that_repeat_are_refused_naming_the_source(tmp_path, checker):
    rows = [*MATH500_ROWS, {**MATH500_ROWS[0], "problem": "How many more?"}]
    path = write_jsonl(tmp_path / "math500" / "test.jsonl", rows)
    with pytest.raises(ValueError, match=r"test\.jsonl: 1 problem id\(s\) repeat among the 3 held-out problems "
                                         r"\(e\.g\. 'test/prealgebra/1\.json'\)"):
        heldout_problems("MATH", str(path), "{problem}", None, checker, log=lambda line: None)
    assert len(heldout_problems("MATH", str(path), "{problem}", None, checker, count=2, log=lambda line: None)) == 2, \
        "only the problems the study evaluates need unique ids"


def test_a_single_training_file_without_a_held_out_set_is_refused_rather_than_evaluated_on(tmp_path, checker):
    path = write_jsonl(tmp_path / "math_train.jsonl", MATH_ROWS)  # one file holds one split: the training one
    with pytest.raises(ValueError, match=r"math_train\.jsonl is a single file, one split, which training reads: set "
                                         r"world\.heldout"):
        heldout_problems(str(path), None, "{problem}", None, checker, log=lambda line: None)


def test_prompt_substitution_keeps_latex_braces_in_template_and_problem(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    problems, _ = load_math_problems(str(path), "train", TEMPLATE)
    expected = "Solve, and put the answer in \\boxed{}.\nCompute $\\frac{1}{2}+0$.\nAnswer:"
    assert problems[0].prompt == expected, f"prompt mangled: {problems[0].prompt!r}"
    assert problems[0].question == "Compute $\\frac{1}{2}+0$.", "the PRM's question should be the bare problem"
    assert problems[2].prompt.count(r"\{x\}") == 1, f"escaped braces of the problem lost: {problems[2].prompt!r}"


def test_math500_style_file_uses_unique_id_and_the_answer_column(tmp_path):
    path = write_jsonl(tmp_path / "math500" / "test.jsonl", MATH500_ROWS)
    problems, report = load_math_problems(str(path), "test", "{problem}")
    assert problems == [
        Problem("test/prealgebra/1.json", "How many?", "8", question="How many?"),
        Problem("test/geometry/5.json", "Which?", r"\text{(C)}", question="Which?"),
    ], f"MATH-500 rows not read by unique_id and answer: {problems}"
    assert (report.rows, report.kept, report.no_gold) == (2, 2, 0), f"wrong report: {report}"


def test_folder_snapshot_with_subset_configs_concatenates_them_in_the_given_order(tmp_path):
    folder = tmp_path / "hendrycks_math"
    write_rows(folder / "algebra" / "train-00000-of-00001.parquet", MATH_ROWS[:2])
    write_rows(folder / "geometry" / "train-00000-of-00001.parquet", MATH_ROWS[3:])
    configs = "".join(
        f"- config_name: {name}\n  data_files:\n  - split: train\n    path: {name}/train-*\n"
        for name in ("algebra", "geometry")
    )
    (folder / "README.md").write_text(f"---\nconfigs:\n{configs}---\n# a local MATH snapshot\n")
    problems, report = load_math_problems(str(folder), "train", "{problem}", subsets=["geometry", "algebra"])
    assert [p.problem_id for p in problems] == ["geometry/train/0", "algebra/train/0", "algebra/train/1"], (
        f"subsets not concatenated in the given order with subset/split/index ids: {[p.problem_id for p in problems]}"
    )
    assert report.rows == 3 and report.kept == 3, f"wrong report: {report}"
    with pytest.raises(ValueError, match="precalculus"):
        load_math_problems(str(folder), "train", "{problem}", subsets=["precalculus"])


def test_folder_without_configs_is_read_by_split_file_names(tmp_path):
    folder = tmp_path / "math500"
    write_jsonl(folder / "test.jsonl", MATH500_ROWS)
    problems, _ = load_math_problems(str(folder), "test", "{problem}")
    assert [p.answer for p in problems] == ["8", r"\text{(C)}"], f"folder split not found: {problems}"


@pytest.mark.parametrize("template", ["no placeholder", "{problem} and again {problem}", "{ problem }"])
def test_template_without_exactly_one_placeholder_is_refused_naming_it(tmp_path, template):
    path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    with pytest.raises(ValueError, match="exactly once") as raised:
        load_math_problems(str(path), "train", template)
    assert repr(template) in str(raised.value), f"the error does not name the template: {raised.value}"


def test_missing_columns_are_refused_naming_the_source_and_the_columns(tmp_path):
    no_problem = write_jsonl(tmp_path / "no_problem.jsonl", [{"question": "q", "solution": r"\boxed{1}"}])
    with pytest.raises(ValueError, match="'problem'") as raised:
        load_math_problems(str(no_problem), "train", "{problem}")
    assert str(no_problem) in str(raised.value), f"the error does not name the source: {raised.value}"
    no_gold = write_jsonl(tmp_path / "no_gold.jsonl", [{"problem": "q", "level": "Level 1"}])
    with pytest.raises(ValueError, match="answer or solution"):
        load_math_problems(str(no_gold), "train", "{problem}")


def test_missing_local_path_raises_file_not_found_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "math.jsonl"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_math_problems(str(missing), "train", "{problem}")
    with pytest.raises(FileNotFoundError, match="not_here"):
        load_math_problems("./not_here", "train", "{problem}")


def test_subsets_of_a_single_file_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    with pytest.raises(ValueError, match="single file"):
        load_math_problems(str(path), "train", "{problem}", subsets=["algebra"])


def test_offline_hub_id_raises_data_unavailable_naming_it_and_how_to_use_a_local_copy():
    start = time.monotonic()
    with pytest.raises(DataUnavailable) as raised:
        load_math_problems("EleutherAI/hendrycks_math", "train", "{problem}", subsets=["algebra"])
    message = str(raised.value)
    assert time.monotonic() - start < 10, "an offline hub load took long: it may have tried the network"
    for needed in ("EleutherAI/hendrycks_math", "'train'", "'algebra'", "HF_DATASETS_OFFLINE", "world.problems"):
        assert needed in message, f"the DataUnavailable message lacks {needed!r}: {message}"
    assert isinstance(raised.value, ValueError), "DataUnavailable must be a ValueError"
    assert raised.value.__cause__ is not None, "the original load_dataset error was not chained"


@pytest.fixture(scope="module")
def checker():
    with AnswerChecker(timeout_seconds=5.0) as checker:
        yield checker


def test_unparsable_golds_lists_the_bad_ones_once_without_raising(checker):
    golds = ["18", "}{", r"\frac{1}{2}", "}{", ""]
    assert checker.unparsable_golds(golds) == ["}{", ""], "wrong golds reported unparsable"
    assert checker.check(["18"], [r"\boxed{18}"]) == [Verdict.CORRECT], "the checker broke after bad golds"


def test_golds_math_verify_reads_only_as_text_are_named_apart_from_those_it_reads_as_math(checker):
    golds = ["18", r"\frac{1}{", r"0.\overline{3}", r"\text{(C)}", "}{", r"\frac{1}{"]
    assert checker.text_only_golds(golds) == [r"\frac{1}{", r"0.\overline{3}"]
    assert checker.unparsable_golds(golds) == ["}{"], "a gold read as text is still parsed"


def test_a_math_set_keeps_its_text_only_golds_and_says_so(tmp_path, checker):
    rows = [*MATH500_ROWS, {**MATH500_ROWS[0], "answer": r"\frac{1}{", "unique_id": "test/algebra/9.json"}]
    path, said = write_jsonl(tmp_path / "math500" / "test.jsonl", rows), []
    problems = heldout_problems("MATH", str(path), "{problem}", None, checker, log=said.append)
    assert [p.problem_id for p in problems][-1] == "test/algebra/9.json", "a text-only gold is kept"
    assert any("1 problem(s) whose gold math-verify reads only as its text" in line and "test/algebra/9.json" in line
               for line in said), said


def test_drop_unparsable_drops_golds_math_verify_cannot_parse_and_keeps_the_rest(checker):
    answers = [r"\frac{1}{2}", "}{", "18", "}", r"2\sqrt{113}"]
    problems = [Problem(f"p{i}", "prompt", answer) for i, answer in enumerate(answers)]
    kept, dropped = drop_unparsable(problems, checker)
    assert [p.answer for p in kept] == [r"\frac{1}{2}", "18", r"2\sqrt{113}"], f"wrong problems kept: {kept}"
    assert [p.problem_id for p in dropped] == ["p1", "p3"], f"wrong problems dropped: {dropped}"
    report = MathLoadReport("src", "train", rows=6, kept=5, no_gold=1).with_unparsable(len(dropped))
    assert (report.kept, report.unparsable) == (3, 2), f"the report does not count the dropped golds: {report}"


def test_a_held_out_set_drawn_from_the_training_data_is_left_out_of_training(tmp_path, checker, capsys):
    """One MATH-schema file as both world.problems and world.heldout: its first problems are held out, the rest
    trained on; a held-out set that is the whole training set is refused."""
    from reward_density.experiment import cell
    from reward_density.experiment.profiles import REPO_ROOT, cell_config, load_profile

    path = str(write_jsonl(tmp_path / "math.jsonl", [MATH_ROWS[0], MATH_ROWS[1], MATH_ROWS[3]]))
    profile = load_profile(REPO_ROOT / "params" / "smoke.yaml")
    config = cell_config(profile, "outcome", 1, 0, problems=path, heldout=path, prompt_template="{problem}",
                         eval_problems=1, curve_problems=None, out_dir=str(tmp_path / "cell"))
    train, heldout = cell.load_problem_splits(config, checker)
    assert [p.prompt for p in heldout] == [MATH_ROWS[0]["problem"]]
    assert [p.prompt for p in train] == [MATH_ROWS[1]["problem"], MATH_ROWS[3]["problem"]], "trained on held out"
    assert "1 of 3 training problems repeat a held-out problem's prompt" in capsys.readouterr().out
    with pytest.raises(ValueError, match="every one of the 3 training problems is held out"):
        cell.load_problem_splits(dataclasses.replace(config, eval_problems=3), checker)


def test_the_sft_control_reads_its_own_folder_beside_math_schema_problems(tmp_path, checker):
    """A paper-style profile (MATH-schema problems with a prompt template) with the SFT control: the control is a
    mini-world folder of its own and is read as one, with its solutions."""
    from reward_density.data.problems import write_problems
    from reward_density.experiment import cell
    from reward_density.experiment.profiles import REPO_ROOT, cell_config, load_profile
    from reward_density.world.control import ControlConfig, control_splits

    for split, problems in control_splits(ControlConfig(size=4), seed=0).items():  # as the world build writes it
        write_problems(tmp_path / "control" / f"{split}.jsonl", problems)
    path = str(write_jsonl(tmp_path / "math.jsonl", [MATH_ROWS[0], MATH_ROWS[1], MATH_ROWS[3]]))
    profile = load_profile(REPO_ROOT / "params" / "smoke.yaml")
    config = cell_config(profile, "sft", 1, 0, problems=path, heldout=path, prompt_template="{problem}",
                         control=str(tmp_path / "control"), out_dir=str(tmp_path / "cell"))
    train, heldout = cell.load_problem_splits(config, checker)
    assert train and all(p.solution for p in train), "the control's facts lost their solutions"
    assert {p.prompt for p in heldout} == {p.prompt for p in train}, "the control is scored on the facts it teaches"

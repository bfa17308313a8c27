"""Evaluation: the unbiased pass@k estimator, and greedy pass@1 with per-problem rows."""
import itertools
import json
from types import SimpleNamespace

import pytest

from reward_density.data.answer_check import AnswerChecker, LastIntegerChecker, Verdict
from reward_density.data.problems import Problem
from reward_density.experiment import baseline
from reward_density.experiment.evaluation import greedy_eval, pass_at_k, sampled_pass_at_k
from reward_density.experiment.profiles import cell_config, find_profile, load_profile
from reward_density.grpo.sampler import SamplingConfig
from reward_density.tools.stand_ins import build_qwen3


@pytest.mark.parametrize("n,c,k", [(4, 0, 1), (4, 1, 1), (8, 3, 4), (5, 5, 2), (6, 2, 6)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_correct_sample(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


@pytest.fixture(scope="module")
def checker():
    with AnswerChecker(timeout_seconds=5.0) as c:
        yield c


def test_greedy_eval_scores_each_problem_once_and_matches_its_rows(tiny_tokenizer, checker):
    model = build_qwen3(len(tiny_tokenizer), seed=0)
    problems = [Problem(f"p{i}", f"Problem: {i} + 1 = ?\n", str(i + 1)) for i in range(5)]
    accuracy, rows = greedy_eval(model, tiny_tokenizer, problems, checker, max_new_tokens=6, batch_size=2)
    assert [r["problem_id"] for r in rows] == [p.problem_id for p in problems]
    assert accuracy == sum(r["correct"] for r in rows) / 5
    assert all(r["verdict"] in {"correct", "wrong", "unparsable", "timeout"} for r in rows)
    _, rows_again = greedy_eval(model, tiny_tokenizer, problems, checker, max_new_tokens=6, batch_size=5)
    assert rows_again == rows, "greedy evaluation must not depend on the batch size or on randomness"


def test_sampled_pass_at_k_reports_each_k_from_n_draws(tiny_tokenizer, checker):
    model = build_qwen3(len(tiny_tokenizer), seed=0)
    problems = [Problem("a", "Problem: 1 + 1 = ?\n", "2"), Problem("b", "Problem: 2 + 2 = ?\n", "4")]
    scores, rows = sampled_pass_at_k(model, tiny_tokenizer, problems, checker,
                                     SamplingConfig(max_new_tokens=4, temperature=1.0), n_samples=4, ks=[1, 4], seed=0)
    assert len(rows) == 8 and set(scores) == {1, 4}
    assert 0 <= scores[1] <= scores[4] <= 1


def _smoke_config(out_dir, **settings):
    """The config of the smoke study's outcome r1 arm, seed 0, with these settings."""
    from reward_density.experiment.profiles import REPO_ROOT, cell_config, load_profile

    profile = load_profile(REPO_ROOT / "params" / "smoke.yaml")
    return cell_config(profile, "outcome", 1, 0, out_dir=out_dir, report_to="none", **settings)


def _train_smoke_arm(out_dir, checker, curve_problems, **settings):
    """One smoke outcome arm (two steps, evaluated at 0, 1 and 2) trained in this process; its writer."""
    from reward_density.experiment import cell

    config = _smoke_config(out_dir, curve_problems=curve_problems, **settings)
    inputs = cell.load_inputs(config, checker)
    writer = cell.CellWriter(config)
    cell.train([config], inputs, cell.make_policy([config], inputs.student), [writer], progress=False)
    return writer


@pytest.fixture(scope="module")
def smoke_arms(smoke_project, tmp_path_factory, checker):
    """The same smoke arm evaluated on all 8 held-out problems at every evaluation, and on 3 in between."""
    root = tmp_path_factory.mktemp("curve")
    return _train_smoke_arm(root / "all", checker, None), _train_smoke_arm(root / "curve", checker, 3)


def test_the_evaluations_between_first_and_last_score_only_the_curve_problems(smoke_arms):
    _, curve = smoke_arms
    assert [e["scored"] for e in curve.evals] == [8, 3, 8]
    for evaluation in curve.evals:
        rows = [r for r in curve.answers if r["step"] == evaluation["step"]]
        assert evaluation["pass1"] == sum(r["correct"] for r in rows[:3]) / 3, "pass1 is not over the curve problems"
        assert evaluation["pass1_scored"] == sum(r["correct"] for r in rows) / len(rows)


def _metrics(history):
    """Every metric of the steps but the wall-clock timings."""
    return [{k: v for k, v in row.items() if "seconds" not in k} for row in history]


def test_scoring_fewer_problems_in_between_changes_neither_training_nor_the_first_and_last_answers(smoke_arms):
    every, curve = smoke_arms
    assert _metrics(every.history) == _metrics(curve.history), "the curve subset changed the training steps"
    for step in (0, 2):
        assert ([r for r in every.answers if r["step"] == step] == [r for r in curve.answers if r["step"] == step]), \
            f"the step-{step} answers differ"
    middle = [r for r in every.answers if r["step"] == 1][:3]
    assert middle == [r for r in curve.answers if r["step"] == 1], "the curve problems were scored differently"
    assert [e["scored"] for e in every.evals] == [8, 8, 8]
    assert [e["pass1_scored"] for e in every.evals] == [e["pass1"] for e in every.evals]


def test_an_arm_scores_its_dev_problems_after_step_0_and_changes_neither_training_nor_its_held_out_answers(
        smoke_arms, tmp_path, checker):
    every, _ = smoke_arms
    dev = _train_smoke_arm(tmp_path / "dev", checker, None, dev_problems=3)
    assert [(e["step"], e["scored"]) for e in dev.dev_evals] == [(1, 3), (2, 3)], "dev is scored after step 0 only"
    assert (tmp_path / "dev" / "dev_evals.csv").is_file()
    assert _metrics(dev.history) == _metrics(every.history), "scoring dev problems changed the training steps"
    assert dev.answers == every.answers, "scoring dev problems changed the held-out answers"


def test_dev_problems_beyond_the_dev_split_or_beside_a_dev_evaluation_are_clear_errors(smoke_project, tmp_path,
                                                                                       checker):
    from reward_density.experiment import cell

    with pytest.raises(ValueError, match=r"1000000 dev problems requested but .*dev\.jsonl holds"):
        cell.load_dev_problems(_smoke_config(tmp_path, dev_problems=10**6), checker)
    with pytest.raises(ValueError, match="with eval_split dev every evaluation is on dev already"):
        _smoke_config(tmp_path, dev_problems=3, eval_split="dev")


HELDOUT = [SimpleNamespace(problem_id="000", answer="12")]  # what base_evaluation reads of a held-out problem
BASE_CONFIG = SimpleNamespace(device="cpu", precision="fp32", eval_max_new_tokens=4, eval_batch_size=1,
                              student="student")


@pytest.fixture
def base_answers(tmp_path, monkeypatch):
    """base_evaluation saving under key k in tmp_path, its greedy evaluation answering '12' to every problem
    (graded by the checker it is given, in greedy_eval's order of keys); the config."""

    def greedy_eval(model, tokenizer, problems, checker, *args, **kwargs):
        verdicts = checker.check([p.answer for p in problems], ["12"] * len(problems))
        rows = [{"problem_id": p.problem_id, "verdict": v.value, "correct": v is Verdict.CORRECT, "length": 1,
                 "answered": True, "truncated": False, "completion": "12"} for p, v in zip(problems, verdicts)]
        return sum(r["correct"] for r in rows) / len(rows), rows

    monkeypatch.setattr(baseline, "base_eval_key", lambda config: "k")
    monkeypatch.setattr(baseline, "greedy_eval", greedy_eval)
    return SimpleNamespace(**vars(BASE_CONFIG), base_answers=str(tmp_path))


def test_a_damaged_saved_base_evaluation_is_evaluated_again_with_a_warning(base_answers, tmp_path):
    (tmp_path / "base-k.json").write_text('{"pass1": 0.5, "rows": [')
    with pytest.warns(UserWarning, match=r"base-k\.json is not valid JSON"):
        computed = baseline.base_evaluation(base_answers, None, None, HELDOUT, LastIntegerChecker())
    assert computed[0] == 1.0
    assert baseline.base_evaluation(base_answers, None, None, HELDOUT, LastIntegerChecker()) == computed, \
        "the evaluation was not saved again"


def test_a_base_evaluation_gives_its_rows_keys_in_one_order_whether_computed_or_read_back(base_answers, tmp_path):
    """A cell's answers.csv takes its columns from the base rows' keys: computed or read from the saved
    evaluation, the same params must write the same bytes."""
    computed = baseline.base_evaluation(base_answers, None, None, HELDOUT, LastIntegerChecker())
    read_back = baseline.base_evaluation(base_answers, None, None, HELDOUT, LastIntegerChecker())
    assert (tmp_path / "base-k.json").is_file(), "the first call should have saved the evaluation"
    assert computed == read_back
    assert [list(row) for row in computed[1]] == [list(row) for row in read_back[1]], (
        "the computed rows' keys come in another order than the saved ones': answers.csv would differ in bytes")


def test_a_saved_base_evaluation_is_graded_by_the_checker_as_it_is_now(base_answers, tmp_path):
    """The key names what decides the completions, not the grading: a saved verdict from an older checker is not
    what the cell's later evaluations would say."""
    stale = {"problem_id": "000", "verdict": "wrong", "correct": False, "length": 2, "answered": False,
             "truncated": False, "completion": "1,2 so 12.0"}
    (tmp_path / "base-k.json").write_text(json.dumps({"pass1": 0.0, "rows": [stale], "student": "student"}))
    pass1, [row] = baseline.base_evaluation(base_answers, None, None, HELDOUT, LastIntegerChecker())
    assert (pass1, row["verdict"], row["correct"], row["answered"]) == (1.0, "correct", True, True)
    assert list(row) == list(stale), "grading again reordered the row's keys"


def test_a_saved_base_evaluation_of_other_problems_is_not_reused_nor_overwritten(base_answers, tmp_path):
    """One key, two held-out sets: a gold the checker failed to parse on one load dropped its problem."""
    saved = {"pass1": 0.0, "rows": [{"problem_id": "000", "correct": False, "completion": "0"}], "student": "student"}
    (tmp_path / "base-k.json").write_text(json.dumps(saved))
    heldout = [*HELDOUT, SimpleNamespace(problem_id="001", answer="12")]
    with pytest.warns(UserWarning, match=r"other held-out problems than this cell loaded \(1 there, 2 here"):
        pass1, rows = baseline.base_evaluation(base_answers, None, None, heldout, LastIntegerChecker())
    assert (pass1, [r["problem_id"] for r in rows]) == (1.0, ["000", "001"]), "the other set's evaluation was reused"
    assert json.loads((tmp_path / "base-k.json").read_text()) == saved, "the saved evaluation was overwritten"


def test_under_bf16_fullft_reads_a_base_evaluation_of_its_own_fp32_master_copy_not_the_lora_arms():
    # A LoRA arm holds the student in bf16, FullFT its fp32 master copy under autocast: their greedy answers differ.
    profile = load_profile(find_profile("smoke"))
    key = {(precision, rank): baseline.base_eval_key(cell_config(profile, "outcome", rank, 0, precision=precision,
                                                                 engine="peft"))
           for precision in ("fp32", "bf16") for rank in (1, 2, None)}
    assert key["fp32", 1] == key["fp32", 2] == key["fp32", None], "in fp32 every arm starts from the same answers"
    assert key["bf16", 1] == key["bf16", 2] != key["bf16", None]


def test_the_base_evaluations_key_changes_with_each_input_that_decides_its_answers(tmp_path):
    profile = load_profile(find_profile("smoke"))
    student, problems = tmp_path / "student", tmp_path / "problems"
    for folder in (student, problems):
        folder.mkdir()
    (student / "model.safetensors").write_text("weights")
    (problems / "heldout.jsonl").write_text("{}\n")

    def key(**settings) -> str:
        config = cell_config(profile, "outcome", 1, 0, student=str(student), problems=str(problems), **settings)
        return baseline.base_eval_key(config)

    keys = {"base": key(), "eval_problems": key(eval_problems=4), "eval_max_new_tokens": key(eval_max_new_tokens=9),
            "answer_format": key(answer_format="last_integer")}
    (student / "model.safetensors").write_text("other weights")
    keys["student"] = key()
    (problems / "heldout.jsonl").write_text("{}\n{}\n")
    keys["held-out problems"] = key()
    kept = sorted(name for name, value in keys.items() if list(keys.values()).count(value) > 1)
    assert not kept, f"a change that decides the base's answers kept its key: {kept}"

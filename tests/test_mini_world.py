"""The mini world: golds verify, a smoke world builds, reloads through from_pretrained and feeds every reward."""
import json
import random
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralForCausalLM, Qwen3ForCausalLM

from reward_density.data.answer_check import AnswerChecker, LastIntegerChecker, Verdict
from reward_density.data.problem_sets import training_problems
from reward_density.data.problems import read_problems
from reward_density.data.sources import load_causal_lm, load_tokenizer
from reward_density.data.steps import split_steps
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.rewards import build_reward
from reward_density.rewards.process import PRMScorer
from reward_density.world import build as mini_world
from reward_density.world.build import WorldBuildError, build_world, component_keys, stale_components, world_config
from reward_density.world.task import (
    ANSWER_LINE,
    TaskConfig,
    clean_trace,
    make_splits,
    problem_of,
    realistic_trace,
    sample_expression,
)

# ------------------------------------------------------------------------------------ the task


@pytest.mark.parametrize("operations", ["+-", "+-*"])
def test_every_gold_answer_verifies_against_its_own_clean_trace(operations):
    config = TaskConfig(operations=operations, max_digits=3, max_operands=4)
    splits = make_splits(config, {"train": 300, "heldout": 50}, seed=1)
    train, heldout = splits["train"], splits["heldout"]
    problems = [problem_of(e, str(i)) for i, e in enumerate(train + heldout)]
    traces = [clean_trace(e) for e in train + heldout]
    with AnswerChecker() as checker:
        verdicts = checker.check([p.answer for p in problems], traces)
    failures = [(p.prompt, t) for p, t, v in zip(problems, traces, verdicts) if v is not Verdict.CORRECT]
    assert not failures, f"{len(failures)} golds do not verify against their own trace, e.g. {failures[:2]}"


def test_clean_trace_is_one_step_per_line_then_the_boxed_answer():
    expression = sample_expression(random.Random(0), TaskConfig(min_operands=4, max_operands=4))
    lines = clean_trace(expression).split("\n")
    assert len(lines) == 4 and lines[-1] == ANSWER_LINE.format(value=expression.answer)
    assert [int(line.split("=")[1]) for line in lines[:-1]] == expression.values()


def test_splits_are_disjoint_and_fixed_by_seed():
    sizes = {"heldout": 100, "dev": 50, "train": 500}
    splits = make_splits(TaskConfig(), sizes, seed=3)
    assert {name: len(split) for name, split in splits.items()} == sizes
    texts = [{e.text for e in split} for split in splits.values()]
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2]) and not (texts[1] & texts[2])
    assert make_splits(TaskConfig(), sizes, seed=3) == splits
    assert make_splits(TaskConfig(), sizes, seed=4) != splits


def test_long_chains_get_direct_answers_that_stop_after_two_operations():
    config = TaskConfig(min_digits=1, max_digits=1, min_operands=4, max_operands=6, p_direct=1.0,
                        direct_min_operands=5, p_redundant=0, p_wrong_step=0, p_ramble=0)
    rng = random.Random(0)
    for _ in range(200):
        expression = sample_expression(rng, config)
        trace = realistic_trace(rng, expression, config)
        if len(expression.operands) >= 5:
            assert trace == ANSWER_LINE.format(value=expression.values()[1]), "a direct answer stops after two steps"
        else:
            assert trace == clean_trace(expression), "short chains are worked step by step"


def test_realism_settings_put_their_imperfections_in_the_traces():
    rng = random.Random(0)
    expression = sample_expression(rng, TaskConfig())
    wrong = realistic_trace(rng, expression, TaskConfig(p_wrong_step=1, p_redundant=0, p_ramble=0))
    assert wrong.split("\n")[-1] != ANSWER_LINE.format(value=expression.answer), "a slip must reach the answer"
    rambling = realistic_trace(rng, expression, TaskConfig(p_wrong_step=0, p_redundant=0, p_ramble=1))
    assert not rambling.split("\n")[-1].startswith("Answer:"), "rambling goes on after the answer line"
    redundant = realistic_trace(rng, expression, TaskConfig(p_wrong_step=0, p_redundant=1, p_ramble=0))
    assert "So far:" in redundant
    clean = realistic_trace(rng, expression, TaskConfig(p_wrong_step=0, p_redundant=0, p_ramble=0))
    assert clean == clean_trace(expression)


def test_task_settings_are_validated():
    with pytest.raises(ValueError, match="operations"):
        TaskConfig(operations="+/")
    with pytest.raises(ValueError, match="p_ramble"):
        TaskConfig(p_ramble=1.5)
    with pytest.raises(ValueError, match="too few distinct problems"):
        make_splits(TaskConfig(max_digits=1, min_operands=2, max_operands=2, operations="+"), {"train": 500}, seed=0)


def test_world_overrides_name_unknown_settings():
    assert world_config("smoke", student={"hidden": 64}).student.hidden == 64
    with pytest.raises(ValueError, match=r"unknown world setting student\.width"):
        world_config("smoke", student={"width": 64})
    with pytest.raises(ValueError, match="unknown world size"):
        world_config("huge")


def test_world_overrides_keep_each_settings_kind():
    assert world_config("smoke", student_tolerance=1).student_tolerance == 1, "a float setting takes an integer"
    as_written = world_config("smoke", student_target=0, teacher_stop_accuracy=1)  # YAML's 0 for the preset's 0.0
    assert component_keys(as_written) == component_keys(world_config("smoke")), "the preset's own value rebuilt"
    for bad, said in (({"seed": "0"}, "seed must be an integer"), ({"seed": 1.0}, "seed must be an integer"),
                      ({"student": {"hidden": True}}, "student.hidden must be an integer"),
                      ({"student_tolerance": "0.1"}, "student_tolerance must be a number")):
        with pytest.raises(ValueError, match=said):
            world_config("smoke", **bad)


@pytest.mark.parametrize("part", ["student_training", "teacher_training", "prm_pretraining", "prm_training"])
def test_a_training_seed_of_its_own_is_refused_naming_the_worlds_seed(part):
    with pytest.raises(ValueError, match=rf"{part}\.seed is 7, but the world trains every model with the world's "
                                         r"seed \(config\.seed: a profile's build_world\.seed, here 3\)"):
        world_config("smoke", seed=3, **{part: {"seed": 7}})
    assert world_config("smoke", seed=3, **{part: {"seed": 0}}).seed == 3, "the default is no choice of its own"


# ------------------------------------------------------------------------------------ a built world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("world")
    manifest = build_world(world_config("smoke"), folder, log=lambda line: None)
    return folder, manifest


def test_the_manifest_records_settings_accuracies_sizes_and_commit(world):
    folder, manifest = world
    assert json.loads((folder / "manifest.json").read_text()) == manifest
    components = manifest["components"]
    assert set(components) == {"problems", "control", "tokenizer", "student", "teacher", "prm"}
    for name in ("student", "teacher"):
        assert 0 <= components[name]["accuracy"] <= 1 and components[name]["parameters"] > 0
    assert {"accuracy", "majority_baseline", "steps"} <= set(components["prm"]["heldout"])
    assert manifest["config"]["seed"] == 0 and "commit" in manifest["git"]
    assert all(component["git"] == manifest["git"] for component in components.values()), "each records its code"
    assert {components[name]["threads"] for name in ("student", "teacher", "prm")} == {1}, "built on one thread"


def test_a_built_world_loads_back_through_from_pretrained(world):
    folder, _ = world
    assert isinstance(AutoModelForCausalLM.from_pretrained(folder / "student"), Qwen3ForCausalLM)
    assert isinstance(AutoModelForCausalLM.from_pretrained(folder / "teacher"), Qwen3ForCausalLM)
    assert isinstance(AutoModelForCausalLM.from_pretrained(folder / "prm"), MistralForCausalLM)
    student_tok, prm_tok = load_tokenizer(folder / "student"), load_tokenizer(folder / "prm")
    for tok in (student_tok, prm_tok):
        assert None not in (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    assert load_tokenizer(folder / "teacher").get_vocab() == student_tok.get_vocab(), "teacher shares the vocabulary"
    assert student_tok.get_vocab() != prm_tok.get_vocab(), "the PRM has its own tokenizer, as Math-Shepherd's"
    for split, size in world_config("smoke").splits.items():
        assert len(read_problems(folder / "problems" / f"{split}.jsonl")) == size
        control = read_problems(folder / "control" / f"{split}.jsonl")
        assert all(p.solution for p in control), "the SFT control learns from solutions"
        assert len(control) == world_config("smoke").control.size ** 2, "every fact of the control's table"


@pytest.fixture(scope="module")
def student_rollout(world):
    folder, _ = world
    tokenizer = load_tokenizer(folder / "student")
    student = load_causal_lm(folder / "student")
    problems = read_problems(folder / "problems" / "train.jsonl")[:3]
    return sample_rollout(student, tokenizer, problems, 2, SamplingConfig(24, temperature=1.0), seed=0), tokenizer


def test_the_prm_gives_exactly_one_probability_per_step(world, student_rollout):
    folder, _ = world
    rollout, _ = student_rollout
    scorer = PRMScorer(load_causal_lm(folder / "prm"), load_tokenizer(folder / "prm"))
    steps = [[s.text for s in split_steps(text)] for text in rollout.completions]
    scores, lost = scorer.score_batch(list(rollout.prompts), steps)
    assert [len(s) for s in scores] == [len(s) for s in steps] and lost == [0] * len(steps)
    assert all(0 <= p <= 1 for row in scores for p in row)


def test_every_reward_runs_on_samples_from_the_built_student(world, student_rollout):
    folder, _ = world
    rollout, tokenizer = student_rollout
    with AnswerChecker() as checker:
        parts = {
            "checker": checker,
            "prm_model": load_causal_lm(folder / "prm"),
            "prm_tokenizer": load_tokenizer(folder / "prm"),
            "student_tokenizer": tokenizer,
            "teacher": load_causal_lm(folder / "teacher"),
            "temperature": 1.0,
        }
        for regime in ("outcome", "process", "distillation"):
            deposits = build_reward(regime, **parts)(rollout)
            assert deposits.token_rewards.shape == rollout.completion_ids.shape, regime
            assert torch.isfinite(deposits.token_rewards).all(), regime


def test_an_up_to_date_world_is_skipped_and_a_changed_setting_rebuilds_only_what_depends_on_it(world):
    folder, manifest = world
    assert stale_components(world_config("smoke"), folder) == []
    lines = []
    assert build_world(world_config("smoke"), folder, log=lines.append)["components"] == manifest["components"]
    assert all(line.endswith("up to date") for line in lines)
    changed = world_config("smoke", prm_training={"steps": 11})
    assert stale_components(changed, folder) == ["prm"]
    assert component_keys(changed)["student"] == component_keys(world_config("smoke"))["student"]
    assert stale_components(world_config("smoke", control={"size": 5}), folder) == ["control"], \
        "the SFT control's table stands alone: changing it must not rebuild the tokenizer or the models"


def test_a_damaged_world_manifest_stops_the_build_naming_the_file(tmp_path):
    (tmp_path / "manifest.json").write_text('{"components": ')
    with pytest.raises(ValueError, match=r"manifest\.json is not valid JSON"):
        stale_components(world_config("smoke"), tmp_path)


def test_a_new_sampling_version_rebuilds_only_the_prm(world, monkeypatch):
    folder, _ = world
    before = component_keys(world_config("smoke"))
    monkeypatch.setattr(mini_world, "SAMPLING_VERSION", mini_world.SAMPLING_VERSION + 1)
    after = component_keys(world_config("smoke"))
    assert [name for name in before if before[name] != after[name]] == ["prm"], "the PRM's labels are sampled"
    assert stale_components(world_config("smoke"), folder) == ["prm"]


def test_the_same_seed_builds_the_same_world(world, tmp_path):
    folder, manifest = world
    again = build_world(world_config("smoke"), tmp_path, log=lambda line: None)
    for name in ("student", "teacher"):
        assert again["components"][name]["accuracy"] == manifest["components"][name]["accuracy"]
        first, second = load_causal_lm(folder / name).state_dict(), load_causal_lm(tmp_path / name).state_dict()
        assert all(torch.equal(first[k], second[k]) for k in first), f"{name} weights differ between builds"
    assert again["components"]["prm"]["heldout"] == manifest["components"]["prm"]["heldout"]


def test_a_student_that_misses_its_target_stops_the_build_and_keeps_what_was_built(tmp_path):
    config = world_config("smoke", student_target=0.9, student_tolerance=0.05)
    with pytest.raises(WorldBuildError, match="not within 0.05 of its target 0.9"):
        build_world(config, tmp_path, log=lambda line: None)
    built = set(json.loads((tmp_path / "manifest.json").read_text())["components"])
    assert built == {"problems", "control", "tokenizer", "teacher"}, "the teacher, built beside the student, is kept"


def test_a_rejected_rebuild_leaves_the_component_stale_for_the_settings_it_replaced(world, tmp_path):
    folder = tmp_path / "world"
    shutil.copytree(world[0], folder)
    rejected = world_config("smoke", student={"hidden": 64}, student_target=0.9, student_tolerance=0.05)
    with pytest.raises(WorldBuildError, match="not within"):
        build_world(rejected, folder, log=lambda line: None)
    assert load_causal_lm(folder / "student").config.hidden_size == 64, "the rejected student is on disk"
    assert stale_components(world_config("smoke"), folder) == ["student"], \
        "the old settings must rebuild the student, never reuse the rejected one as up to date"


@pytest.mark.parametrize("stricter, said", [
    ({"student_tolerance": 0.01}, r"the world's student was built with dev greedy pass@1 0\.\d{3}, not within 0\.01 "
                                  r"of its target 0\.0: student_tolerance is in no component key"),
    ({"teacher_min_accuracy": 0.99}, r"the world's teacher was built with dev greedy pass@1 0\.\d{3}, below its "
                                     r"minimum 0\.99: teacher_min_accuracy is in no component key"),
])
def test_an_up_to_date_world_whose_recorded_accuracy_fails_a_stricter_threshold_stops_the_build(world, stricter,
                                                                                                 said):
    folder, manifest = world
    config = world_config("smoke", **stricter)
    assert stale_components(config, folder) == [], "thresholds are in no key"
    with pytest.raises(WorldBuildError, match=said):
        build_world(config, folder, log=lambda line: None)
    assert json.loads((folder / "manifest.json").read_text()) == manifest, "the stricter threshold was recorded"


@pytest.mark.parametrize("record, said", [
    ({"problem_id": "p1", "prompt": "2 + 2 =", "answer": None}, "got prompt '2 + 2 =', answer None"),
    ({"problem_id": "p1", "prompt": "2 + 2 =", "answer": ""}, "got prompt '2 + 2 =', answer ''"),
    ({"problem_id": "p1", "prompt": 5, "answer": "4"}, "got prompt 5, answer '4'"),
])
def test_a_problem_without_a_text_prompt_or_a_gold_answer_is_refused_naming_its_line(tmp_path, record, said):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"problem_id": "p0", "prompt": "1 + 1 =", "answer": "2"}) + "\n" + json.dumps(record))
    with pytest.raises(ValueError) as caught:
        read_problems(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: problem 'p1' needs a text prompt and a gold answer") and said in message, \
        message


def test_a_mini_gold_math_verify_reads_only_as_text_stops_the_load(tmp_path):
    folder = tmp_path / "problems"
    folder.mkdir()
    rows = [{"problem_id": f"p{i}", "prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(3)]
    rows[2]["answer"] = r"\frac{1}{"  # a malformed gold: every arm would fail the problem, unseen
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with AnswerChecker() as checker, pytest.raises(ValueError, match=r"cannot read the gold answer of 1 problem\(s\) "
                                                                     r"\(p2: '\\\\frac\{1\}\{'\)"):
        training_problems(str(folder), None, None, checker)


def test_a_gold_the_checker_cannot_read_stops_the_load_naming_its_file_and_problem(tmp_path):
    folder = tmp_path / "problems"
    folder.mkdir()
    rows = [{"problem_id": f"p{i}", "prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(3)]
    rows[1]["answer"] = "two"
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"train\.jsonl: the checker cannot read the gold answer of 1 problem\(s\) "
                                         r"\(p1: 'two'\)"):
        training_problems(str(folder), None, None, LastIntegerChecker())

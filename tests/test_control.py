"""The SFT control's skill: a table of arbitrary facts, the same facts in every split."""
import math

import pytest

from reward_density.data.answer_check import last_boxed
from reward_density.world.control import ControlConfig, control_splits, control_table


def test_the_table_holds_every_pair_once_with_values_in_range():
    config = ControlConfig(size=5, min_value=10, max_value=20)
    table = control_table(config, seed=0)
    assert sorted(table) == [(a, b) for a in range(5) for b in range(5)]
    assert all(10 <= v <= 20 for v in table.values())


def test_the_table_depends_on_the_seed_and_only_on_it():
    config = ControlConfig(size=6)
    assert control_table(config, 0) == control_table(config, 0)
    assert control_table(config, 0) != control_table(config, 1)


def test_every_split_holds_the_same_facts_in_its_own_order():
    splits = control_splits(ControlConfig(size=6), seed=3)
    facts = {name: [(p.prompt, p.answer) for p in problems] for name, problems in splits.items()}
    assert set(facts["train"]) == set(facts["dev"]) == set(facts["heldout"]) and len(facts["train"]) == 36
    assert facts["train"] != facts["heldout"], "each split is shuffled on its own"


def test_a_fact_states_its_value_and_boxes_it():
    problem = control_splits(ControlConfig(size=3), seed=0)["train"][0]
    fact = problem.prompt.split("Compute ")[1].split(".")[0]
    assert problem.solution.startswith(f"{fact}={problem.answer}\n")
    assert last_boxed(problem.solution) == problem.answer and problem.solution.endswith(f"\\boxed{{{problem.answer}}}")


def test_the_bits_to_learn_are_facts_times_the_values_entropy():
    assert ControlConfig(size=14, min_value=10, max_value=99).bits == pytest.approx(196 * math.log2(90))


@pytest.mark.parametrize("settings, message",
                         [({"size": 0}, "size >= 1"), ({"min_value": 9, "max_value": 5}, "min_value")])
def test_a_bad_table_is_refused_with_the_setting_named(settings, message):
    with pytest.raises(ValueError, match=message):
        ControlConfig(**settings)

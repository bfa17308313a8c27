"""Profiles: the shipped ones load and expand; every invalid one fails before any work, naming file and key."""
from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from reward_density.data.sources import load_causal_lm
from reward_density.experiment.baseline import base_configs
from reward_density.experiment.config import CellConfig, parse_cell_name
from reward_density.experiment.profiles import (
    REPO_ROOT,
    ProfileError,
    cell_config,
    find_profile,
    group_configs,
    load_profile,
    resolve_world_entry,
)

SMOKE = yaml.safe_load((REPO_ROOT / "params" / "smoke.yaml").read_text())


def write_profile(folder: Path, data, name: str = "tiny") -> Path:
    """Write a profile (a mapping, or raw text) as folder/<name>.yaml."""
    path = folder / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def tiny(**changes) -> dict:
    """The smoke profile renamed 'tiny', with dotted-key changes applied (value None deletes the key)."""
    data = copy.deepcopy(SMOKE)
    data["profile"] = "tiny"
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return data


def error_of(tmp_path: Path, data) -> str:
    """The ProfileError message of loading this profile."""
    path = write_profile(tmp_path, data)
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    return message


@pytest.mark.parametrize("name, cells", [("mini", 96), ("mini_sweep", 192), ("mini_klfree", 72),
                                         ("mini_outcome_seeds", 72), ("mini_outcome_powered", 204),
                                         ("mini_outcome_longer", 36), ("mini_process_longer", 24),
                                         ("mini_sft_longer", 24), ("mini_sft_longer_decay", 24),
                                         ("mini_process_powered", 126), ("mini_process_stopping", 72),
                                         ("mini_sweep_stopping", 62), ("mini_process_stopping_swept", 72),
                                         ("mini_world1", 96), ("mini_world2", 96),
                                         ("mini_world2_outcome_seeds", 48), ("mini_world1_process_stopping_swept", 72),
                                         ("mini_world2_process_stopping_swept", 72),
                                         ("mini_process_stopping_swept_seeds", 72),
                                         ("mini_epyc_process_stopping_swept", 72), ("smoke", 12), ("paper", 54)])
def test_shipped_profiles_load(name, cells):
    profile = load_profile(find_profile(name))
    assert profile.name == name
    names = [cell.name for cell in profile.cells()]
    assert len(names) == len(set(names)) == cells


def test_shipped_profiles_that_build_one_world_folder_build_it_alike():
    built: dict[str, tuple[str, dict]] = {}  # world folder -> the first profile building it, with its settings
    for path in sorted((REPO_ROOT / "params").glob("*.yaml")):
        profile = load_profile(path)
        if profile.build_world is None:
            continue
        first, settings = built.setdefault(profile.build_world["out_dir"], (profile.name, profile.build_world))
        assert profile.build_world == settings, (
            f"{profile.name} builds {settings['out_dir']} otherwise than {first}: running one after the other would "
            "replace the world the other's cells read (the world stage refuses that)")
    assert len(built) >= 2, "no shipped world folder found"


REPLICATIONS = {"mini_outcome_seeds": "outcome", "mini_outcome_powered": "outcome", "mini_process_powered": "process"}


def assert_minis_arms(mini, other, name: str, regime: str) -> set[str]:
    """Check that a profile trains mini's arms at mini's rates in one regime, in mini's world, analysed as mini;
    return the cell settings where it differs from mini (sft_batch_size, which only the SFT control reads, aside in
    the RL regimes)."""
    assert other.matrix.regimes == (regime,)
    assert (other.matrix.ranks, other.matrix.full_ft) == (mini.matrix.ranks, mini.matrix.full_ft)
    assert other.matrix.learning_rate[regime] == mini.matrix.learning_rate[regime]
    assert other.world == mini.world, f"{name} trains in another world"
    assert other.analysis == mini.analysis, f"{name} is analysed with another margin or level"
    differing = {k for k in mini.cell.keys() | other.cell.keys() if mini.cell.get(k) != other.cell.get(k)}
    return differing - ({"sft_batch_size"} if regime != "sft" else set())


def test_the_replications_differ_from_mini_only_in_fresh_seeds():
    mini = load_profile(find_profile("mini"))
    earlier = set(mini.matrix.all_seeds)
    for name, regime in REPLICATIONS.items():  # in the order they first ran
        replication = load_profile(find_profile(name))
        seeds = set(replication.matrix.all_seeds)
        assert not seeds & earlier, f"{name} reuses seeds an earlier study ran: {sorted(seeds & earlier)}"
        earlier |= seeds
        differing = assert_minis_arms(mini, replication, name, regime)
        steps, length = (cell_config(profile, regime, 1, 0).steps for profile in (replication, mini))
        assert steps == length, f"{name} trains {steps} steps, not mini's {length}"
        differing -= {"curve_problems"}  # what the evaluations between the first and last score: training is the same
        assert not differing, f"{name}'s cell settings differ from mini's: {sorted(differing)}"


@pytest.mark.parametrize("name, regime, steps", [("mini_outcome_longer", "outcome", 200),
                                                  ("mini_process_longer", "process", 200),
                                                  ("mini_sft_longer", "sft", 400)])
def test_a_longer_run_continues_minis_cells_of_its_regime_and_changes_nothing_else(name, regime, steps):
    mini, longer = (load_profile(find_profile(profile)) for profile in ("mini", name))
    differing = assert_minis_arms(mini, longer, name, regime)
    assert set(mini.matrix.seeds[regime]) <= set(longer.matrix.seeds[regime]), f"{name} leaves out mini's seeds"
    assert cell_config(longer, regime, 1, 0).steps == steps
    assert differing == {"steps"}, f"{name} differs from mini in {sorted(differing)}"


def test_the_decayed_sft_control_is_the_longer_one_with_a_linear_schedule_and_nothing_else_changed():
    mini, longer, decayed = (load_profile(find_profile(name))
                             for name in ("mini", "mini_sft_longer", "mini_sft_longer_decay"))
    differing = assert_minis_arms(mini, decayed, "mini_sft_longer_decay", "sft")
    assert differing == {"steps", "lr_schedule"}, f"mini_sft_longer_decay differs from mini in {sorted(differing)}"
    assert decayed.matrix.seeds == longer.matrix.seeds
    config = cell_config(decayed, "sft", 1, 0)
    assert (config.steps, config.lr_schedule) == (cell_config(longer, "sft", 1, 0).steps, "linear")


def test_the_stopping_run_is_minis_process_regime_on_powered_seeds_trained_longer_and_scored_at_every_step():
    mini, stopping, powered = (load_profile(find_profile(name))
                               for name in ("mini", "mini_process_stopping", "mini_process_powered"))
    differing = assert_minis_arms(mini, stopping, "mini_process_stopping", "process")
    assert set(stopping.matrix.seeds["process"]) <= set(powered.matrix.seeds["process"])
    assert differing == {"steps", "curve_problems", "dev_problems"}, sorted(differing)
    config = cell_config(stopping, "process", 1, 52)
    assert config.curve_problems is None, "a cell must be comparable at whichever step dev chooses"
    assert (config.steps, config.dev_problems) == (200, 500)


def test_the_stopping_runs_sweep_trains_its_arms_as_it_does_on_the_sweeps_seeds_scoring_dev_at_each_best_step():
    stopping, sweep, rates_sweep = (load_profile(find_profile(name))
                                    for name in ("mini_process_stopping", "mini_sweep_stopping", "mini_sweep"))
    assert (sweep.matrix.regimes, sweep.matrix.ranks) == (stopping.matrix.regimes, stopping.matrix.ranks)
    assert sweep.matrix.seeds == {"process": rates_sweep.matrix.seeds["process"]}, "the sweep's seeds are mini_sweep's"
    for arm, rates in sweep.matrix.learning_rate["process"].items():
        chosen = stopping.matrix.learning_rate["process"][arm][0]
        assert len(rates) >= 5 and chosen in rates[1:-1], f"{arm}'s grid does not span its 100-step rate {chosen:g}"
    differing = {k for k in stopping.cell.keys() | sweep.cell.keys() if stopping.cell.get(k) != sweep.cell.get(k)}
    assert differing == {"eval_split", "eval_problems", "dev_problems"}, sorted(differing)
    assert (sweep.cell["eval_split"], sweep.cell["eval_problems"]) == ("dev", stopping.cell["dev_problems"])
    assert sweep.analysis["choose_rate_by"] == "best_step" and rates_sweep.analysis["choose_rate_by"] == "final"


def test_the_swept_stopping_run_is_the_stopping_run_at_the_rates_its_committed_sweep_chose():
    stopping, swept = (load_profile(find_profile(name))
                       for name in ("mini_process_stopping", "mini_process_stopping_swept"))
    chosen = pd.read_csv(REPO_ROOT / "outputs" / "mini_sweep_stopping" / "chosen_rates.csv").set_index("regime")
    assert swept.matrix.learning_rate["process"] == {arm: (chosen.loc["process", arm],) for arm in ("lora", "full")}, (
        "params/mini_process_stopping_swept.yaml does not train at "
        "outputs/mini_sweep_stopping/chosen_rates.csv's rates")
    assert replace(swept.matrix, learning_rate=stopping.matrix.learning_rate) == stopping.matrix
    assert (swept.world, swept.cell, swept.analysis) == (stopping.world, stopping.cell, stopping.analysis)


DEV_STOPPED_STUDIES = ("mini_process_stopping", "mini_process_stopping_swept", "mini_process_stopping_swept_seeds",
                       "mini_world1_process_stopping_swept", "mini_world2_process_stopping_swept",
                       "mini_epyc_process_stopping_swept")


@pytest.mark.parametrize("name", DEV_STOPPED_STUDIES)
def test_the_committed_stopping_report_compares_every_arm_at_its_dev_chosen_step(name):
    profile = load_profile(find_profile(name))
    outputs = REPO_ROOT / "outputs" / name
    chosen, steps = (pd.read_csv(outputs / f"{table}.csv") for table in ("equivalence_chosen", "chosen_steps"))
    assert chosen["arm"].tolist() == [f"r{rank}" for rank in profile.matrix.ranks]
    assert (chosen["n_seeds"] == len(profile.matrix.seeds["process"])).all() and (chosen["n_problems"] == 1000).all()
    assert steps["arm"].tolist() == [*chosen["arm"], "full"] and steps["step_mean"].between(25, 200).all()


WORLD_REPLICATIONS = ("mini_world1", "mini_world2")


def test_each_world_replication_is_mini_in_a_world_built_from_a_seed_of_its_own():
    mini = load_profile(find_profile("mini"))
    seeds = [mini.build_world["seed"]]
    for name in WORLD_REPLICATIONS:
        other = load_profile(find_profile(name))
        assert other.build_world["seed"] not in seeds, f"{name} builds an earlier study's world again"
        seeds.append(other.build_world["seed"])
        folder = other.build_world["out_dir"]
        assert folder == f"outputs/{name}/world", f"{name} builds its world outside its own outputs: {folder}"
        assert all(path.startswith(f"{folder}/") for path in other.world.values()), (
            f"{name} trains in a world it does not build: {other.world}")
        assert other.analysis["replicates"] == "mini", f"{name}'s report does not set its verdicts beside mini's"
        assert replace(other, name=mini.name, world=mini.world, build_world=mini.build_world, kl_bound=mini.kl_bound,
                       path=mini.path, analysis=mini.analysis) == mini, f"{name} differs from mini beyond its world"
        assert {**other.analysis, "replicates": None} == mini.analysis, f"{name} is analysed unlike mini"


@pytest.mark.parametrize("world", WORLD_REPLICATIONS)
def test_each_worlds_dev_stopped_process_study_is_the_swept_one_in_that_world(world):
    study, built = (load_profile(find_profile(name)) for name in ("mini_process_stopping_swept", world))
    again = load_profile(find_profile(f"{world}_process_stopping_swept"))
    assert (again.world, again.build_world) == (built.world, built.build_world), f"it does not train in {world}'s world"
    assert again.analysis["replicates"] == study.name, f"its report does not set its verdicts beside {study.name}'s"
    assert replace(again, name=study.name, world=study.world, build_world=study.build_world, path=study.path,
                   analysis=study.analysis) == study, f"it differs from {study.name} beyond the world"


def test_the_swept_stopping_run_on_fresh_seeds_is_that_run_on_as_many_seeds_none_an_earlier_study_ran():
    study, again = (load_profile(find_profile(name))
                    for name in ("mini_process_stopping_swept", "mini_process_stopping_swept_seeds"))
    seeds, earlier = again.matrix.seeds["process"], set()
    for path in sorted((REPO_ROOT / "params").glob("mini*.yaml")):
        other = load_profile(path)
        if other.name != again.name and other.world == again.world:
            earlier |= {seed for ran in other.matrix.seeds.values() for seed in ran}
    assert len(seeds) == len(study.matrix.seeds["process"]), "not as many seeds as the study it replicates"
    assert not set(seeds) & earlier, f"seeds {sorted(set(seeds) & earlier)} already ran in this world"
    assert again.analysis["replicates"] == study.name
    assert replace(again, name=study.name, matrix=replace(again.matrix, seeds=study.matrix.seeds), path=study.path,
                   analysis=study.analysis) == study, f"it differs from {study.name} beyond its seeds"


def test_the_swept_stopping_run_by_another_cpu_kind_is_that_run_to_the_last_setting_in_the_committed_world():
    study, again = (load_profile(find_profile(name))
                    for name in ("mini_process_stopping_swept", "mini_epyc_process_stopping_swept"))
    assert again.analysis["replicates"] == study.name
    assert replace(again, name=study.name, path=study.path, analysis=study.analysis) == study, (
        f"it differs from {study.name} beyond its name: only the CPU that built the world may differ")
    students, committed = ({*pd.read_csv(REPO_ROOT / "outputs" / name / "worlds.csv").query("entry == 'student'")
                            ["fingerprint"]} for name in (again.name, "mini"))
    assert students == committed, f"its committed cells trained on student {students}, the default study's {committed}"


def test_the_seed_2_worlds_outcome_replication_is_its_study_on_as_many_fresh_seeds_as_its_power_table_asked():
    study, again = (load_profile(find_profile(name)) for name in ("mini_world2", "mini_world2_outcome_seeds"))
    projected = pd.read_csv(REPO_ROOT / "outputs" / "mini_world2" / "equivalence.csv").set_index(["regime", "arm"])
    seeds = again.matrix.seeds["outcome"]
    assert len(seeds) == projected.loc[("outcome", "r1"), "seeds_needed"], "not the seeds the power table projected"
    assert not set(seeds) & set(study.matrix.seeds["outcome"]), "it reuses the study's seeds"
    assert (again.world, again.build_world) == (study.world, study.build_world), "it trains in another world"
    assert {**again.cell, "sft_batch_size": None} == {**study.cell, "sft_batch_size": None}  # only SFT reads that
    assert again.matrix.regimes == ("outcome",) and again.analysis["replicates"] == "mini_world2"
    assert replace(again.matrix, regimes=study.matrix.regimes, seeds=study.matrix.seeds,
                   learning_rate=study.matrix.learning_rate) == study.matrix
    assert again.matrix.learning_rate["outcome"] == study.matrix.learning_rate["outcome"]


def test_mini_trains_at_the_rates_the_committed_sweep_chose():
    chosen = pd.read_csv(REPO_ROOT / "outputs" / "mini_sweep" / "chosen_rates.csv").set_index("regime")
    mini = load_profile(find_profile("mini")).matrix.learning_rate
    for regime, row in chosen.iterrows():
        assert mini[regime] == {"lora": (row["lora"],), "full": (row["full"],)}, (
            f"params/mini.yaml's {regime} rates {mini[regime]} are not the sweep's choice "
            f"(outputs/mini_sweep/chosen_rates.csv: LoRA {row['lora']:g}, FullFT {row['full']:g})")


def test_the_profiles_compared_with_minis_cells_train_at_its_rates_and_steps():
    mini = load_profile(find_profile("mini"))
    for name in ("mini_klfree", "mini_sgrpo", "mini_tspmo"):
        other = load_profile(find_profile(name))
        for regime in other.matrix.regimes:
            rates, steps = other.matrix.learning_rate[regime], cell_config(other, regime, 1, 0).steps
            assert rates == mini.matrix.learning_rate[regime], (
                f"{name} trains {regime} at {rates}, mini at {mini.matrix.learning_rate[regime]}")
            assert steps == cell_config(mini, regime, 1, 0).steps, f"{name} trains {regime} {steps} steps, not mini's"


@pytest.mark.parametrize("name", ["mini_outcome_seeds", "mini_outcome_powered", "mini_outcome_longer",
                                  "mini_process_longer", "mini_process_powered", *DEV_STOPPED_STUDIES,
                                  "mini_sft_longer", "mini_sft_longer_decay"])
def test_a_committed_single_regime_report_is_of_its_profiles_seeds_and_steps(name):
    # (The 12-seed run's first, 100-step version projected the powered run's 34 seeds; it is in git history.)
    profile = load_profile(find_profile(name))
    (regime,) = profile.matrix.regimes
    outputs = REPO_ROOT / "outputs" / name
    seeds = pd.read_csv(outputs / "equivalence.csv")["n_seeds"]
    steps = pd.read_csv(outputs / "plateau.csv")["final_step"]
    ran = profile.matrix.seeds[regime]
    assert len(seeds) and len(steps), f"{name}'s committed report has no equivalence or plateau rows"
    assert (seeds == len(ran)).all(), f"{name}'s committed report has {set(seeds)} seeds, its profile {len(ran)}"
    assert (steps == cell_config(profile, regime, 1, ran[0]).steps).all(), (
        f"{name}'s committed report ran {set(steps)} steps")


def test_mini_cells_come_in_regime_rank_seed_order_each_at_its_arms_rate():
    profile = load_profile(find_profile("mini"))
    cells, seeds = profile.cells(), profile.matrix.seeds
    first = len(seeds["outcome"])
    assert [c.name for c in cells[:first + 1]] == [f"outcome-r1-s{s}" for s in seeds["outcome"]] + ["outcome-r2-s0"]
    assert cells[5 * first].name == "outcome-rfull-s0" and cells[6 * first].name == "process-r1-s0"
    assert cells[-1].name == f"sft-rfull-s{seeds['sft'][-1]}"
    for cell in cells:
        assert cell.learning_rate == profile.matrix.learning_rate_of(cell.regime, cell.rank)


def test_ranks_sorted_ascending_then_full(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(matrix__ranks=[4, 1], matrix__regimes=["process"])))
    assert [c.name for c in profile.cells()] == ["process-r1-s0", "process-r4-s0", "process-rfull-s0"]


def test_cell_config_merges_profile_arm_and_root(tmp_path):
    profile = load_profile(find_profile("smoke"))
    config = cell_config(profile, "process", "full", 0, out_dir=tmp_path / "cell", root=tmp_path)
    assert config.rank is None and config.regime == "process" and config.learning_rate == 3.0e-5
    assert config.out_dir == str(tmp_path / "cell") and config.profile == "smoke"
    assert config.student == str(tmp_path / "outputs/smoke/world/student")
    params = config.to_parameters()
    assert params["rank"] == "full" and {k: params[k] for k in profile.cell} == profile.cell
    paper = load_profile(find_profile("paper"))
    config = cell_config(paper, "outcome", 4, 1, root=tmp_path)
    assert config.student == "Qwen/Qwen3-1.7B-Base" and config.heldout == "HuggingFaceH4/MATH-500"
    assert config.rank == 4 and config.learning_rate == 3.0e-5
    assert config.out_dir == str(tmp_path / "outputs/paper/cells/outcome-r4-s1")


def test_a_setting_left_out_takes_the_arm_rate_and_the_profile_value():
    smoke = load_profile(find_profile("smoke"))
    full, lora = (cell_config(smoke, "outcome", rank, 0) for rank in ("full", 1))
    assert (full.learning_rate, lora.learning_rate) == (smoke.matrix.learning_rate_of("outcome", None),
                                                        smoke.matrix.learning_rate_of("outcome", 1))
    assert full.steps == smoke.cell["steps"] and full.max_new_tokens == smoke.cell["max_new_tokens"]
    assert cell_config(smoke, "outcome", "full", 0, steps=7, learning_rate=0.5).steps == 7


@pytest.mark.parametrize("settings, message", [
    ({"stepz": 3}, "unknown cell settings ['stepz']"),
    ({"steps": 0}, "cell setting steps = 0: expected a positive integer"),
    ({"kl_estimator": "k2"}, "cell setting kl_estimator = 'k2': expected one of paper, k3, k1"),
])
def test_cell_config_rejects_bad_settings_by_name(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cell_config(load_profile(find_profile("smoke")), "outcome", 1, 0, **settings)


@pytest.mark.parametrize("rank, message", [(0, "rank must be a positive integer or 'full', got 0"),
                                           ("r4", "got 'r4'"), (True, "got True")])
def test_a_rank_that_is_not_a_positive_integer_or_full_is_refused(rank, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cell_config(load_profile(find_profile("smoke")), "outcome", rank, 0)


@pytest.mark.parametrize("ranks, message", [([], "no rank given"), ([1, 1], "two arms would both write outcome-r1-s0"),
                                            ([1, "full", None], "two arms would both write outcome-rfull-s0")])
def test_arms_trained_together_each_get_their_own_folder(ranks, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        group_configs(load_profile(find_profile("smoke")), "outcome", ranks, 0)


def test_a_sweep_may_train_one_rank_at_several_rates_side_by_side():
    configs = group_configs(load_profile(find_profile("mini_sweep")), "outcome", [1, 1], 100,
                            learning_rate=[1e-4, 1e-3])
    assert len({config.out_dir for config in configs}) == 2, "a sweep's cell names carry the rate"


def test_a_profile_may_leave_out_cell_settings_and_gets_the_schema_defaults(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(cell__steps=None, cell__max_new_tokens=None)))
    defaults = {f.name: f.default for f in CellConfig.settings("cell")}
    assert (profile.cell["steps"] == defaults["steps"] == 100
            and profile.cell["max_new_tokens"] == defaults["max_new_tokens"])
    assert set(profile.cell) == set(defaults)
    bare = load_profile(write_profile(tmp_path, tiny(cell=None)))
    assert bare.cell == defaults


def test_without_full_ft_a_full_learning_rate_is_allowed_and_unused(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(matrix__full_ft=False)))
    assert all(cell.rank is not None for cell in profile.cells())
    without = load_profile(write_profile(tmp_path, tiny(matrix__full_ft=False, matrix__learning_rate={"lora": 1e-3})))
    assert [c.learning_rate for c in without.cells()] == [1e-3] * len(without.cells())


def test_world_entries_resolve_local_paths_against_the_root_and_pass_hub_ids_through(tmp_path):
    (tmp_path / "local" / "model").mkdir(parents=True)
    assert resolve_world_entry("Qwen/Qwen3-8B", tmp_path) == "Qwen/Qwen3-8B"
    assert resolve_world_entry("local/model", tmp_path) == str(tmp_path / "local/model")
    assert resolve_world_entry("./x", tmp_path) == str(tmp_path / "x")
    assert resolve_world_entry("outputs/w/student", tmp_path) == str(tmp_path / "outputs/w/student")
    assert resolve_world_entry("/abs/path", tmp_path) == "/abs/path"
    # No hub id has these forms: missing, they are local copies not made yet, to be named as missing.
    assert resolve_world_entry("models/qwen3/student", tmp_path) == str(tmp_path / "models/qwen3/student")
    assert resolve_world_entry("data/test.jsonl", tmp_path) == str(tmp_path / "data/test.jsonl")
    assert resolve_world_entry("HuggingFaceH4/MATH-500", tmp_path) == "HuggingFaceH4/MATH-500"


def test_a_missing_local_model_folder_is_named_not_looked_up_on_the_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match="student folder not found: .*models/qwen3/student"):
        load_causal_lm(resolve_world_entry("models/qwen3/student", tmp_path), what="student")


@pytest.mark.parametrize(
    "changes, key, expected",
    [
        ({"extra": 1}, "extra: unknown key", "allowed keys in the profile: profile, world"),
        ({"matrix__rank": [1]}, "matrix.rank: unknown key", "regimes, ranks, full_ft, seeds, learning_rate"),
        ({"cell__lr": 0.1}, "cell.lr: unknown key", "allowed keys in cell: steps"),
        ({"world__tokenizer": "x"}, "world.tokenizer: unknown key",
         "student, teacher, prm, problems, control, heldout"),
        ({"analysis": None}, "analysis: missing key", "required in the profile"),
        ({"matrix__ranks": [1, 0]}, "matrix.ranks[1] = 0", "a positive integer"),
        ({"matrix__ranks": [-2]}, "matrix.ranks[0] = -2", "a positive integer"),
        ({"matrix__ranks": ["4"]}, "matrix.ranks[0] = '4'", "a positive integer"),
        ({"matrix__ranks": [True]}, "matrix.ranks[0] = True", "a positive integer"),
        ({"matrix__ranks": [1.5]}, "matrix.ranks[0] = 1.5", "a positive integer"),
        ({"matrix__ranks": [2, 2]}, "matrix.ranks[1] = 2", "unique"),
        ({"matrix__ranks": []}, "matrix.ranks = []", "a non-empty list"),
        ({"matrix__seeds": [-1]}, "matrix.seeds[0] = -1", "an integer from 0 to 4294967295 (a seed)"),
        ({"matrix__seeds": [0, 2**44]}, "matrix.seeds[1] = 17592186044416", "an integer from 0 to 4294967295"),
        ({"matrix__regimes": ["outcome", "dense"]}, "matrix.regimes[1] = 'dense'", "outcome, process, distillation"),
        ({"matrix__full_ft": "yes"}, "matrix.full_ft = 'yes'", "true or false"),
        ({"matrix__learning_rate": {"lora": 3.0e-4}}, "matrix.learning_rate.full: missing key", "lora, full"),
        ({"matrix__learning_rate__dora": 1e-3}, "matrix.learning_rate.dora: unknown key", "lora, full"),
        ({"matrix__learning_rate__lora": "3e-4"}, "matrix.learning_rate.lora = '3e-4'", "write it with a dot"),
        ({"matrix__learning_rate__full": 0}, "matrix.learning_rate.full = 0", "a positive number"),
        ({"matrix__learning_rate__full": float("inf")}, "matrix.learning_rate.full = inf", "a positive number, finite"),
        ({"cell__beta": float("nan")}, "cell.beta = nan", "a number >= 0, finite"),
        ({"cell__replay_threshold": float("-inf")}, "cell.replay_threshold = -inf", "a number, finite"),
        ({"cell__steps": True}, "cell.steps = True", "a positive integer"),
        ({"cell__group_size": 1}, "cell.group_size = 1", "an integer >= 2"),
        ({"cell__top_p": 1.5}, "cell.top_p = 1.5", "(0, 1]"),
        ({"cell__lora_dropout": 1.0}, "cell.lora_dropout = 1.0", "[0, 1)"),
        ({"cell__kl_estimator": "k2"}, "cell.kl_estimator = 'k2'", "one of paper, k3, k1"),
        ({"cell__loss_normalisation": "sum"}, "cell.loss_normalisation = 'sum'", "token_mean, sequence_mean"),
        ({"analysis__confidence": 1}, "analysis.confidence = 1", "(0, 1)"),
        ({"analysis__compare_with": ""}, "analysis.compare_with = ''", "a non-empty string"),
        ({"analysis__methods": {"GRPO": "mini"}}, "analysis.methods", "at least two names"),
        ({"analysis__choose_rate_by": "peak"}, "analysis.choose_rate_by = 'peak'", "one of final, best_step"),
        ({"analysis__replicates": 3}, "analysis.replicates = 3", "a non-empty string"),
        ({"cell__token_p": 2}, "cell.token_p = 2", "a probability in [0, 1]"),
        ({"cell__advantage_estimator": "trie"}, "cell.advantage_estimator = 'trie'", "one of group, prefix_trie"),
        ({"cell__track_kl": "yes"}, "cell.track_kl = 'yes'", "true or false"),
        ({"kl_bound": {"seeds": 2}}, "kl_bound", "with an out_dir"),
        ({"baseline": {"batch_size": 0}}, "baseline.batch_size = 0", "a positive integer"),
        ({"baseline": {"batch": 8}}, "baseline.batch: unknown key", "batch_size"),
        ({"world__student": ""}, "world.student = ''", "a non-empty string"),
        ({"build_world": [1]}, "build_world = [1]", "a mapping"),
        ({"cell": [1]}, "cell = [1]", "a mapping with keys steps"),
        ({"profile": "mini"}, "profile = 'mini'", "the file's stem 'tiny'"),
        ({"cell__precision": "fp16"}, "cell.precision = 'fp16'", "one of fp32, bf16"),
        ({"cell__micro_batch_size": 0}, "cell.micro_batch_size = 0", "a positive integer"),
        ({"cell__gradient_checkpointing": "no"}, "cell.gradient_checkpointing = 'no'", "true or false"),
        ({"cell__device": "gpu"}, "cell.device = 'gpu'", "a torch device of type cpu, cuda, mps"),
        ({"cell__prm_device": "cuda:x"}, "cell.prm_device = 'cuda:x'", "a torch device of type cpu, cuda, mps"),
        ({"data": {"prompt_template": "Solve {question}"}}, "data.prompt_template", "{problem} exactly once"),
        ({"data": {"problem_subsets": ["algebra"]}}, "data.prompt_template: missing key", "required in data"),
        ({"data": {"prompt_template": "{problem}", "subjects": []}}, "data.subjects: unknown key", "problem_subsets"),
        ({"data": {"prompt_template": "{problem}", "problem_subsets": []}}, "data.problem_subsets = []", "non-empty"),
        ({"cluster": {"mem_gb": 8}}, "cluster.timeout_min: missing key", "required in cluster"),
        ({"cluster": {"timeout_min": 0.5}}, "cluster.timeout_min = 0.5", "a positive integer"),
        ({"cluster": 5}, "cluster = 5", "a mapping of submitit executor settings"),
        ({"matrix__learning_rate__lora": [1.0e-4, 1.0000001e-4]}, "rates 0.0001 and 0.00010000001 both name the "
         "cell outcome-r1-lr0.0001-s0", "give rates that differ within them"),
        ({"cluster": {1: 2, "timeout_min": 3}}, "cluster.1", "a submitit executor setting's name"),
        # Settings that are each valid but that no cell can run together, caught before the world is built.
        ({"cell__precision": "bf16"}, "cell outcome-r1-s0: engine stacked", "set engine: peft, or change precision"),
        ({"cell__lora_dropout": 0.1}, "cell outcome-r1-s0: engine stacked", "change lora_dropout"),
        ({"cell__gradient_checkpointing": True}, "engine stacked", "change gradient_checkpointing"),
        ({"cell__replay_successes": 2}, "engine stacked", "cannot replay"),
        ({"cell__device": "cuda"}, "cell outcome-r1-s0: engine stacked runs on the CPU only", "set engine: peft"),
        ({"cell__token_alpha": 2}, "cell outcome-r1-s0: S-GRPO's token rule", "['token_k', 'token_p'] unset"),
        ({"cell__dev_problems": 4, "cell__eval_split": "dev"}, "cell outcome-r1-s0: dev_problems", "on dev already"),
        ({"cell__curve_problems": 50}, "cell outcome-r1-s0: curve_problems = 50", "exceeds eval_problems = 8"),
    ],
)
def test_invalid_profile_names_key_and_expectation(tmp_path, changes, key, expected):
    message = error_of(tmp_path, tiny(**changes))
    assert key in message and expected in message, message


def test_paper_world_without_build_world_is_valid(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(build_world=None)))
    assert profile.build_world is None


def test_malformed_yaml_names_the_file(tmp_path):
    message = error_of(tmp_path, "profile: tiny\nmatrix: [1, 2\n")
    assert "not valid YAML" in message


def test_a_key_given_twice_is_refused_naming_it_rather_than_the_last_kept(tmp_path):
    text = yaml.safe_dump(tiny(), sort_keys=False)
    message = error_of(tmp_path, text + "matrix:\n  ranks: [1]\n")  # a section appended below the profile's own
    assert "found the key 'matrix' twice" in message, message
    nested = text.replace("  group_size: 2\n", "  group_size: 2\n  group_size: 3\n")
    assert nested != text, "the smoke profile no longer sets cell.group_size: pick another key"
    assert "found the key 'group_size' twice" in error_of(tmp_path, nested)


def test_a_key_that_is_a_list_or_mapping_is_refused_as_yaml_naming_the_file(tmp_path):
    text = yaml.safe_dump(tiny(), sort_keys=False)
    message = error_of(tmp_path, text + "extra: {[1, 2]}\n")  # braces typed for brackets: the list is a key
    assert "not valid YAML" in message and "found a key that is not a name: [1, 2]" in message, message


def test_a_yaml_merge_key_merges_and_a_key_given_beside_it_overrides(tmp_path):
    text = yaml.safe_dump(tiny(matrix__learning_rate=None), sort_keys=False).replace(
        "matrix:\n", "matrix:\n  learning_rate:\n    outcome: &rates {lora: 3.0e-4, full: 3.0e-5}\n"
        "    process: {<<: *rates, lora: 1.0e-3}\n    distillation: *rates\n    sft: *rates\n", 1)
    rates = load_profile(write_profile(tmp_path, text)).matrix.learning_rate
    assert rates["process"] == {"lora": (1e-3,), "full": (3e-5,)}, rates


def test_an_empty_profile_file_is_refused_saying_which_keys_it_needs(tmp_path):
    assert "expected a mapping with keys profile, world" in error_of(tmp_path, "")


def test_unknown_profile_lists_known(tmp_path):
    (tmp_path / "params").mkdir()
    write_profile(tmp_path / "params", tiny())
    with pytest.raises(ProfileError, match="no such profile file.*profiles in .*: tiny"):
        find_profile("nope", tmp_path)
    assert find_profile("tiny", tmp_path) == tmp_path / "params" / "tiny.yaml"


def test_a_profile_given_by_a_relative_path_is_found_from_any_folder_after(tmp_path, monkeypatch):
    (tmp_path / "params").mkdir()
    write_profile(tmp_path / "params", tiny())
    monkeypatch.chdir(tmp_path)
    found = find_profile("params/tiny.yaml")
    monkeypatch.chdir(tmp_path / "params")  # as a cell or stage notebook runs in the project root, not the caller's
    assert found == tmp_path / "params" / "tiny.yaml" and load_profile(found).name == "tiny"


def test_learning_rates_may_differ_per_regime(tmp_path):
    rates = {"outcome": {"lora": 1e-3, "full": 1e-4}, "process": {"lora": 2e-3, "full": 2e-4},
             "distillation": {"lora": 3e-3, "full": 3e-4}, "sft": {"lora": 4e-3, "full": 4e-4}}
    profile = load_profile(write_profile(tmp_path, tiny(matrix__learning_rate=rates)))
    assert profile.matrix.learning_rate_of("process", None) == 2e-4
    assert {(c.regime, c.rank is None, c.learning_rate) for c in profile.cells()} == {
        (regime, arm == "full", rate) for regime, arms in rates.items() for arm, rate in arms.items()}
    message = error_of(tmp_path, tiny(matrix__learning_rate={"outcome": rates["outcome"]}))
    assert "matrix.learning_rate.process: missing key" in message
    one_regime = load_profile(write_profile(tmp_path, tiny(matrix__regimes=["outcome"])))
    for regime in ("dense", "sft"):  # not a regime at all; a regime this profile does not run
        with pytest.raises(ValueError, match=f"regime '{regime}' is not one of the profile's matrix.regimes: outcome$"):
            cell_config(one_regime, regime, 1, 0, root=tmp_path)


def test_seeds_may_differ_per_regime(tmp_path):
    seeds = {"outcome": [0, 1, 2], "process": [0], "distillation": [4, 5], "sft": [0]}
    profile = load_profile(write_profile(tmp_path, tiny(matrix__seeds=seeds)))
    assert {regime: sorted({c.seed for c in profile.cells() if c.regime == regime}) for regime in seeds} == seeds
    assert profile.matrix.all_seeds == (0, 1, 2, 4, 5)
    message = error_of(tmp_path, tiny(matrix__seeds={"outcome": [0]}))
    assert "matrix.seeds.process: missing key" in message
    assert "matrix.seeds.sft[0] = -2" in error_of(tmp_path, tiny(matrix__seeds={**seeds, "sft": [-2]}))


def test_a_regime_may_train_its_own_number_of_steps_and_the_others_keep_the_cell_setting(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(matrix__steps={"outcome": 7})))
    steps = {regime: cell_config(profile, regime, 1, 0, root=tmp_path).steps for regime in profile.matrix.regimes}
    assert steps["outcome"] == 7, "matrix.steps.outcome must reach the outcome cells' config"
    assert {s for regime, s in steps.items() if regime != "outcome"} == {profile.cell["steps"]}, steps
    assert cell_config(profile, "outcome", 1, 0, root=tmp_path, steps=3).steps == 3, "a setting given here wins"
    assert "matrix.steps.outcome = 0" in error_of(tmp_path, tiny(matrix__steps={"outcome": 0}))
    message = error_of(tmp_path, tiny(matrix__regimes=["outcome"], matrix__steps={"process": 200}))
    assert "matrix.steps.process: unknown key" in message


def test_a_sweep_cells_own_folder_carries_its_rate_and_parses_back_even_with_an_exponent(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(matrix__learning_rate={"lora": [1e-5, 3e-5], "full": 1e-4},
                                                        matrix__regimes=["outcome"], matrix__ranks=[1])))
    name = Path(cell_config(profile, "outcome", 1, 0, learning_rate=3e-5, root=tmp_path).out_dir).name
    assert name == "outcome-r1-lr3e-05-s0", "two rates of one arm would share a folder"
    assert parse_cell_name(name) == ("outcome", 1, 0)


@pytest.mark.parametrize("changes, said", [
    ({"world__control": None}, "regime sft trains on the SFT control's problems: set world.control"),
    ({"world__heldout": "outputs/elsewhere.jsonl", "cell__eval_split": "dev"},
     "eval_split dev reads the mini world's dev.jsonl; with world.heldout set"),
    ({"data__prompt_template": "{problem}", "cell__eval_split": "dev"},
     "MATH-schema data (data.prompt_template set) has no dev split, so the cell would score its test split"),
    ({"data__prompt_template": "{problem}", "cell__dev_problems": 10},
     "MATH-schema data (data.prompt_template set) has no dev split, so the cell would score its test split"),
])
def test_settings_no_cell_can_run_together_stop_the_profile_before_any_work(tmp_path, changes, said):
    assert said in error_of(tmp_path, tiny(**changes))


def test_the_shared_base_evaluation_covers_the_task_even_when_the_control_is_listed_first(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(matrix__regimes=["sft", "outcome", "process"])))
    assert [c.regime for c in base_configs(profile, tmp_path / "baseline", root=tmp_path)] == ["outcome", "sft"]


def test_a_learning_rate_sweep_is_a_matrix_axis_with_tagged_cell_names(tmp_path):
    profile = load_profile(write_profile(tmp_path, tiny(matrix__learning_rate={"lora": [1e-3, 3e-3], "full": 1e-4},
                                                        matrix__regimes=["outcome"], matrix__ranks=[1])))
    assert [c.name for c in profile.cells()] == ["outcome-r1-lr0.001-s0", "outcome-r1-lr0.003-s0",
                                                 "outcome-rfull-lr0.0001-s0"]
    with pytest.raises(ValueError, match="sweeps 2 learning rates"):
        profile.matrix.learning_rate_of("outcome", 1)


def test_a_relative_profile_path_is_found_from_a_notebooks_folder_as_from_the_root(monkeypatch):
    monkeypatch.chdir(REPO_ROOT / "notebooks")  # where a JupyterLab kernel runs
    assert find_profile("params/smoke.yaml") == REPO_ROOT / "params" / "smoke.yaml"

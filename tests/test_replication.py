"""A replication beside the study it replicates: verdict by verdict, and FullFT's gain in both."""
import nbformat
import pandas as pd
import pytest

from reward_density.analysis.replication import (
    fullft_gains,
    needed_agreement,
    read_summaries,
    stopping_steps,
    verdict_agreement,
    verdicts_agree,
    write_replication_report,
)
from reward_density.analysis.tables import WORLDS, worlds_frame
from reward_density.experiment.profiles import REPO_ROOT
from reward_density.run.notebooks import execute_notebook

NAMES = ("mini", "again")


def equivalence(verdicts: dict[tuple[str, str], str]) -> pd.DataFrame:
    """An equivalence table with these verdicts (the differences are the row's index, for telling rows apart)."""
    rows = [{"regime": regime, "rank": int(arm[1:]), "arm": arm, "estimate": i / 100, "ci_low": i / 100 - 0.01,
             "ci_high": i / 100 + 0.01, "tost_low": i / 100 - 0.005, "tost_high": i / 100 + 0.005, "verdict": verdict}
            for i, ((regime, arm), verdict) in enumerate(verdicts.items())]
    return pd.DataFrame(rows)


def gains(base: float, gain: float) -> pd.DataFrame:
    return pd.DataFrame([{"regime": "outcome", "arm": arm, "base": base, "gain": gain if arm == "full" else 0.0,
                          "ci_low": gain - 0.03, "ci_high": gain + 0.03} for arm in ("r1", "full")])


def steps(full_step: float) -> pd.DataFrame:
    """A chosen_steps table of one process study: r1 stopped at step 150, FullFT at full_step."""
    arms = (("r1", 150.0, 0.7), ("full", full_step, 0.65))
    return pd.DataFrame([{"regime": "process", "arm": arm, "n_seeds": 4, "step_mean": step, "step_std": 10.0,
                          "dev_pass1_mean": 0.6, "dev_pass1_std": 0.02, "heldout_pass1_mean": pass1,
                          "heldout_pass1_std": 0.03} for arm, step, pass1 in arms])


def study(folder, verdicts, base=0.36, gain=0.45, chosen=None, full_step=75.0, student=None):
    """A finished study's tables; with chosen (its verdicts at the dev-chosen steps), a dev-stopped study's too;
    with student, the world its two cells read (worlds.csv: one of them recorded none)."""
    folder.mkdir(parents=True)
    equivalence(verdicts).to_csv(folder / "equivalence.csv", index=False)
    gains(base, gain).to_csv(folder / "gain.csv", index=False)
    if student:
        worlds = {"outcome-r1-s0": {"problems": "cccc", "student": student}, "outcome-rfull-s0": {}}
        worlds_frame(worlds).to_csv(folder / WORLDS, index=False)
    if chosen:
        equivalence(chosen).to_csv(folder / "equivalence_chosen.csv", index=False)
        steps(full_step).to_csv(folder / "chosen_steps.csv", index=False)
    return folder


def test_agreement_counts_matching_verdicts_and_marks_each_flip():
    original = equivalence({("outcome", "r1"): "equivalent", ("process", "r1"): "inconclusive",
                            ("sft", "r1"): "different"})
    again = equivalence({("outcome", "r1"): "equivalent", ("process", "r1"): "different", ("sft", "r1"): "different"})
    table = verdict_agreement(original, again, NAMES)
    assert table.frame["agree"].tolist() == [True, False, True]
    assert "**2 of 3 verdicts agree**" in table.markdown
    flipped = next(line for line in table.markdown.splitlines() if line.startswith("| process"))
    assert "inconclusive" in flipped and "different" in flipped and "**no**" in flipped
    assert "+0.010 [+0.000, +0.020]" in flipped, "the differences and intervals of both studies are shown"


def test_a_significant_difference_that_changes_side_is_a_disagreement(tmp_path):
    verdicts = {("outcome", "r1"): "equivalent", ("process", "r1"): "different", ("process", "r2"): "different"}
    original = equivalence(verdicts)
    again = original.copy()
    again.loc[1, ["estimate", "ci_low", "ci_high"]] = [-0.01, -0.02, -0.005]  # process r1: LoRA now behind FullFT
    table = verdict_agreement(original, again, NAMES)
    assert table.frame["agree"].tolist() == [True, False, True], "LoRA ahead in one study, behind in the other"
    assert "**2 of 3 verdicts agree**" in table.markdown
    report = write_replication_report(study(tmp_path / "mini", verdicts), study(tmp_path / "again", verdicts), NAMES,
                                      margin=0.05).read_text()
    change_of_side = "or from LoRA significantly ahead of FullFT to significantly behind it or back, is a result"
    assert change_of_side in report, "the report does not say that a change of side is a result that did not hold"


def test_a_comparison_only_one_study_made_is_counted_not_compared():
    original = equivalence({("outcome", "r1"): "equivalent", ("outcome", "r2"): "equivalent"})
    again = equivalence({("outcome", "r1"): "different"})
    table = verdict_agreement(original, again, NAMES)
    assert len(table.frame) == 1
    assert "**0 of 1 verdicts agree**; not compared, made by one study only: 1." in table.markdown


def test_a_comparison_one_study_skipped_is_not_counted_as_agreeing():
    original = equivalence({("outcome", "r1"): "equivalent", ("outcome", "r2"): "skipped"})
    again = equivalence({("outcome", "r1"): "equivalent", ("outcome", "r2"): "skipped"})
    table = verdict_agreement(original, again, NAMES)
    assert table.frame["arm"].tolist() == ["r1"], "a skipped comparison was made by neither study"
    assert "**1 of 1 verdicts agree**" in table.markdown


def test_the_rank_each_regime_needs_and_each_studys_answer_are_set_side_by_side():
    committed = [pd.read_csv(REPO_ROOT / "outputs" / study / "equivalence.csv") for study in ("mini", "mini_world1")]
    table = needed_agreement(*committed, ("mini", "mini_world1"))
    assert table.frame.set_index("regime")["agree"].to_dict() == {
        "outcome": True, "process": False, "distillation": True, "sft": True}
    assert "| process | r2 or less (r1 inconclusive) | r1 or less | **no** |" in table.markdown
    assert table.markdown.endswith("Does the needed rank grow with the reward's density? mini: cannot tell, "
                                   "mini_world1: does not grow.\n")


def test_fullft_gains_are_set_side_by_side_per_regime():
    table = fullft_gains(gains(0.36, 0.45), gains(0.30, 0.20), NAMES)
    assert table.frame[["base_original", "gain_original", "base_replication", "gain_replication"]].values.tolist() == [
        [0.36, 0.45, 0.30, 0.20]]
    assert "+0.450 [+0.420, +0.480]" in table.markdown and "+0.200 [+0.170, +0.230]" in table.markdown


def test_where_each_arm_stopped_is_set_side_by_side():
    table = stopping_steps(steps(75.0), steps(175.0), NAMES)
    assert table.frame["arm"].tolist() == ["r1", "full"]
    full = next(line for line in table.markdown.splitlines() if line.startswith("| process | full"))
    assert "75 ± 10, 0.650 ± 0.030" in full and "175 ± 10, 0.650 ± 0.030" in full



def test_a_one_seed_study_shows_where_its_arms_stopped_without_an_sd():
    one_seed = steps(175.0).assign(n_seeds=1, step_std=float("nan"), heldout_pass1_std=float("nan"))
    full = next(line for line in stopping_steps(steps(75.0), one_seed, NAMES).markdown.splitlines()
                if line.startswith("| process | full"))
    assert "| 175, 0.650 |" in full and "nan" not in full, full


def test_two_dev_stopped_studies_are_also_compared_at_their_chosen_steps(tmp_path):
    last = {("process", "r1"): "different"}
    original = study(tmp_path / "mini", last, chosen={("process", "r1"): "different"})
    again = study(tmp_path / "again", last, chosen={("process", "r1"): "equivalent"}, full_step=175.0)
    report = write_replication_report(original, again, NAMES, margin=0.05).read_text()
    section = report.split("## At each arm's dev-chosen step")
    assert len(section) == 2, "no section for the comparisons at the dev-chosen steps"
    assert "**1 of 1 verdicts agree**" in section[0] and "**0 of 1 verdicts agree**" in section[1], (
        "the last-step and chosen-step verdicts are not counted apart")
    assert "175 ± 10" in section[1], "where each arm stopped is missing"
    assert "The rank needed to match FullFT at those steps" in section[1] and "| r1 or less | **no** |" in section[1]
    assert "Does the needed rank grow" not in report, "the question needs two densities, and neither study has them"
    assert pd.read_csv(again / "replication_chosen.csv")["verdict_replication"].tolist() == ["equivalent"]
    assert (again / "figures" / "replication_chosen.png").is_file()


def test_a_dev_stopped_study_beside_one_that_is_not_gets_no_chosen_step_section(tmp_path):
    verdicts = {("process", "r1"): "different"}
    original = study(tmp_path / "mini", verdicts)
    again = study(tmp_path / "again", verdicts, chosen=verdicts)
    report = write_replication_report(original, again, NAMES, margin=0.05).read_text()
    assert "dev-chosen step" not in report and not (again / "replication_chosen.csv").exists()


def test_the_report_says_whether_both_studies_read_one_world_and_not_known_where_one_wrote_none(tmp_path):
    verdicts = {("outcome", "r1"): "equivalent"}
    digits = "0123456789012345"  # a fingerprint of digits, read back as text
    original = study(tmp_path / "mini", verdicts, student=digits)
    same = study(tmp_path / "same", verdicts, student=digits)
    other = study(tmp_path / "other", verdicts, student="bbbb")
    unrecorded = study(tmp_path / "old", verdicts)

    def sentence(again):
        report = write_replication_report(original, again, (NAMES[0], again.name), margin=0.05).read_text()
        return report.split("\n\n")[2]

    assert sentence(same) == ("The compared studies' cells read one world (2 cells recorded none): student "
                              f"{digits}, problems cccc (a hash of each entry's files)."), "not read as one world"
    assert sentence(other) == (
        f"**The compared studies read different worlds** (2 cells recorded none): student {digits} (mini), bbbb "
        "(other). A replication in another world is meant to; for one on fresh seeds of the same world, a verdict "
        "that did not hold may owe it to the world rather than to the seeds.")
    assert sentence(unrecorded) == ("Whether the two studies' cells read one world is not known: no worlds.csv in "
                                    "old (the analysis writes it since cells record their world).")


def test_a_study_whose_worlds_csv_records_no_world_leaves_one_world_not_known(tmp_path):
    verdicts = {("outcome", "r1"): "equivalent"}
    original = study(tmp_path / "mini", verdicts, student="aaaa")
    again = study(tmp_path / "again", verdicts)
    worlds_frame({"outcome-r1-s0": {}, "outcome-rfull-s0": {}}).to_csv(again / WORLDS, index=False)
    report = write_replication_report(original, again, NAMES, margin=0.05).read_text()
    assert report.split("\n\n")[2] == ("The cells of again recorded no world (they predate the record): whether "
                                        "the studies read one is not known.")


def test_a_study_without_its_tables_is_named_with_what_to_run(tmp_path):
    (tmp_path / "equivalence.csv").write_text("regime,arm\n")
    with pytest.raises(FileNotFoundError, match=r"has no gain\.csv: run that study's analysis first"):
        read_summaries(tmp_path)


@pytest.mark.parametrize("stopped", [False, True])
def test_the_notebook_writes_the_report_and_the_verdicts_table(tmp_path, stopped):
    verdicts = {("outcome", "r1"): "equivalent", ("process", "r1"): "inconclusive"}
    chosen = {("process", "r1"): "different"} if stopped else None
    original = study(tmp_path / "outputs" / "mini", verdicts, chosen=chosen, student="aaaa")
    again = study(tmp_path / "outputs" / "again", {**verdicts, ("process", "r1"): "different"}, base=0.30,
                  chosen=chosen, student="bbbb")
    execute_notebook(REPO_ROOT / "notebooks" / "replication.py", tmp_path / "run.ipynb",
                     {"profile": "again", "outputs_dir": str(again), "replicates": "mini",
                      "replicates_dir": str(original)})
    printed = "".join(o.get("text", "") for c in nbformat.read(tmp_path / "run.ipynb", 4).cells
                      for o in c.get("outputs", []))
    assert "**1 of 2 verdicts agree**" in printed
    assert "Does the needed rank grow with the reward's density? mini: cannot tell, again: does not grow." in printed
    assert "**The compared studies read different worlds** (2 cells recorded none): student aaaa (mini)" in printed
    report = (again / "replication.md").read_text()
    assert report.startswith("# again against mini") and "**1 of 2 verdicts agree**" in report and "0.300" in report
    assert "## The rank needed to match FullFT, in both" in report
    assert pd.read_csv(again / "replication.csv")["agree"].tolist() == [True, False]
    assert "![LoRA − FullFT per rank in both studies" in report and (again / "figures" / "replication.png").is_file()
    assert ("**1 of 1 verdicts agree**" in printed) == stopped, "the chosen-step verdicts are not shown as expected"
    assert (again / "figures" / "replication_chosen.png").is_file() == stopped


def test_the_committed_default_study_read_against_a_copy_of_itself_agrees_at_every_comparison(tmp_path):
    committed = REPO_ROOT / "outputs" / "mini"
    for name in ("equivalence.csv", "gain.csv"):
        (tmp_path / name).write_bytes((committed / name).read_bytes())
    report = write_replication_report(committed, tmp_path, ("mini", "copy"), margin=0.05).read_text()
    assert "**20 of 20 verdicts agree**." in report, "the committed tables are not read as the analysis writes them"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["equivalence.csv", "figures/replication.png", "gain.csv", "replication.csv", "replication.md"], (
        "it wrote beside the original")


COMMITTED_REPLICATIONS = [("mini", "mini_world1"), ("mini", "mini_world2"),
                          ("mini_world2", "mini_world2_outcome_seeds"),
                          ("mini_process_stopping_swept", "mini_world1_process_stopping_swept"),
                          ("mini_process_stopping_swept", "mini_world2_process_stopping_swept"),
                          ("mini_process_stopping_swept", "mini_process_stopping_swept_seeds"),
                          ("mini_process_stopping_swept", "mini_epyc_process_stopping_swept")]


@pytest.mark.parametrize("original, replication", COMMITTED_REPLICATIONS)
def test_a_committed_replication_report_sets_every_shared_verdict_of_both_studies_side_by_side(original, replication):
    folder = REPO_ROOT / "outputs" / replication
    compared = {"replication": "equivalence"}
    if (REPO_ROOT / "outputs" / original / "equivalence_chosen.csv").is_file():
        compared["replication_chosen"] = "equivalence_chosen"  # two dev-stopped studies: at the chosen steps too
    for written, source in compared.items():
        committed = pd.read_csv(folder / f"{written}.csv").set_index(["regime", "arm"])
        for study, column in ((original, "verdict_original"), (replication, "verdict_replication")):
            verdicts = pd.read_csv(REPO_ROOT / "outputs" / study / f"{source}.csv").set_index(["regime", "arm"])
            assert committed[column].to_dict() == verdicts["verdict"].loc[committed.index].to_dict(), (
                f"outputs/{replication}/{written}.csv does not hold outputs/{study}/{source}.csv's verdicts: "
                f"run `./run_all.sh --profile {replication} --stages analysis`")
        shared = len(pd.read_csv(folder / f"{source}.csv"))
        assert len(committed) == shared, f"{written}.csv misses a comparison both studies made"
        assert (committed["agree"] == verdicts_agree(committed)).all()
        assert (folder / "figures" / f"{written}.png").is_file()


@pytest.mark.parametrize("original, replication", COMMITTED_REPLICATIONS)
def test_a_committed_replication_report_is_what_the_code_writes_from_the_committed_summaries(original, replication,
                                                                                           tmp_path):
    committed = REPO_ROOT / "outputs" / replication
    for summary in committed.glob("*.csv"):
        if not summary.name.startswith("replication"):
            (tmp_path / summary.name).write_bytes(summary.read_bytes())
    written = write_replication_report(REPO_ROOT / "outputs" / original, tmp_path, (original, replication), margin=0.05)
    assert written.read_text() == (committed / "replication.md").read_text(), (
        f"outputs/{replication}/replication.md is stale: rerun `./run_all.sh --profile {replication} --stages "
        f"analysis`, or, without its cells, write_replication_report on the committed summaries")

"""A replication beside the study it replicates: verdict by verdict, and FullFT's gain in both."""
import nbformat
import pandas as pd
import pytest

from reward_density.analysis.replication import (
    fullft_gains,
    read_summaries,
    verdict_agreement,
    write_replication_report,
)
from reward_density.experiment.profiles import REPO_ROOT
from reward_density.run.notebooks import execute_notebook

NAMES = ("mini", "again")


def equivalence(verdicts: dict[tuple[str, str], str]) -> pd.DataFrame:
    """An equivalence table with these verdicts (the differences are the row's index, for telling rows apart)."""
    rows = [{"regime": regime, "arm": arm, "estimate": i / 100, "ci_low": i / 100 - 0.01, "ci_high": i / 100 + 0.01,
             "tost_low": i / 100 - 0.005, "tost_high": i / 100 + 0.005, "verdict": verdict}
            for i, ((regime, arm), verdict) in enumerate(verdicts.items())]
    return pd.DataFrame(rows)


def gains(base: float, gain: float) -> pd.DataFrame:
    return pd.DataFrame([{"regime": "outcome", "arm": arm, "base": base, "gain": gain if arm == "full" else 0.0,
                          "ci_low": gain - 0.03, "ci_high": gain + 0.03} for arm in ("r1", "full")])


def study(folder, verdicts, base=0.36, gain=0.45):
    folder.mkdir(parents=True)
    equivalence(verdicts).to_csv(folder / "equivalence.csv", index=False)
    gains(base, gain).to_csv(folder / "gain.csv", index=False)
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


def test_a_comparison_only_one_study_made_is_counted_not_compared():
    original = equivalence({("outcome", "r1"): "equivalent", ("outcome", "r2"): "equivalent"})
    again = equivalence({("outcome", "r1"): "different"})
    table = verdict_agreement(original, again, NAMES)
    assert len(table.frame) == 1
    assert "**0 of 1 verdicts agree**; not compared, made by one study only: 1." in table.markdown


def test_fullft_gains_are_set_side_by_side_per_regime():
    table = fullft_gains(gains(0.36, 0.45), gains(0.30, 0.20), NAMES)
    assert table.frame[["base_original", "gain_original", "base_replication", "gain_replication"]].values.tolist() == [
        [0.36, 0.45, 0.30, 0.20]]
    assert "+0.450 [+0.420, +0.480]" in table.markdown and "+0.200 [+0.170, +0.230]" in table.markdown


def test_a_study_without_its_tables_is_named_with_what_to_run(tmp_path):
    (tmp_path / "equivalence.csv").write_text("regime,arm\n")
    with pytest.raises(FileNotFoundError, match=r"has no gain\.csv: run that study's analysis first"):
        read_summaries(tmp_path)


def test_the_notebook_writes_the_report_and_the_verdicts_table(tmp_path):
    verdicts = {("outcome", "r1"): "equivalent", ("process", "r1"): "inconclusive"}
    original = study(tmp_path / "outputs" / "mini", verdicts)
    again = study(tmp_path / "outputs" / "again", {**verdicts, ("process", "r1"): "different"}, base=0.30)
    execute_notebook(REPO_ROOT / "notebooks" / "replication.py", tmp_path / "run.ipynb",
                     {"profile": "again", "outputs_dir": str(again), "replicates": "mini",
                      "replicates_dir": str(original)})
    printed = "".join(o.get("text", "") for c in nbformat.read(tmp_path / "run.ipynb", 4).cells
                      for o in c.get("outputs", []))
    assert "**1 of 2 verdicts agree**" in printed
    report = (again / "replication.md").read_text()
    assert report.startswith("# again against mini") and "**1 of 2 verdicts agree**" in report and "0.300" in report
    assert pd.read_csv(again / "replication.csv")["agree"].tolist() == [True, False]
    assert "![LoRA − FullFT per rank in both studies" in report and (again / "figures" / "replication.png").is_file()


def test_the_committed_default_study_read_against_a_copy_of_itself_agrees_at_every_comparison(tmp_path):
    committed = REPO_ROOT / "outputs" / "mini"
    for name in ("equivalence.csv", "gain.csv"):
        (tmp_path / name).write_bytes((committed / name).read_bytes())
    report = write_replication_report(committed, tmp_path, ("mini", "copy"), margin=0.05).read_text()
    assert "**20 of 20 verdicts agree**." in report, "the committed tables are not read as the analysis writes them"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["equivalence.csv", "figures/replication.png", "gain.csv", "replication.csv", "replication.md"], (
        "it wrote beside the original")


@pytest.mark.parametrize("original, replication", [("mini", "mini_world1"), ("mini", "mini_world2"),
                                                    ("mini_world2", "mini_world2_outcome_seeds")])
def test_a_committed_replication_report_sets_every_shared_verdict_of_both_studies_side_by_side(original, replication):
    committed = pd.read_csv(REPO_ROOT / "outputs" / replication / "replication.csv").set_index(["regime", "arm"])
    for study, column in ((original, "verdict_original"), (replication, "verdict_replication")):
        verdicts = pd.read_csv(REPO_ROOT / "outputs" / study / "equivalence.csv").set_index(["regime", "arm"])
        assert committed[column].to_dict() == verdicts["verdict"].loc[committed.index].to_dict(), (
            f"outputs/{replication}/replication.csv does not hold outputs/{study}/equivalence.csv's verdicts: "
            f"run `./run_all.sh --profile {replication} --stages analysis`")
    shared = len(pd.read_csv(REPO_ROOT / "outputs" / replication / "equivalence.csv"))
    assert len(committed) == shared, "a comparison both studies made is missing"
    assert (committed["agree"] == (committed["verdict_original"] == committed["verdict_replication"])).all()
    assert (REPO_ROOT / "outputs" / replication / "figures" / "replication.png").is_file()

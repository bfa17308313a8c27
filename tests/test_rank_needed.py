"""The rank each regime needs to match FullFT, and the answer to the study's question, read off the verdicts."""
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle

from reward_density.analysis.plots import STANDING_COLORS, plot_rank_needed
from reward_density.analysis.rank_needed import (
    density_answer,
    growth,
    main,
    needed_ranks,
    rank_needed_table,
    seeds_to_decide,
)
from reward_density.analysis.tables import power_markdown
from reward_density.experiment.profiles import REPO_ROOT
from reward_density.rewards import DENSITIES, DENSITY, REGIMES

AHEAD, BEHIND = ("different", +0.06), ("different", -0.06)
EQUIVALENT, INCONCLUSIVE, SKIPPED = ("equivalent", -0.01), ("inconclusive", 0.02), ("skipped", float("nan"))


def equivalence(**regimes: dict[int, tuple[str, float]]) -> pd.DataFrame:
    """An equivalence table from {regime: {rank: (verdict, estimate)}}."""
    return pd.DataFrame([{"regime": regime, "rank": rank, "arm": f"r{rank}", "estimate": estimate, "verdict": verdict}
                         for regime, by_rank in regimes.items() for rank, (verdict, estimate) in by_rank.items()])


def described(frame: pd.DataFrame) -> dict[str, str]:
    return {n.regime: n.describe() for n in needed_ranks(frame)}


def test_the_needed_rank_lies_above_every_rank_behind_and_at_the_smallest_that_matches():
    frame = equivalence(
        outcome={1: EQUIVALENT, 4: EQUIVALENT},
        process={1: BEHIND, 4: INCONCLUSIVE, 16: AHEAD},
        distillation={1: BEHIND, 4: EQUIVALENT, 16: EQUIVALENT},
        sft={1: BEHIND, 4: BEHIND},
    )
    assert described(frame) == {
        "outcome": "r1 or less",  # the grid's floor matches: the need may lie below it
        "process": "more than r1, at most r16 (r4 inconclusive)",  # significantly ahead counts as matching
        "distillation": "r4",
        "sft": "more than r4",
    }


def test_undecided_ranks_leave_the_range_open_and_name_their_verdicts():
    frame = equivalence(outcome={1: INCONCLUSIVE, 2: SKIPPED, 4: EQUIVALENT},
                        process={1: BEHIND, 2: INCONCLUSIVE}, distillation={1: SKIPPED})
    assert described(frame) == {"outcome": "r4 or less (r1 inconclusive; r2 skipped)",
                                "process": "more than r1 (r2 inconclusive)", "distillation": "unknown (r1 skipped)"}
    assert not any(n.pinned for n in needed_ranks(frame))


def test_a_rank_behind_above_one_that_matches_is_called_not_monotone_and_orders_nothing():
    frame = equivalence(outcome={1: EQUIVALENT, 4: BEHIND}, distillation={1: EQUIVALENT})
    assert described(frame)["outcome"] == "not monotone: r4 is behind FullFT although r1 matches it"
    assert density_answer(needed_ranks(frame)).startswith("Cannot tell")


@pytest.mark.parametrize("verdicts, answer", [
    ({"outcome": {1: EQUIVALENT}, "process": {1: AHEAD}, "distillation": {1: EQUIVALENT}},
     "The needed rank does not grow with the reward's density: every regime needs r1 or less (outcome, process, "
     "distillation). r1 is the smallest rank run: below it, growth was not tested."),
    ({"outcome": {1: EQUIVALENT, 4: EQUIVALENT}, "process": {1: BEHIND, 4: EQUIVALENT},
      "distillation": {1: BEHIND, 4: BEHIND}},
     "The needed rank grows with the reward's density: outcome (O(1)): r1 or less; process (O(S)): r4; "
     "distillation (O(N)): more than r4."),
    ({"outcome": {1: BEHIND, 4: EQUIVALENT}, "distillation": {1: EQUIVALENT, 4: EQUIVALENT}},
     "The needed rank shrinks as the reward grows denser: outcome (O(1)): r4; distillation (O(N)): r1 or less."),
    ({"outcome": {1: BEHIND, 4: EQUIVALENT}, "process": {1: EQUIVALENT}, "distillation": {1: BEHIND, 4: AHEAD}},
     "The needed rank neither grows nor shrinks steadily with the reward's density: outcome (O(1)): r4; "
     "process (O(S)): r1 or less; distillation (O(N)): r4."),
    ({"outcome": {1: EQUIVALENT, 4: EQUIVALENT}, "process": {1: INCONCLUSIVE, 4: EQUIVALENT}},
     "Cannot tell whether the needed rank grows with the reward's density (outcome against process): outcome (O(1)): "
     "r1 or less; process (O(S)): r4 or less (r1 inconclusive)."),
    ({"outcome": {1: EQUIVALENT}}, "The regimes compared span fewer than two reward densities: the question needs two "
                                   "or more."),
    ({"sft": {1: BEHIND, 4: EQUIVALENT}},
     "The regimes compared span fewer than two reward densities: the question needs two or more. The SFT control "
     "needs r4: these statistics find LoRA behind FullFT where it falls behind."),
])
def test_the_answer_orders_regimes_by_density_only_where_their_ranges_do_not_overlap(verdicts, answer):
    assert density_answer(needed_ranks(equivalence(**verdicts))) == answer


@pytest.mark.parametrize("verdicts, answer", [({"sft": {1: BEHIND}}, "no RL regime"),
                                              ({"outcome": {1: EQUIVALENT}, "sft": {1: BEHIND}}, "one density")])
def test_a_study_of_fewer_than_two_densities_says_how_many_it_has(verdicts, answer):
    assert growth(needed_ranks(equivalence(**verdicts))) == answer


def test_an_undecided_rank_does_not_stop_two_disjoint_ranges_from_being_ordered():
    # outcome needs at most r1; distillation more than r4 whatever r16 turns out: growth is shown.
    frame = equivalence(outcome={1: EQUIVALENT}, distillation={1: BEHIND, 4: BEHIND, 16: INCONCLUSIVE})
    assert density_answer(needed_ranks(frame)).startswith("The needed rank grows with the reward's density")


def test_known_pairs_that_go_both_ways_are_not_steady_growth_whatever_an_unknown_pair_is():
    # outcome at most r1 < process r4 > distillation at most r2; outcome against distillation overlaps (unknown).
    frame = equivalence(outcome={1: EQUIVALENT, 2: EQUIVALENT}, process={1: BEHIND, 2: BEHIND, 4: EQUIVALENT},
                        distillation={1: INCONCLUSIVE, 2: EQUIVALENT})
    assert growth(needed_ranks(frame)) == "not steadily"
    assert density_answer(needed_ranks(frame)).startswith(
        "The needed rank neither grows nor shrinks steadily with the reward's density: outcome (O(1)): r1 or less; "
        "process (O(S)): r4; distillation (O(N)): r2 or less (r1 inconclusive).")


def test_two_regimes_that_every_rank_trails_cannot_be_ordered():
    # Both need more than r16, the largest rank run: one may need r32, the other r256.
    frame = equivalence(outcome={1: BEHIND, 16: BEHIND}, distillation={1: BEHIND, 16: BEHIND})
    assert growth(needed_ranks(frame)) == "cannot tell"


def test_a_control_behind_fullft_at_a_rank_above_one_that_matches_says_so_without_a_needed_rank():
    answer = density_answer(needed_ranks(equivalence(outcome={1: EQUIVALENT}, sft={2: EQUIVALENT, 4: BEHIND})))
    assert answer.endswith("The SFT control finds LoRA behind FullFT, but its verdicts are not monotone: r4 is behind "
                           "FullFT although r2 matches it: these statistics see a rank fall behind, though the control "
                           "pins no needed rank."), answer


def test_the_sft_control_says_whether_the_statistics_can_see_a_rank_effect():
    rl = {"outcome": {1: EQUIVALENT}, "distillation": {1: EQUIVALENT}}
    seen = density_answer(needed_ranks(equivalence(**rl, sft={1: BEHIND, 16: BEHIND})))
    assert seen.endswith("The SFT control needs more than r16: these statistics find LoRA behind FullFT where it "
                         "falls behind.")
    unseen = density_answer(needed_ranks(equivalence(**rl, sft={1: EQUIVALENT, 16: EQUIVALENT})))
    assert "this study cannot tell a regime that needs no more rank than it ran from one whose rank effect it cannot " \
           "see" in unseen


def test_the_seeds_that_would_decide_each_open_rank_are_the_power_tables_projection():
    frame = equivalence(outcome={1: INCONCLUSIVE, 2: EQUIVALENT}, process={1: SKIPPED, 2: INCONCLUSIVE, 4: AHEAD},
                        distillation={1: EQUIVALENT, 2: INCONCLUSIVE})  # distillation's r2 leaves nothing open
    frame["seeds_needed"] = pd.array([12, 2, None, None, 3, 5, 9], dtype="Int64")
    assert seeds_to_decide(frame, needed_ranks(frame)) == (
        "What would decide the open ranks: the seeds the power table projects for them (80% TOST power at a true "
        "difference of 0, on the same problems): outcome r1: 12 seeds, process r2: more than 1000 seeds.")
    frame["seeds_suffice"] = [True, True, True, False, True, True, True]  # process r2: only more problems would do
    assert seeds_to_decide(frame, needed_ranks(frame)).endswith("process r2: no number of seeds (only more problems).")
    power = power_markdown(frame.assign(se=0.01, df=3.0, tost_half_width=0.02, mdd=0.03, n_seeds=4))
    assert "| process | r2 | 0.0100 | 3.0 | ±0.020 | 0.030 | none: more problems | 4 |" in power, power
    assert "| distillation | r2 | 0.0100 | 3.0 | ±0.020 | 0.030 | 9 | 4 |" in power, power
    pinned = equivalence(outcome={1: EQUIVALENT}).assign(seeds_needed=2)
    assert seeds_to_decide(pinned, needed_ranks(pinned)) == ""
    committed = pd.read_csv(REPO_ROOT / "outputs" / "mini" / "equivalence.csv")
    assert seeds_to_decide(committed, needed_ranks(committed)).endswith("process r1: 21 seeds."), (
        "the default study's one open rank is process r1, which the powered process study was sized for")


def test_every_regime_declares_its_density_and_densities_run_sparsest_first():
    assert set(DENSITY) == set(REGIMES), "a regime without a density cannot be placed on the study's axis"
    places = [DENSITIES.index(DENSITY[regime]) for regime in REGIMES]
    assert places == sorted(places), f"REGIMES should run sparsest first, as the tables show them: {DENSITY}"


def test_the_table_keeps_the_numbers_behind_each_sentence_for_its_csv():
    table = rank_needed_table(equivalence(outcome={1: EQUIVALENT}, process={1: BEHIND, 4: INCONCLUSIVE},
                                          sft={1: BEHIND}))
    assert table.frame.to_dict("records") == [
        {"regime": "outcome", "density": "O(1)", "largest_rank_behind": 0, "smallest_rank_matching": 1,
         "pinned": True, "needed": "r1 or less"},
        {"regime": "process", "density": "O(S)", "largest_rank_behind": 1, "smallest_rank_matching": None,
         "pinned": False, "needed": "more than r1 (r4 inconclusive)"},
        {"regime": "sft", "density": "control", "largest_rank_behind": 1, "smallest_rank_matching": None,
         "pinned": True, "needed": "more than r1"},
    ]
    assert "| process | O(S) | more than r1 (r4 inconclusive) |" in table.markdown
    nothing = pd.DataFrame(columns=["regime", "rank", "arm", "estimate", "verdict"])
    assert rank_needed_table(nothing).markdown == "No LoRA arm was compared with FullFT.\n"


def test_the_command_reads_a_studys_csv_and_names_a_file_that_is_not_an_equivalence_table(tmp_path, capsys):
    path = tmp_path / "equivalence.csv"
    equivalence(outcome={1: EQUIVALENT}, distillation={1: EQUIVALENT}).to_csv(path, index=False)
    main([str(path)])
    assert "every regime needs r1 or less" in capsys.readouterr().out
    (tmp_path / "other.csv").write_text("regime,arm\noutcome,r1\n")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "other.csv")])
    assert "lacks the column(s) ['rank', 'estimate', 'verdict']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.csv")])
    assert "missing.csv: no such file" in capsys.readouterr().err


def test_the_command_given_several_studies_sets_their_needed_ranks_side_by_side(tmp_path, capsys):
    paths = [tmp_path / "dense.csv", tmp_path / "outcome_only.csv"]
    equivalence(outcome={1: EQUIVALENT}, distillation={1: BEHIND, 4: EQUIVALENT}).to_csv(paths[0], index=False)
    equivalence(outcome={1: INCONCLUSIVE, 2: EQUIVALENT}).to_csv(paths[1], index=False)
    main([str(path) for path in paths])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| study | outcome (O(1)) | process (O(S)) | distillation (O(N)) | SFT control | does it grow? |"
    assert lines[2:4] == [f"| {paths[0]} | r1 or less | – | r4 | – | grows |",
                         f"| {paths[1]} | r2 or less (r1 inconclusive) | – | – | – | one density |"]
    (tmp_path / "gain.csv").write_text("regime,arm,gain\noutcome,full,0.5\n")
    with pytest.raises(SystemExit):
        main([str(paths[0]), str(tmp_path / "gain.csv")])
    assert "gain.csv: not an equivalence table" in capsys.readouterr().err, "the file that is not one is named"


def test_the_figure_draws_each_range_open_below_and_closed_above_with_each_ranks_standing_beside_it(tmp_path):
    frame = equivalence(  # given out of order: the figure puts the sparsest reward first and the control last
        sft={1: BEHIND, 4: BEHIND}, distillation={1: BEHIND, 4: EQUIVALENT, 16: EQUIVALENT},
        outcome={1: EQUIVALENT, 4: INCONCLUSIVE, 16: AHEAD}, process={1: EQUIVALENT, 16: BEHIND},
    )
    ax = plot_rank_needed(frame, tmp_path / "rank_needed.png").axes[0]
    assert (tmp_path / "rank_needed.png").is_file()
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "outcome\nO(1)", "process\nO(S)", "distillation\nO(N)", "sft\ncontrol"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "r1", "r4", "r16", "beyond r16"]
    bars = {round(p.get_x() + p.get_width() / 2): p for p in ax.patches if isinstance(p, Rectangle) and p.get_width()}
    spans = {x: (bar.get_y(), bar.get_y() + bar.get_height(), bool(bar.get_hatch())) for x, bar in bars.items()}
    assert spans == {0: (0, 1, False), 2: (1, 2, False), 3: (2, 4, False)}, "outcome r1 or less, distillation r4, " \
        "sft more than r4; process is not monotone and gets no range"
    assert [t.get_text() for t in ax.texts] == ["not monotone"]
    dots = {(round(line.get_xdata()[0] - 0.25), line.get_ydata()[0]): to_hex(line.get_color()) for line in ax.lines
            if len(line.get_xdata()) and line.get_xdata()[0] % 1}
    assert dots[(0, 2)] == to_hex(STANDING_COLORS["undecided"]) and dots[(0, 3)] == to_hex(STANDING_COLORS["matches"])
    assert dots[(1, 3)] == to_hex(STANDING_COLORS["behind"]), "process r16 is significantly behind FullFT"
    assert ax.get_title().endswith("cannot tell")


def test_the_figure_hatches_a_range_that_undecided_ranks_leave_open_and_marks_an_empty_table(tmp_path):
    frame = equivalence(outcome={1: INCONCLUSIVE, 4: EQUIVALENT}, distillation={1: EQUIVALENT})
    ax = plot_rank_needed(frame, tmp_path / "open.png").axes[0]
    assert [bool(p.get_hatch()) for p in ax.patches if p.get_width()] == [True, False]
    no_lora = equivalence(outcome={1: EQUIVALENT}).iloc[:0]  # FullFT alone: the table has its columns and no row
    empty = plot_rank_needed(no_lora, tmp_path / "empty.png").axes[0]
    assert [t.get_text() for t in empty.texts] == ["no LoRA arm paired with FullFT"]

"""GRPO against its token-selection variants: the same arms paired across studies, and the tokens in the loss."""
import nbformat
import pandas as pd
import pytest
from test_analysis import N_PROBLEMS, write_cell

from reward_density.analysis.load import load_cells
from reward_density.analysis.methods import loss_tokens, method_accuracy, write_method_comparison
from reward_density.experiment.profiles import REPO_ROOT
from reward_density.run.notebooks import execute_notebook


def method_study(root, finals: dict, tokens_in_loss: float | None = None):
    """An outcome study of r4 and FullFT over two seeds; finals: {arm rank: [problems solved per seed]}."""
    for rank, solved in finals.items():
        for seed, final in enumerate(solved):
            folder = write_cell(root, "outcome", rank, seed, final)
            history = pd.read_csv(folder / "history.csv")
            history["len_mean"] = 20.0
            if tokens_in_loss is not None:  # a GRPO history from before loss_tokens was logged has none
                history["loss_tokens"] = tokens_in_loss
            history.to_csv(folder / "history.csv", index=False)
    return load_cells(root)


@pytest.fixture
def studies(tmp_path):
    return {"GRPO": method_study(tmp_path / "grpo", {4: [5, 5], None: [6, 6]}),
            "T-SPMO": method_study(tmp_path / "tspmo", {4: [8, 8], None: [6, 6]}, tokens_in_loss=2.0)}


def test_each_method_is_paired_with_the_baseline_arm_by_arm(studies):
    frame = method_accuracy(studies, "outcome", margin=0.05).frame.set_index(["method", "arm"])
    assert frame.loc[("T-SPMO", "r4"), "estimate"] == pytest.approx(3 / N_PROBLEMS)
    assert frame.loc[("T-SPMO", "r4"), "ci_low"] < 3 / N_PROBLEMS < frame.loc[("T-SPMO", "r4"), "ci_high"]
    assert frame.loc[("T-SPMO", "full"), "estimate"] == pytest.approx(0.0)
    assert pd.isna(frame.loc[("GRPO", "r4"), "estimate"]), "the baseline is not compared with itself"
    assert frame.loc[("GRPO", "full"), "pass1"] == pytest.approx(6 / N_PROBLEMS)


def test_tokens_in_the_loss_are_counted_per_completion(studies):
    frame = loss_tokens(studies, "outcome").frame.set_index("method")
    assert frame.loc["GRPO", "loss_tokens"] == 20.0, "GRPO puts every completion token into the loss"
    assert frame.loc["T-SPMO", "loss_tokens"] == 2.0 and frame.loc["T-SPMO", "share"] == pytest.approx(0.1)


def test_the_comparison_is_written_with_its_figures(studies, tmp_path):
    path = write_method_comparison(studies, tmp_path / "out", "outcome", margin=0.05)
    text = path.read_text()
    assert "GRPO vs T-SPMO" in text and "minus GRPO" in text and "Tokens in the loss" in text
    for figure in ("method_accuracy.png", "method_curves.png"):
        assert (tmp_path / "out" / "figures" / figure).stat().st_size > 0


def test_the_notebook_compares_the_studies_that_ran_and_names_the_rest(tmp_path):
    method_study(tmp_path / "outputs" / "grpo", {4: [5, 5], None: [6, 6]})
    method_study(tmp_path / "outputs" / "tspmo", {4: [8, 8], None: [6, 6]}, tokens_in_loss=2.0)
    out = tmp_path / "outputs" / "tspmo"
    execute_notebook(REPO_ROOT / "notebooks" / "method_comparison.py", tmp_path / "run.ipynb",
                     {"outputs_dir": str(out), "methods": {"GRPO": "grpo", "S-GRPO": "sgrpo", "T-SPMO": "tspmo"}})
    printed = "".join(o.get("text", "") for c in nbformat.read(tmp_path / "run.ipynb", 4).cells for o in c.get("outputs", []))
    assert "S-GRPO: left out" in printed and "compared: GRPO, T-SPMO" in printed
    assert "GRPO vs T-SPMO" in (out / "method_comparison.md").read_text()

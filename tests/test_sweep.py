"""The learning-rate sweep's choice: each arm's best final pass@1, among plateaued rates where the study needs one."""
import json

import pandas as pd

from reward_density.analysis.load import load_cells
from reward_density.analysis.sweep import chosen_rates, write_sweep_report

# pass@1 at steps 0, 3 (75% of the steps) and 4 (the end) of each arm and rate, the same for every seed.
PLATEAUED = {0: 0.3, 3: 0.58, 4: 0.60}  # 7% of its gain in the last quarter
CLIMBING = {0: 0.3, 3: 0.45, 4: 0.70}  # best final, but 62% of its gain came last
FLAT = {0: 0.3, 3: 0.3, 4: 0.3}
CURVES = {
    None: {1e-5: FLAT, 3e-5: CLIMBING, 1e-4: PLATEAUED},
    1: {1e-4: PLATEAUED, 1e-3: CLIMBING},
    2: {1e-4: PLATEAUED, 1e-3: CLIMBING},
}


def write_cell(outputs, regime, rank, seed, rate, curve):
    name = f"{regime}-r{rank or 'full'}-lr{rate:g}-s{seed}"
    folder = outputs / "cells" / name
    folder.mkdir(parents=True)
    pd.DataFrame([{"step": s, "loss": 0.1} for s in range(1, 5)]).to_csv(folder / "history.csv", index=False)
    pd.DataFrame([{"step": s, "pass1": p} for s, p in curve.items()]).to_csv(folder / "evals.csv", index=False)
    pd.DataFrame([{"step": s, "problem_id": "000", "correct": True} for s in curve]).to_csv(folder / "answers.csv",
                                                                                           index=False)
    (folder / "summary.json").write_text(json.dumps({
        "cell": name, "regime": regime, "rank": rank, "seed": seed, "learning_rate": rate, "steps": 4,
        "final_pass1": curve[4], "peak_pass1": max(curve.values())}))


def sweep(tmp_path, regimes=("outcome", "process"), curves=CURVES):
    for regime in regimes:
        for rank, by_rate in curves.items():
            for rate, curve in by_rate.items():
                for seed in (100, 101):
                    write_cell(tmp_path, regime, rank, seed, rate, curve)
    return load_cells(tmp_path)


def test_outcome_takes_the_best_plateaued_rate_of_each_arm(tmp_path):
    chosen = chosen_rates(sweep(tmp_path)).frame.set_index("regime")
    assert chosen.loc["outcome", "full"] == 1e-4, "FullFT's best final (3e-5) was still climbing"
    assert chosen.loc["outcome", "lora"] == 1e-4, "LoRA's best final (1e-3) was still climbing"
    assert chosen.loc["outcome", "ratio"] == 1.0


def test_process_takes_the_best_final_whatever_its_curve(tmp_path):
    chosen = chosen_rates(sweep(tmp_path)).frame.set_index("regime")
    assert (chosen.loc["process", "full"], chosen.loc["process", "lora"]) == (3e-5, 1e-3)


def test_without_a_plateaued_rate_the_best_final_is_taken_and_flagged(tmp_path):
    curves = {None: {3e-5: CLIMBING, 1e-5: FLAT}, 1: {1e-3: CLIMBING}}
    table = chosen_rates(sweep(tmp_path, ("distillation",), curves))
    row = table.frame.iloc[0]
    assert (row["full"], row["full_plateau"], row["lora"], row["lora_plateau"]) == (3e-5, False, 1e-3, False)
    assert "no rate plateaued" in table.markdown


def test_the_sweep_report_lists_every_arm_rate_and_its_late_share(tmp_path):
    path = write_sweep_report(sweep(tmp_path), tmp_path / "out", "test")
    text = path.read_text()
    assert "share of gain in last 25%" in text and "62%" in text and "7%" in text
    assert (tmp_path / "out" / "chosen_rates.csv").is_file()

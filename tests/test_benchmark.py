"""The throughput benchmark runs end to end on tiny sizes (no speed threshold: it measures, it does not judge)."""
import json

import pytest

from reward_density.tools.benchmark import main


def test_benchmark_times_every_implementation_on_every_arm_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    report = main(["--steps", "1", "--warmup", "0", "--max-new-tokens", "4", "--hidden", "16", "--layers", "1",
                   "--ranks", "1,full", "--out", str(out)])
    seconds = report["cpu_seconds_per_step"]
    assert set(seconds["TRL"]) == set(seconds["ours (peft)"]) == {"LoRA r=1", "FullFT"}
    assert seconds["ours (stacked, all arms)"] > 0 and all(v > 0 for v in seconds["TRL"].values())
    assert seconds["ours (stacked, all arms, beta 0)"] > 0 and report["kl_free_saving"] < 1, "the KL-free step is timed"
    assert set(report["samples_per_cpu_second"]) == {"ours (stacked)", "ours (peft, one arm at a time)",
                                                     "TRL GRPOTrainer (one arm at a time)"}
    assert report["ours_over_trl"] > 0
    phases = report["stacked_phase_wall_seconds"]
    assert list(phases) == ["generate", "reward", "reference", "train"], f"the stacked step's phases: {phases}"
    assert phases["generate"] > 0 and phases["reference"] > 0 and phases["train"] > 0
    written = json.loads(out.read_text())
    assert written["samples_per_cpu_second"] == report["samples_per_cpu_second"]
    assert written["config"]["steps"] == 1 and written["config"]["hidden"] == 16
    assert {"torch", "transformers", "trl", "peft", "cpu", "torch_threads"} <= set(written["environment"])


@pytest.mark.parametrize("argv, message", [
    (["--ranks", "1,0"], "each rank is a positive integer or 'full', got '0'"),
    (["--ranks", "4,lora"], "got 'lora'"),
    (["--steps", "0"], "need steps >= 1"),
    (["--hidden", "0"], "hidden must be >= 1, got 0"),
])
def test_bad_benchmark_arguments_are_usage_errors_that_name_the_problem(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2, "argparse's usage error exits with status 2"
    assert message in capsys.readouterr().err

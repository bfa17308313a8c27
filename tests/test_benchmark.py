"""The step-speed benchmark runs end to end on tiny sizes (no speed threshold: it measures, it does not judge)."""
import json

from reward_density.tools.benchmark import PHASES, BenchConfig, main


def test_benchmark_times_both_implementations_on_both_arms_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    report = main(["--steps", "1", "--warmup", "0", "--max-new-tokens", "4", "--hidden", "16", "--out", str(out)])
    assert set(report["results"]) == set(BenchConfig(rank=1).arms) == {"LoRA r=1", "FullFT"}
    for arm, result in report["results"].items():
        for impl in ("ours", "trl"):
            assert result[impl]["step_seconds"] > 0, f"{arm}/{impl} has no step time"
            assert all(result[impl][name] >= 0 for name in PHASES)
            assert len(result[impl]["all_step_seconds"]) == 1
        assert result["ours_over_trl"] > 0
    written = json.loads(out.read_text())
    assert written["results"] == report["results"]
    assert written["config"]["steps"] == 1 and written["config"]["hidden"] == 16
    assert {"torch", "transformers", "trl", "peft", "device", "torch_threads"} <= set(written["environment"])

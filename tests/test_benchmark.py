"""The throughput benchmark runs end to end on tiny sizes (no speed threshold: it measures, it does not judge)."""
import json

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from reward_density.tools.benchmark import CPU_ATTENTION_FLOPS, aten_ms_by_kind, main
from reward_density.tools.measurement import write_report


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
    sampling = report["stacked_sampling_ms_per_decoding_step"]
    assert 1 <= sampling["decoding_steps"] <= 4, f"at most --max-new-tokens decoding steps: {sampling}"
    assert sampling["cpu_ms"] > 0 and sampling["products_ms"] > 0 and sampling["attention_ms"] > 0
    assert sampling["outside_aten_ms"] >= 0, f"the ATen operations' own times exceed the profiled time: {sampling}"
    floor = report["compute_floor"]
    assert floor["gflop_per_step"]["products"] > 0 and floor["gflop_per_step"]["attention"] > 0, floor
    assert floor["matmul_gflop_per_cpu_second"] > 0 and floor["floor_cpu_seconds"] > 0
    assert floor["step_over_floor"] == pytest.approx(seconds["ours (stacked, all arms)"] / floor["floor_cpu_seconds"])
    assert floor["trl_over_floor"] == pytest.approx(sum(seconds["TRL"].values()) / floor["floor_cpu_seconds"])
    written = json.loads(out.read_text())
    assert written["samples_per_cpu_second"] == report["samples_per_cpu_second"]
    assert written["config"]["steps"] == 1 and written["config"]["hidden"] == 16
    assert {"torch", "transformers", "trl", "peft", "cpu", "torch_threads", "commit", "dirty", "tree"} <= set(
        written["environment"]), "the benchmark must record what it ran on and the code it ran"


def test_a_failing_part_leaves_what_was_measured_before_it_in_a_partial_report(tmp_path, monkeypatch):
    from reward_density.tools import benchmark

    def no_trl(*args, **kwargs):
        raise RuntimeError("trl broke")

    monkeypatch.setattr(benchmark, "time_trl", no_trl)
    out = tmp_path / "bench.json"
    with pytest.raises(RuntimeError, match="trl broke"):
        main(["--steps", "1", "--warmup", "0", "--max-new-tokens", "4", "--hidden", "16", "--layers", "1",
              "--ranks", "1", "--out", str(out)])
    partial = json.loads((tmp_path / "bench.partial.json").read_text())
    assert not out.exists(), "a failed run wrote the report the analysis reads"
    assert partial["error"] == "RuntimeError: trl broke"
    assert partial["cpu_seconds_per_step"]["ours (peft)"]["LoRA r=1"] > 0, "the parts timed before TRL were lost"


def test_the_sampling_profile_splits_aten_time_into_products_attention_and_the_rest_without_counting_twice():
    x, w = torch.randn(6, 16, 128), torch.randn(6, 128, 256)
    q = torch.randn(96, 4, 1, 32)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        torch.bmm(x, w)
        F.scaled_dot_product_attention(q, q, q)
        (x * 2).to(torch.float64)  # to -> _to_copy -> copy_: nested operations, each counted by its own time
    kinds, other = aten_ms_by_kind(profiler.key_averages())
    assert kinds["products_ms"] > 0 and kinds["attention_ms"] > 0 and kinds["other_aten_ms"] > 0, kinds
    assert {"aten::mul", "aten::copy_"} <= set(other), f"the other operations by name: {other}"
    assert not {"aten::bmm", "aten::scaled_dot_product_attention"} & set(other), "a product or attention among the rest"
    inclusive = sum(e.cpu_time_total for e in profiler.key_averages() if e.key.startswith("aten::")) / 1e3
    assert sum(kinds.values()) < inclusive, "self times, not times including the nested operations"


def test_the_flop_count_takes_the_cpu_attention_at_its_products_and_its_gradient_at_five_of_them():
    rows, heads, kv_heads, queries, keys, dim = 3, 4, 2, 5, 7, 8  # grouped-query, as the student's attention
    q = torch.randn(rows, heads, queries, dim, requires_grad=True)
    k, v = torch.randn(rows, kv_heads, keys, dim), torch.randn(rows, kv_heads, keys, dim)
    mask = torch.ones(queries, keys, dtype=torch.bool)  # a mask, as the packed forward's, keeps the CPU's kernel
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    product = 2 * rows * heads * queries * keys * dim  # one [queries x dim] by [dim x keys] product per query head
    forward = counter.get_flop_counts()["Global"]
    assert forward == {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: 2 * product}, (
        f"scores and values, every query head: {forward}")
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        out.sum().backward()
    backward = counter.get_flop_counts()["Global"]
    assert backward == {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: 5 * product}, (
        f"the scores recomputed, then the gradients of values, probabilities, queries and keys: {backward}")


def test_the_benchmark_times_a_worlds_student_on_its_training_prompts_when_given_them(smoke_project):
    world = smoke_project / "outputs" / "smoke" / "world"
    report = main(["--steps", "1", "--warmup", "0", "--max-new-tokens", "4", "--ranks", "1,full",
                   "--student", str(world / "student"), "--problems", str(world / "problems")])
    model = report["model"]
    assert model["timed"] == str(world / "student") and model["prompts"] == f"{world / 'problems'}/train.jsonl"
    assert (model["hidden"], model["layers"]) == (32, 1), f"the smoke student's shape, not --hidden's: {model}"
    assert 1 <= report["stacked_sampling_ms_per_decoding_step"]["completion_tokens_mean"] <= 4
    assert 1 <= report["completion_tokens_mean"] <= 4, "the timed steps' completion length"
    assert report["ours_over_trl"] > 0 and set(report["cpu_seconds_per_step"]["TRL"]) == {"LoRA r=1", "FullFT"}


@pytest.mark.parametrize("argv, message", [
    (["--student", "."], "--student and --problems go together"),
    (["--student", "no/such/folder", "--problems", "."], "--student no/such/folder: no config.json there"),
    (["--ranks", "1,0"], "each rank is a positive integer or 'full', got '0'"),
    (["--ranks", "4,lora"], "got 'lora'"),
    (["--ranks", "1,full,01"], "rank '01' is given twice"),
    (["--steps", "0"], "need steps >= 1"),
    (["--hidden", "0"], "hidden must be >= 1, got 0"),
])
def test_bad_benchmark_arguments_are_usage_errors_that_name_the_problem(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2, "argparse's usage error exits with status 2"
    assert message in capsys.readouterr().err


def test_a_report_goes_where_asked_its_folder_made_and_to_stderr_when_it_cannot(tmp_path, capsys):
    report = {"ratio": 2.5}
    write_report(report, tmp_path / "new" / "folder" / "bench.json")
    assert json.loads((tmp_path / "new" / "folder" / "bench.json").read_text()) == report
    (tmp_path / "a_file").write_text("")
    write_report(report, tmp_path / "a_file" / "bench.json")  # a file where its folder should be
    err = capsys.readouterr().err
    assert "could not be written" in err and '"ratio": 2.5' in err, "a measurement that cannot be written is lost"

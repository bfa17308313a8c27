"""The levers tool applies each lever to the stacked step (its scoring forward, or sampling's decoder) and times it
between two runs of the plain fp32 step (no speed threshold: it measures, it does not judge)."""
import json
import subprocess
import sys
import time
from unittest import mock

import pytest
import torch

from reward_density.data.problems import Problem
from reward_density.grpo import sampler
from reward_density.grpo import stacked as stacked_engine
from reward_density.grpo.policy import PolicyConfig
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.grpo.stacked import StackedPolicy
from reward_density.tools.levers import (
    CompiledDecoder,
    CompiledGraphedDecoder,
    check_levers,
    lever_forward,
    lever_patches,
    main,
)
from reward_density.tools.measurement import cpu_seconds_with_children
from reward_density.tools.stand_ins import build_qwen3

PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\n", "41")]


def two_arms(tiny_tokenizer) -> StackedPolicy:
    """A rank-2 LoRA arm and a full fine-tuning arm of one tiny random Qwen3."""
    return StackedPolicy(build_qwen3(len(tiny_tokenizer), seed=0), [PolicyConfig(rank=2), PolicyConfig(rank=None)],
                         seed=0)


def scores_under(lever: str, tiny_tokenizer) -> torch.Tensor:
    """The stacked policy's completion log-probs of one fixed rollout, with the lever patched in as the tool does."""
    policy = two_arms(tiny_tokenizer)
    with torch.no_grad():
        rollout = sample_rollout(policy.weights(), tiny_tokenizer, PROBLEMS, 2, SamplingConfig(6), seed=1)
        with mock.patch.object(stacked_engine, "forward", lever_forward(lever)):
            return policy.logprobs(rollout, 1.0)


def test_bf16_lever_changes_the_bits_of_the_scores_but_not_their_values(tiny_tokenizer):
    plain, bf16 = scores_under("fp32", tiny_tokenizer), scores_under("bf16", tiny_tokenizer)
    assert not torch.equal(plain, bf16), "the bf16 lever did not reach the stacked forward"
    torch.testing.assert_close(bf16, plain, atol=0.1, rtol=0.05, msg="bf16 scores are not the fp32 ones, rounded")


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")  # the lever compiles without the on-disk cache
def test_compiled_decode_lever_draws_the_study_decoders_tokens(tiny_tokenizer):
    policy = two_arms(tiny_tokenizer)

    def rollout():
        with torch.no_grad():
            return sample_rollout(policy.weights(), tiny_tokenizer, PROBLEMS, 2, SamplingConfig(6), seed=1)

    plain = rollout()
    with lever_patches("compiled-decode"):
        assert sampler.decoder_kind(SamplingConfig(6), torch.device("cpu")) is CompiledDecoder
        # Where the study would replay its step as a CUDA graph, the compiled step is replayed as one too.
        assert sampler.decoder_kind(SamplingConfig(6), torch.device("cuda")) is CompiledGraphedDecoder
        assert sampler.decoder_kind(SamplingConfig(6, cuda_graphs=False), torch.device("cuda")) is CompiledDecoder
        compiled = rollout()
    assert torch.equal(compiled.completion_ids, plain.completion_ids), "the compiled decode drew other tokens"
    torch.testing.assert_close(compiled.sampler_logps, plain.sampler_logps,
                               msg="the compiled decode's log-probs are not the study's up to rounding")


def test_levers_are_checked_and_fp32_always_leads():
    assert check_levers(["compile", "fp32", "bf16", "compile"]) == ("fp32", "compile", "bf16")
    with pytest.raises(ValueError, match="unknown lever 'fp16'.*fp32, bf16, compile, bf16\\+compile"):
        check_levers(["fp16"])


def test_levers_tool_times_each_lever_between_two_fp32_runs_and_writes_json(tmp_path):
    out = tmp_path / "levers.json"
    report = main(["--steps", "1", "--warmup", "1", "--max-new-tokens", "4", "--hidden", "16", "--layers", "1",
                   "--ranks", "1,full", "--levers", "bf16,bf16+compile", "--out", str(out)])
    assert list(report["levers"]) == ["bf16", "bf16+compile"]
    assert len(report["fp32_runs"]) == 3, "the plain step should be timed before the first lever and after each"
    for name, timing in [("fp32", run) for run in report["fp32_runs"]] + list(report["levers"].items()):
        assert timing["cpu_seconds_per_step"] > 0, f"{name}: no step was timed"
        assert list(timing["phase_wall_seconds"]) == ["generate", "reward", "reference", "train"]
    plain = [run["cpu_seconds_per_step"] for run in report["fp32_runs"]]
    assert report["speedup_over_fp32"]["bf16+compile"] == pytest.approx(
        (plain[1] + plain[2]) / 2 / report["levers"]["bf16+compile"]["cpu_seconds_per_step"]), \
        "a lever's speed-up should be over the mean of the two plain runs beside it"
    compiled = report["levers"]["bf16+compile"]["setup_and_warmup_cpu_seconds"]
    assert compiled > max(run["setup_and_warmup_cpu_seconds"] for run in report["fp32_runs"]), \
        "compiling the forward should cost the warm-up step CPU time the fp32 one does not spend"
    assert json.loads(out.read_text())["speedup_over_fp32"] == report["speedup_over_fp32"]


BUSY_CHILD = """import sys, time
start = time.process_time()
while time.process_time() - start < 0.5:
    pass
print("busy", flush=True)
time.sleep(60)
"""


def test_the_set_up_clock_counts_the_cpu_of_child_processes_running_and_ended():
    # Inductor compiles in a pool of worker processes that outlive the compile, and runs the C++ compiler: a clock of
    # this process alone left about 40% of a compile's CPU out.
    start, own = cpu_seconds_with_children(), time.process_time()
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "busy"
        running = cpu_seconds_with_children() - start
    finally:
        child.kill()
        child.wait()
    ended = cpu_seconds_with_children() - start
    assert time.process_time() - own < 0.4, "this process itself was busy: the test cannot tell the child's part"
    assert running >= 0.5, f"a running child's 0.5 CPU-s were not counted ({running:.2f})"
    assert ended >= 0.5, f"an ended child's 0.5 CPU-s were not counted ({ended:.2f})"

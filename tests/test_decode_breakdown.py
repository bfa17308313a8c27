"""The decode breakdown takes a tiny model of the paper policy's architecture apart on a CPU: every step is measured
in every way a CPU allows, the folded and compiled steps compute the study step's logits up to rounding, and the
report is written. It measures; no test here judges a speed."""
import json

import pytest

from reward_density.grpo.cuda_graph import StaticDecoder
from reward_density.tools import decode_breakdown as db


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("breakdown") / "decode.json"
    result = db.main(["--scale", "tiny", "--device", "cpu", "--tokens", "14", "--warmup", "2", "--prompt-tokens", "8",
                      "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result)), "the JSON is not the report returned"
    return result


def test_every_step_is_measured_without_graphs_on_a_cpu(report):
    assert list(report["steps"]) == ["study (SDPA), whole cache", "study (SDPA), short cache", "folded, whole cache",
                                     "folded compiled (default), whole cache"]
    for name, result in report["steps"].items():
        assert all(result[key] > 0 for key in ("sampler_ms", "no_draw_ms", "draw_ms")), f"{name}: not timed"
        assert "replay_ms" not in result, f"{name}: a CPU has no graph to replay"
    compiled = report["steps"]["folded compiled (default), whole cache"]["set_up_seconds"]
    assert compiled > report["steps"]["folded, whole cache"]["set_up_seconds"], "compiling should cost set-up time"
    assert report["eager_profile"]["aten_calls_per_token"] > 0 and report["eager_profile"]["kernels_per_token"] == 0


def test_folded_and_compiled_steps_compute_the_study_steps_logits(report):
    # bf16 (the paper profile's precision): a few units in the last place of the largest logit.
    for name, result in report["steps"].items():
        assert result["max_logit_difference"] <= 0.02 * report["largest_reference_logit"], f"{name}'s logits differ"


def test_the_setting_comes_from_the_paper_profile(report):
    setting = report["setting"]
    assert setting["rows"] == 16 and setting["precision"] == "bf16", "P x G = 4 x 4 rows in bf16, as the paper"
    assert setting["cache_positions"] == 8 + 1536, "the cache holds the prompt and the paper's length cap"


@pytest.mark.parametrize("args, message", [(["--device", "cpu", "--warmup", "0"], "0 < warmup < tokens"),
                                           (["--device", "cpu", "--tokens", "8", "--warmup", "2"], "tokens >= 12"),
                                           (["--scale", "huge"], "invalid choice"),
                                           (["--device", "cuda:99"], "CUDA device(s) here")])
def test_bad_settings_are_refused_by_name(args, message, capsys):
    with pytest.raises(SystemExit):
        db.parse_args(args)
    assert message in capsys.readouterr().err


def test_a_step_that_fails_is_recorded_and_the_others_are_still_measured(monkeypatch, tmp_path):
    class Broken(StaticDecoder):
        def extend(self, *args):
            raise RuntimeError("this step cannot decode")

    monkeypatch.setattr(db, "decode_steps", lambda config, cache, timed: {"broken": (Broken, cache),
                                                                          "study": (StaticDecoder, cache)})
    out = tmp_path / "decode.json"
    config = db.BreakdownConfig(scale="tiny", device="cpu", tokens=12, warmup=2, prompt_tokens=4, compile_modes=())
    report = db.run(config, out)
    assert "this step cannot decode" in report["steps"]["broken"]["error"]
    assert report["steps"]["study"]["sampler_ms"] > 0, "the step after a failed one was not measured"
    assert json.loads(out.read_text())["steps"]["broken"]["error"], "the failure is not in the written report"
    assert "broken" in db.format_table(report) and "failed" in db.format_table(report)

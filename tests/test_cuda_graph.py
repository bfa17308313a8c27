"""The fixed-shape decode step gives the eager decoder's logits; on a GPU its CUDA graph gives the same tokens."""
import pytest
import torch
from test_qwen3 import with_lora

from reward_density.data.problems import Problem
from reward_density.grpo.cuda_graph import GraphedDecoder, StaticDecoder
from reward_density.grpo.logprobs import position_ids_from_mask
from reward_density.grpo.qwen3 import Decoder, Qwen3Weights, make_decoder, weights_of
from reward_density.grpo.sampler import SamplingConfig, sample_rollout
from reward_density.tools.stand_ins import build_qwen3

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
PROBLEMS = [Problem("a", "Problem: 3 + 4 = ?\n", "7"), Problem("b", "Problem: 12 + 29 = ?\nStep 1:", "41")]


def _model(vocab: int, lora: bool, device: str = "cpu") -> torch.nn.Module:
    model = build_qwen3(vocab, seed=2)
    return (with_lora(model) if lora else model.eval()).to(device)


def _stacked(models: list[torch.nn.Module]) -> Qwen3Weights:
    """Several models' weights as arms of one stacked forward (as stacked.py builds them for adapters)."""
    arms = [weights_of(model) for model in models]
    layers = [{key: torch.cat([arm.layers[i][key] for arm in arms]) for key in arms[0].layers[0]}
              for i in range(len(arms[0].layers))]
    return Qwen3Weights(torch.cat([arm.embed for arm in arms]), layers, torch.cat([arm.norm for arm in arms]),
                        torch.cat([arm.lm_head for arm in arms]), arms[0].shape)


def _decode_side_by_side(decoders: list[Decoder], vocab: int, keep: list[int], device: str = "cpu") -> list[list]:
    """Each decoder's logits over 6 extended tokens from one left-padded batch of 4 rows: row 1 stops attending
    after two tokens and the rows in keep alone continue after the fourth (compaction). Every decoder is fed the
    first decoder's greedy tokens, so a rounding difference cannot make their inputs diverge."""
    torch.manual_seed(1)
    ids = torch.randint(3, vocab, (4, 7), device=device)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :1] = 0
    positions = position_ids_from_mask(mask)
    with torch.no_grad():
        logits = [decoder.prefill(ids, mask, positions) for decoder in decoders]
        seen, next_position = [logits], positions[:, -1:] + 1
        for step in range(6):
            token = logits[0].argmax(-1)
            attend = torch.ones_like(token, dtype=torch.bool)
            if step >= 2 and len(token) == 4:
                attend[1] = False
            logits = [decoder.extend(token, next_position + step, attend) for decoder in decoders]
            seen.append(logits)
            if step == 3:
                rows = torch.tensor(keep, device=device)
                for decoder in decoders:
                    decoder.keep_rows(rows)
                logits, next_position = [x[rows] for x in logits], next_position[rows]
    return seen


@pytest.mark.parametrize("lora", [False, True])
def test_the_fixed_shape_step_gives_the_eager_decoders_logits(tiny_tokenizer, lora):
    """Attending over the whole cache under a mask changes only the order of floating-point sums."""
    model = _model(len(tiny_tokenizer), lora)
    decoders = [make_decoder(model, 4, 13, kind) for kind in (Decoder, StaticDecoder)]
    for token, (eager, static) in enumerate(_decode_side_by_side(decoders, len(tiny_tokenizer), [3, 0, 2])):
        torch.testing.assert_close(static, eager, atol=2e-5, rtol=1e-4, msg=f"logits differ at token {token}")


def test_the_fixed_shape_step_gives_the_eager_decoders_logits_for_stacked_arms(tiny_tokenizer):
    """Two arms of two rows each (arm-major), compacted to one row per arm."""
    weights = _stacked([_model(len(tiny_tokenizer), lora=False), _model(len(tiny_tokenizer), lora=True)])
    decoders = [kind(weights, 2, 13) for kind in (Decoder, StaticDecoder)]
    for token, (eager, static) in enumerate(_decode_side_by_side(decoders, len(tiny_tokenizer), [1, 3])):
        torch.testing.assert_close(static, eager, atol=2e-5, rtol=1e-4, msg=f"logits differ at token {token}")


@needs_cuda
@pytest.mark.parametrize("lora", [False, True])
def test_the_cuda_graph_replays_the_fixed_shape_step(tiny_tokenizer, lora):
    model = _model(len(tiny_tokenizer), lora, "cuda")
    decoders = [make_decoder(model, 4, 13, kind) for kind in (StaticDecoder, GraphedDecoder)]
    for token, (static, graphed) in enumerate(_decode_side_by_side(decoders, len(tiny_tokenizer), [3, 0, 2], "cuda")):
        torch.testing.assert_close(graphed, static, atol=1e-5, rtol=1e-5, msg=f"logits differ at token {token}")


@needs_cuda
def test_sampling_with_cuda_graphs_draws_the_eager_tokens(tiny_tokenizer):
    """The sampler's default on a GPU: the same completions as without graphs (in float32, where the two steps'
    different summation orders stay far below any draw's margin), log-probs within rounding."""
    model = _model(len(tiny_tokenizer), lora=True, device="cuda")
    eager, graphed = (sample_rollout(model, tiny_tokenizer, PROBLEMS, 4, SamplingConfig(12, temperature=1.0,
                                                                                       cuda_graphs=graphs), seed=5)
                      for graphs in (False, True))
    assert torch.equal(graphed.completion_ids, eager.completion_ids), "graphs must not change what is drawn"
    torch.testing.assert_close(graphed.sampler_logps, eager.sampler_logps, atol=1e-4, rtol=0)

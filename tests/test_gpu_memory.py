"""The GPU memory estimate counts the same parameters the models have, and the paper cell fits an 80 GB GPU."""
import pytest
from peft import LoraConfig, get_peft_model

from reward_density.experiment.profiles import REPO_ROOT, load_profile
from reward_density.tools.gpu_memory import QWEN3_1_7B, DecoderShape, memory_table, student_memory
from reward_density.tools.stand_ins import build_tokenizer
from reward_density.world.architectures import ModelSpec, new_mistral, new_qwen3


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_matches_a_real_qwen3(tokenizer, tied):
    model = new_qwen3(ModelSpec(32, 2), tokenizer, seed=0, tie_word_embeddings=tied)
    assert DecoderShape.of(model.config).parameters() == sum(p.numel() for p in model.parameters())


def test_parameter_count_matches_a_real_mistral(tokenizer):
    model = new_mistral(ModelSpec(32, 2), tokenizer, seed=0)
    assert DecoderShape.of(model.config).parameters() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("rank", [1, 8])
def test_lora_count_matches_peft_all_linear(tokenizer, rank):
    model = new_qwen3(ModelSpec(32, 2), tokenizer, seed=0, tie_word_embeddings=True)
    shape = DecoderShape.of(model.config)
    peft_model = get_peft_model(model, LoraConfig(r=rank, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert shape.lora_parameters(rank) == trainable


def test_the_paper_cell_fits_an_80_gb_gpu_in_every_arm():
    cell = load_profile(REPO_ROOT / "params" / "paper.yaml").cell
    for rank in (None, 256, 1):
        peak = student_memory(cell, rank)["peak"]
        assert 10 < peak < 0.9 * 80 * 1e9 / 2**30, f"rank {rank}: estimated peak {peak:.1f} GiB"
    assert student_memory(cell, None)["peak"] > student_memory(cell, 256)["peak"] > student_memory(cell, 1)["peak"]
    assert "Second GPU: teacher Qwen3-8B" in memory_table(cell, [None, 256])


def test_a_fullft_cell_that_tracks_kl_at_beta_0_is_estimated_with_its_reference_copy():
    cell = load_profile(REPO_ROOT / "params" / "paper.yaml").cell | {"beta": 0.0}
    tracked = student_memory(cell | {"track_kl": True}, None)["reference copy"]
    assert tracked > 1, "cell.py keeps a reference to track KL at beta 0; the estimate left it out"
    assert student_memory(cell | {"track_kl": False}, None)["reference copy"] == 0


def test_a_profile_without_a_micro_batch_size_is_estimated_on_its_whole_batch():
    cell = load_profile(REPO_ROOT / "params" / "mini.yaml").cell
    assert cell["micro_batch_size"] is None
    whole = student_memory(cell, 1)
    assert whole["activations (one micro-batch)"] == student_memory(
        cell | {"micro_batch_size": cell["prompts_per_step"] * cell["group_size"]}, 1)["activations (one micro-batch)"]
    assert "Second GPU" in memory_table(cell, [None, 1])


def test_an_fp32_cell_holds_its_caches_and_activations_at_four_bytes_a_value():
    cell = load_profile(REPO_ROOT / "params" / "paper.yaml").cell
    assert cell["precision"] == "bf16"
    mixed, full = student_memory(cell, 1), student_memory(cell | {"precision": "fp32"}, 1)
    for part in ("KV cache while sampling", "KV cache while evaluating", "activations (one micro-batch)"):
        assert full[part] == pytest.approx(2 * mixed[part]), f"{part}: counted at 2 bytes a value in fp32"


def test_a_bf16_fullft_cell_caches_fp32_keys_beside_bf16_values_and_a_lora_cell_bf16_both():
    cell = load_profile(REPO_ROOT / "params" / "paper.yaml").cell
    full, lora = student_memory(cell, None), student_memory(cell, 1)
    for part in ("KV cache while sampling", "KV cache while evaluating"):
        assert full[part] == pytest.approx(1.5 * lora[part]), f"{part}: FullFT's fp32 keys (its k_norm is fp32)"


def test_an_fp32_lora_cell_holds_a_copy_of_the_base_while_sampling_and_its_fp32_logits_are_not_copied():
    cell = load_profile(REPO_ROOT / "params" / "paper.yaml").cell | {"precision": "fp32"}
    lora, full = student_memory(cell, 1), student_memory(cell, None)
    shape = QWEN3_1_7B  # the paper's student, student_memory's default
    assert lora["weights as the sampler reads them"] == pytest.approx(shape.linear_weights() * 4 / 2**30), \
        "Policy.sampling keeps an fp32 copy of the base's linear layers to restore them after merging the adapter"
    assert full["weights as the sampler reads them"] == 0, "FullFT samples from its fp32 parameters themselves"
    rows, completion = cell["micro_batch_size"], cell["max_new_tokens"]
    assert lora["logits (one micro-batch)"] == pytest.approx(rows * completion * shape.vocab * 3 * 4 / 2**30), \
        "fp32 logits, their tempered copy and the softmax: .float() makes no copy of fp32 logits"

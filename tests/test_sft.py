"""The SFT control's step: the same update however many problems each forward pass takes, and its forward passes
under the precision's autocast, as the GRPO step's are."""
import pytest
import torch

from reward_density.data.answer_check import make_checker
from reward_density.experiment import cell
from reward_density.experiment.profiles import cell_config, find_profile, load_profile
from reward_density.experiment.sft import sft_step


def sft_arm(smoke_project, rank, **settings):
    """A smoke SFT arm's config, policy, optimizer, tokenizer and first batch of training problems."""
    config = cell_config(load_profile(find_profile("smoke", smoke_project)), "sft", rank, 0, root=smoke_project,
                         **({"engine": "peft"} | settings))
    checker = make_checker(config.answer_format)
    try:
        inputs = cell.load_inputs(config, checker)
    finally:
        checker.close()
    policy = cell.make_policy([config], inputs.student)
    return config, policy, cell.make_optimizer([config], policy), inputs.tokenizer, inputs.train[:4]


@pytest.mark.parametrize("rank", [None, 1])
def test_one_problem_at_a_time_gives_the_whole_batchs_loss_and_gradients(smoke_project, rank):
    results = []
    for size in (None, 1):
        config, policy, optimizer, tokenizer, problems = sft_arm(smoke_project, rank)
        optimizer.step = lambda: None  # compare the gradients before any update
        row = sft_step(policy, tokenizer, optimizer, problems, config.max_grad_norm, micro_batch_size=size)[0]
        results.append((row, [p.grad.clone() for p in policy.parameters(0)]))
    (whole, whole_grads), (parts, part_grads) = results
    assert parts["loss"] == pytest.approx(whole["loss"], rel=1e-5) and parts["tokens"] == whole["tokens"]
    for a, b in zip(whole_grads, part_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg="micro-batches changed the gradient")


def test_the_forward_passes_run_under_bf16_autocast_when_the_cell_asks_for_it(smoke_project, monkeypatch):
    config, policy, optimizer, tokenizer, problems = sft_arm(smoke_project, None, precision="bf16")
    enabled, logprobs = [], policy.logprobs
    monkeypatch.setattr(policy, "logprobs", lambda *a, **k: enabled.append(torch.is_autocast_enabled("cpu"))
                        or logprobs(*a, **k))
    sft_step(policy, tokenizer, optimizer, problems, config.max_grad_norm, config.precision, micro_batch_size=2)
    assert enabled == [True, True], "the FullFT arm trained in fp32 while its LoRA arms ran a bf16 base"


@pytest.mark.parametrize("setting", [{"l2": 0.1}, {"token_alpha": 2, "token_k": 8, "token_p": 0.5},
                                     {"replay_successes": 2}], ids=["l2", "token rule", "replay"])
def test_an_rl_methods_setting_on_an_sft_cell_is_refused_rather_than_recorded_and_ignored(setting):
    with pytest.raises(ValueError, match=f"regime sft takes supervised steps, which read none of the RL methods' "
                                         f"{next(iter(setting))}"):
        cell_config(load_profile(find_profile("smoke")), "sft", 1, 0, engine="peft", **setting)


def test_an_sft_step_draws_sft_batch_size_solutions_and_full_ft_keeps_no_reference(smoke_project):
    profile = load_profile(find_profile("smoke"))
    assert cell_config(profile, "sft", 1, 0, sft_batch_size=3).problems_per_step == 3
    assert cell_config(profile, "sft", 1, 0).problems_per_step == 2 * 2, "unset: P x G solutions"
    assert cell_config(profile, "outcome", 1, 0, sft_batch_size=3).problems_per_step == 2, "RL draws P prompts"
    _, policy, *_ = sft_arm(smoke_project, None)
    assert not policy.has_reference, "an SFT cell has no KL term, so no frozen copy of the student"

"""Several policies of one Qwen3 base trained side by side, in one batched pass (the mini world's engine).

Each arm is what `Policy` would hold for its config: a LoRA adapter of its rank on every linear layer
(initialised exactly as peft initialises it, from the same seed) over the frozen base, or a full copy
of the model (full fine-tuning). Their forward passes run through one stacked Qwen3 forward (qwen3.py):
a LoRA linear of arm a applies W + (alpha / r) B A, so the arms share every kernel launch, which is what
costs at hidden size 128; each arm's gradient reaches only its own parameters. The reference policy of
every arm is the base (LoRA: the adapter disabled; FullFT: the frozen initial weights).

Supported: Qwen3 students (SiLU, no attention dropout), fp32, no LoRA dropout, on a CPU, without gradient
checkpointing or replay; anything else is refused (by the profile check or here) and runs with `engine: peft`
(`Policy`, one arm at a time).
`tests/test_stacked.py` pins each arm's log-probs, loss and gradients to its own peft `Policy`.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from peft.tuners.lora import LoraLayer

from .logprobs import token_logprobs
from .packing import pack
from .policy import Policy, PolicyConfig
from .qwen3 import LINEARS, NORMS, Qwen3Weights, forward, has_dropout, supports, weights_of
from .rollout import Rollout

LINEAR_NAMES = [name for names in LINEARS.values() for name in names]


def check_stackable(base: torch.nn.Module, configs: Sequence[PolicyConfig]) -> None:
    """Raise ValueError naming what the stacked engine cannot do for these arms."""
    if not supports(base) or has_dropout(base):  # the base is checked in eval mode; the arms train
        raise ValueError("the stacked engine needs a plain Qwen3 student without dropout (use engine: peft for other "
                         "models)")
    for config in configs:
        if config.precision != "fp32" or config.dropout or config.gradient_checkpointing:
            raise ValueError(f"the stacked engine runs fp32 without LoRA dropout or checkpointing; got {config}")
        if config.target_modules != "all-linear":
            raise ValueError(f"the stacked engine puts LoRA on all linear layers; got {config.target_modules!r}")


class StackedPolicy:
    """The arms' trainable weights over one frozen base, and their stacked forward."""

    def __init__(self, base: torch.nn.Module, configs: Sequence[PolicyConfig], seed: int) -> None:
        check_stackable(base, configs)
        self.configs = list(configs)
        base = base.float().eval()
        self.base = _detached(weights_of(base))
        self.tied = bool(base.config.tie_word_embeddings)
        self.arms = [self._lora_arm(base, c, seed) if c.is_lora else self._full_arm() for c in self.configs]

    # ------------------------------------------------------------------ construction

    def _lora_arm(self, base: torch.nn.Module, config: PolicyConfig, seed: int) -> dict:
        """A and B of every linear layer, taken from the peft model Policy would build from this seed."""
        torch.manual_seed(seed)
        peft_model = Policy(copy.deepcopy(base), config, keep_reference=False).model
        layers = []
        for layer in peft_model.get_base_model().model.layers:
            adapters = {}
            for block, names in LINEARS.items():
                for name in names:
                    lora = getattr(getattr(layer, block), name)
                    assert isinstance(lora, LoraLayer), f"{block}.{name} has no LoRA adapter"
                    adapters[name] = (torch.nn.Parameter(lora.lora_A["default"].weight.detach().clone()),
                                      torch.nn.Parameter(lora.lora_B["default"].weight.detach().clone()),
                                      lora.scaling["default"])
            layers.append(adapters)
        return {"lora": layers}

    def _full_arm(self) -> dict:
        """A trainable copy of every base tensor (the lm_head shares the embedding when they are tied)."""
        def copy_of(tensor: torch.Tensor) -> torch.nn.Parameter:
            return torch.nn.Parameter(tensor[0].detach().clone())

        embed = copy_of(self.base.embed)
        return {
            "embed": embed,
            "lm_head": embed if self.tied else copy_of(self.base.lm_head),
            "norm": copy_of(self.base.norm),
            "layers": [{key: copy_of(value) for key, value in layer.items()} for layer in self.base.layers],
        }

    # ------------------------------------------------------------------ parameters

    @property
    def n_arms(self) -> int:
        return len(self.arms)

    def named_parameters(self, arm: int) -> dict[str, torch.nn.Parameter]:
        """The trainable parameters of one arm under the names transformers gives them (peft's without its
        wrapper prefix): no two arms share one."""
        spec, named = self.arms[arm], {}
        for index in range(len(self.base.layers)):
            prefix = f"model.layers.{index}"
            for block, names in LINEARS.items():
                for name in names:
                    if "lora" in spec:
                        a, b, _ = spec["lora"][index][name]
                        named |= {f"{prefix}.{block}.{name}.lora_A": a, f"{prefix}.{block}.{name}.lora_B": b}
                    else:
                        named[f"{prefix}.{block}.{name}.weight"] = spec["layers"][index][name]
            if "lora" not in spec:
                named |= {f"{prefix}.{path}.weight": spec["layers"][index][key] for key, path in NORMS.items()}
        if "lora" not in spec:
            named |= {"model.embed_tokens.weight": spec["embed"], "model.norm.weight": spec["norm"]}
            if not self.tied:
                named["lm_head.weight"] = spec["lm_head"]
        return named

    def parameters(self, arm: int) -> list[torch.nn.Parameter]:
        """The trainable parameters of one arm."""
        return list(self.named_parameters(arm).values())

    # ------------------------------------------------------------------ weights

    def weights(self) -> Qwen3Weights:
        """The stacked weights of every arm, differentiable with respect to each arm's parameters."""
        base = self.base
        layers = []
        for index, base_layer in enumerate(base.layers):
            layer = {}
            for key, base_value in base_layer.items():
                layer[key] = torch.stack([self._layer_tensor(spec, index, key, base_value[0]) for spec in self.arms])
            layers.append(layer)
        return Qwen3Weights(
            embed=self._stack("embed", base.embed[0]),
            layers=layers,
            norm=self._stack("norm", base.norm[0]),
            lm_head=self._stack("lm_head", base.lm_head[0]),
            shape=base.shape,
            ends=base.ends,
        )

    def _stack(self, key: str, base_value: torch.Tensor) -> torch.Tensor:
        """One of the model-level tensors (embed, norm, lm_head), per arm: frozen under LoRA."""
        return torch.stack([base_value if "lora" in spec else spec[key] for spec in self.arms])

    @staticmethod
    def _layer_tensor(spec: dict, index: int, key: str, base_value: torch.Tensor) -> torch.Tensor:
        if "lora" not in spec:
            return spec["layers"][index][key]
        if key not in LINEAR_NAMES:
            return base_value  # norms stay frozen under LoRA
        a, b, scale = spec["lora"][index][key]
        return base_value + scale * (b @ a)

    # ------------------------------------------------------------------ log-probs

    def logprobs(self, rollout: Rollout, temperature: float) -> torch.Tensor:
        """log pi_arm of each row's completion tokens at the temperature, [A * N, T], with gradients."""
        return completion_logprobs(self.weights(), rollout, temperature)

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout, temperature: float) -> torch.Tensor:
        """log pi_ref (the base) of every row's completion tokens, [A * N, T].

        The base is repeated once per arm (views, no copies), so the rows pack exactly as in the policy's pass: an
        arm at the base then scores log pi - log pi_ref = 0 exactly, as its peft Policy does. Packed as one arm,
        every arm but the first rounded differently, and the paper's KL estimator, clamped at 0, dropped the
        tokens whose round-off came out negative."""
        return completion_logprobs(_repeated(self.base, self.n_arms), rollout, temperature)


def _mapped(weights: Qwen3Weights, function: Callable[[torch.Tensor], torch.Tensor]) -> Qwen3Weights:
    """The weights with function applied to every tensor."""
    layers = [{key: function(value) for key, value in layer.items()} for layer in weights.layers]
    return Qwen3Weights(function(weights.embed), layers, function(weights.norm), function(weights.lm_head),
                        weights.shape, weights.ends)


def _repeated(weights: Qwen3Weights, arms: int) -> Qwen3Weights:
    """One-arm weights as `arms` identical arms (expanded views)."""
    return _mapped(weights, lambda tensor: tensor.expand(arms, *tensor.shape[1:]))


def _detached(weights: Qwen3Weights) -> Qwen3Weights:
    """The same weights with no autograd history (the frozen base)."""
    return _mapped(weights, lambda tensor: tensor.detach().clone())


def completion_logprobs(weights: Qwen3Weights, rollout: Rollout, temperature: float) -> torch.Tensor:
    """Per-token log-probs of the completions under the stacked weights, [A * N, T], 0 on padding.

    The rows are arm-major (qwen3.py): with A arms, rows a*N..a*N+N-1 are arm a's; a one-arm weights
    (the base) scores every row. The forward runs over the rows' real tokens packed (packing.py).
    """
    packed = pack(rollout, weights)
    logits = forward(weights, packed.ids, packed.real, packed.positions, keep=packed.keep, allowed=packed.allowed)
    logits = logits.float() / temperature
    logps = token_logprobs(logits, packed.targets) * packed.target_real
    out = torch.zeros(rollout.completion_ids.shape, dtype=logps.dtype)
    out = out.index_put((packed.rows, packed.columns), logps[packed.target_real])
    return out * rollout.completion_mask

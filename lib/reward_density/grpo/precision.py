"""Numeric precision of a run: fp32 throughout, or bf16 autocast over fp32 trainable weights.

Under "bf16", forward passes run in bf16 autocast; weights that are never updated (the LoRA base, the
FullFT reference copy, the teacher, the PRM) are stored in bf16, and every trained weight (LoRA adapters,
the FullFT master weights) stays fp32 so that small updates are not rounded away.
"""
from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str) -> str:
    """The precision itself, or a ValueError naming the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    return precision


def stored_in(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The model with its parameters cast to dtype, its buffers left as they are. from_pretrained keeps a bf16
    model's rotary inv_freq in fp32, and Module.to would round it: at Qwen3-1.7B's settings a phase error of
    about 2 radians 1,700 positions apart, in LoRA arms and the FullFT reference but not the fp32 FullFT policy."""
    for parameter in model.parameters():
        parameter.data = parameter.data.to(dtype)
    return model


def frozen_dtype(precision: str) -> torch.dtype:
    """Storage dtype of weights that are never updated."""
    return torch.bfloat16 if check_precision(precision) == "bf16" else torch.float32


def autocast(device: str | torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on the device's type under "bf16"; no change under "fp32"."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)

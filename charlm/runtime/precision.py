"""What a run computes in: the dtype (`auto` is `charlm.runtime.profile`'s), the weights' dtype
for decoding, autocast, the GradScaler and `torch.compile`, tried once."""

from __future__ import annotations

import contextlib

import torch

from charlm.core.errors import CharlmError, Setting, SettingError, first_line


def cuda_has_bf16(device: torch.device) -> bool:
    """Whether this GPU computes in bf16 natively: Ampere and later, or ROCm
    (`torch.cuda.is_bf16_supported()` says yes on a V100 or T4, which emulate it)."""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype of a resolved `train.dtype`."""
    dtype = DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise CharlmError(
            "train.dtype float16 is not supported on the CPU; use bfloat16 or float32"
        )
    return dtype


def weights_dtype(name: str) -> torch.dtype:
    """The dtype of a loaded model's weights (`--dtype`): bf16 and fp16 halve the bytes a decode
    step streams, at the cost of rounding; logits are sampled in float32 either way."""
    if name not in DTYPES:
        raise SettingError(Setting("dtype"), f" must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass; weights stay fp32 (the master copy)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def compile_model(model: torch.nn.Module, example: tuple[torch.Tensor, ...],
                  device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, str | None]:
    """`torch.compile(model)` tried at once on `example`, so a backend that cannot build here
    fails now, not mid-run: (compiled, None), or (model, a one-line reason). The probe leaves
    no gradients and draws no random numbers."""
    try:
        compiled = torch.compile(model)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            # separate contiguous tensors, as the samplers return: dynamo guards on that
            with autocast(device, dtype):
                _, loss = compiled(*example)
            loss.backward()
        return compiled, None
    except Exception as e:  # any failure: compile is an optimisation, never a requirement
        return model, first_line(e)
    finally:
        model.zero_grad(set_to_none=True)


def grad_scaler(device: torch.device, dtype: torch.dtype) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (bf16 and fp32 need no loss scaling)."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

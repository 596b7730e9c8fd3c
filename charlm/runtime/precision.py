"""What a run computes in: a resolved `train.dtype` (`auto` is `charlm.runtime.profile`'s to
decide), the weights' dtype for decoding, autocast, the GradScaler (fp16 only) and
`torch.compile` of a model, tried once and reported when it fails."""

from __future__ import annotations

import contextlib

import torch

from charlm.core.errors import CharlmError, Setting, SettingError, first_line


def cuda_has_bf16(device: torch.device) -> bool:
    """Whether this GPU computes in bf16 natively: Ampere (compute capability 8) and later, or
    ROCm. (`torch.cuda.is_bf16_supported()` also says yes on a V100 or T4, which only emulate
    it, slowly, and it asks about the current GPU rather than `device`.)"""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype for autocast of a `train.dtype` that the profile has resolved
    (`charlm.runtime.profile`: `auto` is its to decide)."""
    dtype = DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise CharlmError(
            "train.dtype float16 is not supported on the CPU; use bfloat16 or float32"
        )
    return dtype


def weights_dtype(name: str) -> torch.dtype:
    """The dtype a loaded model's weights are cast to for sampling and scoring (`--dtype`).

    float32 is the model as trained. bfloat16 and float16 halve the bytes a decode step streams
    from memory, which bounds batch-1 decoding: faster on any CPU or GPU, at the cost of
    rounding the weights and activations (float16 keeps 3 more mantissa bits than bfloat16).
    Logits are sampled in float32 either way."""
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
    """`torch.compile(model)`, tried out at once: one forward and backward of `example` (a
    training batch's shapes, in zeros) under the training autocast, so a backend that cannot
    build here (no C++ compiler, an unsupported device or op) fails now rather than mid-run.
    Returns (compiled model, None), or (model, a one-line reason) to train without compile. The
    probe leaves no gradients and draws no random numbers; its graph is the one training then
    reuses."""
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

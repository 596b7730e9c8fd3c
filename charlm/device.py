"""Devices and numerics: resolve `auto`, pick the AMP dtype, build the autocast context and the
GradScaler (fp16 only), and seed every RNG."""

from __future__ import annotations

import contextlib
import random

import torch

from charlm.errors import CharlmError


def resolve_device(name: str) -> torch.device:
    """`auto` picks cuda > mps > cpu; an explicit device that is missing is an error."""
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if has_mps else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise CharlmError(
            "train.device is 'cuda' but no CUDA GPU is available to this torch build; "
            "use --set train.device=cpu (or auto), or install a CUDA build of torch"
        )
    if name == "mps" and not has_mps:
        raise CharlmError("train.device is 'mps' but MPS is not available; use cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype for autocast. `auto`: bf16 on CUDA where supported, else fp16;
    float32 on CPU and MPS."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise CharlmError(
            "train.dtype float16 is not supported on the CPU; use bfloat16 or float32"
        )
    return dtype


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass; weights stay fp32 (the master copy)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, dtype: torch.dtype) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (bf16 and fp32 need no loss scaling)."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device

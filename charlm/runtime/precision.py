"""What a run computes in: the dtype `auto` resolves to (bf16 where the CPU or GPU computes it
natively and faster), the weights' dtype for decoding, autocast, the GradScaler (fp16 only) and
`torch.compile` of a model, tried once and reported when it fails."""

from __future__ import annotations

import contextlib
import functools
import time

import torch

from charlm.core.errors import CharlmError, first_line


def cpu_bf16_unit() -> str | None:
    """What multiplies bf16 matrices in hardware on this CPU, or None where bf16 is emulated:
    "AMX" (tiles; Intel Sapphire Rapids and later) or "AVX512_BF16" (bf16 dot products; AMD
    Zen 4 and later, Intel Cooper Lake). Where neither is, bf16 is emulated, far slower than
    float32."""
    for unit, probe in (("AMX", "_is_amx_tile_supported"),
                        ("AVX512_BF16", "_is_avx512_bf16_supported")):
        supported = getattr(torch.cpu, probe, None)
        if supported and supported():
            return unit
    return None


BF16_GAIN = 1.5  # bf16 products must run this many times float32's speed for autocast to pay
PROBE_N, PROBE_REPEATS = 768, 3


@functools.cache
def cpu_bf16_speedup() -> float:
    """How many times float32's speed this CPU multiplies bf16 matrices at: the best of
    PROBE_REPEATS products of PROBE_N-square matrices in each dtype, on torch's threads (about
    0.1 s, once a process). A unit in the flags is not enough: a Zen 5 EPYC's AVX512_BF16 ran at
    4.1x float32, an Intel Xeon's (no AMX) at 0.56x. Draws nothing from the random streams."""
    with torch.random.fork_rng(devices=[]):
        a = torch.randn(PROBE_N, PROBE_N)

    def seconds(dtype: torch.dtype) -> float:
        x = a.to(dtype)
        torch.mm(x, x)  # the first call's one-off costs
        times = []
        for _ in range(PROBE_REPEATS):
            start = time.perf_counter()
            torch.mm(x, x)
            times.append(time.perf_counter() - start)
        return min(times)

    return seconds(torch.float32) / seconds(torch.bfloat16)


def cuda_has_bf16(device: torch.device) -> bool:
    """Whether this GPU computes in bf16 natively: Ampere (compute capability 8) and later, or
    ROCm. (`torch.cuda.is_bf16_supported()` also says yes on a V100 or T4, which only emulate
    it, slowly, and it asks about the current GPU rather than `device`.)"""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


def precision_line(device: torch.device, dtype: torch.dtype, setting: str) -> str:
    """What a run computes in, said once as it starts: `train.dtype: auto` (`setting`) differs
    from one machine to the next (on a CPU with AMX or AVX512_BF16, bf16 where it measured
    faster)."""
    how = str(dtype).removeprefix("torch.")
    how = how if dtype == torch.float32 else f"{how} autocast"
    why = ""
    if setting == "auto" and device.type == "cpu" and (unit := cpu_bf16_unit()):
        why = f": {unit} multiplies bf16 at {cpu_bf16_speedup():.2f}x float32's speed here"
    return f"training on {device} in {how} (train.dtype: {setting}{why})"


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype for autocast. `auto`: bf16 on a GPU that has it natively, else fp16 with
    a GradScaler; on a CPU that multiplies bf16 in hardware (`cpu_bf16_unit`) at least
    BF16_GAIN times float32's speed, measured (`cpu_bf16_speedup`), bf16 (faster per step
    there, with the same loss curve); float32 on other CPUs and on MPS."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if cuda_has_bf16(device) else torch.float16
        if device.type == "cpu" and cpu_bf16_unit() and cpu_bf16_speedup() >= BF16_GAIN:
            return torch.bfloat16
        return torch.float32
    dtype = DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise CharlmError(
            "train.dtype float16 is not supported on the CPU; use bfloat16 or float32"
        )
    return dtype


def weights_dtype(name: str, option: str = "dtype") -> torch.dtype:
    """The dtype a loaded model's weights are cast to for sampling and scoring (`--dtype`).

    float32 is the model as trained. bfloat16 and float16 halve the bytes a decode step streams
    from memory, which bounds batch-1 decoding: faster on any CPU or GPU, at the cost of
    rounding the weights and activations (float16 keeps 3 more mantissa bits than bfloat16).
    Logits are sampled in float32 either way."""
    if name not in DTYPES:
        raise CharlmError(f"{option} must be one of {', '.join(DTYPES)}, got {name!r}")
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

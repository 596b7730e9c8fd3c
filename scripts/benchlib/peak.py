"""The peak FLOP/s that `bench.py train`'s MFU divides by: for a known GPU its bf16 dense peak
from a table; on a CPU a matmul probe in the dtype the CPU computes natively, as charlm's
`dtype: auto` decides (bf16 where AMX or AVX512_BF16 computes it, else float32: emulated bf16
is slow and no peak to aim at). The probe grows its n x n x n matmul until one takes about
0.2 s, then keeps the best of three, so it ends in a second or two on any CPU."""

from __future__ import annotations

import time

import torch
from common import cpu_native_dtype

# bf16 dense (no sparsity) per GPU, from NVIDIA's datasheets. The first key found in the device
# name wins, so the PCIe and NVL cards (fewer SMs or lower clocks) come before the SXM parts.
GPU_PEAK_BF16 = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12,
                 "A100": 312e12, "H100": 989e12, "H200": 989e12}


def matmul_seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    """The wall time of one `a @ b` (on the CPU, where the result is ready when it returns)."""
    t = time.perf_counter()
    a @ b
    return time.perf_counter() - t


def cpu_peak(dtype: torch.dtype, target_s: float = 0.2, repeats: int = 3,
             max_n: int = 8192) -> tuple[float, int]:
    """(FLOP/s, n): the best of `repeats` n x n x n matmuls in `dtype` on this CPU, n grown from
    256 (in multiples of 64, at most doubling, as the last time predicts) until one matmul takes
    about `target_s`, so a slow CPU gets a small probe rather than one that runs for minutes."""
    n = 256
    while True:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b  # warm-up: threads, packing buffers
        seconds = matmul_seconds(a, b)
        if seconds >= target_s / 2 or n >= max_n:
            break
        grow = (target_s / max(seconds, 1e-9)) ** (1 / 3)  # time grows as n^3
        n = min(max_n, 64 * round(n * min(grow, 2.0) / 64))
    best = min([seconds] + [matmul_seconds(a, b) for _ in range(repeats - 1)])
    return 2 * n**3 / best, n


def gpu_peak(name: str) -> tuple[float | None, str]:
    """The bf16 dense peak of the GPU called `name` (torch.cuda.get_device_name), from the table."""
    for key, peak in GPU_PEAK_BF16.items():
        if key in name:
            return peak, f"{key} bf16 dense (table)"
    return None, f"{name}: not in the table"


def device_peak(device: torch.device) -> tuple[float | None, torch.dtype, str]:
    """(peak FLOP/s, its dtype, where it comes from): bf16 from the table for a GPU; on a CPU
    measured in its native dtype (`cpu_native_dtype`, charlm's `dtype: auto`)."""
    if device.type == "cuda":
        peak, source = gpu_peak(torch.cuda.get_device_name(device))
        return peak, torch.bfloat16, source
    dtype = cpu_native_dtype()
    peak, n = cpu_peak(dtype)
    name = str(dtype).removeprefix("torch.")
    return peak, dtype, f"cpu {name} {n}^3 matmul probe, best of 3"


def peaks(device: torch.device) -> tuple[float | None, float | None, dict]:
    """(peak FLOP/s, float32 peak FLOP/s, their facts as `bench.py train` reports them): the
    native peak, and on a CPU the float32 one too (probed once, whichever the native dtype)."""
    peak, dtype, source = device_peak(device)
    fp32 = None
    if device.type == "cpu":
        fp32 = peak if dtype == torch.float32 else cpu_peak(torch.float32)[0]
    return peak, fp32, {"peak_dtype": str(dtype).removeprefix("torch."),
                        "peak_tflops": round(peak / 1e12, 3) if peak else None,
                        "peak_source": source,
                        "fp32_peak_tflops": round(fp32 / 1e12, 3) if fp32 else None}

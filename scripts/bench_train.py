"""Benchmark training throughput: steady-state ms/step, tokens/s and MFU, as one JSON line that
opens with the machine's facts (CPU model, cores, torch threads and version).

    python scripts/bench_train.py CONFIG [--steps 50] [--warmup 10] [--seconds 30]
        [--set section.key=value ...]

It builds exactly what `charlm train` builds (model, AdamW, batch sampler, autocast) and times
`train_step` after a warm-up, on the config's data (tiny-shakespeare by default). The warm-up and
the timed steps each stop after --seconds (at least one step each), so a config too large for
the machine ends in bounded time: about twice --seconds, plus one step of each, the peak probe,
and building the model (compiling it too where the config sets train.compile: minutes on a slow
CPU, which `--set train.compile=false` skips); `steps` in the output says how many were timed.
FLOPs per token follow the PaLM appendix: 6N + 12 * n_layer * n_embd * block_size (see
charlm.summary).

MFU is relative to the dense peak named by `peak_dtype`: for a known GPU its bf16 peak from a
table; on a CPU a matmul probe in the dtype the CPU computes natively, as `dtype: auto` decides
(bf16 where AMX or AVX512_BF16 computes it, else float32: emulated bf16 is slow and no peak to
aim at). The probe grows its n x n x n matmul until one takes about 0.2 s, then keeps the best of
three, so it ends in a second or two on any CPU. On a CPU the MFU against the float32 peak is
printed too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import cpu_native_dtype, machine_facts, positive, run_script, summary

from charlm.config.loading import load_config
from charlm.config.schema import RunConfig
from charlm.data.batches import BatchSampler
from charlm.data.dataset import Dataset, dataset_for
from charlm.info.parameters import flops_per_token, parameter_table
from charlm.model.gpt import GPT
from charlm.runtime.device import resolve_device
from charlm.runtime.precision import compile_model, grad_scaler, resolve_dtype
from charlm.training.loop import train_step
from charlm.training.optimizer import make_optimizer

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


def benchmark(cfg: RunConfig, data: Dataset, steps: int, warmup: int,
              seconds: float = float("inf")) -> dict:
    """Time `steps` training steps of `cfg` on `data` after `warmup` untimed ones; the warm-up
    and the timed steps each stop early (after at least one step) once `seconds` have passed."""
    device = resolve_device(cfg.train.device)
    dtype = resolve_dtype(cfg.train.dtype, device)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model, len(data.vocab)).to(device)
    step_model = model
    if cfg.train.compile:
        example = tuple(torch.zeros(cfg.train.batch_size, cfg.model.block_size, dtype=torch.long,
                                    device=device) for _ in "xy")
        step_model, failure = compile_model(model, example, device, dtype)
        if failure:
            print(f"warning: torch.compile failed ({failure}); timing without compile",
                  file=sys.stderr)
    optimizer = make_optimizer(model, cfg.optim)
    scaler = grad_scaler(device, dtype)
    sampler = BatchSampler(data.train, cfg.model.block_size, cfg.train.batch_size, device, 0)

    def run(n: int) -> tuple[int, float]:
        """(steps run, seconds): `n` steps, or fewer once `seconds` have passed."""
        t = time.perf_counter()
        done = 0
        while done < n and (done == 0 or time.perf_counter() - t < seconds):
            loss, _, _ = train_step(step_model, optimizer, scaler, sampler, cfg, device, dtype)
            done += 1
        loss.item()  # wait for the device
        if device.type == "cuda":
            torch.cuda.synchronize()
        return done, time.perf_counter() - t

    warmed = run(warmup)[0] if warmup else 0
    timed, elapsed = run(steps)
    tokens_per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.block_size
    tokens_per_s = timed * tokens_per_step / elapsed
    flops = flops_per_token(parameter_table(model), cfg.model, len(data.vocab))["training"]
    peak, peak_dtype, peak_source = device_peak(device)
    fp32_peak = None
    if device.type == "cpu":  # the float32 probe once, whichever the native dtype
        fp32_peak = peak if peak_dtype == torch.float32 else cpu_peak(torch.float32)[0]
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."), "compile": step_model is not model,
        "threads": torch.get_num_threads(), "warmup_steps": warmed, "steps": timed,
        "tokens_per_step": tokens_per_step,
        "ms_per_step": round(1000 * elapsed / timed, 2),
        "tokens_per_s": round(tokens_per_s), "flops_per_token": flops,
        "achieved_tflops": round(tokens_per_s * flops / 1e12, 4),
        "peak_dtype": str(peak_dtype).removeprefix("torch."),
        "peak_tflops": round(peak / 1e12, 3) if peak else None, "peak_source": peak_source,
        "mfu": round(tokens_per_s * flops / peak, 4) if peak else None,
        "fp32_peak_tflops": round(fp32_peak / 1e12, 3) if fp32_peak else None,
        "mfu_vs_fp32_peak": round(tokens_per_s * flops / fp32_peak, 4) if fp32_peak else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("config")
    parser.add_argument("--steps", type=positive(int), default=50)
    parser.add_argument("--warmup", type=positive(int, zero=True), default=10)
    parser.add_argument("--seconds", type=positive(float), default=30.0,
                        help="stop the warm-up, and then the timed steps, after this many "
                        "seconds each (at least one step each), so the script ends in bounded "
                        "time on a slow CPU (default 30)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    with tempfile.TemporaryDirectory() as tmp:  # a text file is prepared here, not left behind
        data = dataset_for(cfg.data.path, cfg.data.val_fraction, Path(tmp) / "dataset")
        result = benchmark(cfg, data, args.steps, args.warmup, args.seconds)
    print(json.dumps({"machine": machine_facts(), "config": args.config,
                      "overrides": args.overrides, **result}))


if __name__ == "__main__":
    run_script(main)

"""What the benchmark scripts share: their --help description, argparse's positive (or
non-negative) counts, the facts of the machine their figures come from (`machine_facts`,
`machine_line`), and bad input reported as the charlm CLI reports it (one `error:` line,
exit code 2, no traceback);
Ctrl-C and SIGTERM end a script with 130 and 143, running its cleanup (`finally`) on the way."""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from charlm.core.errors import CharlmError

if TYPE_CHECKING:
    import torch


def summary(doc: str | None) -> str:
    """A script's --help description: the first paragraph of its docstring (its first line alone
    can stop mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def positive(kind: type, zero: bool = False) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` greater than 0 (at least 0 with `zero`)."""
    def parse(text: str) -> Any:
        value = kind(text)
        if not (value >= 0 if zero else value > 0):
            bound = "at least 0" if zero else "greater than 0"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return parse


def cpu_native_dtype() -> torch.dtype:
    """The dtype this CPU computes matmuls in natively: charlm's own `dtype: auto` for the CPU
    (bf16 where AMX or AVX512_BF16 multiplies it, else float32; bf16 elsewhere is emulated, and
    slow)."""
    import torch  # here, not above: scripts that print no machine facts start without torch

    from charlm.runtime.precision import DTYPES
    from charlm.runtime.profile import Machine, pick_dtype
    return DTYPES[pick_dtype("auto", torch.device("cpu"), Machine())[0]]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name: /proc/cpuinfo's "model name" on Linux, else what `platform` knows
    (on macOS and Windows, or a Linux whose cpuinfo has no model name, as on some ARM boards)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_facts() -> dict:
    """What a figure depends on besides the code: the CPU model, its logical cores, torch's
    threads and version, the CPU capability torch dispatches to (AVX2, AVX512, ...), what
    computes bf16 natively on the CPU (`Machine.bf16_unit`: AMX, AVX512_BF16, or None where it is
    emulated and `dtype: auto` trains in float32) and how fast (`Machine.bf16_speedup`, over
    float32: `auto` trains in bf16 from BF16_GAIN up), and the GPU, if torch sees one."""
    import torch

    from charlm.runtime.profile import Machine

    machine = Machine()
    unit = machine.bf16_unit()
    return {
        "cpu": cpu_model(), "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_unit": unit, "bf16_speedup": round(machine.bf16_speedup(), 2) if unit else None,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def machine_line(facts: dict) -> str:
    """`machine_facts` as the one line a script prints above its figures."""
    from charlm.runtime.profile import BF16_GAIN

    unit, speedup = facts["bf16_unit"], facts["bf16_speedup"]
    bf16 = (f"bf16 native ({unit}, {speedup}x float32's speed"
            f"{'' if speedup >= BF16_GAIN else ': auto trains in float32'})" if unit
            else "float32 native (bf16 emulated)")
    gpu = f", GPU {facts['gpu']}" if facts["gpu"] else ""
    return (f"machine: {facts['cpu']}, {facts['logical_cores']} logical cores, "
            f"{facts['torch_threads']} torch threads, torch {facts['torch']}, "
            f"{facts['cpu_capability']}, {bf16}{gpu}")


def terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, unlike the default SIGTERM


def run_script(main: Callable[[], None]) -> None:
    """Run a script's `main`; a CharlmError (a missing config, a bad --set) ends in one line, and
    Ctrl-C (or SIGTERM) stops it without a traceback, after its `finally` blocks have run."""
    signal.signal(signal.SIGTERM, terminated)
    try:
        main()
    except CharlmError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)

"""Devices: resolve `auto` or a name to a device that is there, refuse a request its memory
cannot hold before anything is allocated, and seed every RNG."""

from __future__ import annotations

import os
import random

import torch

from charlm.config.schema import device_error
from charlm.core.errors import CharlmError, Setting, SettingError


def resolve_device(name: str, setting: str = "train.device") -> torch.device:
    """`auto` picks cuda > mps > cpu; a missing named device is an error naming `setting`."""
    unknown = device_error(name)
    if unknown:
        raise CharlmError(unknown)
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if has_mps else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SettingError(Setting(setting), f" is {name!r} but no CUDA GPU is available to this "
                           "torch build; use cpu (or auto), or install a CUDA build of torch")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise SettingError(Setting(setting), f" is {name!r} but this machine has {n} CUDA "
                           f"GPU{'s' if n != 1 else ''} (cuda:0 to cuda:{n - 1}); use one of "
                           "them, or cuda (the first)")
    if name == "mps" and not has_mps:
        raise SettingError(Setting(setting), " is 'mps' but MPS is not available; use cpu "
                           "(or auto)")
    return torch.device(name)


def memory_bytes(device: torch.device) -> int | None:
    """The GPU's memory, or the machine's RAM for the CPU; None for MPS (shared)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def require_memory(need: int, device: torch.device, needs: str, advice: str,
                   setting: str | None = None) -> None:
    """Refuse work whose `need` bytes exceed the device's memory: `{needs}, more than the N GiB
    of {device}; {advice}`, the need where `needs` says `{gib}`, and a SettingError of
    `setting` where the message says `{setting}`."""
    have = memory_bytes(device)
    if have is not None and need > have:
        needs = needs.replace("{gib}", f"{need / 2**30:,.1f} GiB")
        message = f"{needs}, more than the {have / 2**30:,.1f} GiB of {device.type}; {advice}"
        if setting is not None:
            first, *rest = message.split("{setting}")
            raise SettingError(first, *(p for piece in rest for p in (Setting(setting), piece)))
        raise CharlmError(message)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device

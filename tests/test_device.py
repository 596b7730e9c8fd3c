"""Devices and numerics: resolving the device and the AMP dtype, the current GPU."""


import pytest
import torch

from charlm.device import resolve_device, resolve_dtype
from charlm.errors import CharlmError


def test_auto_dtype_is_bf16_on_a_cpu_with_amx_only(monkeypatch):
    from charlm import device as device_module
    cpu = torch.device("cpu")
    monkeypatch.setattr(device_module, "cpu_has_amx_bf16", lambda: True)
    assert resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(device_module, "cpu_has_amx_bf16", lambda: False)
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("float32", cpu) == torch.float32


def test_auto_dtype_on_a_gpu_before_ampere_is_float16(monkeypatch):
    """torch.cuda.is_bf16_supported() says yes on a V100 or T4 (emulated bf16, without tensor
    cores): those train in float16 with loss scaling."""
    capability = {}
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capability[d])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    capability.update({torch.device("cuda", 0): (8, 0), torch.device("cuda", 1): (7, 5)})
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda", 1)) == torch.float16
    assert resolve_dtype("bfloat16", torch.device("cuda", 1)) == torch.bfloat16  # as asked


def test_a_run_on_cuda_n_makes_that_gpu_the_current_one(monkeypatch):
    """Without it, pinned memory and other lazily made CUDA state went to GPU 0."""
    from charlm.device import distributed
    made_current = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for device in (torch.device("cuda", 1), torch.device("cuda"), torch.device("cpu")):
        with distributed(device) as (dist, used):
            assert (dist.active, used) == (False, device)
    assert made_current == [torch.device("cuda", 1)]


def test_a_cuda_index_past_the_gpus_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(CharlmError) as e:
        resolve_device("cuda:2", "--device")
    assert str(e.value) == ("--device is 'cuda:2' but this machine has 2 CUDA GPUs (cuda:0 to "
                            "cuda:1); use one of them, or cuda (the first)")



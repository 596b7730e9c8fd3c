"""charlm.runtime.device: resolving a device, and the current GPU."""

import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.runtime.device import resolve_device


def test_a_run_on_cuda_n_makes_that_gpu_the_current_one(monkeypatch):
    """Without it, pinned memory and other lazily made CUDA state went to GPU 0."""
    from charlm.runtime.distributed import distributed
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

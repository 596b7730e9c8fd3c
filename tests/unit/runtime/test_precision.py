"""charlm.runtime.precision: the dtype `train.dtype: auto` resolves to on each CPU and GPU."""

import pytest
import torch

from charlm.runtime.precision import resolve_dtype


@pytest.mark.parametrize("amx, avx512_bf16, unit", [
    (True, True, "AMX"), (True, False, "AMX"), (False, True, "AVX512_BF16"),
    (False, False, None),
])
def test_auto_dtype_is_bf16_on_a_cpu_that_multiplies_it_in_hardware(monkeypatch, amx,
                                                                    avx512_bf16, unit):
    """AMX tiles or AVX512_BF16's dot products compute bf16 (4.1x float32's matmul on a Zen 5
    EPYC); elsewhere it is emulated and `auto` is float32."""
    from charlm.runtime import precision as device_module
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16,
                        raising=False)
    assert device_module.cpu_bf16_unit() == unit
    assert resolve_dtype("auto", cpu) == (torch.bfloat16 if unit else torch.float32)
    assert resolve_dtype("float32", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16


def test_a_torch_without_the_cpu_probes_trains_in_float32(monkeypatch):
    from charlm.runtime import precision as device_module
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    assert device_module.cpu_bf16_unit() is None
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


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

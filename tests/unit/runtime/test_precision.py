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
    monkeypatch.setattr(device_module, "cpu_bf16_speedup", lambda: 4.1)
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


@pytest.mark.parametrize("speedup, dtype", [(4.1, torch.bfloat16), (1.5, torch.bfloat16),
                                            (1.4, torch.float32), (0.56, torch.float32)])
def test_auto_is_bf16_on_a_cpu_only_where_its_products_measure_faster(monkeypatch, speedup,
                                                                      dtype):
    """An Intel Xeon with AVX512_BF16 and no AMX multiplied bf16 at 0.56x float32's speed, and
    trained 1.32x faster in float32: a bf16 unit must also measure BF16_GAIN times faster."""
    from charlm.runtime import precision as device_module
    monkeypatch.setattr(device_module, "cpu_bf16_unit", lambda: "AVX512_BF16")
    monkeypatch.setattr(device_module, "cpu_bf16_speedup", lambda: speedup)
    assert resolve_dtype("auto", torch.device("cpu")) == dtype
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # as asked


def test_the_bf16_probe_times_both_dtypes_and_leaves_the_random_streams_alone():
    from charlm.runtime import precision as device_module
    device_module.cpu_bf16_speedup.cache_clear()
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    assert device_module.cpu_bf16_speedup() > 0
    assert torch.equal(torch.rand(2), expected)

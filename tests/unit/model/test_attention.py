"""charlm.model.attention: rotary positions and the CPU's float32 attention kernel. How attention
behaves inside the model (causality, the cache against a full forward) is tested in
test_gpt.py."""

import pytest
import torch

from charlm.model.attention import apply_rope, attention, rope_angles


def test_rope_preserves_norms_and_depends_only_on_relative_position():
    torch.manual_seed(0)
    D = 16
    q, k = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)

    def at(x, p):
        return apply_rope(x, *rope_angles(torch.tensor([p]), D))

    for p in (0, 1, 7, 100):
        torch.testing.assert_close(at(q, p).norm(), q.norm())
    assert not torch.allclose(at(q, 3), q)  # it does rotate

    def score(m, n):
        return (at(q, m) * at(k, n)).sum().item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) == pytest.approx(score(60, 58), abs=1e-5)
    assert score(0, 0) == pytest.approx((q * k).sum().item(), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_rope_equals_the_rotation_of_feature_pairs():
    torch.manual_seed(0)
    D, T = 8, 5
    x = torch.randn(2, 3, T, D)
    pos = torch.arange(4, 4 + T)
    y = apply_rope(x, *rope_angles(pos, D))
    theta = 10000.0 ** -(torch.arange(0, D, 2).float() / D)  # (D/2,)
    angle = pos.float()[:, None] * theta  # (T, D/2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    expected = torch.cat([x1 * angle.cos() - x2 * angle.sin(),
                          x1 * angle.sin() + x2 * angle.cos()], dim=-1)
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("autocast", [False, True])
def test_cpu_attention_in_bf16_runs_the_kernel_in_float32(autocast, monkeypatch):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 16, requires_grad=True) for _ in range(3))
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    reference = attention(q, k, v, None, True, 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, True, 0.0)
    assert seen == [{torch.float32}, {torch.float32}]  # never the slow bf16 kernel
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), reference, atol=2e-2, rtol=2e-2)
    y.float().sum().backward()  # gradients flow back to the float32 leaves through the casts
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))

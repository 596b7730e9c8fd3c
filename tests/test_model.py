import pytest
import torch

from charlm.config import ModelConfig
from charlm.model import GPT, param_counts

V = 11


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{"block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, **kw})


def test_output_shapes_and_loss():
    model = GPT(tiny(), V)
    idx = torch.randint(0, V, (3, 10))
    logits, loss = model(idx)
    assert logits.shape == (3, 10, V) and loss is None
    logits, loss = model(idx, targets=torch.randint(0, V, (3, 10)))
    assert loss.shape == () and loss.item() == pytest.approx(torch.log(torch.tensor(V)).item(),
                                                             abs=0.3)


def test_too_long_sequence_is_refused():
    with pytest.raises(ValueError, match="exceeds block_size 16"):
        GPT(tiny(), V)(torch.zeros(1, 17, dtype=torch.long))


def test_causality():
    model = GPT(tiny(), V).eval()
    idx = torch.randint(0, V, (2, 12))
    changed = idx.clone()
    changed[:, 7] = (idx[:, 7] + 1) % V
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def expected_params(cfg: ModelConfig, vocab: int) -> int:
    C, F, L, T = cfg.n_embd, cfg.ff_width, cfg.n_layer, cfg.block_size
    b = 1 if cfg.bias else 0
    attn = 4 * C * C + b * 4 * C
    mlp = 2 * C * F + b * (F + C)
    norms = 2 * C * (1 + b)
    head = 0 if cfg.tie_weights else vocab * C
    return vocab * C + T * C + L * (attn + mlp + norms) + C * (1 + b) + head


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("n_ff", [None, 48])
def test_parameter_count_matches_formula(bias, tie, n_ff):
    cfg = tiny(bias=bias, tie_weights=tie, n_ff=n_ff)
    model = GPT(cfg, V)
    counts = param_counts(model)
    assert counts["total"] == expected_params(cfg, V)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["head"] == (0 if tie else V * cfg.n_embd)
    assert counts["position_embedding"] == cfg.block_size * cfg.n_embd


def test_baby_gpt_has_10_7m_parameters():
    cfg = ModelConfig(block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2)
    assert round(param_counts(GPT(cfg, 65))["total"] / 1e6, 1) == 10.7


def test_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(ModelConfig(block_size=16, n_layer=8, n_head=4, n_embd=256), V)
    std = model.blocks[0].attn.proj.weight.std().item()
    assert std == pytest.approx(0.02 / (2 * 8) ** 0.5, rel=0.05)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.head.weight is model.wte.weight


def test_cached_forward_matches_full_forward():
    model = GPT(tiny(), V).eval()
    idx = torch.randint(0, V, (2, 12))
    full, _ = model(idx)
    cache = model.new_cache(2)
    parts = [model(idx[:, :5], cache=cache)[0]]  # prefill 5
    parts.append(model(idx[:, 5:9], cache=cache)[0])  # a chunk of 4 after the prefix
    parts += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(9, 12)]  # one at a time
    assert cache.pos == 12
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert not any("cache" in k for k in model.state_dict())

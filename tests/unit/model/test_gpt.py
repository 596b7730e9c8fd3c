"""charlm.model.gpt: shapes and loss, causality, parameter counts, the cached forward, positions and
norms."""

import itertools
import math

import pytest
import torch

from charlm.config.schema import ModelConfig
from charlm.core.errors import CharlmError
from charlm.model.gpt import GPT, RMSNorm, param_counts, parameter_count, sinusoidal_table
from tests.helpers import VARIANTS, expected_params, tiny_model_config

V = 11


def test_output_shapes_and_loss():
    model = GPT(tiny_model_config(), V)
    idx = torch.randint(0, V, (3, 10))
    logits, loss = model(idx)
    assert logits.shape == (3, 10, V) and loss is None
    logits, loss = model(idx, targets=torch.randint(0, V, (3, 10)))
    assert loss.shape == () and loss.item() == pytest.approx(torch.log(torch.tensor(V)).item(),
                                                             abs=0.3)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_label_smoothing_applies_to_the_training_loss_only(arch):
    torch.manual_seed(0)
    if arch == "decoder":
        model = GPT(tiny_model_config(label_smoothing=0.4), V)
        inputs = (torch.randint(0, V, (3, 10)),)
    else:
        from charlm.model.encoder_decoder import EncoderDecoder
        model = EncoderDecoder(tiny_model_config(arch=arch, label_smoothing=0.4), V, V,
                               source_pad=V - 1)
        inputs = (torch.randint(0, V - 1, (3, 7)), torch.randint(0, V, (3, 10)))
    targets = torch.randint(0, V, (3, 10))
    targets[0, 6:] = -1  # padding: ignored in both modes
    keep = targets != -1
    logits, smoothed = model(*inputs, targets)
    logp = torch.log_softmax(logits.float(), -1)[keep]
    nll = -logp.gather(1, targets[keep][:, None]).squeeze(1)
    assert smoothed.item() == pytest.approx((0.6 * nll - 0.4 * logp.mean(-1)).mean().item(),
                                            rel=1e-5)
    model.eval()
    logits, plain = model(*inputs, targets)
    assert plain.item() == pytest.approx(nll.mean().item(), rel=1e-5)
    assert abs(plain.item() - smoothed.item()) > 1e-3  # the two checks above differ


def test_too_long_sequence_is_refused():
    with pytest.raises(ValueError, match="exceeds block_size 16"):
        GPT(tiny_model_config(), V)(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("variant", VARIANTS)
def test_causality(variant):
    model = GPT(tiny_model_config(**VARIANTS[variant]), V).eval()
    with torch.no_grad():  # away from the init, which `zero_init` makes position-blind
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    idx = torch.randint(0, V, (2, 12))
    changed = idx.clone()
    changed[:, 7] = (idx[:, 7] + 1) % V
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu"])
@pytest.mark.parametrize("n_ff", [None, 48])
def test_parameter_count_matches_formula_for_every_combination(activation, n_ff):
    for bias, tie, pos, norm, placement in itertools.product(
            [False, True], [False, True], ["learned", "sinusoidal", "rope", "none"],
            ["layernorm", "rmsnorm"], ["pre", "post"]):
        cfg = tiny_model_config(bias=bias, tie_weights=tie, n_ff=n_ff, activation=activation,
                                pos_encoding=pos, norm=norm, norm_placement=placement)
        model = GPT(cfg, V)
        where = f"{cfg}"
        expected = expected_params(cfg, V)
        assert sum(p.numel() for p in model.parameters()) == expected, where
        assert param_counts(model)["total"] == expected, where
        assert param_counts(model)["head"] == (0 if tie else V * cfg.n_embd), where
        assert param_counts(model)["position_embedding"] == (
            cfg.block_size * cfg.n_embd if pos == "learned" else 0), where


def test_swiglu_hidden_size_rule():
    # 2/3 * 4 * 32 = 85.3, up to a multiple of 8
    assert tiny_model_config(activation="swiglu").ff_width == 88
    assert ModelConfig(n_embd=384, activation="swiglu").ff_width == 1024
    # an explicit n_ff is honoured
    assert tiny_model_config(activation="swiglu", n_ff=40).ff_width == 40
    model = GPT(tiny_model_config(activation="swiglu", n_ff=40), V)
    assert model.blocks[0].mlp.fc.weight.shape == (80, 32)  # gate and up, fused
    assert model.blocks[0].mlp.proj.weight.shape == (32, 40)


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


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_forward_matches_full_forward(variant):
    model = GPT(tiny_model_config(**VARIANTS[variant]), V).eval()
    idx = torch.randint(0, V, (2, 12))
    full, _ = model(idx)
    cache = model.new_cache(2)
    parts = [model(idx[:, :5], cache=cache)[0]]  # prefill 5
    parts.append(model(idx[:, 5:9], cache=cache)[0])  # a chunk of 4 after the prefix
    parts += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(9, 12)]  # one at a time
    assert cache.pos == 12
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert not any("cache" in k for k in model.state_dict())


def test_cached_forward_runs_the_modules_and_reads_their_live_tensors():
    model = GPT(tiny_model_config(), V).eval()
    calls = []
    model.blocks[0].attn.qkv.register_forward_hook(lambda *_: calls.append("qkv"))
    idx = torch.randint(0, V, (1, 4))
    model(idx)
    assert calls == ["qkv"]  # the uncached forward goes through the modules
    cache = model.new_cache(1)
    before, _ = model(idx, cache=cache)
    assert calls == ["qkv", "qkv"]  # so does the cached one: one block implementation
    with torch.no_grad():  # it reads the live tensors, e.g. after load_state_dict
        model.blocks[0].attn.qkv.weight.mul_(2)
    cache.reset()
    after, _ = model(idx, cache=cache)
    torch.testing.assert_close(after, model(idx)[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)


def test_sinusoidal_table_values_at_known_positions():
    table = sinusoidal_table(torch.tensor([0, 1, 5]), 4)
    assert table.shape == (3, 4)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]  # sin 0, cos 0 in every pair
    # pair i turns at rate 1 / 10000^(2i / dim): 1 for i = 0, 1/100 for i = 1 when dim = 4
    expected = [math.sin(5), math.cos(5), math.sin(0.05), math.cos(0.05)]
    torch.testing.assert_close(table[2], torch.tensor(expected))
    odd = sinusoidal_table(torch.tensor([3]), 5)  # an odd width ends on a sine
    assert odd.shape == (1, 5)
    assert odd[0, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 5)))


def test_sinusoidal_embedding_scales_tokens_and_adds_the_table():
    model = GPT(tiny_model_config(pos_encoding="sinusoidal"), V)
    assert not hasattr(model, "wpe") and not any("pe" in k for k in model.state_dict())
    idx, pos = torch.randint(0, V, (2, 6)), torch.arange(3, 9)
    expected = model.wte(idx) * math.sqrt(32) + sinusoidal_table(pos, 32)
    torch.testing.assert_close(model.embed(idx, pos), expected)


def test_rope_needs_an_even_head_size():
    with pytest.raises(CharlmError, match="rope .* even head size, but n_embd / n_head = 15"):
        ModelConfig(n_embd=30, n_head=2, pos_encoding="rope")


def test_rmsnorm_divides_by_root_mean_square():
    x = torch.randn(2, 3, 8) * 5 + 2
    norm = RMSNorm(8)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), expected)
    assert list(norm.state_dict()) == ["weight"]


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_pre_and_post_norm_blocks_follow_their_definitions(placement):
    model = GPT(tiny_model_config(norm_placement=placement, bias=True), V).eval()
    block = model.blocks[0]
    with torch.no_grad():  # non-trivial norm parameters, so a misplaced norm would show
        for p in (block.ln_1.weight, block.ln_1.bias, block.ln_2.weight, block.ln_2.bias):
            p.normal_(0.0, 0.5)
    x = torch.randn(2, 5, 32)
    out = block(x, None, 0)
    if placement == "pre":  # x + f(norm(x))
        h = x + block.attn(block.ln_1(x))
        expected = h + block.mlp(block.ln_2(h))
        assert not isinstance(model.ln_f, torch.nn.Identity)
    else:  # norm(x + f(x)), and no final norm after the last block
        h = block.ln_1(x + block.attn(x))
        expected = block.ln_2(h + block.mlp(h))
        assert isinstance(model.ln_f, torch.nn.Identity)
        # unit weight, no bias
        plain = GPT(tiny_model_config(norm_placement="post"), V).blocks[0].eval()
        y = plain(x * 10 + 3, None, 0)
        torch.testing.assert_close(y.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
        torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-3,
                                   rtol=0)
    torch.testing.assert_close(out, expected)


def test_default_architecture_keeps_the_state_dict_names():
    """Checkpoints written before the architecture options still load: same names, same order."""
    per_block = ["ln_1.weight", "attn.qkv.weight", "attn.proj.weight", "ln_2.weight",
                 "mlp.fc.weight", "mlp.proj.weight"]
    expected = ["wte.weight", "wpe.weight"]
    expected += [f"blocks.{i}.{name}" for i in range(2) for name in per_block]
    expected += ["ln_f.weight", "head.weight"]
    assert list(GPT(tiny_model_config(), V).state_dict()) == expected


@pytest.mark.parametrize("variant", ["default", "all_changed", "pos_encoding=sinusoidal"])
def test_parameter_count_of_a_config_is_the_built_models(variant):
    cfg = tiny_model_config(**VARIANTS[variant], n_layer=3)
    built = param_counts(GPT(cfg, V))
    one_layer = GPT(tiny_model_config(**VARIANTS[variant], n_layer=1), V)
    assert param_counts(one_layer, 3) == built  # one block stands for three, per component
    assert parameter_count(cfg, V) == built["total"] == expected_params(cfg, V)
    # counted on the meta device, at once
    huge = tiny_model_config(**VARIANTS[variant], n_layer=10**9)
    assert parameter_count(huge, V) == expected_params(huge, V)


@pytest.mark.parametrize("variant", ["default", "pos_encoding=sinusoidal", "pos_encoding=rope",
                                     "all_changed"])
@torch.inference_mode()
def test_a_position_per_row_gives_each_row_the_logits_of_its_own_sequence(variant):
    """Rows of one cache at different positions (requests of different lengths in one batch,
    as `charlm serve` decodes them): each row is prefilled alone through a view of the cache,
    then every step decodes all rows at once, each at its own position, and gives each row the
    logits of its own sequence."""
    model = GPT(tiny_model_config(**VARIANTS[variant]), V).eval()
    idx = torch.randint(0, V, (3, 12))
    lengths = torch.tensor([3, 7, 1])
    cache = model.new_cache(3)
    for row, n in enumerate(lengths.tolist()):
        view = cache.view(slice(row, row + 1))  # its writes land in the cache
        view.pos = 0
        model(idx[row:row + 1, :n], cache=view)
    cache.pos = lengths.clone()
    for t in range(3):
        at = lengths + t
        got, _ = model(idx[torch.arange(3), at][:, None], cache=cache)  # (3, 1, V)
        for row in range(3):
            expected, _ = model(idx[row:row + 1, :at[row] + 1])
            torch.testing.assert_close(got[row, -1], expected[0, -1], rtol=1e-5, atol=1e-5)
    assert cache.pos.tolist() == (lengths + 3).tolist()


def test_a_cache_row_copied_to_another_continues_its_sequence():
    model = GPT(tiny_model_config(), V).eval()
    idx = torch.randint(0, V, (1, 6))
    cache = model.new_cache(2)
    with torch.inference_mode():
        first = cache.view(slice(0, 1))
        model(idx[:, :5], cache=first)
        cache.copy_row(0, 1)
        moved = cache.view(slice(1, 2))
        moved.pos = 5
        got, _ = model(idx[:, 5:], cache=moved)
        expected, _ = model(idx)
    torch.testing.assert_close(got[0, -1], expected[0, -1], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_position_per_row_works_with_bfloat16_weights_and_a_float32_cache():
    """On the CPU the cache is float32 whatever the weights (`attention_dtype`): a step at
    per-row positions converts the new keys and values as the prefill does."""
    model = GPT(tiny_model_config(), V).eval().to(torch.bfloat16)
    idx = torch.randint(0, V, (2, 6))
    cache = model.new_cache(2)
    assert cache.k[0].dtype == torch.float32
    model(idx[:, :5], cache=cache)
    cache.pos = torch.tensor([5, 5])
    got, _ = model(idx[:, 5:], cache=cache)
    expected, _ = model(idx)
    torch.testing.assert_close(got[:, -1], expected[:, -1], rtol=2e-2, atol=2e-2)


def test_zero_init_starts_every_block_as_the_identity_and_an_untied_head_uniform():
    model = GPT(tiny_model_config(zero_init=True, tie_weights=False), V)
    idx = torch.randint(0, V, (2, 12))
    logits, loss = model(idx, idx)
    assert torch.equal(logits, torch.zeros_like(logits))
    assert loss.item() == pytest.approx(math.log(V))
    projections = [p for n, p in model.named_parameters() if n.endswith("proj.weight")]
    assert len(projections) == 4 and all(not p.any() for p in projections)


def test_the_logit_softcap_squashes_the_logits_into_its_bounds():
    model = GPT(tiny_model_config(logit_softcap=2.0), V).eval()
    with torch.no_grad():
        model.head.weight.mul_(1000)  # tied: the table too
    idx = torch.randint(0, V, (2, 12))
    capped, _ = model(idx)
    model.cfg = tiny_model_config(logit_softcap=0.0)
    raw, _ = model(idx)
    assert raw.abs().max() > 100 and capped.abs().max() <= 2.0
    torch.testing.assert_close(capped, 2.0 * torch.tanh(raw / 2.0))

"""charlm.model.layers and how the models are built from torch's layers: children registered in
the order they run, hooks seen on every path, and the initial draws."""

import math
import sys

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook

from charlm.config.schema import ModelConfig
from charlm.model import layers
from charlm.model.gpt import GPT


def tiny_gpt(**over) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, **over), 11)


def test_children_register_in_the_order_they_run():
    model = tiny_gpt()
    block = model.blocks[0]
    assert model.head.weight is model.wte.weight  # tied by assignment in __init__
    assert [name for name, _ in block.named_children()] == ["ln_1", "attn", "ln_2", "mlp"]


def test_an_absent_child_is_an_attribute_error():
    model = tiny_gpt(pos_encoding="rope")  # rope has no position table
    assert getattr(model, "wpe", None) is None
    assert not hasattr(model.blocks[0], "cross_attn")
    with pytest.raises(AttributeError, match="'Block' object has no attribute 'ln_cross'"):
        _ = model.blocks[0].ln_cross


@pytest.mark.parametrize("overwrite", [False, True])
def test_dtype_conversion_is_seen(overwrite):
    """`to()` may swap in new Parameter objects (torch's overwrite flag): the model computes in
    the new dtype either way."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    try:
        model = tiny_gpt().to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)
    assert model.blocks[0].attn.qkv.weight.dtype == torch.float64
    logits, _ = model(torch.zeros(1, 2, dtype=torch.long))
    assert logits.dtype == torch.float64


def test_every_kind_of_hook_runs_in_prefill_and_decode():
    model = tiny_gpt().eval()
    seen = []
    qkv = model.blocks[1].attn.qkv
    qkv.register_forward_pre_hook(lambda m, args: seen.append("pre"))
    qkv.register_forward_hook(lambda m, args, out: out * 0)  # a hook may replace the output
    handle = register_module_forward_hook(
        lambda m, args, out: seen.append("global") if m is qkv else None)
    try:
        cache = model.new_cache(1)
        with torch.no_grad():
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    finally:
        handle.remove()
    assert seen == ["pre", "global"] * 2
    assert torch.all(cache.k[1][:, :, :4] == 0)  # the zeroed q, k, v reached the cache


def test_full_backward_hooks_run():
    model = tiny_gpt()
    grads = []
    model.blocks[0].mlp.register_full_backward_hook(lambda m, gin, gout: grads.append(gout[0]))
    idx = torch.zeros(1, 3, dtype=torch.long)
    model(idx, idx)[1].backward()
    assert len(grads) == 1 and grads[0].shape == (1, 3, 16)


@pytest.mark.parametrize("options", [{}, {"padding_idx": 2}, {"padding_idx": -1}])
def test_an_embedding_draws_what_torchs_draws(options):
    """`layers.Embedding` draws its initial weights as nn.Embedding does, from the same seed, a
    padding row zero; on the meta device it draws nothing (torch's draw there would import the
    compiler) and takes no random numbers."""
    torch.manual_seed(0)
    ours = layers.Embedding(6, 4, **options)
    torch.manual_seed(0)
    theirs = nn.Embedding(6, 4, **options)
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=0, atol=0)
    if "padding_idx" in options:
        assert ours.weight.detach()[options["padding_idx"]].abs().sum() == 0
    state = torch.random.get_rng_state()
    with torch.device("meta"):
        meta = layers.Embedding(6, 4, **options)
    assert meta.weight.is_meta and torch.equal(torch.random.get_rng_state(), state)
    if "torch._dynamo" not in sys.modules:  # another test may have imported it already
        layers.normal_(torch.empty(3, device="meta"))
        assert "torch._dynamo" not in sys.modules


@pytest.mark.parametrize("shape", [(1, 256), (3, 256), (2, 5, 256)])
def test_split_product_is_linears_product_within_rounding(shape):
    torch.manual_seed(0)
    w, b, x = torch.randn(512, 256), torch.randn(512), torch.randn(*shape)
    for bias in (None, b):
        split = layers.split_product(x, w, bias, 2)
        assert split.shape == (*shape[:-1], 512)
        torch.testing.assert_close(split, nn.functional.linear(x, w, bias), rtol=1e-5, atol=1e-5)


@pytest.fixture
def splits(monkeypatch) -> list:
    """The products `Linear` split, with the split made to apply to small weights."""
    seen = []
    real = layers.split_product
    monkeypatch.setattr(layers, "SPLIT_MIN_WEIGHTS", 0)
    monkeypatch.setattr(layers, "split_product",
                        lambda x, w, b, parts: seen.append((tuple(x.shape), parts))
                        or real(x, w, b, parts))
    return seen


def test_linear_splits_a_few_rows_outside_autograd_only(splits):
    lin = layers.Linear(16, 32)
    x = torch.randn(1, 16)
    with torch.inference_mode():
        lin(x)  # split_parts 1 (the class's): F.linear
        lin.split_parts = 2
        torch.testing.assert_close(lin(x), nn.functional.linear(x, lin.weight, lin.bias))
        lin(torch.randn(layers.SPLIT_ROWS + 1, 16))  # too many rows
        lin.to(torch.bfloat16)(x.bfloat16())  # half precision: F.linear
    lin.float()(x)  # autograd on
    assert splits == [((1, 16), 2)]


def test_cached_greedy_equals_uncached_with_split_products(splits):
    """With every product of a few rows split (the decode steps, the short prefills), cached and
    uncached decoding still give the same tokens."""
    from charlm.config.sampling import SampleConfig
    from charlm.generation.decoding import generate

    model = tiny_gpt().eval()
    assert layers.lay_out_for_decoding(model, 2, column_major=False) > 0
    prompt = torch.randint(0, 11, (1, 3))
    cached, uncached = ([step.tolist() for step in generate(
        model, prompt, 12, SampleConfig(temperature=0, use_cache=use_cache))]
        for use_cache in (True, False))
    assert splits and cached == uncached


@pytest.mark.parametrize("column_major", [True, False])
def test_lay_out_for_decoding_keeps_the_values_in_the_layout_given(monkeypatch, column_major):
    monkeypatch.setattr(layers, "SPLIT_MIN_WEIGHTS", 0)
    model = tiny_gpt().eval()
    linears = [m for m in model.modules() if isinstance(m, layers.Linear)]
    weights = {id(m.weight) for m in linears}
    before = {name: p.clone() for name, p in model.named_parameters()}
    idx = torch.randint(0, 11, (3, 5))
    with torch.inference_mode():
        logits = model(idx)[0]
        assert layers.lay_out_for_decoding(model, 6, column_major) == len(weights)
        torch.testing.assert_close(model(idx)[0], logits, rtol=1e-5, atol=1e-5)
        again = layers.lay_out_for_decoding(model, 6, column_major)
        assert again == (0 if column_major else len(weights))  # column-major once only
    # split over gcd(out features, 6): 48 -> 6, 16 -> 2, 64 -> 2, 11 (the head) -> 1
    assert [m.split_parts for m in linears] == [
        1 if column_major else math.gcd(m.weight.shape[0], 6) for m in linears]
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])
        if p.dim() == 2:
            laid = column_major and id(p) in weights
            assert p.is_contiguous() is not laid
            assert p.t().is_contiguous() is laid
    assert model.head.weight is model.wte.weight  # still tied


def test_lay_out_for_decoding_leaves_half_precision_and_small_weights():
    model = tiny_gpt().eval()  # every weight below SPLIT_MIN_WEIGHTS
    assert layers.lay_out_for_decoding(model, 2, True) == 0
    assert layers.lay_out_for_decoding(model.to(torch.bfloat16), 2, True) == 0
    assert all(p.is_contiguous() for p in model.parameters())
    assert all(m.split_parts == 1 for m in model.modules() if isinstance(m, layers.Linear))

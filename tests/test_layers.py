"""charlm.layers: named children read from torch's registries, and the hook-free call path."""

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook

from charlm.config import ModelConfig
from charlm.layers import Linear, Module, child, param
from charlm.model import GPT, MLP


def tiny_gpt(**over) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, **over), 11)


def test_children_read_what_torch_registered():
    model = tiny_gpt()
    block = model.blocks[0]
    assert block.mlp is block._modules["mlp"]
    assert block.attn.qkv.weight is block.attn.qkv._parameters["weight"]
    assert model.head.weight is model.wte.weight  # tied by assignment in __init__
    assert [name for name, _ in block.named_children()] == ["ln_1", "attn", "ln_2", "mlp"]


def test_an_absent_child_is_an_attribute_error():
    model = tiny_gpt(pos_encoding="rope")  # rope has no position table
    assert getattr(model, "wpe", None) is None
    assert not hasattr(model.blocks[0], "cross_attn")
    with pytest.raises(AttributeError, match="'Block' object has no attribute 'ln_cross'"):
        _ = model.blocks[0].ln_cross
    assert Linear(2, 3, bias=False).bias is None


def test_replacing_and_deleting_children_is_seen():
    model = tiny_gpt()
    block = model.blocks[0]
    new_mlp = MLP(model.cfg)
    block.mlp = new_mlp
    assert block.mlp is new_mlp
    calls = []
    new_mlp.register_forward_hook(lambda *_: calls.append(1))
    model(torch.zeros(1, 3, dtype=torch.long))
    assert calls == [1]
    weight = nn.Parameter(torch.ones(3, 2))
    lin = Linear(2, 3)
    lin.weight = weight
    assert lin.weight is weight
    del lin.bias
    with pytest.raises(AttributeError):
        _ = lin.bias


@pytest.mark.parametrize("overwrite", [False, True])
def test_dtype_conversion_is_seen(overwrite):
    """`to()` may swap in new Parameter objects (torch's overwrite flag): reads follow."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    try:
        model = tiny_gpt().to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)
    assert model.blocks[0].attn.qkv.weight.dtype == torch.float64
    logits, _ = model(torch.zeros(1, 2, dtype=torch.long))
    assert logits.dtype == torch.float64


def test_every_kind_of_hook_still_runs():
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


def test_a_plain_module_subclass_gets_the_fast_call():
    class Scale(Module):
        inner = child()
        gain = param()

        def __init__(self):
            super().__init__()
            self.inner = nn.Identity()
            self.gain = nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return self.inner(x) * self.gain

    m = Scale()
    assert m(torch.ones(2)).tolist() == [2.0, 2.0]
    assert list(m.state_dict()) == ["gain"]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    m.compile(backend=backend)  # module.compile() is honoured
    assert m(torch.full((2,), 3.0)).tolist() == [6.0, 6.0]
    assert len(graphs) == 1

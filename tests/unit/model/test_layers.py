"""charlm.layers: named children read from torch's registries, the hook-free call path, and the
threaded product with a few rows."""

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook

from charlm.config.schema import ModelConfig
from charlm.generation.decoding import CachedDecoder
from charlm.model import layers
from charlm.model.gpt import GPT, MLP
from charlm.model.layers import Linear, Module, child, param, split_product


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


@pytest.mark.parametrize("options", [{}, {"padding_idx": 2}, {"padding_idx": -1},
                                     {"max_norm": 0.5}, {"scale_grad_by_freq": True}])
def test_an_embedding_looks_up_as_torch_does(options):
    """`Embedding.forward` calls torch.embedding itself: the same rows and the same gradient as
    nn.Embedding's F.embedding, a padding row's gradient zero, max_norm's rows renormalized."""
    torch.manual_seed(0)
    ours = layers.Embedding(6, 4, **options)
    theirs = nn.Embedding(6, 4, **options)
    theirs.load_state_dict(ours.state_dict())
    idx = torch.tensor([[0, 2, 5, 2], [1, 1, 4, 5]])
    y, expected = ours(idx), theirs(idx)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    (y * torch.arange(32.0).view(2, 4, 4)).sum().backward()
    (expected * torch.arange(32.0).view(2, 4, 4)).sum().backward()
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=0, atol=0)
    if "padding_idx" in options:
        assert ours.weight.grad[options["padding_idx"]].abs().sum() == 0
    if "max_norm" in options:
        assert ours.weight.detach()[[0, 1, 2, 4, 5]].norm(dim=1).max() <= 0.5 + 1e-6


@pytest.mark.parametrize("parts", [2, 3, 4])
@pytest.mark.parametrize("shape", [(24,), (1, 24), (1, 1, 24), (3, 24), (2, 5, 24), "strided"])
def test_a_split_product_in_blocks_is_the_linear_product(shape, parts):
    """One contiguous row takes the decode step's short path; several rows, or a row that is
    a strided view, the general one."""
    torch.manual_seed(0)
    w, bias = torch.randn(12, 24), torch.randn(12)
    if shape == "strided":
        x, shape = torch.randn(1, 48)[:, ::2], (1, 24)
        assert not x.is_contiguous()
    else:
        x = torch.randn(shape)
    for b in (None, bias):
        got = split_product(x, w, b, parts)
        assert got.shape == shape[:-1] + (12,)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w, b))


def test_linear_splits_only_a_few_float32_cpu_rows_outside_autograd(monkeypatch):
    """The blocked product is taken for up to SPLIT_ROWS rows by a weight of at least
    SPLIT_MIN_WEIGHTS under no_grad or inference_mode, with as many blocks as the thread count
    shares with the output width; never with autograd on, for more rows, a smaller weight, half
    precision, an odd width on two threads, or one thread."""
    calls = []
    real = layers.split_product
    def spy(x, w, b, parts):
        calls.append((x.shape, parts))
        return real(x, w, b, parts)

    monkeypatch.setattr(layers, "split_product", spy)
    monkeypatch.setattr(layers, "SPLIT_MIN_WEIGHTS", 8 * 12)
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    even, odd, small = Linear(8, 12), Linear(8, 13), Linear(8, 10)
    row, most = torch.randn(1, 1, 8), torch.randn(layers.SPLIT_ROWS, 8)
    try:
        torch.set_num_threads(2)
        with torch.no_grad():
            even(row), even(most), even(torch.randn(layers.SPLIT_ROWS + 1, 8))
            odd(row), small(row), even.half()(row.half())
        even.float()
        assert calls == [(row.shape, 2), (most.shape, 2)]
        with torch.inference_mode():
            even(row)
        assert calls[2:] == [(row.shape, 2)]
        y = even(row)
        assert y.requires_grad and len(calls) == 3
        torch.set_num_threads(3)
        with torch.no_grad():
            even(row), odd(row)
        assert calls[3:] == [(row.shape, 3)]
        torch.set_num_threads(1)
        with torch.no_grad():
            even(row)
        assert len(calls) == 4
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("in_features, out_features, splits", [
    (384, 384, True), (384, 1152, True), (1536, 384, True),  # the baby GPT's, smallest first
    (128, 688, False), (96, 512, False), (32, 128, False),  # the CPU presets' and tiny's largest
])
def test_only_weights_of_at_least_2_to_the_17_values_are_split(monkeypatch, in_features,
                                                               out_features, splits):
    calls = []
    monkeypatch.setattr(layers, "split_product", lambda *a: calls.append(a) or a[0].new_zeros(1))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch.no_grad():
            Linear(in_features, out_features)(torch.randn(1, 1, in_features))
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == splits


def test_a_decode_step_with_the_blocked_product_matches_one_thread(monkeypatch):
    """The cached decode of a GPT on two threads (blocked products) gives the logits of one
    thread (plain products), within rounding."""
    monkeypatch.setattr(layers, "SPLIT_MIN_WEIGHTS", 0)  # every product of this small model
    model = tiny_gpt().eval()
    prompt = torch.tensor([[1, 2, 3]])
    threads = torch.get_num_threads()
    logits = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.inference_mode():
                decoder = CachedDecoder(model, 1)
                decoder.prefill(prompt)
                logits.append([decoder.step(torch.tensor([t])) for t in (4, 5, 6)])
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*logits, strict=True):
        torch.testing.assert_close(two, one)


def test_the_thread_count_is_marked_constant_as_torch_compiler_marks_it():
    def count() -> int:
        return 2

    marked = torch.compiler.assume_constant_result(count)
    assert vars(marked) == {"_dynamo_marked_constant": True} == vars(layers.threads)


def test_a_compiled_decode_step_is_one_graph_without_breaks(monkeypatch):
    """The split is traced into a compiled decode step's graph: `torch.get_num_threads` broke
    the graph at the first Linear, and dynamo then ran the forward eagerly; the thread count
    is now a constant to the compiler (`layers.threads`)."""
    monkeypatch.setattr(layers, "SPLIT_MIN_WEIGHTS", 0)  # every product of this small model
    model = tiny_gpt().eval()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch.inference_mode():
            explained = torch._dynamo.explain(model)(torch.tensor([[1]]))
    finally:
        torch.set_num_threads(threads)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    targets = [node.target for node in explained.graphs[0].graph.nodes]
    assert targets.count(torch.bmm) == 2 * 4  # qkv, proj, fc, proj of each block (head: 11 rows)

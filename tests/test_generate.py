import pytest
import torch

from charlm.config import ModelConfig
from charlm.generate import apply_top_k, generate, sample_next
from charlm.model import GPT

from .conftest import VARIANTS

V = 13


def random_model(**options) -> GPT:
    torch.manual_seed(1)
    cfg = ModelConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, **options)
    model = GPT(cfg, V).eval()
    with torch.no_grad():  # larger weights than the init, so greedy output is not constant
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


@pytest.fixture
def model() -> GPT:
    return random_model()


def run(model, prompt, n, **kw):
    return torch.stack(list(generate(model, prompt, n, **kw)), dim=1)  # (B, n)


@pytest.mark.parametrize("batch, prompt_len", [(1, 1), (1, 5), (4, 1), (4, 7)])
def test_cached_greedy_equals_uncached(model, batch, prompt_len):
    prompt = torch.randint(0, V, (batch, prompt_len))
    n = 16 - prompt_len + 1  # every step until the context window is full
    cached = run(model, prompt, n, temperature=0, use_cache=True)
    uncached = run(model, prompt, n, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)
    assert len(set(cached.flatten().tolist())) > 1  # not a degenerate constant stream


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_greedy_equals_uncached_for_every_variant(variant):
    model = random_model(**VARIANTS[variant])
    prompt = torch.randint(0, V, (3, 4))
    cached = run(model, prompt, 13, temperature=0, use_cache=True)  # up to a full window
    uncached = run(model, prompt, 13, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)
    assert len(set(cached.flatten().tolist())) > 1


def test_generation_past_the_window_has_exact_length_and_bounded_cache(model, monkeypatch):
    caches = []
    original = GPT.new_cache

    def spy(self, *a, **kw):
        caches.append(original(self, *a, **kw))
        return caches[-1]

    monkeypatch.setattr(GPT, "new_cache", spy)
    out = run(model, torch.zeros(2, 3, dtype=torch.long), 4 * 16, temperature=0)
    assert out.shape == (2, 64)
    assert len(caches) == 1 and caches[0].k[0].shape[2] == 16  # allocated once, block_size long
    assert caches[0].pos <= 16


def test_long_prompt_is_cropped_to_block_size(model):
    prompt = torch.randint(0, V, (1, 40))
    a = run(model, prompt, 1, temperature=0)
    b = run(model, prompt[:, -16:], 1, temperature=0)
    assert torch.equal(a, b)


def test_temperature_zero_is_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert sample_next(logits, temperature=0).tolist() == [1, 0]


def test_top_k_never_samples_outside_the_k_largest():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    allowed = torch.topk(logits, 5, dim=-1).indices
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        picks = sample_next(logits, temperature=2.0, top_k=5, generator=g)
        assert all(p in allowed[i] for i, p in enumerate(picks.tolist()))
    masked = apply_top_k(torch.tensor([[1.0, 5.0, 3.0, 4.0]]), 2)
    assert masked.tolist() == [[float("-inf"), 5.0, float("-inf"), 4.0]]


def test_same_seed_same_tokens(model):
    prompt = torch.zeros(2, 1, dtype=torch.long)
    a = run(model, prompt, 40, temperature=1.0, generator=torch.Generator().manual_seed(5))
    b = run(model, prompt, 40, temperature=1.0, generator=torch.Generator().manual_seed(5))
    c = run(model, prompt, 40, temperature=1.0, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)

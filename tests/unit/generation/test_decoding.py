"""charlm.generation.decoding and .beams: cached against uncached decoding, the logits processors,
sampling errors, beam search, and the fallback when compiling fails."""

import copy

import pytest
import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError
from charlm.generation import compiled_step
from charlm.generation.decoding import beam_search, generate
from charlm.model.gpt import GPT
from tests.helpers import (
    GREEDY,
    RANDOM_GPT_VOCAB,
    VARIANTS,
    decode_ids,
    random_gpt,
    sampler_for,
    uncached,
)

V = RANDOM_GPT_VOCAB


@pytest.fixture
def model() -> GPT:
    return random_gpt()


@pytest.mark.parametrize("batch, prompt_len", [(1, 1), (1, 5), (4, 1), (4, 7)])
def test_cached_greedy_equals_uncached(model, batch, prompt_len):
    prompt = torch.randint(0, V, (batch, prompt_len))
    n = 16 - prompt_len + 1  # every step until the context window is full
    cached = decode_ids(model, prompt, n)
    assert torch.equal(cached, decode_ids(model, prompt, n, uncached(GREEDY)))
    assert len(set(cached.flatten().tolist())) > 1  # not a degenerate constant stream


def test_cached_sampling_equals_uncached_with_every_processor(model):
    opts = SampleConfig(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05,
                        repetition_penalty=1.3, repetition_window=5)
    prompt = torch.randint(0, V, (3, 4))
    a = decode_ids(model, prompt, 13, opts, torch.Generator().manual_seed(2))
    b = decode_ids(model, prompt, 13, uncached(opts), torch.Generator().manual_seed(2))
    assert torch.equal(a, b)


def test_generation_past_the_window_has_exact_length_and_bounded_cache(model, monkeypatch):
    caches = []
    original = GPT.new_cache

    def spy(self, *a, **kw):
        caches.append(original(self, *a, **kw))
        return caches[-1]

    monkeypatch.setattr(GPT, "new_cache", spy)
    out = decode_ids(model, torch.zeros(2, 3, dtype=torch.long), 4 * 16)
    assert out.shape == (2, 64)
    assert len(caches) == 1 and caches[0].k[0].shape[2] == 16  # allocated once, block_size long
    assert caches[0].pos <= 16


def test_past_the_window_the_cache_restarts_from_the_last_half(model):
    prompt = torch.randint(0, V, (1, 16))  # the window is full after the prompt
    cached = decode_ids(model, prompt, 2)
    # After the first new token the cache re-prefills the last 8 ids (7 old + the new one).
    first = cached[:, :1]
    context = torch.cat([prompt[:, -7:], first], dim=1)
    logits, _ = model(context)
    assert cached[0, 1].item() == logits[0, -1].argmax().item()


def test_long_prompt_is_cropped_to_block_size(model):
    prompt = torch.randint(0, V, (1, 40))
    assert torch.equal(decode_ids(model, prompt, 1), decode_ids(model, prompt[:, -16:], 1))


def test_beams_1_equals_greedy(model):
    prompt = torch.randint(0, V, (1, 3))
    greedy = decode_ids(model, prompt, 30)[0].tolist()
    assert beam_search(model, prompt, 30, beams=1) == greedy
    assert beam_search(model, prompt, 30, beams=1, use_cache=False) == decode_ids(
        model, prompt, 30, uncached(GREEDY))[0].tolist()  # past the window the paths differ


def sequence_logprob(model, prompt, seq):
    full = torch.tensor([prompt[0].tolist() + seq])
    logp = torch.log_softmax(model(full)[0][0, :-1].float(), dim=-1)
    T0 = prompt.size(1)
    return sum(logp[T0 - 1 + i, t].item() for i, t in enumerate(seq))


def test_beam_search_finds_a_likelier_sequence_than_greedy(model):
    prompt = torch.randint(0, V, (1, 2))
    greedy = beam_search(model, prompt, 10, beams=1)
    best = beam_search(model, prompt, 10, beams=6)
    assert len(best) == 10
    assert sequence_logprob(model, prompt, best) >= sequence_logprob(model, prompt, greedy) - 1e-4
    # From this prompt greedy's 10 ids are not the likeliest (-10.08 against -9.56 for the six
    # beams' best), so a search that ignored `beams` and decoded greedily fails here.
    assert best != greedy
    assert sequence_logprob(model, prompt, best) > sequence_logprob(model, prompt, greedy) + 0.1
    assert beam_search(model, prompt, 10, beams=6, use_cache=False) == best


def test_as_many_beams_as_ids_find_the_likeliest_two_ids():
    """Two steps of V beams keep every first id, so they find the likeliest of all V * V
    continuations, here not greedy's: after [0, 1] greedy takes 8 (and then 8, -2.83 in all)
    where 11 then 8 is likelier (-1.86)."""
    model, prompt = random_gpt(), torch.tensor([[0, 1]])
    with torch.no_grad():
        first = torch.log_softmax(model(prompt)[0][0, -1], dim=-1)  # (V,) over the first id
        prompts = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], dim=1)  # (V, 3)
        second = torch.log_softmax(model(prompts)[0][:, -1], dim=-1)  # (V, V): row = first id
    likeliest = list(divmod((first[:, None] + second).argmax().item(), V))
    assert likeliest != beam_search(model, prompt, 2, beams=1)
    assert beam_search(model, prompt, 2, beams=V) == likeliest
    assert beam_search(model, prompt, 2, beams=V, use_cache=False) == likeliest


def test_beam_search_stops_at_a_stop_sequence(model):
    prompt = torch.randint(0, V, (1, 2))
    free = beam_search(model, prompt, 12, beams=3)
    stop = free[4:6]
    out = beam_search(model, prompt, 12, beams=3, stops=[stop])
    assert out[-2:] == stop and len(out) <= 12


def test_beam_search_that_stops_early_returns_a_finished_hypothesis(model):
    # Every id but 12 is a stop: enough hypotheses finish at the first step to end the search,
    # and the live beam (still empty then) must not win with its score of 0.
    prompt = torch.randint(0, V, (1, 2))
    out = beam_search(model, prompt, 10, beams=2, stops=[[t] for t in range(V - 1)])
    assert len(out) == 1 and out[0] != V - 1
    # Without stops every hypothesis runs to max_new_tokens.
    assert len(beam_search(model, prompt, 10, beams=2)) == 10


def drawn(logits: torch.Tensor, draws: int = 1, **options) -> set[int]:
    """The ids that `draws` rows of a Sampler with SampleConfig(**options) draw, in one step,
    from logits (1, V)."""
    s = sampler_for(SampleConfig(**options), rows=draws)
    return set(s.step(logits.expand(draws, -1))[1])


def test_temperature_zero_is_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9], [1.0, 2.0, 2.0]])
    _, ids, ok, _ = sampler_for(GREEDY, rows=3).step(logits)
    assert ids == [1, 0, 1] and ok == [True] * 3  # a tie: the first


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_sampling_from_non_finite_logits_is_a_plain_error(model, temperature):
    """A row with a NaN or +inf logit is flagged, greedy or sampled, and `generate` says so."""
    logits = torch.tensor([[0.0, float("nan"), 1.0], [0.0, float("inf"), 1.0], [0.0, 1.0, 2.0]])
    opts = SampleConfig(temperature=temperature)
    assert sampler_for(opts, rows=3).step(logits)[2] == [False, False, True]
    with torch.no_grad():
        model.head.weight[3, 0] = float("nan")
    with pytest.raises(CharlmError, match="the model's next-character probabilities are not "
                                          "finite"):
        next(generate(model, torch.tensor([[1, 2, 3]]), 5, opts, torch.Generator()))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_greedy_and_beam_search_on_a_diverged_model_are_the_same_plain_error(model, bad):
    message = "the model's next-character probabilities are not finite"
    with torch.no_grad():
        model.head.weight[3, 0] = bad  # one logit of every position is NaN or inf
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(CharlmError, match=message):
        decode_ids(model, prompt, 5)
    for beams in (1, 3):
        with pytest.raises(CharlmError, match=message):
            beam_search(model, prompt, 5, beams)


def test_top_k_never_samples_outside_the_k_largest():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    allowed = torch.topk(logits, 5, dim=-1).indices
    s = sampler_for(SampleConfig(temperature=2.0, top_k=5), rows=4)
    for _ in range(200):
        picks = s.step(logits)[1]
        assert all(p in allowed[i] for i, p in enumerate(picks))
    assert drawn(torch.tensor([[1.0, 5.0, 3.0, 4.0]]), 200, temperature=1.0, top_k=2) == {1, 3}
    tied = torch.tensor([[4.0, 5.0, 3.0, 4.0]])  # a tie with the 2nd stays
    assert drawn(tied, 200, temperature=1.0, top_k=2) == {0, 1, 3}


def test_top_p_keeps_the_smallest_set_with_enough_mass():
    logits = torch.tensor([[0.1, 0.5, 0.05, 0.3, 0.05]]).log()
    keep = lambda p: drawn(logits, 400, temperature=1.0, top_p=p)  # noqa: E731
    assert keep(0.5) == {1}  # 0.5 alone reaches 0.5
    assert keep(0.6) == {1, 3}  # 0.5 + 0.3
    assert keep(0.85) == {0, 1, 3}  # 0.5 + 0.3 + 0.1 = 0.9
    assert keep(1.0) == {0, 1, 2, 3, 4}
    for tiny in (0.01, 1e-46, 5e-324):  # the likeliest always stays (1e-46 is 0 in float32)
        assert keep(tiny) == {1}


def test_min_p_threshold():
    logits = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]).log()
    assert drawn(logits, 600, temperature=1.0, min_p=0.1) == {0, 1, 2, 3}  # threshold 0.05
    assert drawn(logits, 600, temperature=1.0, min_p=0.0) == {0, 1, 2, 3, 4}


def test_repetition_penalty_direction():
    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5]])
    # ids 0 and 1 were seen: both became less likely (the distribution is shifted by its max)
    out = sampler_for(SampleConfig(temperature=1.0, repetition_penalty=2.0), recent=[0, 1])
    assert out.warp(logits).tolist() == [[-2.0, -5.0, 0.0, -2.5]]
    off = sampler_for(SampleConfig(temperature=1.0), recent=[0, 1])
    assert off.warp(logits).tolist() == (logits - 3.0).tolist()


def test_repetition_penalty_changes_greedy_output(model):
    prompt = torch.zeros(1, 1, dtype=torch.long)
    plain = decode_ids(model, prompt, 15)
    penalised = decode_ids(model, prompt, 15, SampleConfig(temperature=0, repetition_penalty=5.0))
    assert not torch.equal(plain, penalised)
    distinct = lambda t: len(set(t[0].tolist()))  # noqa: E731
    assert distinct(penalised) > distinct(plain)


def test_a_repetition_window_longer_than_the_text_allocates_only_the_text(model):
    prompt = torch.randint(0, V, (2, 5))
    opts = SampleConfig(temperature=0, repetition_penalty=2.0, repetition_window=16)
    expected = decode_ids(model, prompt, 11, opts)  # the window holds prompt and output whole
    for window in (17, 10**15):  # 8 PB of ids if allocated as asked
        wide = SampleConfig(temperature=0, repetition_penalty=2.0, repetition_window=window)
        assert torch.equal(decode_ids(model, prompt, 11, wide), expected)
        assert torch.equal(decode_ids(model, prompt, 11, uncached(wide)), expected)
    assert not torch.equal(decode_ids(model, prompt, 11), expected)  # the penalty made a difference


def test_same_seed_same_tokens(model):
    prompt = torch.zeros(2, 1, dtype=torch.long)
    opts = SampleConfig(temperature=1.0)
    a = decode_ids(model, prompt, 40, opts, torch.Generator().manual_seed(5))
    b = decode_ids(model, prompt, 40, opts, torch.Generator().manual_seed(5))
    c = decode_ids(model, prompt, 40, opts, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_greedy_equals_uncached_for_every_variant(variant):
    model = random_gpt(**VARIANTS[variant])
    prompt = torch.randint(0, V, (3, 4))
    cached = decode_ids(model, prompt, 13)  # up to a full window
    assert torch.equal(cached, decode_ids(model, prompt, 13, uncached(GREEDY)))
    assert len(set(cached.flatten().tolist())) > 1


@pytest.mark.parametrize("variant", ["default", "all_changed", "pos_encoding=sinusoidal",
                                     "levers"])
def test_static_position_cache_gives_the_dynamic_logits(variant):
    """The static-shape step (a device tensor as position, the whole cache masked) computes what
    the growing-slice cache does, one token at a time."""
    model = random_gpt(**VARIANTS[variant])
    idx = torch.randint(0, V, (2, 12))
    dynamic = model.new_cache(2)
    model(idx[:, :4], cache=dynamic)
    static = copy.copy(dynamic)  # the same keys and values (each step writes the same ones)
    static.pos, static.last_ids = torch.tensor(4), dynamic.last_ids.clone()
    for t in range(4, 12):
        expected, _ = model(idx[:, t:t + 1], cache=dynamic)
        got, _ = model(idx[:, t:t + 1], cache=static)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert int(static.pos) == dynamic.pos == 12


def test_compile_failure_falls_back_to_eager_with_one_warning(model, monkeypatch, capsys):
    def broken_step(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore")

    monkeypatch.setattr(compiled_step, "compiled_decode_step", lambda: broken_step)
    prompt = torch.randint(0, V, (1, 3))
    got = decode_ids(model, prompt, 20, SampleConfig(temperature=0, compile=True))
    assert torch.equal(got, decode_ids(model, prompt, 20))
    assert capsys.readouterr().err == (
        "warning: torch.compile failed (RuntimeError: InvalidCxxCompiler: No working C++ compiler "
        "found); decoding without compile\n")


def test_compile_needs_the_cache():
    with pytest.raises(CharlmError) as e:
        SampleConfig(compile=True, use_cache=False)
    assert str(e.value) == "compile needs the KV cache: it compiles the cached decode step"


@pytest.mark.parametrize("use_cache", [True, False])
def test_forward_hooks_run_at_every_decode_step(model, use_cache):
    """The cached decode goes through the same modules as training, so their hooks fire."""
    calls = {"block": 0, "attn": 0}
    model.blocks[1].register_forward_hook(lambda *_: calls.__setitem__("block", calls["block"] + 1))
    model.blocks[0].attn.register_forward_hook(
        lambda *_: calls.__setitem__("attn", calls["attn"] + 1))
    decode_ids(model, torch.randint(0, V, (2, 3)), 6,
               SampleConfig(temperature=0, use_cache=use_cache))
    assert calls == {"block": 6, "attn": 6}  # one prefill, then five one-token steps

"""charlm.serve.engine: continuous batching against `generate` (greedy parity under 16 concurrent
requests, past the context window, for learned and rotary positions), seeded determinism in a
crowd, stop strings, logprobs, cancel, close, bad prompts, the compiled step, the
encoder-decoder, and the caller's model left as it was."""

import threading

import pytest
import torch
from safetensors.torch import save_file

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.generation import compiled_step
from charlm.generation.decoding import CachedDecoder
from charlm.generation.seq2seq import translate_ids
from charlm.generation.text import sample_text
from charlm.model import layers
from charlm.runtime.profile import DecodeLayout
from charlm.serve.engine import Engine, Event, Params, Stats, slots_within
from charlm.serve.responses import Choice, usage
from tests.helpers import RANDOM_GPT_VOCAB, decode_ids, fixed_memory, random_gpt, random_seq2seq

VOCAB = Vocab("abcdefghijklm"[:RANDOM_GPT_VOCAB])
BLOCK = 16  # random_gpt's block_size
GREEDY = Params(max_tokens=40, temperature=0)


class Completion:
    """What one request received: its events, and when it finished."""

    def __init__(self):
        self.events: list[Event] = []
        self.finished = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if event.finish_reason is not None:
            self.finished.set()

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def reason(self) -> str | None:
        return self.events[-1].finish_reason if self.events else None


def run(engine: Engine, jobs: list[tuple[str, Params]], timeout: float = 60) -> list[Completion]:
    """Submit every job before the engine starts (so they decode together), wait for all."""
    done = [Completion() for _ in jobs]
    for (prompt, params), completion in zip(jobs, done, strict=True):
        engine.submit(prompt, params, completion)
    engine.start()
    try:
        for completion in done:
            assert completion.finished.wait(timeout)
    finally:
        engine.close()
    return done


@torch.inference_mode()  # as the engine decodes (and generate)
def greedy_reference(model, prompt: str, n: int) -> tuple[str, list[torch.Tensor]]:
    """`generate`'s greedy text after prompt (cropped as `charlm sample` crops it), with the
    logits (V,) each character was chosen from."""
    ids = torch.tensor([VOCAB.encode(prompt[-BLOCK:])])
    decoder = CachedDecoder(model, 1)
    logits, out, seen = decoder.prefill(ids), [], []
    for i in range(n):
        if i:
            logits = decoder.step(torch.tensor([out[-1]]))
        seen.append(logits[0])
        out.append(int(logits[0].argmax()))
    assert out == decode_ids(model, ids, n)[0].tolist()  # the loop above is generate's
    return VOCAB.decode(out), seen


def assert_greedy_parity(model, jobs, done) -> None:
    """Each completion is generate's greedy text, except where a near-tie (top two logits
    within 1e-5) flipped: from there the two may differ."""
    for (prompt, params), completion in zip(jobs, done, strict=True):
        expected, logits = greedy_reference(model, prompt, params.max_tokens)
        got = completion.text
        assert len(got) == params.max_tokens and completion.reason == "length"
        t = next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), None)
        if t is not None:
            top2 = logits[t].topk(2)
            assert float(top2.values[0] - top2.values[1]) < 1e-5, (prompt, t)
            assert VOCAB.encode(got[t])[0] in top2.indices.tolist()


def prompts(n: int, seed: int = 0) -> list[str]:
    """n prompts of different lengths, some longer than the context."""
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 2, 3, 5, 7, 9, 11, 13, 15, 16, 17, 20, 24, 4, 6, 8][:n]
    return [VOCAB.decode(torch.randint(0, len(VOCAB), (k,), generator=g).tolist())
            for k in lengths]


# Each position encoding once with all 16 decoding together and once with 5 slots (the rest
# queue): the two axes are crossed in a Latin square rather than in full. learned: 16 slots;
# rope: 5 (rotary positions of rows that join late); bigram + qk_norm: 16 and 5 (its rows'
# previous tokens, kept apart as rows leave and join).
@pytest.mark.parametrize("options, slots", [({"pos_encoding": "learned"}, 16),
                                            ({"pos_encoding": "rope"}, 5),
                                            ({"bigram": True, "qk_norm": True}, 16),
                                            ({"bigram": True, "qk_norm": True}, 5)])
def test_greedy_of_16_concurrent_requests_equals_generate(options, slots):
    """16 requests of different prompt lengths and max_tokens, past block_size (each row's
    window rule on its own: even the 1-character prompt ends 2 past it); with 5 slots the rest
    queue and take the slots that free up. A bigram model's rows each keep their own previous
    token."""
    model = random_gpt(**options)
    jobs = [(p, Params(max_tokens=17 + i, temperature=0)) for i, p in enumerate(prompts(16))]
    engine = Engine(model, VOCAB, slots=slots)
    done = run(engine, jobs)
    assert_greedy_parity(model, jobs, done)
    assert len({c.text for c in done}) > 8  # not one constant stream
    # the longest request ends alone in the batch
    assert engine.stats() == Stats(slots=slots, busy=0, queued=0, batch_size=1,
                                   characters=sum(p.max_tokens for _, p in jobs))


def test_the_engine_decodes_from_its_own_copy_and_leaves_the_callers_model_as_it_was(
        monkeypatch, tmp_path):
    """Laid out column-major (given, so nothing is timed; every weight counts as large), the
    engine's copy decodes generate's greedy text, and the caller's model keeps its tensors
    bitwise, contiguous at the same addresses, in train mode: safetensors saves it."""
    monkeypatch.setattr(layers, "SPLIT_MIN_WEIGHTS", 0)
    model = random_gpt().train()
    before = {name: (p.data_ptr(), p.clone()) for name, p in model.state_dict().items()}
    engine = Engine(model, VOCAB, layout=DecodeLayout(2, True))
    assert engine.layout == DecodeLayout(2, True) and engine.model is not model
    assert model.training and not engine.model.training
    own = {k: v for k, v in engine.model.state_dict().items() if k != "head.weight"}  # tied
    assert not all(t.is_contiguous() for t in own.values())  # the copy is column-major
    with pytest.raises(ValueError, match="contiguous"):
        save_file(own, tmp_path / "copy.safetensors")
    for name, t in model.state_dict().items():
        ptr, value = before[name]
        assert t.data_ptr() == ptr and t.is_contiguous() and torch.equal(t, value), name
    save_file({k: v for k, v in model.state_dict().items() if k != "head.weight"},
              tmp_path / "model.safetensors")
    jobs = [(p, Params(max_tokens=20, temperature=0)) for p in prompts(4)]
    done = run(engine, jobs)
    assert_greedy_parity(model.eval(), jobs, done)


def test_a_seeded_request_gives_the_same_text_alone_and_among_15_others():
    model = random_gpt()
    params = Params(max_tokens=50, temperature=0.9, top_k=8, top_p=0.95,
                    repetition_penalty=1.2, seed=7)
    [alone] = run(Engine(model, VOCAB), [("abc", params)])
    others = [(p, Params(max_tokens=30 + i, temperature=1.0, seed=100 + i)) if i % 2 else
              (p, Params(max_tokens=30 + i, temperature=0)) for i, p in enumerate(prompts(15))]
    crowd = run(Engine(model, VOCAB), others[:7] + [("abc", params)] + others[7:])
    assert crowd[7].text == alone.text and len(alone.text) == 50
    # and `charlm sample --seed 7` with the same options draws the same characters
    [sample] = sample_text(model, VOCAB, "abc", SampleConfig(
        max_new_tokens=50, temperature=0.9, top_k=8, top_p=0.95, repetition_penalty=1.2, seed=7))
    assert sample.text == alone.text
    [other_seed] = run(Engine(model, VOCAB), [("abc", Params(**{**params.__dict__, "seed": 8}))])
    assert other_seed.text != alone.text


def test_a_completion_ends_before_its_first_stop_string():
    model = random_gpt()
    expected, _ = greedy_reference(model, "abc", 40)
    stop = expected[12:15]
    cut = expected.index(stop)
    [stopped, held, unmatched] = run(Engine(model, VOCAB), [
        ("abc", Params(max_tokens=40, temperature=0, stop=("zz", stop))),
        # the last two characters may start a stop string until max_tokens ends the request
        ("abc", Params(max_tokens=14, temperature=0, stop=(expected[12:14] + "z",))),
        ("abc", Params(max_tokens=40, temperature=0, stop=("z",))),
    ])
    assert (stopped.text, stopped.reason) == (expected[:cut], "stop")
    assert (held.text, held.reason) == (expected[:14], "length")
    assert (unmatched.text, unmatched.reason) == (expected, "length")
    # one event per character, then the last one, which adds none
    assert [e.text for e in stopped.events] == list(expected[:cut]) + [""]


def test_logprobs_are_of_the_penalised_tempered_distribution():
    model = random_gpt()
    prompt = "abcab"
    params = Params(max_tokens=5, temperature=0.7, repetition_penalty=1.5, seed=3, logprobs=3)
    [greedy, sampled] = run(Engine(model, VOCAB), [
        (prompt, Params(max_tokens=5, temperature=0, logprobs=5)), (prompt, params)])
    with torch.inference_mode():
        logits = model(torch.tensor([VOCAB.encode(prompt)]))[0][:, -1].float()  # (1, V)
    # greedy: the model's own distribution; the chosen character is the likeliest
    first = greedy.events[0]
    expected = torch.log_softmax(logits[0], dim=-1)
    assert list(first.top) == [VOCAB.chars[i] for i in expected.topk(5).indices.tolist()]
    assert first.logprob == pytest.approx(float(expected.max()), abs=1e-5)
    assert first.top[first.text] == first.logprob
    # sampled: after the repetition penalty and the temperature, before top-k and top-p
    seen = torch.zeros_like(logits, dtype=torch.bool)
    seen[0, VOCAB.encode(prompt)] = True
    x = torch.where(seen, torch.where(logits > 0, logits / 1.5, logits * 1.5), logits) / 0.7
    expected = torch.log_softmax(x[0], dim=-1)
    first = sampled.events[0]
    assert first.logprob == pytest.approx(float(expected[VOCAB.encode(first.text)[0]]), abs=1e-5)
    assert len(first.top) == 3
    assert all(e.logprob is not None for e in sampled.events[:-1])
    assert sampled.events[-1] == Event("", finish_reason="length")


def test_a_cancelled_request_leaves_at_the_next_step_and_frees_its_slot():
    model = random_gpt()
    engine = Engine(model, VOCAB, slots=1)
    first, second = Completion(), Completion()

    def cancel_after_three(event: Event) -> None:
        first(event)
        if len(first.events) == 3:
            request.cancel()

    request = engine.submit("abc", Params(max_tokens=10_000, temperature=0), cancel_after_three)
    engine.submit("ba", GREEDY, second)  # queued until the slot is free
    engine.start()
    try:
        assert second.finished.wait(30)
        assert first.reason == "cancelled" and len(first.text) == 3
        assert second.text == greedy_reference(model, "ba", 40)[0]
        assert engine.stats().busy == 0
    finally:
        engine.close()


def test_close_ends_requests_in_flight_and_queued_with_shutdown():
    model = random_gpt()
    engine = Engine(model, VOCAB, slots=1)
    running, queued = Completion(), Completion()
    started = threading.Event()

    def on_event(event: Event) -> None:
        running(event)
        started.set()

    engine.submit("abc", Params(max_tokens=10**9, temperature=0), on_event)
    engine.submit("abc", GREEDY, queued)
    engine.start()
    assert started.wait(30)
    assert engine.stats().busy == 1 and engine.stats().queued == 1
    engine.close(grace_s=10)
    assert not engine.thread.is_alive()
    assert running.reason == "shutdown" and queued.events == [Event("", finish_reason="shutdown")]
    with pytest.raises(CharlmError, match="the engine is shutting down"):
        engine.submit("abc", GREEDY, Completion())


@pytest.mark.parametrize("prompt, params, message", [
    ("abz!", GREEDY, "the prompt has characters outside the model's vocabulary: 'z' at position "
                     "2, '!' at position 3; remove them"),
    ("", GREEDY, "the prompt is empty; give at least one character the model knows"),
    ("abc", Params(max_tokens=5, stop=("",)), "stop must not be empty"),
])
def test_a_bad_prompt_is_one_line_error_at_submit(prompt, params, message):
    engine = Engine(random_gpt(), VOCAB)
    with pytest.raises(CharlmError) as e:
        engine.submit(prompt, params, Completion())
    assert str(e.value) == message
    assert engine.stats().queued == 0


def test_the_compiled_step_is_one_graph_for_every_batch(monkeypatch):
    """compile=True builds the batched step at start; requests joining and leaving never build
    another (a stand-in backend that runs the traced graph counts the traces and the steps)."""
    traces, steps = [], []

    def backend(gm, example_inputs):
        traces.append(gm)
        return lambda *args: steps.append(1) or gm.forward(*args)

    step = torch.compile(compiled_step.decode_one_token, backend=backend, dynamic=False,
                         fullgraph=True)
    monkeypatch.setattr(compiled_step, "compiled_decode_step", lambda: step)
    model = random_gpt(pos_encoding="rope")
    engine = Engine(model, VOCAB, slots=6, compile=True)
    jobs = [(p, Params(max_tokens=18 + 2 * i, temperature=0)) for i, p in enumerate(prompts(10))]
    done = [Completion() for _ in jobs]
    engine.start()
    assert len(traces) == 1
    try:
        for (prompt, params), completion in zip(jobs, done, strict=True):
            engine.submit(prompt, params, completion)
        assert all(c.finished.wait(60) for c in done)
    finally:
        engine.close()
    assert_greedy_parity(model, jobs, done)
    assert len(traces) == 1
    assert len(steps) > 20  # the steps with more than half the slots live ran the graph


def test_an_encoder_decoder_completes_the_source_with_its_target():
    model = random_seq2seq()
    vocab = PairVocab(tuple("abcdefg"), tuple("ABCDEFGHI"))
    [greedy, capped, bad] = [Completion() for _ in range(3)]
    engine = Engine(model, vocab)
    engine.submit("abcab", Params(max_tokens=30, temperature=0), greedy)
    engine.submit("abcab", Params(max_tokens=2, temperature=0), capped)
    with pytest.raises(CharlmError, match="logprobs are not available for an encoder-decoder"):
        engine.submit("abc", Params(max_tokens=3, logprobs=1), bad)
    engine.start()
    try:
        assert greedy.finished.wait(30) and capped.finished.wait(30)
    finally:
        engine.close()
    [ids] = translate_ids(model, torch.tensor([vocab.encode_source("abcab")]),
                          SampleConfig(max_new_tokens=30, temperature=0))
    expected = vocab.decode_target(ids)
    assert greedy.text == expected and len(expected) > 2
    assert (capped.text, capped.reason) == (expected[:2], "length")


def test_a_request_that_fails_ends_with_an_error_and_the_others_go_on(monkeypatch, capsys):
    """A prefill that raises ends its request with finish_reason "error" and the reason; a
    request whose logits are not finite ends the same way, alone; the batch goes on. Each
    failure is a warning line in the server's log (the logits' said nothing)."""
    model = random_gpt()
    engine = Engine(model, VOCAB, slots=4)
    real_add = engine.decoder.add

    def add(ids):
        if ids == VOCAB.encode("bad"):
            raise RuntimeError("out of memory\ndetails")
        return real_add(ids)

    monkeypatch.setattr(engine.decoder, "add", add)
    real_step = engine.sampler.step

    def step(logits):
        for i, row in enumerate(engine.rows):
            if row.request.ids == VOCAB.encode("mam") and row.count == 3:
                logits = logits.clone()
                logits[i] = float("nan")
        return real_step(logits)

    monkeypatch.setattr(engine.sampler, "step", step)
    bad, nan, good = run(engine, [("bad", GREEDY), ("mam", GREEDY), ("abc", GREEDY)])
    assert bad.events == [Event("", finish_reason="error",
                                error="RuntimeError: out of memory")]
    assert nan.reason == "error" and nan.events[-1].error.startswith(
        "the model's next-character probabilities are not finite")
    assert len(nan.text) == 3
    assert capsys.readouterr().err.splitlines() == [
        "warning: a request failed (RuntimeError: out of memory)",
        f"warning: a request failed ({nan.events[-1].error})"]
    assert good.text == greedy_reference(model, "abc", 40)[0] and good.reason == "length"
    assert engine.stats().busy == 0


def test_a_byte_model_serves_whole_characters_as_charlm_sample_does():
    """A random GPT over 13 bytes: each event is one whole character (its logprob the sum of
    its bytes'), a seeded request's text is `sample_text`'s, and top logprobs, which a
    character would need several draws for, are one error."""
    vocab = Vocab(sorted(set("ab é漢🙂\n".encode().decode("latin-1"))), "byte")
    model = random_gpt()
    params = Params(max_tokens=60, temperature=1.0, seed=4, logprobs=0)
    [done] = run(Engine(random_gpt(), vocab, slots=2), [("é", params)])
    texts = [e.text for e in done.events[:-1]]
    assert texts and all(len(t) == 1 for t in texts) and "\ufffd" not in done.text
    assert any(len(t.encode()) > 1 for t in texts)
    assert all(e.logprob is not None and e.logprob <= 0 for e in done.events[:-1])
    [expected] = sample_text(model, vocab, "é", SampleConfig(max_new_tokens=60, temperature=1.0,
                                                         seed=4))
    assert done.text == expected.text
    with pytest.raises(CharlmError, match="top logprobs are per character"):
        Engine(model, vocab).submit("é", Params(max_tokens=5, logprobs=2), Completion())


def test_default_slots_fit_their_keys_and_values_in_the_budget():
    """A slot holds every layer's keys and values over the block, in float32 on the CPU even
    for bf16 weights (attention's dtype there)."""
    model = random_gpt()
    cfg = model.cfg
    per_slot = 2 * cfg.n_layer * cfg.block_size * cfg.n_embd * 4
    assert per_slot == sum(t[0].numel() * 4 for t in model.new_cache(1).k + model.new_cache(1).v)
    assert slots_within(model, 3 * per_slot + per_slot // 2, most=64) == 3
    assert slots_within(model, 100 * per_slot, most=64) == 64
    assert slots_within(model, per_slot - 1, most=64) == 1  # one at least
    assert slots_within(model.to(torch.bfloat16), 3 * per_slot, most=64) == 3


def test_more_slots_than_memory_holds_are_refused_before_anything_is_allocated(monkeypatch):
    """`charlm serve RUN --slots 10000000` allocated the KV cache until the kernel killed it."""
    fixed_memory(monkeypatch, 1)
    model = random_gpt()  # 2 layers x 16 positions x 32 dims x float32: 8 KiB a slot's K and V
    Engine(model, VOCAB, slots=1000)  # 8 MiB
    with pytest.raises(CharlmError) as e:  # (that old code allocates 1.5 GiB, not 76 GiB)
        Engine(model, VOCAB, slots=200_000)
    assert str(e.value) == ("200,000 slots need about 1.5 GiB for their keys and values, more "
                            "than the 1.0 GiB of cpu; give fewer --slots (the default fits "
                            "them in 1 GiB)")


def test_an_encoder_decoder_s_tokens_are_its_target_units_as_max_tokens_counts_them():
    """max_tokens counts a space-unit model's phonemes, and `usage` counted its characters
    (spaces included): the event says how many target units its text holds."""
    model = random_seq2seq()
    vocab = PairVocab(tuple("abcdefg"), ("AA", "B", "CH", "D", "EH", "F", "G", "HH", "IY"),
                      "space")
    capped = Completion()
    engine = Engine(model, vocab)
    engine.submit("abcab", Params(max_tokens=2, temperature=0), capped)
    engine.start()
    try:
        assert capped.finished.wait(30)
    finally:
        engine.close()
    [event] = [e for e in capped.events if e.text]
    assert len(event.text.split()) == 2 and event.tokens == 2
    choice = Choice(0)
    for e in capped.events:
        choice.add(e)
    assert usage(5, [choice]) == {"prompt_tokens": 5, "completion_tokens": 2,
                                  "total_tokens": 7}


def test_a_decode_step_samples_every_row_in_one_softmax(monkeypatch):
    """Eight sampled requests with different options decode together: one softmax a step for
    the whole batch, not one a row, and each request's text is its text alone (its own
    generator)."""
    model = random_gpt()
    jobs = [("abc", Params(max_tokens=6, temperature=0.8 + i / 10, top_k=(None, 3)[i % 2],
                           top_p=(None, 0.9)[i // 4], min_p=(None, 0.05)[i % 3 == 0],
                           repetition_penalty=(1.0, 1.3)[i % 2], seed=i)) for i in range(8)]
    alone = [run(Engine(model, VOCAB, slots=1), [job])[0].text for job in jobs]
    calls = []
    real_softmax = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda *a, **k: calls.append(1) or real_softmax(*a, **k))
    together = run(Engine(model, VOCAB, slots=8), jobs)
    assert [c.text for c in together] == alone
    assert len(calls) <= 7  # one a step (6 characters each), however many rows

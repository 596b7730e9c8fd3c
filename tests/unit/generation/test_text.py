"""charlm.generation.text: prompts, stop strings and `sample_text` with its memory guard."""

import random

import pytest
import torch

from charlm.cli.options import flag as cli_flag
from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError, SettingError
from charlm.data.vocab import Vocab
from charlm.generation.text import StopMatcher, encode_prompt, sample_text
from charlm.model.footprint import sampling_bytes
from charlm.model.gpt import GPT
from tests.helpers import RANDOM_GPT_VOCAB, random_gpt, sampler_for

V = RANDOM_GPT_VOCAB


VOCAB = Vocab([chr(ord("a") + i) for i in range(V)])  # 'a'..'m'


@pytest.fixture
def model() -> GPT:
    return random_gpt()


def test_more_samples_or_beams_than_memory_holds_is_a_plain_error(model, monkeypatch):
    """A mistyped num_samples or beams is refused up front, naming the memory its keys and
    values and a forward need, rather than exhausting the machine or failing in the
    allocator."""
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: 2**30)
    for opts, setting, flag in [
            (SampleConfig(beams=10**12, max_new_tokens=1), "beams", "--beams"),
            (SampleConfig(num_samples=10**12, max_new_tokens=1), "num_samples", "--num-samples")]:
        with pytest.raises(SettingError) as e:  # 8 KiB of keys and values, 52 KiB forward a row
            sample_text(model, VOCAB, "ab", opts)
        message = ("{} 1,000,000,000,000 needs about 57,637,691.5 GiB for the keys and values "
                   "of the context and a forward's activations, more than the 1.0 GiB of cpu; "
                   "use a smaller {}")
        assert str(e.value) == message.format(setting, setting)  # as the Python API says it
        assert e.value.calling(cli_flag) == message.format(flag, flag)  # as the CLI does
    four = sampling_bytes(model.cfg, V, 4, 4)
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: four)
    assert len(sample_text(model, VOCAB, "ab", SampleConfig(num_samples=4, max_new_tokens=3))) == 4
    with pytest.raises(CharlmError):
        sample_text(model, VOCAB, "ab", SampleConfig(num_samples=5, max_new_tokens=3))


def test_the_memory_guard_counts_the_float32_cache_of_a_half_precision_model(model,
                                                                            monkeypatch):
    """On the CPU a bf16 model keeps its KV cache in float32 (`attention.attention_dtype`), so four
    samples need what they need in float32, not half the cache."""
    model = model.to(torch.bfloat16)
    four = sampling_bytes(model.cfg, V, 4, 4)
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: four)
    assert len(sample_text(model, VOCAB, "ab", SampleConfig(num_samples=4, max_new_tokens=3))) == 4
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: four - 1)
    with pytest.raises(CharlmError, match="num_samples 4 needs about"):
        sample_text(model, VOCAB, "ab", SampleConfig(num_samples=4, max_new_tokens=3))


def test_stop_matcher_holds_back_and_cuts():
    m = StopMatcher(["\n\n", "END"], include_stop=False)
    assert [m.feed(c) for c in "ab\nc"] == ["a", "b", "", "\nc"]
    assert [m.feed(c) for c in "xEN"] == ["x", "", ""]
    assert m.feed("D") == "" and m.done
    m2 = StopMatcher(["END"], include_stop=True)
    assert "".join(m2.feed(c) for c in "aEND") == "aEND" and m2.done
    m3 = StopMatcher(["END"], include_stop=False)
    assert "".join(m3.feed(c) for c in "xEN") + m3.flush() == "xEN" and not m3.done


@pytest.mark.parametrize("stops", [["b", "ab"], ["ab", "b"]])
def test_stop_strings_ending_together_cut_the_longest_whatever_their_order(stops):
    m = StopMatcher(stops, include_stop=False)
    assert "".join(m.feed(c) for c in "xxab") == "xx" and m.done


def reference_feed(stops: list[str], text: str) -> tuple[list[str], bool]:
    """What a matcher shows of `text` fed a character at a time, by the definition: cut at the
    end of the first (longest) stop string the text ends with; else show all but the longest
    tail that is a proper prefix of a stop string."""
    shown, pending = [], ""
    for c in text:
        pending += c
        ended = [s for s in sorted(stops, key=len, reverse=True) if pending.endswith(s)]
        if ended:
            return [*shown, pending[: -len(ended[0])]], True
        hold = max((n for s in stops for n in range(1, len(s)) if pending.endswith(s[:n])),
                   default=0)
        shown.append(pending[: len(pending) - hold])
        pending = pending[len(pending) - hold:]
    return shown, False


def test_stop_matcher_shows_what_the_definition_shows_on_random_texts():
    """The automaton against the definition, on 500 random texts and sets of stop strings over
    two letters, where prefixes overlap most (aab in aaab, abab in ababab)."""
    rng = random.Random(0)
    for _ in range(500):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5)))
                 for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 30)))
        m = StopMatcher(stops, include_stop=False)
        shown = []
        for c in text:
            shown.append(m.feed(c))
            if m.done:
                break
        assert (shown, m.done) == reference_feed(stops, text), (stops, text)


def test_stop_matcher_holds_back_a_long_stop_strings_prefix_and_lets_it_go():
    """Four stop strings of 250,000 characters (a 1 MB request body), whose prefixes the text
    runs into: held back while they may still match, shown once they cannot. (Building every
    prefix of every stop string for every character took 13 s for 3 characters; the automaton
    takes a few steps a character: the time is the note's and the benchmark's, not a test's.)"""
    stops = ["A" * 249_999 + c for c in "BCDE"]
    m = StopMatcher(stops, include_stop=False)
    assert [m.feed(c) for c in "xAA"] == ["x", "", ""]
    assert m.feed("x") == "AAx" and not m.done


def test_sample_text_stops_at_the_stop_string(model):
    free = sample_text(model, VOCAB, "ab", SampleConfig(temperature=0, max_new_tokens=12))[0]
    stop = free.text[5:7]
    first = free.text.index(stop)
    out = sample_text(model, VOCAB, "ab",
                      SampleConfig(temperature=0, max_new_tokens=12, stop=(stop,)))[0]
    assert out.text == free.text[:first] and out.stopped and out.tokens == first + 2
    kept = sample_text(model, VOCAB, "ab", SampleConfig(temperature=0, max_new_tokens=12,
                                                        stop=(stop,), include_stop=True))[0]
    assert kept.text == free.text[:first + 2]


def test_sample_text_batch_streams_in_order(model):
    pieces: list[tuple[int, str]] = []
    opts = SampleConfig(temperature=1.0, num_samples=3, max_new_tokens=20, seed=4)
    samples = sample_text(model, VOCAB, "a", opts, lambda i, s: pieces.append((i, s)))
    assert len(samples) == 3 and all(s.tokens == 20 and len(s.text) == 20 for s in samples)
    for i, s in enumerate(samples):
        assert "".join(p for j, p in pieces if j == i) == s.text
    again = sample_text(model, VOCAB, "a", opts)  # the same seed: the same texts
    assert [s.text for s in again] == [s.text for s in samples]
    assert len({s.text for s in samples}) == 3


def test_encode_prompt_unknown_policies():
    with pytest.raises(CharlmError) as e:
        encode_prompt(VOCAB, "abZcY", "error", 16)
    assert str(e.value) == ("prompt has characters outside the model's vocabulary: 'Z' at "
                            "position 2, 'Y' at position 4; remove them or pass --unknown skip")
    text, ids, warnings = encode_prompt(VOCAB, "abZcY", "skip", 16)
    assert (text, ids) == ("abc", [0, 1, 2])
    assert warnings == ["skipped 2 characters of the prompt outside the vocabulary: 'Z' at "
                        "position 2, 'Y' at position 4"]
    text, ids, warnings = encode_prompt(VOCAB, "abcdefghij" * 2, "error", 16)
    assert (text, ids) == ("abcdefghij" * 2, VOCAB.encode(("abcdefghij" * 2)[-16:]))
    assert warnings == ["the prompt has 20 characters, more than the context of 16; using its "
                        "last 16"]
    with pytest.raises(CharlmError, match="the prompt is empty"):
        encode_prompt(VOCAB, "ZZ", "skip", 16)



def test_a_byte_model_sees_whole_characters_of_a_long_prompt_and_the_prompt_stays_whole():
    """A prompt longer than the context was printed cut, for a byte model inside a character:
    the prompt is kept as given, and the model sees the whole characters that fit."""
    vocab = Vocab(sorted(set("aé".encode().decode("latin-1"))), "byte")
    text, ids, warnings = encode_prompt(vocab, "aé" * 4, "error", 4)
    assert text == "aé" * 4
    assert ids == vocab.encode("aé")  # its last 4 bytes start inside an é: 3 are seen
    assert warnings == ["the prompt has 12 bytes, more than the context of 4; using its "
                        "last 4"]


def test_unknown_prompt_characters_are_listed_up_to_ten():
    """A prompt in another script (a long --prompt-file) is one error line of ten characters and
    a count, not every character of the file."""
    listed = ", ".join(f"'Z' at position {i}" for i in range(10))
    with pytest.raises(CharlmError) as e:
        encode_prompt(VOCAB, "Z" * 500 + "a", "error", 16)
    assert str(e.value) == ("prompt has characters outside the model's vocabulary: "
                            f"{listed} and 490 more; remove them or pass --unknown skip")
    _, _, warnings = encode_prompt(VOCAB, "Z" * 500 + "a", "skip", 16)
    assert warnings == [f"skipped 500 characters of the prompt outside the vocabulary: {listed} "
                        "and 490 more"]


def test_a_tiny_temperature_or_penalty_that_overflows_the_logits_still_samples(model):
    # logits / 1e-45 and a positive logit / a penalty of 1e-40 overflow float32 to +inf; the
    # draw then goes to the likeliest characters, as the limit says, instead of failing on NaN.
    greedy = sample_text(model, VOCAB, "ab", SampleConfig(temperature=0, max_new_tokens=12))[0]
    for temperature in (1e-45, 1e-46, 5e-324):  # 1e-46 and less are 0 in float32
        tiny = sample_text(model, VOCAB, "ab",
                           SampleConfig(temperature=temperature, max_new_tokens=12))
        assert tiny[0].text == greedy.text
    logits = torch.tensor([[2.0, 1.0, 3.0, -0.5]])
    # CUDA divides by a number as a product with its inverse, inf for these: the same product
    # here, so what runs on the CPU is what runs there (0 * inf would be NaN)
    for temperature in (1e-45, 2.0**-149, 1e-40):
        scaled = sampler_for(SampleConfig(temperature=temperature)).warp(logits)
        assert scaled[0, 2] == 0 and bool((scaled[0, [0, 1, 3]] < -1e37).all()), scaled
    boosted = sampler_for(SampleConfig(temperature=1.0, repetition_penalty=1e-40), recent=[1])
    assert [boosted.step(logits)[1][0] for _ in range(20)] == [1] * 20


def test_sample_text_ends_where_it_is_once_stop_says_so(model):
    """What lets a training run's eval sample (train.sample_chars) give way to a stop signal."""
    opts = SampleConfig(num_samples=2, max_new_tokens=50, seed=1)
    full = sample_text(model, VOCAB, "ab", opts)
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) == 5

    cut = sample_text(model, VOCAB, "ab", opts, stop=stop)
    assert len(asked) == 5
    assert [(s.tokens, s.text, s.stopped) for s in cut] == [(5, s.text[:5], False) for s in full]


def test_a_byte_models_samples_are_whole_utf8_characters(model):
    """A random GPT over 13 bytes (those of 'ab é漢🙂\\n', leads and continuations mixed): every
    sample, beam search's too, streams only whole characters, never a replacement character,
    and the text's UTF-8 is the bytes drawn less at most an unfinished last character."""
    raw = "ab é漢🙂\n".encode()
    vocab = Vocab(sorted(set(raw.decode("latin-1"))), "byte")
    assert len(vocab) == V
    for opts in (SampleConfig(max_new_tokens=60, num_samples=4, seed=3),
                 SampleConfig(max_new_tokens=40, beams=3)):
        pieces: dict[int, list[str]] = {}

        def emit(i: int, s: str, pieces=pieces) -> None:
            pieces.setdefault(i, []).append(s)

        samples = sample_text(model, vocab, "é", opts, emit)
        for i, sample in enumerate(samples):
            assert "".join(pieces.get(i, [])) == sample.text
            assert "\ufffd" not in sample.text
            assert sample.tokens - 3 <= len(sample.text.encode()) <= sample.tokens
        assert any(len(c.encode()) > 1 for s in samples for c in s.text)


def test_a_prompt_takes_the_normal_form_of_the_models_data():
    """--unicode-normalize NFC: an NFD `café` (e + U+0301) was unknown to a model that knows
    `é`; it is put in the vocabulary's form first, and the form survives the checkpoint."""
    import unicodedata

    vocab = Vocab(list(" acfé"), normalize="NFC")
    nfd = unicodedata.normalize("NFD", "café")
    assert encode_prompt(vocab, nfd, "error", 16)[:2] == ("café", vocab.encode("café"))
    assert Vocab.from_state(vocab.state()) == vocab != Vocab(list(" acfé"))
    with pytest.raises(CharlmError, match="outside the model's vocabulary"):
        encode_prompt(Vocab(list(" acfé")), nfd, "error", 16)

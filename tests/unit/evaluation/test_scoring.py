"""charlm.evaluation.scoring: loss and bits per character of a text over overlapping windows."""

import bz2
import gzip
import lzma
import math
import tracemalloc

import numpy as np
import pytest
import torch

from charlm.config.schema import ModelConfig
from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab
from charlm.evaluation.scoring import (
    score_file,
    score_ids,
    score_stream,
    score_text,
    score_windows,
    stream_windows,
)
from charlm.model.gpt import GPT

V = 7
VOCAB = Vocab(list("abcdefg"))


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(block_size=8, n_layer=1, n_head=2, n_embd=16), V).eval()


def reference_windows(n: int, block: int, min_context: int) -> list[tuple[int, int]]:
    """(start, first new target offset) per window over n ids: the plan `stream_windows` cuts
    from its buffer, written out whole."""
    out, scored_to, start = [], 0, 0  # scored_to: targets 1..scored_to are done
    while scored_to < n - 1:
        out.append((start, scored_to - start))
        scored_to = min(start + block, n - 1)
        start += block - min_context
    return out


@pytest.mark.parametrize("n, min_context", [(2, 4), (9, 4), (10, 4), (37, 4), (37, 0), (37, 7)])
@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_every_character_after_the_first_is_scored_once_with_enough_context(n, min_context,
                                                                           chunk):
    block = 8
    ids = np.arange(n)  # each id its own position
    chunks = [ids[i:i + chunk] for i in range(0, n, chunk)]
    scored = []
    for row, offset in stream_windows(chunks, block, min_context):
        assert len(row) <= block + 1
        for target in row[1:][offset:].tolist():
            assert target - row[0] >= min(min_context, target)  # the first window: what there is
            scored.append(target)
    assert scored == list(range(1, n))


def test_score_equals_one_forward_when_the_text_fits(model):
    ids = torch.randint(0, V, (9,))  # 8 inputs, 8 targets: one window
    logits, _ = model(ids[None, :-1])
    expected = -torch.log_softmax(logits[0], -1).gather(-1, ids[1:, None]).sum().item()
    total, count = score_windows(model, stream_windows([ids.numpy()], 8, 4))
    assert count == 8 and total == pytest.approx(expected, rel=1e-5)


def test_long_text_matches_a_per_window_reference(model):
    ids = torch.randint(0, V, (50,))
    total, count = score_windows(model, stream_windows([ids.numpy()], 8, 4), batch_size=3)
    ref = 0.0
    for start, offset in reference_windows(50, 8, 4):
        x = ids[start:start + 9]
        logp = torch.log_softmax(model(x[None, :-1])[0][0], -1)
        ref -= logp.gather(-1, x[1:, None])[offset:].sum().item()
    assert count == 49 and total == pytest.approx(ref, rel=1e-5)


def test_score_text_units_and_unknown_policies(model):
    text = "abcabcgfedcba" * 5
    s = score_text(model, VOCAB, text, progress=False)
    assert s.chars_scored == len(text) - 1
    assert s.bpc == pytest.approx(s.loss / math.log(2))
    assert s.perplexity == pytest.approx(math.exp(s.loss))
    with pytest.raises(CharlmError) as e:
        score_text(model, VOCAB, "abXcY" + text, progress=False)
    assert str(e.value) == ("the text has 2 characters outside the model's vocabulary ('X' at 2,"
                            " 'Y' at 4); pass --unknown skip to drop them")
    skipped = score_text(model, VOCAB, "abXcY" + text, unknown="skip", progress=False)
    assert skipped.skipped_unknown == 2
    assert skipped.notes() == ["skipped 2 characters outside the vocabulary"]
    with pytest.raises(CharlmError) as e:  # one character: not "1 characters"
        score_text(model, VOCAB, "abX" + text, progress=False)
    assert str(e.value) == ("the text has 1 character outside the model's vocabulary ('X' at 2);"
                            " pass --unknown skip to drop them")
    assert score_text(model, VOCAB, "abX" + text, unknown="skip", progress=False).notes() == [
        "skipped 1 character outside the vocabulary"]
    assert skipped.loss == score_text(model, VOCAB, "abc" + text, progress=False).loss
    with pytest.raises(CharlmError, match="stride must be in"):
        score_text(model, VOCAB, text, min_context=8, progress=False)


def test_score_text_rejects_an_unknown_policy_it_does_not_have(model):
    # "drop" is neither policy: an error even for a text without unknown characters, not a
    # silent skip
    for text in ("abcabc", "abXcabc"):
        with pytest.raises(CharlmError) as e:
            score_text(model, VOCAB, text, unknown="drop", progress=False)
        assert str(e.value) == "unknown must be 'error' or 'skip', got 'drop'"


def test_a_diverged_model_scores_without_a_traceback_and_as_strict_json(model):
    with torch.no_grad():
        model.wte.weight.mul_(1e4)  # tied head: the logits are huge, the loss is past exp's range
    huge = score_text(model, VOCAB, "abcdefgabc", progress=False)
    assert huge.loss > 1000 and huge.perplexity == math.inf
    assert huge.as_dict()["perplexity"] is None and huge.as_dict()["loss"] == huge.loss



def test_a_model_whose_outputs_are_not_finite_is_refused_as_sample_refuses_it(model):
    """Weights that load (finite floats) but overflow gave `loss nan` and exit 0 (issue 40,
    item 6); the loaders refuse NaN weights themselves, this is the model it lets through."""
    with torch.no_grad():
        model.wte.weight.mul_(3e37)  # finite, but the tied head's logits reach inf
    assert torch.isfinite(model.wte.weight).all()
    with pytest.raises(CharlmError) as e:
        score_text(model, VOCAB, "abcdefgabc", progress=False)
    assert str(e.value) == (
        "the model's next-character probabilities are not finite (NaN or inf): its weights "
        "have diverged; score an earlier checkpoint, or train again with a lower optim.lr")


def test_a_text_in_many_chunks_scores_to_the_last_bit_what_its_windows_score(model, monkeypatch):
    """`charlm eval` streams the text (chunks of 7 characters here, so windows and unknown
    characters straddle chunks); the loss is the one of the whole text's windows, 32 full
    windows a forward then the shorter last one, summed in float64 in window order (as
    `charlm eval` summed them when it held the whole text)."""
    monkeypatch.setattr("charlm.evaluation.scoring.CHUNK_BYTES", 7)
    known = "abcabcgfedcba" * 40 + "gab"
    text = "XY" + known[:100] + "Z" + known[100:]  # X, Y, Z: outside the vocabulary
    score = score_text(model, VOCAB, text, min_context=3, unknown="skip", progress=False)
    ids = torch.tensor(VOCAB.encode(known))
    plan = reference_windows(len(ids), 8, 3)
    full = [w for w in plan if w[0] + 8 <= len(ids) - 1]
    batches = [full[i:i + 32] for i in range(0, len(full), 32)] + [[w] for w in plan[len(full):]]
    total, ref = 0.0, 0.0
    for batch in batches:
        rows = torch.stack([ids[s:s + 9] for s, _ in batch])
        nll = -torch.log_softmax(model(rows[:, :-1])[0], -1).gather(-1, rows[:, 1:, None])[..., 0]
        for row, (_, offset) in enumerate(batch):
            total += nll[row, offset:].sum(dtype=torch.float64).item()
    for start, offset in plan:  # one window a forward, summed otherwise: equal to rounding
        x = ids[start:start + 9][None]
        ref -= torch.log_softmax(model(x[:, :-1])[0], -1)[0].gather(-1, x[0, 1:, None])[
            offset:].sum().item()
    assert (score.chars_scored, score.skipped_unknown) == (len(known) - 1, 3)
    assert score.loss == total / (len(known) - 1)
    assert score.loss == pytest.approx(ref / (len(known) - 1), rel=1e-6)


def test_the_window_stream_holds_a_bounded_buffer_whatever_the_length():
    """It held every id of the text and a (start, offset) tuple per window: about 31 bytes a
    character. Streamed: 200 chunks of 100,000 ids (160 MB as int64) in a few MB at most, and
    no chunk read before a window needs it."""
    read = []

    def chunks():
        for i in range(200):
            read.append(i)
            yield np.full(100_000, i % 7, dtype=np.uint8)

    windows = stream_windows(chunks(), 1024, 0)
    next(windows)
    assert read == [0]
    tracemalloc.start()
    n = 1 + sum(1 for _ in windows)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == -(-(200 * 100_000 - 1) // 1024) and read == list(range(200))
    assert peak < 4 << 20, peak


def test_unknown_characters_are_counted_not_kept(model):
    """Listing 10 MB of unknown characters took 1.4 GB (a tuple and a str per character): now
    they are counted, a chunk at a time, the first ten kept for the message, and nothing is
    scored once the error is certain."""
    def chunks():
        yield b"abcXdefg"
        for _ in range(30):
            yield b"Y" * (1 << 20)
        yield np.array([ord("a"), 0x20AC, ord("b")], dtype=np.uint32)

    tracemalloc.start()
    with pytest.raises(CharlmError) as e:
        score_stream(model, VOCAB, chunks())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    total = 2 + 30 * (1 << 20)
    listed = ", ".join(["'X' at 3"] + [f"'Y' at {i}" for i in range(8, 17)])
    assert str(e.value) == (f"the text has {total:,} characters outside the model's vocabulary "
                            f"({listed} and {total - 10} more); pass --unknown skip to drop "
                            "them")
    assert peak < 32 << 20, peak
    skipped = score_stream(model, VOCAB, chunks(), unknown="skip")
    assert (skipped.skipped_unknown, skipped.chars_scored) == (total, 8)
    assert skipped.loss == score_text(model, VOCAB, "abcdefgab", progress=False).loss


def test_a_split_s_ids_score_as_the_text_they_encode(model):
    ids = np.array(VOCAB.encode("abcabcgfedcba" * 7), dtype=np.uint8)
    split = score_ids(model, ids, progress=False)
    assert split.__dict__ == score_text(model, VOCAB, "abcabcgfedcba" * 7,
                                        progress=False).__dict__
    assert split.chars_scored == len(ids) - 1


@pytest.mark.parametrize("suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress),
                                              (".xz", lzma.compress)])
def test_a_compressed_text_file_scores_as_its_text(model, tmp_path, suffix, compress):
    """`charlm eval RUN text.gz` was refused as not UTF-8, with the hint to name it *.gz."""
    text = "abcdefgfedcba" * 40
    plain, packed = tmp_path / "t.txt", tmp_path / f"t.txt{suffix}"
    plain.write_text(text, encoding="utf-8")
    packed.write_bytes(compress(text.encode()))
    got = score_file(model, VOCAB, packed, progress=False)
    assert got.as_dict() == score_file(model, VOCAB, plain, progress=False).as_dict()


def test_a_cut_compressed_text_file_is_one_error(model, tmp_path):
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(b"abcdefg" * 500)[:30])
    with pytest.raises(CharlmError) as e:
        score_file(model, VOCAB, cut, progress=False)
    assert str(e.value) == (f"cannot decompress {cut} as .gz data: it ends before its "
                            f"end-of-stream marker (cut short?); check the file (`gzip -t "
                            f"{cut}`)")


def test_a_byte_model_scores_a_binary_file_as_prepare_reads_it(tmp_path):
    """A byte model trains on any file (`prepare --units byte`), but eval read the file as
    UTF-8 text and refused a NUL byte or an invalid sequence: its bytes are its ids, scored as
    `score_ids` scores them."""
    data = bytes(range(256)) * 3 + b"\xff\xfe\x00\x80"
    vocab = Vocab([chr(b) for b in range(256)], "byte")
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=32), 256).eval()
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    got = score_file(model, vocab, path, progress=False)
    expected = score_ids(model, np.frombuffer(data, dtype=np.uint8).astype(np.int64),
                         progress=False)
    assert got.as_dict() == expected.as_dict() and got.as_dict()["chars_scored"] == len(data) - 1

"""charlm.data.vocab: character and pair vocabularies, their ids, and the vocabularies refused."""

import json

import numpy as np
import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.data import vocab as vocab_module
from charlm.data.chunks import CharacterSet
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab, id_dtype, list_unknown


def test_vocab_round_trip_unicode():
    text = "héllo, wörld — ☃ 𝄞\n"
    vocab = Vocab(sorted(set(text)))
    ids = vocab.encode(text)
    assert vocab.decode(ids) == text
    assert ids == [vocab.chars.index(c) for c in text]
    assert vocab.chars == sorted(vocab.chars)


def test_vocab_round_trip_control_characters():
    text = "a\x00b\r\n\x01\x00"  # NUL survives (numpy strings pad with it)
    vocab = Vocab(sorted(set(text)))
    assert vocab.decode(vocab.encode(text)) == text
    assert vocab.decode([]) == ""


def test_vocab_unknown_positions():
    vocab = Vocab(list("abc"))
    assert vocab.unknown("abXcY") == [(2, "X"), (4, "Y")]
    with pytest.raises(CharlmError, match="characters outside the vocabulary: 'X' at 2"):
        vocab.encode("abXc")


def test_id_dtype_is_smallest_that_fits():
    assert id_dtype(65) == np.uint8
    assert id_dtype(256) == np.uint8
    assert id_dtype(257) == np.uint16
    assert id_dtype(65536) == np.uint16
    assert id_dtype(65537) == np.uint32


def test_encode_array_uses_the_smallest_id_dtype():
    vocab = Vocab(list("ab"))
    ids = vocab.encode_array("abba")
    assert ids.dtype == np.uint8 and ids.tolist() == [0, 1, 1, 0]
    assert vocab.encode("abba") == [0, 1, 1, 0]


def test_the_vocab_of_a_character_set_sorts_and_equals_by_characters():
    seen = CharacterSet()
    seen.add(np.array([ord("c"), ord("a"), ord("b")], dtype=np.uint32))
    vocab = seen.vocab()
    assert vocab.chars == ["a", "b", "c"] and len(vocab) == 3
    assert vocab == Vocab(list("abc")) and vocab != Vocab(list("ab")) and vocab != "abc"


@pytest.mark.parametrize("chars, message", [
    (["a", "b", "a"], "a vocabulary must be free of duplicates"),
    (["a", "a"], "a vocabulary must be free of duplicates"),
    ([], "a vocabulary must hold at least one character"),
    (["ab"], "a vocabulary must be a list of single characters"),
    ([1], "a vocabulary must be a list of single characters"),
    (["a", "\udc80"], "a vocabulary must not hold a surrogate (U+D800..U+DFFF)"),
])
def test_a_bad_vocabulary_is_refused(chars, message):
    with pytest.raises(CharlmError) as e:
        Vocab(chars)
    assert str(e.value) == message


def test_unknown_characters_are_listed_up_to_the_limit(monkeypatch):
    vocab = Vocab(list("a"))
    bad = vocab.unknown("a" + "x" * 12)
    assert bad[:2] == [(1, "x"), (2, "x")] and len(bad) == 12
    monkeypatch.setattr(vocab_module, "UNKNOWN_LISTED", 2)
    assert list_unknown(bad) == "'x' at 1, 'x' at 2 and 10 more"
    assert list_unknown(bad[:2], "at position") == "'x' at position 1, 'x' at position 2"


@pytest.mark.parametrize("size", [3, 255, 256, 300])
def test_code_points_as_bytes_or_arrays_give_the_same_ids(size):
    """Bytes of code points below 256 are mapped by bytes.translate while the ids fit in a byte
    (up to 255 characters, the id 255 then marking an unknown one), else through numpy; either
    way the ids are encode_array's."""
    vocab = Vocab([chr(i) for i in range(size)])
    text = "".join(chr(i) for i in range(min(size, 256)))[::-1] * 3
    expected = vocab.encode_array(text)
    ids = vocab.encode_code_points(text.encode("latin-1"))
    assert type(ids) is (bytes if size < 256 else np.ndarray)
    assert bytes(ids) == expected.tobytes()
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    assert vocab.encode_code_points(cps).tobytes() == expected.tobytes()
    assert len(vocab.encode_code_points(b"")) == 0


@pytest.mark.parametrize("chars", ["abc", "abc€", "".join(map(chr, range(1, 256)))])
def test_code_points_outside_the_vocabulary_are_named(chars):
    vocab = Vocab(sorted(chars))
    for cps in (b"ab\x00c\x00", np.array([97, 98, 0, 99, 0], dtype=np.uint32)):
        with pytest.raises(CharlmError) as e:
            vocab.encode_code_points(cps)
        assert str(e.value) == "characters outside the vocabulary: '\\x00' at 2, '\\x00' at 4"


def test_character_set_collects_bytes_and_arrays():
    seen = CharacterSet()
    seen.add(b"banana")
    seen.add(b"")
    seen.add(np.array([], dtype=np.uint32))
    seen.add(np.array([ord("Ж"), ord("a"), 0x1F642], dtype=np.uint32))
    seen.add(b"abn\xe9")  # Latin-1: \xe9 is a new character, the rest were met
    assert seen.vocab() == Vocab(sorted("abn\u00e9\u0416\U0001F642"))


def test_vocab_ids_encoding_and_decoding():
    vocab = PairVocab(("a", "b", "c"), ("AH", "B", "K"), "space")
    assert (vocab.source_size, vocab.src_pad, vocab.target_size) == (4, 3, 6)
    assert (vocab.pad, vocab.bos, vocab.eos) == (3, 4, 5)
    assert vocab.encode_source("cab") == [2, 0, 1]
    assert vocab.encode_target(" K  AH B ") == [2, 0, 1]
    assert vocab.decode_target([4, 2, 0, 5, 1, 3]) == "K AH"
    assert vocab.decode_target(torch.tensor([2, 3, 3])) == "K"
    with pytest.raises(CharlmError) as e:
        vocab.encode_source("cxaby", where="the word 'cxaby'")
    assert str(e.value) == ("the word 'cxaby' has characters outside the model's source "
                            "vocabulary: 'x' at position 1, 'y' at position 4; remove them or "
                            "pass --unknown skip")
    assert vocab.encode_source("cxaby", unknown="skip") == [2, 0, 1]
    with pytest.raises(CharlmError) as e:
        vocab.encode_target("K OY")
    assert str(e.value) == ("the target 'K OY' has units outside the target vocabulary: 'OY' "
                            "at unit 1; use only the units of the training pairs")
    chars = PairVocab(("a",), (" ", "x"))
    assert chars.units("x x") == ["x", " ", "x"] and chars.decode_target([1, 0, 1]) == "x x"
    assert PairVocab.from_dict(json.loads(json.dumps(vocab.to_dict()))) == vocab


@pytest.mark.parametrize("raw", [
    None, [], {"source": ["a"], "target": ["X"]},
    {"source": "ab", "target": ["X"], "target_units": "space"},
    {"source": ["b", "a", "b"], "target": ["X"], "target_units": "space"},
    {"source": ["a", "a"], "target": ["X"], "target_units": "space"},
    {"source": ["ab"], "target": ["X"], "target_units": "space"},
    {"source": [], "target": ["X"], "target_units": "space"},
    {"source": ["a"], "target": ["X Y"], "target_units": "space"},
    {"source": ["a"], "target": ["XY"], "target_units": "char"},
    {"source": ["a"], "target": [1], "target_units": "char"},
    {"source": ["a"], "target": ["X"], "target_units": "word"},
])
def test_a_garbled_vocab_is_a_value_error(raw):
    with pytest.raises(ValueError):
        PairVocab.from_dict(raw)


def test_extended_keeps_every_id_and_numbers_new_characters_after_the_old_ones():
    """A fine-tune's vocabulary: the parent's ids as they were (not re-sorted), then the
    characters the parent lacks in code point order; encoding and decoding follow that order."""
    parent = Vocab(list("ab c"))  # a parent's own order need not be sorted either
    union = parent.extended("cabzé!")
    assert union.chars == ["a", "b", " ", "c", "!", "z", "é"]
    assert union.encode("c a!é") == [3, 2, 0, 4, 6] and union.decode([6, 5, 0]) == "éza"
    assert union.encode_code_points(b"zc") == bytes([5, 3])  # the byte table, out of order
    assert parent.extended("ba") == parent


def test_pair_vocab_extended_moves_the_specials_after_the_new_units():
    parent = PairVocab(("b", "a"), ("X", "Y"), "char")
    union = parent.extended(PairVocab(("a", "c"), ("Z", "X"), "char"))
    assert union.source == ("b", "a", "c") and union.src_pad == 3
    assert union.target == ("X", "Y", "Z") and (union.pad, union.bos, union.eos) == (3, 4, 5)
    assert union.encode_source("cab") == [2, 1, 0] and union.encode_target("ZX") == [2, 0]
    with pytest.raises(CharlmError) as e:
        parent.extended(PairVocab(("a",), ("X",), "space"))
    assert str(e.value) == ("the data's targets are space units, but the model's are char "
                            "units; set data.target_units: char")


BYTE_TEXT = "a漢🙂é\n"


def test_a_byte_vocabulary_encodes_utf8_bytes_and_streams_whole_characters():
    """Byte units: the ids are the UTF-8 bytes' (each byte the character of its code point),
    decode gives the text back, unknown() names the characters with a byte outside, and a
    stream gives each character exactly when its last byte arrives, never a part of one."""
    raw = BYTE_TEXT.encode()
    vocab = Vocab(sorted(set(raw.decode("latin-1"))), "byte")
    ids = vocab.encode(BYTE_TEXT)
    assert ids == [vocab.chars.index(chr(b)) for b in raw]
    assert vocab.decode(ids) == BYTE_TEXT
    assert vocab.unknown("a€\n漢") == [(1, "€")]
    assert vocab.tail("a漢🙂", 5) == "🙂" and vocab.tail("a漢🙂", 7) == "漢🙂"
    stream = vocab.stream()
    pieces = [stream.feed(i) for i in ids]
    assert pieces == ["a", "", "", "漢", "", "", "", "🙂", "", "é", "\n"]
    assert Vocab.from_state(vocab.state()) == vocab != Vocab(vocab.chars)
    assert Vocab.from_state(Vocab(["a", "b"]).state()) == Vocab(["a", "b"])  # a list, as before
    with pytest.raises(CharlmError, match="U\\+0000..U\\+00FF"):
        Vocab(["a", "€"], "byte")

"""charlm.generation.utf8: the mask that keeps a byte model's samples valid UTF-8."""

import codecs

import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab
from charlm.generation.utf8 import NEXT, Utf8Mask

ALL_BYTES = Vocab([chr(b) for b in range(256)], "byte")


def draw(mask: Utf8Mask, steps: int, seed: int) -> list[bytes]:
    """Random byte sequences that the mask allows, from uniform logits over its vocabulary."""
    g = torch.Generator().manual_seed(seed)
    rows, V = mask.state.numel(), mask.allowed.size(1)
    out = torch.empty(rows, steps, dtype=torch.long)
    for t in range(steps):
        logits = mask.apply(torch.randn(rows, V, generator=g))
        out[:, t] = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
        mask.advance(out[:, t])
    return [bytes(row) for row in out.tolist()]


def test_every_sequence_the_mask_allows_is_valid_utf8():
    """300 random draws of 200 bytes over all 256 byte values: each decodes strictly (a cut
    inside the last character aside), and the state says whether a character is unfinished."""
    mask = Utf8Mask(ALL_BYTES, 300)
    for seq, state in zip(draw(mask, 200, 0), mask.state.tolist(), strict=True):
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        decoder.decode(seq)  # raises UnicodeDecodeError on any invalid byte
        assert bool(decoder.getstate()[0]) == (state != 0)
    # the draws reach every kind of character: 1 to 4 bytes, and the narrowed second bytes
    text = b"".join(draw(Utf8Mask(ALL_BYTES, 100), 200, 1)).decode("utf-8", "ignore")
    assert {len(c.encode()) for c in text} == {1, 2, 3, 4}


def test_the_mask_refuses_overlongs_surrogates_and_bytes_that_never_occur():
    allowed = NEXT >= 0
    assert not allowed[0, [0x80, 0xBF, 0xC0, 0xC1, 0xF5, 0xFF]].any()  # no lead, or invalid
    assert not allowed[4, 0x80:0xA0].any()  # E0 80..9F: overlong
    assert not allowed[5, 0xA0:0xC0].any()  # ED A0..BF: a surrogate
    assert not allowed[6, 0x80:0x90].any()  # F0 80..8F: overlong
    assert not allowed[7, 0x90:0xC0].any()  # F4 90..BF: past U+10FFFF
    assert not allowed[1:, :0x80].any()  # ASCII where a continuation is due


def test_a_vocabulary_without_a_leads_continuations_never_draws_that_lead():
    """A byte vocabulary holding the lead byte of 'é' (C3) but no continuation byte: the mask
    leaves C3 out, and every draw stays ASCII; one that can begin no character (E0 needs
    A0..BF next, and 80 is all it has) is an error."""
    vocab = Vocab(["a", "b", "\xc3"], "byte")
    mask = Utf8Mask(vocab, 50)
    assert not mask.allowed[0, 2]
    assert all(seq.decode("ascii") for seq in draw(mask, 40, 2))
    with pytest.raises(CharlmError, match="holds no byte that begins a UTF-8 character"):
        Utf8Mask(Vocab(["\x80", "\xe0"], "byte"), 1)


def test_the_mask_comes_after_the_temperature_so_a_vanishing_factor_is_no_nan():
    """A temperature of 1e46 made 1/T 0 in float32; the mask's -inf times 0 was NaN, and the
    sample "diverged". Masked after the temperature, the draw is uniform over what the mask
    allows: here, after a lead byte, a continuation byte."""
    from charlm.config.sampling import SampleConfig
    from tests.helpers import sampler_for

    opts = SampleConfig(temperature=2.0)
    opts.temperature = 1e46  # past the bound SampleConfig checks: the order alone must hold
    mask = Utf8Mask(ALL_BYTES, 4)
    s = sampler_for(opts, rows=4, mask=mask)
    mask.advance(torch.full((4,), 0xC3))  # 'é' begun: a continuation byte is due
    _, ids, ok, _ = s.step(torch.randn(4, 256))
    assert ok == [True] * 4 and all(0x80 <= i < 0xC0 for i in ids)

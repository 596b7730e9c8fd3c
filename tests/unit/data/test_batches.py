"""charlm.data.batches: `BatchSampler` gathers windows, resumes and refuses a split too short;
`collate` pads and shifts pairs, and `PairBatchSampler` is seeded, resumes exactly, keeps
padding small and shards its batches across ranks."""


import numpy as np
import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.data.batches import IGNORE_INDEX, BatchSampler, PairBatchSampler, collate
from charlm.data.pairs import PairSplit, PairVocab

CPU = torch.device("cpu")


def test_collate_pads_and_shifts():
    vocab = PairVocab(("a", "b", "c"), ("X", "Y"))  # src_pad 3; pad 2, bos 3, eos 4
    src, tgt_in, tgt_out = collate([([0, 1, 2], [0]), ([1], np.array([1, 0, 1]))], vocab)
    assert src.tolist() == [[0, 1, 2], [1, 3, 3]]
    assert tgt_in.tolist() == [[3, 0, 2, 2], [3, 1, 0, 1]]
    assert tgt_out.tolist() == [[0, 4, IGNORE_INDEX, IGNORE_INDEX], [1, 0, 1, 4]]
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == torch.int64


def skewed(n=2000, seed=0):
    """A split of n pairs with sources of 1 to 30 characters (most short, a few long) and
    targets about as long, as words and their pronunciations."""
    rng = np.random.default_rng(seed)
    src_len = np.minimum(rng.geometric(0.15, n), 30)
    tgt_len = np.maximum(src_len + rng.integers(-2, 3, n), 1)
    return PairSplit(rng.integers(0, 5, src_len.sum()).astype(np.uint8),
                     np.concatenate([[0], np.cumsum(src_len)]),
                     rng.integers(0, 5, tgt_len.sum()).astype(np.uint8),
                     np.concatenate([[0], np.cumsum(tgt_len)]))


VOCAB = PairVocab(tuple("abcde"), tuple("ABCDE"))


def test_sampler_is_seeded_and_resumes_exactly():
    split = skewed(300)
    a, b = (PairBatchSampler(split, VOCAB, 16, CPU, seed=3) for _ in range(2))
    for _ in range(3):
        assert all(torch.equal(x, y) for x, y in zip(a.batch(), b.batch(), strict=True))
    state = a.state_dict()
    expected = [a.batch() for _ in range(2)]
    c = PairBatchSampler(split, VOCAB, 16, CPU, seed=3)  # a resumed run: its seed, then state
    c.load_state_dict(state)
    for batch in expected:
        assert all(torch.equal(x, y) for x, y in zip(c.batch(), batch, strict=True))
    assert not torch.equal(PairBatchSampler(split, VOCAB, 16, CPU, seed=4).batch()[0],
                           PairBatchSampler(split, VOCAB, 16, CPU, seed=3).batch()[0])


def test_sampler_keeps_padding_small():
    split = skewed()
    sampler = PairBatchSampler(split, VOCAB, 32, CPU, seed=0)
    generator = torch.Generator().manual_seed(0)

    def padding(src, tgt_out):
        return ((src == VOCAB.src_pad).sum() + (tgt_out == IGNORE_INDEX).sum()).item() / (
            src.numel() + tgt_out.numel())

    bucketed = np.mean([padding(*sampler.batch()[::2]) for _ in range(50)])
    shuffled = np.mean([padding(*collate([split.example(i) for i in torch.randint(
        len(split), (32,), generator=generator).tolist()], VOCAB)[::2]) for _ in range(50)])
    assert shuffled > 0.5 and bucketed < shuffled / 4  # about 0.09 against 0.7


def test_sampler_rows_and_a_small_split():
    split = skewed(100)
    whole = PairBatchSampler(split, VOCAB, 8, CPU, seed=1).batch()
    ranks = [PairBatchSampler(split, VOCAB, 8, CPU, seed=1, rows=slice(r * 4, r * 4 + 4))
             .batch() for r in range(2)]
    for part, full in zip(ranks, (whole[0][:4], whole[0][4:]), strict=True):
        assert part[0].shape[0] == 4
        assert torch.equal(part[0], full[:, :part[0].shape[1]])
    tiny = PairBatchSampler(PairSplit(split.src, split.src_offsets[:4], split.tgt,
                                      split.tgt_offsets[:4]), VOCAB, 8, CPU, seed=0)
    assert tiny.batch()[0].shape[0] == 3  # all three pairs
    with pytest.raises(CharlmError, match="the split holds no pairs"):
        PairBatchSampler(PairSplit(split.src, split.src_offsets[:1], split.tgt,
                                   split.tgt_offsets[:1]), VOCAB, 8, CPU, seed=0)


def test_batch_gather_equals_reference_slicing():
    arr = np.arange(1000, dtype=np.uint16) % 251
    sampler = BatchSampler(arr, block_size=8, batch_size=5, device=torch.device("cpu"), seed=3)
    g = torch.Generator().manual_seed(3)
    starts = torch.randint(len(arr) - 8, (5,), generator=g)
    x, y = sampler.batch()
    for row, s in enumerate(starts.tolist()):
        assert x[row].tolist() == arr[s:s + 8].tolist()
        assert y[row].tolist() == arr[s + 1:s + 9].tolist()
    assert x.dtype == torch.int64 and x.shape == (5, 8)


def test_sampler_state_round_trip():
    arr = np.arange(500, dtype=np.uint8)
    a = BatchSampler(arr, 4, 3, torch.device("cpu"), seed=1)
    a.batch()
    state = a.state_dict()
    expected = a.batch()[0]
    b = BatchSampler(arr, 4, 3, torch.device("cpu"), seed=99)
    b.load_state_dict(state)
    assert torch.equal(b.batch()[0], expected)


def test_split_too_short_says_minimum():
    with pytest.raises(CharlmError) as e:
        BatchSampler(np.arange(10, dtype=np.uint8), 16, 2, torch.device("cpu"), 0, name="val")
    assert "the val split is too short: 10 characters, but one window needs " \
           "block_size + 1 = 17" in str(e.value)

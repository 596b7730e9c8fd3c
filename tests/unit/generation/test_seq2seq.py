"""charlm.generation.seq2seq: the encoder-decoder's cached decoder, greedy translation, beam search
and its n-best."""

import pytest
import torch

from charlm.config.sampling import SampleConfig
from charlm.generation.seq2seq import Seq2SeqDecoder, beam_search_ids, translate_ids
from charlm.model.encoder_decoder import EncoderDecoder, output_limit
from tests.helpers import (
    BOS,
    EOS,
    GREEDY,
    PAD,
    PAIR_VARIANTS,
    random_seq2seq,
    seq2seq_batch,
    uncached,
)


@pytest.mark.parametrize("variant", PAIR_VARIANTS)
def test_cached_decoder_gives_the_uncached_logits(variant):
    """Step by step over forced ids, through a reorder that drops and repeats rows."""
    model = random_seq2seq(**PAIR_VARIANTS[variant])
    src, _, _ = seq2seq_batch([[1, 2, 3], [4, 0, 6, 5, 2], [6]], [[0]] * 3)
    memory = model.encode(src)
    ids = torch.randint(0, PAD, (3, 9))
    cached, full = Seq2SeqDecoder(model, memory), Seq2SeqDecoder(model, memory, use_cache=False)
    start = torch.full((3, 1), BOS)
    torch.testing.assert_close(cached.prefill(start), full.prefill(start))
    for t in range(ids.size(1)):
        if t == 4:
            index = torch.tensor([2, 0, 2])  # row 1 leaves, row 2 continues twice
            cached.reorder(index), full.reorder(index)
            ids = ids[index]
        a, b = cached.step(ids[:, t]), full.step(ids[:, t])
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert (a[:, [PAD, BOS]] == float("-inf")).all()  # never an output
    torch.testing.assert_close(a[0], a[2], rtol=1e-5, atol=1e-5)  # one history, one future


@pytest.mark.parametrize("variant", PAIR_VARIANTS)
def test_cached_decoding_equals_uncached(variant):
    model = random_seq2seq(**PAIR_VARIANTS[variant])
    src, _, _ = seq2seq_batch([[1, 2, 3], [4, 0, 6, 5, 2], [6], [3, 3, 1, 0]], [[0]] * 4)
    greedy = translate_ids(model, src, GREEDY)
    assert translate_ids(model, src, uncached(GREEDY)) == greedy
    opts = SampleConfig(temperature=1.5, top_k=8, top_p=0.98, min_p=0.01,
                        repetition_penalty=1.3, repetition_window=4)
    sampled = translate_ids(model, src, opts, generator=torch.Generator().manual_seed(2))
    assert translate_ids(model, src, uncached(opts),
                         generator=torch.Generator().manual_seed(2)) == sampled
    assert len({t for row in sampled for t in row}) > 2  # not a degenerate constant stream
    assert all(BOS not in row and PAD not in row and EOS not in row for row in greedy + sampled)


def teacher_forced(model, src, ids):
    """The logits (T, V) at each position of bos + ids over one source src (1, S), with pad
    and bos, which decoding never outputs, at -inf."""
    logits, _ = model(src, torch.tensor([[BOS, *ids]]))
    return logits[0].float().index_fill(-1, torch.tensor([PAD, BOS]), float("-inf"))


def eos_model() -> EncoderDecoder:
    """A random model whose eos takes the place of unit 0 (and a little more): its outputs end
    at eos at varied lengths, or run to their limit."""
    model = random_seq2seq()
    with torch.no_grad():
        model.head.weight[EOS] = 1.1 * model.head.weight[0]
    return model


def test_greedy_decoding_is_the_argmax_of_the_full_forward():
    """Each row's ids are the argmax at each position given the ids before; a row that ends
    before its limit ends where eos is the argmax. Rows decoded alone give the same ids."""
    model = eos_model()
    sources = [[1, 2, 3], [4, 0, 6, 5, 2], [6], [3, 3, 1, 0], [5, 5]]
    src, _, _ = seq2seq_batch(sources, [[0]] * 5)
    out = translate_ids(model, src, GREEDY)
    limits = [output_limit(len(s), 16) for s in sources]
    assert any(len(ids) < n for ids, n in zip(out, limits, strict=True))  # some end at eos
    assert any(len(ids) == n for ids, n in zip(out, limits, strict=True))  # some at the limit
    for s, ids, n in zip(sources, out, limits, strict=True):
        logits = teacher_forced(model, torch.tensor([s]), ids)
        expected = ids + ([EOS] if len(ids) < n else [])
        assert logits[:len(expected)].argmax(-1).tolist() == expected
        assert translate_ids(model, torch.tensor([s]), GREEDY) == [ids]


def test_each_row_ends_at_its_limit():
    model = random_seq2seq()
    src, _, _ = seq2seq_batch([[1, 2, 3], [4, 0, 6, 5, 2]], [[0]] * 2)
    free = translate_ids(model, src, GREEDY, max_len=15)
    assert min(map(len, free)) >= 4
    assert translate_ids(model, src, GREEDY, max_len=[3, 1]) == [free[0][:3], free[1][:1]]
    assert translate_ids(model, src, GREEDY, max_len=[0, 15]) == [[], free[1]]
    capped = translate_ids(model, src, SampleConfig(temperature=0, max_new_tokens=2))
    assert capped == [ids[:2] for ids in free]
    assert output_limit(3, 64) == 16 and output_limit(40, 64) == 63
    assert output_limit(3, 64, cap=5) == 5


@pytest.mark.parametrize("variant", ["default", "all_changed"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_search_with_one_beam_is_greedy(variant, use_cache):
    model = random_seq2seq(**PAIR_VARIANTS[variant])
    src, _, _ = seq2seq_batch([[1, 2, 3], [4, 0, 6, 5, 2], [3, 3, 1, 0]], [[0]] * 3)
    greedy = translate_ids(model, src, GREEDY)
    for row, ids in zip(src, greedy, strict=True):
        [(_, best)] = beam_search_ids(model, row[None], beams=1, use_cache=use_cache)
        assert best == ids


def sequence_score(model, src, ids, length_penalty):
    """The hypothesis's score from one teacher-forced forward: ids and their eos."""
    target = [*ids, EOS]
    logp = torch.log_softmax(teacher_forced(model, src, ids), dim=-1)
    return sum(logp[i, t].item() for i, t in enumerate(target)) / len(target) ** length_penalty


@pytest.mark.parametrize("use_cache", [True, False])
def test_n_best_hypotheses_are_distinct_scored_and_sorted(use_cache):
    model = eos_model()
    src = torch.tensor([[3, 3, 1, 0]])
    hyps = beam_search_ids(model, src, beams=5, n_best=4, use_cache=use_cache)
    scores = [s for s, _ in hyps]
    assert len(hyps) == 4 and scores == sorted(scores, reverse=True)
    assert len({tuple(ids) for _, ids in hyps}) == 4
    for score, ids in hyps:
        assert len(ids) < output_limit(4, 16)  # ended at eos
        assert score == pytest.approx(sequence_score(model, src, ids, 1.0), abs=1e-4)
    [(greedy_score, _)] = beam_search_ids(model, src, beams=1)
    assert scores[0] >= greedy_score - 1e-6


def test_cross_attention_keys_values_are_projected_once_per_source():
    model = random_seq2seq()
    calls = []
    for block in model.blocks:
        block.cross_attn.kv.register_forward_hook(lambda m, args, out: calls.append(args[0].shape))
    encoder_runs = []
    model.encoder[0].register_forward_hook(lambda *_: encoder_runs.append(1))
    src, _, _ = seq2seq_batch([[1, 2, 3], [4, 0, 6, 5, 2], [3, 3, 1, 0]], [[0]] * 3)
    for opts in (GREEDY, uncached(GREEDY)):
        out = translate_ids(model, src, opts, max_len=10)
        assert max(map(len, out)) >= 5  # many decode steps
        assert calls == [torch.Size([3, 5, 32])] * 2 and len(encoder_runs) == 1  # per layer
        calls.clear(), encoder_runs.clear()
    for use_cache in (True, False):
        beam_search_ids(model, src[1:2], beams=4, max_len=10, use_cache=use_cache)
        assert calls == [torch.Size([1, 5, 32])] * 2 and len(encoder_runs) == 1
        calls.clear(), encoder_runs.clear()

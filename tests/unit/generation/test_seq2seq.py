import pytest
import torch

from charlm.config.sampling import SampleConfig
from charlm.config.schema import ModelConfig
from charlm.generation.seq2seq import Seq2SeqDecoder, beam_search_ids, translate_ids
from charlm.model.encoder_decoder import EncoderDecoder, output_limit, parameter_count
from charlm.model.gpt import RMSNorm, param_counts
from tests.helpers import (
    BOS,
    EOS,
    GREEDY,
    PAD,
    SRC_PAD,
    VARIANTS,
    VS,
    VT,
    random_seq2seq,
    seq2seq_batch,
    seq2seq_config,
    uncached,
)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoder_is_causal_and_reads_the_whole_source(variant):
    model = random_seq2seq(**VARIANTS[variant])
    src = torch.randint(0, SRC_PAD, (2, 6))
    tgt = torch.randint(0, PAD, (2, 9))
    base, _ = model(src, tgt)
    later = tgt.clone()
    later[:, 5] = (tgt[:, 5] + 1) % PAD
    changed, _ = model(src, later)
    assert torch.equal(changed[:, :5], base[:, :5])  # a target position sees no later one
    assert not torch.allclose(changed[:, 5:], base[:, 5:])
    last = src.clone()
    last[:, -1] = (src[:, -1] + 1) % SRC_PAD
    first_position, _ = model(last, tgt[:, :1])
    assert not torch.allclose(first_position[:, 0], base[:, 0])  # every source char is seen
    # and the encoder is bidirectional: its first position sees the last
    assert not torch.allclose(model.encode(last).out[:, 0], model.encode(src).out[:, 0])


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_decoder_block_follows_its_definition(placement):
    model = random_seq2seq(norm_placement=placement, bias=True)  # norms with random weights
    block, x = model.blocks[0], torch.randn(2, 5, 32)
    src, _, _ = seq2seq_batch([[1, 2, 3, 4], [5, 6]], [[0]] * 2)
    k, v, mask = cross = model.encode(src).cross(0)
    out = block(x, None, 0, None, None, cross)
    if placement == "pre":  # x + f(norm(x)) for each of the three sublayers
        h = x + block.attn(block.ln_1(x))
        h = h + block.cross_attn(block.ln_cross(h), k, v, mask)
        expected = h + block.mlp(block.ln_2(h))
    else:  # norm(x + f(x)), and no final norm after either stack
        h = block.ln_1(x + block.attn(x))
        h = block.ln_cross(h + block.cross_attn(h, k, v, mask))
        expected = block.ln_2(h + block.mlp(h))
        assert isinstance(model.ln_enc, torch.nn.Identity)
        assert isinstance(model.ln_f, torch.nn.Identity)
    torch.testing.assert_close(out, expected)


def test_options_reach_both_stacks():
    both = random_seq2seq(pos_encoding="learned", activation="swiglu", norm="rmsnorm", bias=True)
    assert both.src_wpe.weight.shape == both.wpe.weight.shape == (16, 32)  # separate tables
    for block in (both.encoder[0], both.blocks[0]):
        assert block.mlp.fc.weight.shape == (2 * 88, 32)  # swiglu's fused gate and up
        assert isinstance(block.ln_1, RMSNorm) and block.attn.qkv.bias is not None
    assert isinstance(both.blocks[0].ln_cross, RMSNorm)
    assert both.blocks[0].cross_attn.q.bias is not None
    assert not hasattr(both.encoder[0], "cross_attn")
    rope = random_seq2seq(pos_encoding="rope")
    assert not hasattr(rope, "src_wpe") and not hasattr(rope, "wpe")
    assert rope.head.weight is rope.wte.weight  # tied to the target's table
    assert random_seq2seq(tie_weights=False).head.weight is not random_seq2seq().wte.weight
    dropout = random_seq2seq(dropout=0.3).train()
    src, tgt_in, _ = seq2seq_batch([[1, 2, 3]], [[4, 5]])
    assert not torch.equal(dropout.encode(src).out, dropout.encode(src).out)
    assert not torch.equal(dropout(src, tgt_in)[0], dropout(src, tgt_in)[0])
    dropout.eval()
    assert torch.equal(dropout(src, tgt_in)[0], dropout(src, tgt_in)[0])


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_changes_no_real_position(variant):
    model = random_seq2seq(**VARIANTS[variant])
    sources, targets = [[1, 2, 3], [4, 0, 6, 5, 2, 1]], [[3, 1, 4, 1], [5, 9 - 1]]
    alone = [model(*seq2seq_batch([s], [t])[:2])[0][0]
             for s, t in zip(sources, targets, strict=True)]
    # a longer third source, extra padding columns on both sides
    src, tgt_in, _ = seq2seq_batch([*sources, [2] * 9], [*targets, [0] * 7], S=11, T=10)
    padded, _ = model(src, tgt_in)
    for row, (logits, t) in enumerate(zip(alone, targets, strict=True)):
        torch.testing.assert_close(padded[row, :len(t) + 1], logits, rtol=1e-5, atol=1e-5)


def test_loss_is_the_mean_over_real_target_positions():
    model = random_seq2seq()
    sources, targets = [[1, 2, 3], [4, 0, 6, 5]], [[3, 1, 4, 1, 5], [2, 6]]
    src, tgt_in, tgt_out = seq2seq_batch(sources, targets)
    logits, loss = model(src, tgt_in, tgt_out)
    real = tgt_out != -1
    expected = -torch.log_softmax(logits[real], -1).gather(1, tgt_out[real][:, None]).mean()
    torch.testing.assert_close(loss, expected)
    _, padded = model(*seq2seq_batch(sources, targets, S=9, T=12))
    torch.testing.assert_close(padded, loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoder_gives_the_uncached_logits(variant):
    """Step by step over forced ids, through a reorder that drops and repeats rows."""
    model = random_seq2seq(**VARIANTS[variant])
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


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_uncached(variant):
    model = random_seq2seq(**VARIANTS[variant])
    src, _, _ = seq2seq_batch([[1, 2, 3], [4, 0, 6, 5, 2], [6], [3, 3, 1, 0]], [[0]] * 4)
    greedy = translate_ids(model, src, GREEDY)
    assert translate_ids(model, src, uncached(GREEDY)) == greedy
    opts = SampleConfig(temperature=1.5, top_k=8, top_p=0.98, min_p=0.01,
                        repetition_penalty=1.3, repetition_window=4)
    sampled = translate_ids(model, src, opts, generator=torch.Generator().manual_seed(3))
    assert translate_ids(model, src, uncached(opts),
                         generator=torch.Generator().manual_seed(3)) == sampled
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
    model = random_seq2seq(**VARIANTS[variant])
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


def test_param_counts_by_component():
    cfg = seq2seq_config(bias=True, tie_weights=False, pos_encoding="learned")
    model = EncoderDecoder(cfg, VS, VT, SRC_PAD)
    counts = param_counts(model)
    C, F, T = 32, 128, 16
    attn = 4 * C * C + 4 * C
    mlp = 2 * C * F + F + C
    norm = 2 * C
    assert counts == {
        "embeddings": (VS + T + VT + T) * C,
        "encoder": 3 * (attn + mlp + 2 * norm) + norm,
        "decoder_self_attention": 2 * attn, "cross_attention": 2 * attn,
        "decoder_mlp": 2 * mlp, "decoder_norms": 2 * 3 * norm + norm, "head": VT * C,
        "total": sum(p.numel() for p in model.parameters()),
    }
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert parameter_count(cfg, VS, VT) == counts["total"]
    deep = seq2seq_config(n_layer=7, n_encoder_layer=5)
    assert parameter_count(deep, VS, VT) == param_counts(EncoderDecoder(deep, VS, VT, SRC_PAD))[
        "total"]
    tied = EncoderDecoder(seq2seq_config(), VS, VT, SRC_PAD)
    assert param_counts(tied)["head"] == 0  # tied to wte


def test_learns_to_reverse_strings(seed=0):
    """2 + 2 layers learn to reverse random strings of 3-6 of 6 letters: exact on held-out
    strings after 250 steps (all of them for seeds 0-5 on a 2-core CPU, in about 10 s)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)

    def strings(n: int) -> list[list[int]]:
        return [torch.randint(0, 6, (k,), generator=g).tolist()
                for k in torch.randint(3, 7, (n,), generator=g).tolist()]

    cfg = ModelConfig(arch="encoder_decoder", block_size=8, n_layer=2, n_head=4, n_embd=64)
    model = EncoderDecoder(cfg, VS, VT, SRC_PAD)
    held_out = strings(200)
    seen = {tuple(s) for s in held_out}
    steps = 250
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    # a linear decay to 0 settles the end (a constant rate wobbles between 92 and 100 %)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - i / steps)
    for _ in range(steps):
        sources = [s for s in strings(64) if tuple(s) not in seen]
        src, tgt_in, tgt_out = seq2seq_batch(sources, [s[::-1] for s in sources])
        _, loss = model(src, tgt_in, tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
    out = translate_ids(model, seq2seq_batch(held_out, held_out)[0], GREEDY)
    exact = sum(o == s[::-1] for o, s in zip(out, held_out, strict=True)) / len(held_out)
    assert exact >= 0.95, f"exact match {exact:.2f}, final loss {loss.item():.3f}"

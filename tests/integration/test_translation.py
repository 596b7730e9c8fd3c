"""The encoder-decoder end to end: training on pairs (resume, eval metrics), `charlm sample
--source`, `charlm eval` on pairs, export, the Python API's `translate`, and the errors that keep
a GPT and an encoder-decoder apart."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

import charlm
from charlm.config.schema import ModelConfig
from charlm.generation.seq2seq import translate_ids
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.training.loop import train
from tests.helpers import (
    GREEDY,
    SRC_PAD,
    VS,
    VT,
    pairs_config,
    reversal_pairs,
    seq2seq_batch,
    write_pairs,
)


@pytest.fixture(scope="session")
def pairs_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An encoder-decoder trained briefly on string reversal, for the tests that read it."""
    tmp = tmp_path_factory.mktemp("pairs_run")
    data = write_pairs(tmp / "reverse.tsv", reversal_pairs(400, 0))
    train(pairs_config(data, tmp / "run"))
    return tmp / "run"


def test_training_on_pairs_logs_exact_match_and_cer(pairs_run):
    events = [json.loads(line) for line in (pairs_run / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [10, 20]
    for e in evals:
        assert 0 <= e["val_exact_match"] <= 1 and e["val_cer"] >= 0
    assert (pairs_run / "best.pt").is_file() and (pairs_run / "dataset" / "meta.json").is_file()


def test_a_resumed_pairs_run_ends_with_the_same_weights(tmp_path):
    data = write_pairs(tmp_path / "reverse.tsv", reversal_pairs(200, 1))
    straight = pairs_config(data, tmp_path / "a")
    train(straight)
    train(pairs_config(data, tmp_path / "b", max_iters=10))
    train(pairs_config(data, tmp_path / "b"), resume=True)
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sample_transduces_a_source_a_file_and_json_nbest(cli, pairs_run, tmp_path):
    one = [cli("sample", pairs_run, "--source", w, "--temperature", "0").out
           for w in ("abc", "gfe")]
    assert all(out.count("\n") == 1 for out in one)
    # greedy unless --temperature is given: the likeliest output
    assert cli("sample", pairs_run, "--source", "abc").out == one[0]
    compiled = cli("sample", pairs_run, "--source", "abc", "--compile")
    assert (compiled.out, compiled.err) == (one[0], "warning: --compile compiles a GPT's decode "
                                            "step; an encoder-decoder decodes eagerly\n")
    sources = write_pairs(tmp_path / "x", [])  # an empty file: no sources
    assert cli("sample", pairs_run, "--source-file", sources).err == (
        "error: there are no sources: the input is empty\n")
    sources.write_text("abc\ngfe\n", encoding="utf-8")
    assert cli("sample", pairs_run, "--source-file", sources, "--temperature", "0").out == \
        "".join(one)
    nbest = json.loads(cli("sample", pairs_run, "--source", "abc", "--beams", "3",
                           "--num-samples", "2", "--json").out)
    assert nbest["source"] == "abc" and len(nbest["outputs"]) == 2
    scores = [o["score"] for o in nbest["outputs"]]
    assert scores == sorted(scores, reverse=True)
    assert nbest["outputs"][0]["text"] != nbest["outputs"][1]["text"]


def test_api_translate_matches_the_cli(cli, pairs_run, run_dir):
    lm = charlm.load(pairs_run, device="cpu")
    [t] = charlm.translate(lm, "abc")
    assert cli("sample", pairs_run, "--source", "abc", "--temperature", "0").out == t.text + "\n"
    assert [x.text for x in charlm.translate(lm, ["abc", "gf"])][0] == t.text
    with pytest.raises(charlm.CharlmError, match="model.arch=encoder_decoder model; use "
                                                 "charlm.translate with it"):
        charlm.generate(lm, "abc")
    with pytest.raises(charlm.CharlmError, match="model.arch=decoder model; use "
                                                 "charlm.sample / generate / score with it"):
        charlm.translate(charlm.load(run_dir, device="cpu"), "abc")


def test_eval_on_pairs_scores_every_reference(cli, pairs_run, tmp_path):
    test = write_pairs(tmp_path / "test.tsv", [("abc", "c b a"), ("abc", "x y"), ("gf", "f g")])
    scored = cli("eval", pairs_run, test, "--json")
    result = json.loads(scored.out)
    assert result["sources"] == 2 and result["units"] == "space"
    assert result["wer"] == pytest.approx(1 - result["exact_match"])
    # every reference its units are known of, each with its end id; "x y" counts as a miss
    assert (result["units_scored"], result["references_not_scored"]) == (4 + 3, 1)
    assert scored.err == ("warning: 1 references hold target units outside the model's "
                          "vocabulary: they count for exact match and PER (never matched), "
                          "not for the loss\n")
    text = cli("eval", pairs_run, test).out
    assert text.startswith("exact match ") and ", PER " in text


def test_eval_on_pairs_from_stdin_scores_as_the_file(cli, pairs_run, tmp_path, monkeypatch):
    """`charlm eval PAIRS_RUN -` was refused ("input file not found: -"), as documented."""
    test = write_pairs(tmp_path / "test.tsv", [("abc", "c b a"), ("gf", "f g")])
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(test.read_bytes())))
    piped = cli("eval", pairs_run, "-", "--json")
    assert (piped.code, piped.err) == (0, "")
    assert piped.out == cli("eval", pairs_run, test, "--json").out


def test_export_safetensors_translates_alike_and_hf_refuses(cli, pairs_run, tmp_path):
    assert cli("export", pairs_run, "--out", tmp_path / "st").code == 0
    a = cli("sample", pairs_run, "--source", "abcd", "--temperature", "0").out
    assert cli("sample", tmp_path / "st", "--source", "abcd", "--temperature", "0").out == a
    hf = cli("export", pairs_run, "--out", tmp_path / "hf", "--format", "hf")
    assert (hf.code, hf.err) == (2, "error: this model cannot be exported as GPT-2 (--format "
                                    "hf): model.arch='encoder_decoder' (GPT-2 is a decoder "
                                    "only); use --format safetensors\n")
    assert not (tmp_path / "hf").exists()


def test_an_encoder_decoder_decodes_and_scores_in_half_precision(cli, pairs_run, tmp_path):
    greedy = cli("sample", pairs_run, "--source", "abcd", "--temperature", "0").out
    half = cli("sample", pairs_run, "--source", "abcd", "--temperature", "0", "--dtype",
               "float16")
    assert (half.code, half.out) == (0, greedy)
    beams = cli("sample", pairs_run, "--source", "abcd", "--beams", "3", "--dtype", "bfloat16")
    assert beams.code == 0 and beams.out.count("\n") == 1
    test = write_pairs(tmp_path / "test.tsv", [("abc", "c b a"), ("gf", "f g")])
    full = json.loads(cli("eval", pairs_run, test, "--json").out)
    scored = json.loads(cli("eval", pairs_run, test, "--json", "--dtype", "bfloat16").out)
    assert scored["sources"] == 2 and scored["loss"] == pytest.approx(full["loss"], abs=0.05)


def test_a_gpt_and_an_encoder_decoder_refuse_each_others_options(cli, pairs_run, run_dir):
    assert cli("sample", pairs_run, "--prompt", "abc").err == (
        "error: --prompt is for a GPT; an encoder-decoder takes --source or --source-file\n")
    assert cli("sample", run_dir, "--source", "abc").err == (
        "error: --source and --source-file are for an encoder-decoder; this model is a GPT: "
        "give --prompt or --prompt-file\n")
    assert cli("sample", pairs_run).err == (
        "error: an encoder-decoder transduces sources: give --source TEXT, --source - (one per "
        "line on stdin) or --source-file FILE\n")
    unknown = cli("sample", pairs_run, "--source", "abz")
    assert unknown.code == 2 and "--unknown skip" in unknown.err


def test_decoding_more_than_memory_holds_is_one_error_line(cli, pairs_run, tmp_path,
                                                           monkeypatch):
    """A mistyped --num-samples or --beams for an encoder-decoder went unchecked: `charlm sample
    --source-file` decodes up to 64 sources x --num-samples rows at once, and `charlm eval
    --beams` that many beams, each with its self-attention cache and its source's
    cross-attention keys and values, until the allocator or the kernel gave up."""
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: int(0.2 * 2**30))
    sources = tmp_path / "sources.txt"
    sources.write_text("abc\ngfe\n", encoding="utf-8")
    sampled = cli("sample", pairs_run, "--source-file", sources, "--num-samples", "5000")
    assert (sampled.code, sampled.out, sampled.err) == (2, "", (
        "error: --num-samples 5,000 for each of 2 sources decoded together needs about 0.6 GiB "
        "for the decoder's keys and values, the sources' cross-attention keys and values and "
        "a forward's activations, more than the 0.2 GiB of cpu; use a smaller --num-samples\n"))
    test = write_pairs(tmp_path / "test.tsv", [("abc", "c b a"), ("gf", "f g")])
    beams = cli("eval", pairs_run, test, "--beams", "5000")
    assert (beams.code, beams.out, beams.err) == (2, "", (
        "error: --beams 5,000 needs about 0.3 GiB for the decoder's keys and values, the "
        "sources' cross-attention keys and values and a forward's activations, more than the "
        "0.2 GiB of cpu; use a smaller --beams\n"))
    nbest = cli("sample", pairs_run, "--source", "abc", "--beams", "2", "--num-samples", "3")
    assert (nbest.code, nbest.err) == (2, "error: --num-samples 3 asks for the 3 best of "
                                          "--beams 2; give at most 2, or more beams\n")
    assert cli("sample", pairs_run, "--source-file", sources, "--num-samples", "2").code == 0
    assert cli("eval", pairs_run, test, "--beams", "2").code == 0


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

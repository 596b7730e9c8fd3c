"""`charlm export --format onnx` and `charlm.onnx`: greedy text from ONNX Runtime equal to
`charlm sample`'s, through the cache's re-prefills, for a char and a byte model; logits within
float tolerance at every step; a batch of rows at different lengths; the refusals. Each export
traces the model twice (about ten seconds), so the variants share five models: every position
encoding, norm, norm placement and activation is in one of them (`MODELS`), and one is of GPT-2's
shape in byte units."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch

from charlm.config.sampling import SampleConfig
from charlm.config.schema import RunConfig
from charlm.data.vocab import Vocab
from charlm.onnx_export import ONNX_FILES, save_onnx
from tests.helpers import VARIANTS, random_gpt, random_served

pytestmark = [
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime", "onnxscript")),
        reason="the onnx extra is not installed"),
    pytest.mark.xdist_group("onnx"),  # one worker exports each model once, for all its tests
]

PROMPTS = ["a", "ab", "abababab"]  # 1, 2 and 8 ids in both vocabularies
# with the byte model's learned positions, LayerNorm and GELU: every option of the architecture
MODELS = {"levers": VARIANTS["levers"], "all_changed": VARIANTS["all_changed"],
          "sinusoidal_relu": {"pos_encoding": "sinusoidal", "activation": "relu"},
          "no_positions": {"pos_encoding": "none"}}


@pytest.fixture(scope="module")
def exports() -> dict:
    """The models `exported` made, by name: a worker given the tests in another order than by
    model builds each once all the same."""
    return {}


@pytest.fixture(scope="module", params=[*MODELS, "byte"])
def exported(request, exports, tmp_path_factory):
    """(model, vocab, export dir): a random GPT of `MODELS` over 13 characters, or one of
    GPT-2's shape over the 13 UTF-8 bytes of "ab é漢🙂", exported."""
    if request.param not in exports:
        if request.param == "byte":
            model, vocab = random_served("byte")
        else:
            model, vocab = random_gpt(**MODELS[request.param]), Vocab("abcdefghijklm")
        out = tmp_path_factory.mktemp("onnx")
        save_onnx(model, vocab, RunConfig(model=model.cfg), out)
        exports[request.param] = model, vocab, out
    return exports[request.param]


def test_greedy_text_equals_charlm_samples_over_200_characters(exported):
    """Block 16: 200 steps re-prefill the cache from its recent half a dozen times."""
    from charlm.generation.text import sample_text
    from charlm.onnx import OnnxLM

    model, vocab, out = exported
    assert sorted(p.name for p in out.iterdir()) == sorted(ONNX_FILES)
    lm = OnnxLM(out)
    prompt = "ab"
    expected = sample_text(model, vocab, prompt, SampleConfig(temperature=0,
                                                              max_new_tokens=200))[0].text
    assert lm.generate(prompt, 200, temperature=0) == expected


def test_rows_of_different_lengths_share_a_batch(exported):
    """Rows prefilled at lengths 1, 2 and 8 decode together as each does alone."""
    from charlm.onnx import OnnxLM

    lm = OnnxLM(exported[2])
    alone = [lm.generate(p, 40, temperature=0) for p in PROMPTS]
    assert lm.generate_batch(PROMPTS, 40, temperature=0) == alone


def test_logits_agree_with_torchs_at_prefill_and_at_every_decode_step(exported):
    """Rows at lengths 1, 2 and 8, 40 greedy steps in one batch (block 16: each row's cache is
    prefilled again from its recent ids on the way): at every step each row's logits are
    torch's over the ids its cache holds, within float tolerance."""
    from charlm.onnx import OnnxLM

    model, _, out = exported
    lm = OnnxLM(out)
    windows = [lm.encode(p) for p in PROMPTS]
    rows = [lm.prefill(w) for w in windows]
    logits = np.stack([r[0] for r in rows])
    last = np.concatenate([r[1] for r in rows])
    kv = [np.concatenate(parts) for parts in zip(*(r[2] for r in rows), strict=True)]
    refilled = 0
    for _ in range(40):
        with torch.no_grad():
            expected = [model(torch.tensor([w]))[0][0, -1].float().numpy() for w in windows]
        np.testing.assert_allclose(logits, np.stack(expected), rtol=1e-4, atol=1e-4)
        before = [len(w) for w in windows]
        logits, last, kv = lm.advance(windows, logits.argmax(-1), last, kv)
        refilled += sum(len(w) < n for w, n in zip(windows, before, strict=True))
    assert refilled >= 3  # every row went through a re-prefill


def test_a_seed_gives_the_same_sampled_text(exported):
    from charlm.onnx import OnnxLM

    lm = OnnxLM(exported[2])
    a, b = (lm.generate("a", 50, temperature=1.0, top_k=5, top_p=0.9, seed=7) for _ in "ab")
    assert a == b and a != lm.generate("a", 50, temperature=1.0, top_k=5, top_p=0.9, seed=8)


def test_the_loader_runs_without_torch(exported):
    """`charlm.onnx` imports numpy and onnxruntime alone: it runs where torch is not."""
    code = ("import sys; sys.modules['torch'] = None; from charlm.onnx import OnnxLM; "
            f"print(OnnxLM({str(exported[2])!r}).generate('a', 20, temperature=0))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) > 1


def test_cli_refuses_an_encoder_decoder(cli, tmp_path):
    from charlm.export import save_safetensors

    model, vocab = random_served("encoder_decoder")
    source = tmp_path / "ed"
    save_safetensors(model, vocab, RunConfig(model=model.cfg), source)
    result = cli("export", source, "--format", "onnx", "--out", tmp_path / "x")
    assert (result.code, result.err) == (
        2, "error: --format onnx: an encoder-decoder is not exported to ONNX yet; export it as "
        "safetensors (--format safetensors)\n")
    assert not (tmp_path / "x").exists()


def test_an_onnx_export_is_replaced_only_with_overwrite(tmp_path):
    from charlm.core.errors import CharlmError
    from charlm.export import check_replaceable

    for name in ONNX_FILES:
        (tmp_path / name).write_text("{}")
    with pytest.raises(CharlmError) as e:
        check_replaceable(tmp_path, overwrite=False)
    assert str(e.value) == (f"--out {tmp_path} holds an earlier export; give a new directory, "
                            "or --overwrite to replace it")
    check_replaceable(tmp_path, overwrite=True)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CharlmError, match="holds files that are not an earlier export"):
        check_replaceable(tmp_path, overwrite=True)

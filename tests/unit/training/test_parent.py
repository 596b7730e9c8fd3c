"""charlm.training.parent: a fine-tune's config takes its parent's architecture, and its first
weights are the parent's, every old row where it was and new characters' rows the mean."""

from pathlib import Path

import pytest
import torch

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT
from charlm.training.parent import Parent, init_from_parent, parent_config
from tests.helpers import (
    RANDOM_GPT_VOCAB,
    SRC_PAD,
    VS,
    VT,
    random_gpt,
    random_seq2seq,
    tiny_model_config,
)


def parent_of(model: torch.nn.Module, vocab: Vocab | PairVocab) -> Parent:
    return Parent("runs/a/best.pt", Path("runs/a/best.pt"), "ab" * 32,
                  RunConfig(model=model.cfg), vocab, model.state_dict())


def test_a_gpt_keeps_every_old_row_and_new_rows_are_the_mean_of_the_old():
    old = random_gpt(tie_weights=False)  # an untied head: both tables grow
    vocab = Vocab(list("zyxwvutsrqpon"))  # 13 characters, in a parent's order
    assert len(vocab) == RANDOM_GPT_VOCAB
    union = vocab.extended("abz")
    new = GPT(old.cfg, len(union))
    init_from_parent(new, parent_of(old, vocab), union)
    assert union.chars[:13] == vocab.chars and union.chars[13:] == ["a", "b"]
    for name in ("wte.weight", "head.weight"):
        rows, grown = old.state_dict()[name], new.state_dict()[name]
        assert grown.shape == (15, 32)
        assert torch.equal(grown[:13], rows)  # bit for bit, each at its old id
        assert torch.equal(grown[13], rows.mean(0)) and torch.equal(grown[14], rows.mean(0))
    for name, tensor in old.state_dict().items():
        if name not in ("wte.weight", "head.weight"):
            assert torch.equal(new.state_dict()[name], tensor), name


def test_a_tied_gpt_without_new_characters_is_its_parent():
    old = random_gpt()
    vocab = Vocab([chr(ord("a") + i) for i in range(RANDOM_GPT_VOCAB)])
    new = GPT(old.cfg, len(vocab))
    init_from_parent(new, parent_of(old, vocab), vocab.extended("cab"))
    assert all(torch.equal(new.state_dict()[k], v) for k, v in old.state_dict().items())
    assert new.head.weight is new.wte.weight  # still tied


def test_an_encoder_decoder_moves_its_source_pad_and_target_specials_after_new_units():
    old = random_seq2seq(tie_weights=False)
    vocab = PairVocab(tuple("gfedcba"), tuple("ABCDEFGHI"), "char")
    assert (vocab.source_size, vocab.target_size, vocab.src_pad) == (VS, VT, SRC_PAD)
    union = vocab.extended(PairVocab(tuple("axy"), tuple("JA"), "char"))
    new = EncoderDecoder(old.cfg, union.source_size, union.target_size, union.src_pad)
    init_from_parent(new, parent_of(old, vocab), union)
    src, grown = old.state_dict()["src_wte.weight"], new.state_dict()["src_wte.weight"]
    assert union.source[7:] == ("x", "y") and union.src_pad == 9
    assert torch.equal(grown[:7], src[:7]) and torch.equal(grown[9], src[7])  # the pad row
    assert torch.equal(grown[7], src[:7].mean(0)) and torch.equal(grown[8], src[:7].mean(0))
    assert (union.pad, union.bos, union.eos) == (10, 11, 12)
    for name in ("wte.weight", "head.weight"):
        rows, grown = old.state_dict()[name], new.state_dict()[name]
        assert torch.equal(grown[:9], rows[:9]) and torch.equal(grown[10:], rows[9:])
        assert torch.equal(grown[9], rows[:9].mean(0))  # "J", from the units' rows only


def test_a_model_key_that_changes_a_shape_is_refused():
    parent = parent_of(random_gpt(), Vocab(list("abcdefghijklm")))
    cfg = RunConfig(model=tiny_model_config(n_layer=3))
    with pytest.raises(CharlmError) as e:
        parent_config(cfg, {"n_layer", "n_embd"}, parent)
    assert str(e.value) == (
        "--init-from: model.n_layer=3 conflicts with the parent's 2 in runs/a/best.pt; a "
        "fine-tuned model keeps its parent's architecture (drop model.n_layer from the config "
        "and --set, or train from scratch without --init-from)")


def test_the_architecture_is_the_parent_s_and_dropout_may_change():
    parent = parent_of(random_gpt(), Vocab(list("abcdefghijklm")))
    given = RunConfig.from_dict({"model": {"dropout": 0.2, "label_smoothing": 0.1}})
    cfg = parent_config(given, {"dropout", "label_smoothing"}, parent)
    assert cfg.model == tiny_model_config(dropout=0.2, label_smoothing=0.1)
    assert (cfg.train.init_from, cfg.train.init_from_sha256) == ("runs/a/best.pt", "ab" * 32)
    assert parent_config(RunConfig(), set(), parent).model == tiny_model_config()


def test_a_parent_other_than_the_pinned_sha256_is_refused():
    parent = parent_of(random_gpt(), Vocab(list("abcdefghijklm")))
    cfg = RunConfig.from_dict({"train": {"init_from_sha256": "cd" * 32}})
    with pytest.raises(CharlmError) as e:
        parent_config(cfg, set(), parent)
    assert str(e.value) == (
        f"--init-from: runs/a/best.pt has sha256 {'ab' * 32}, but train.init_from_sha256 is "
        f"{'cd' * 32}: the parent's weights changed; give the parent the config names, or set "
        "train.init_from_sha256: null to take these")


@pytest.mark.parametrize("units, normalize", [("byte", None), ("char", "NFC")])
def test_a_fine_tune_keeps_its_parent_s_units_and_normal_form(units, normalize):
    """A byte parent's fine-tune was a char model of byte values ('Ã', '©') that refused the
    'é' its parent took; an NFC parent's took U+0301 as a character of its own."""
    chars = [chr(b) for b in range(97, 110)]
    parent = parent_of(random_gpt(), Vocab(chars, units, normalize))
    cfg = parent_config(RunConfig(), set(), parent)
    assert (cfg.data.units, cfg.data.unicode_normalize) == (units, normalize)
    same = RunConfig.from_dict({"data": {"units": units, "unicode_normalize": normalize}})
    assert parent_config(same, set(), parent, {"units", "unicode_normalize"}).data == cfg.data


@pytest.mark.parametrize("units, normalize, key, value, theirs", [
    ("byte", None, "units", "char", "byte"),
    ("char", "NFC", "unicode_normalize", "NFD", "NFC"),
    ("char", None, "units", "byte", "char"),
])
def test_units_or_a_normal_form_other_than_the_parent_s_is_refused(units, normalize, key, value,
                                                                   theirs):
    parent = parent_of(random_gpt(), Vocab([chr(b) for b in range(97, 110)], units, normalize))
    cfg = RunConfig.from_dict({"data": {key: value}})
    with pytest.raises(CharlmError) as e:
        parent_config(cfg, set(), parent, {key})
    assert str(e.value) == (
        f"--init-from: data.{key}={value!r} conflicts with the parent's {theirs!r} in "
        "runs/a/best.pt; a fine-tuned model keeps its parent's units and normal form (drop "
        f"data.{key} from the config and --set, or train from scratch without --init-from)")


@pytest.mark.parametrize("weights", ["run/best.pt", "run/last.pt",
                                     "run/checkpoints/step-000010.pt"])
def test_a_parent_among_the_files_of_the_run_dir_is_refused(tmp_path, monkeypatch, weights):
    """`--init-from RUN --out RUN --overwrite` deleted the parent's weights it had just loaded,
    and the run's config named a parent whose file was the run's own checkpoint."""
    monkeypatch.chdir(tmp_path)
    parent = parent_of(random_gpt(), Vocab(list("abcdefghijklm")))
    parent.weights = Path(weights)
    cfg = RunConfig.from_dict({"train": {"out_dir": str(tmp_path / "run")}})
    with pytest.raises(CharlmError) as e:
        parent_config(cfg, set(), parent)
    assert str(e.value) == (
        f"--init-from {weights} is in the run dir {tmp_path / 'run'}, whose run the new one "
        "replaces (its checkpoints with it); choose another --out")


def test_a_parent_exported_into_a_folder_of_the_run_dir_may_be_fine_tuned_there(tmp_path):
    parent = parent_of(random_gpt(), Vocab(list("abcdefghijklm")))
    parent.weights = tmp_path / "run" / "export" / "model.safetensors"  # --overwrite keeps it
    cfg = RunConfig.from_dict({"train": {"out_dir": str(tmp_path / "run")}})
    assert parent_config(cfg, set(), parent).train.out_dir == str(tmp_path / "run")

"""charlm.export without a trained run: a failed export leaves the dir as it was, and what GPT-2
cannot express is refused."""

import pytest

from charlm.config.loading import load_config
from charlm.core.errors import CharlmError
from charlm.export import save_hf, write_dir
from tests.helpers import ROOT


def test_a_failed_export_leaves_the_existing_dir_as_it_was(tmp_path):
    out = tmp_path / "exported"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"earlier export")

    def fails(d):
        (d / "model.safetensors").write_bytes(b"half")
        raise CharlmError("this model cannot be exported")

    with pytest.raises(CharlmError):
        write_dir(out, fails, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == b"earlier export"
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]


def test_hf_export_refuses_what_gpt2_cannot_express(tmp_path):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", ["model.pos_encoding=rope",
                                                      "model.norm=rmsnorm"])
    from charlm.data.vocab import Vocab
    from charlm.model.gpt import GPT

    with pytest.raises(Exception) as e:
        save_hf(GPT(cfg.model, 3), Vocab(list("abc")), cfg, tmp_path / "hf")
    assert str(e.value) == (
        "this model cannot be exported as GPT-2 (--format hf): model.pos_encoding='rope' (GPT-2 "
        "has 'learned'), model.norm='rmsnorm' (GPT-2 has 'layernorm'); use --format safetensors")
    assert not (tmp_path / "hf").exists()

"""charlm.export without a trained run: a failed or interrupted export leaves the dir as it was,
--overwrite replaces only an earlier export, and what GPT-2 cannot express is refused."""

import json

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


def test_an_export_whose_header_says_int32_is_refused(tmp_path):
    """`"dtype": "I32"` in model.safetensors' header (as long as F32, so the file stays valid)
    loaded the float bytes as integers, cast into the model: sample printed `ROMEOKKKK...`."""
    from charlm.data.vocab import Vocab
    from charlm.export import WEIGHTS, load_safetensors, save_safetensors
    from charlm.model.gpt import GPT

    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    save_safetensors(GPT(cfg.model, 3), Vocab(list("abc")), cfg, tmp_path / "exported")
    path = tmp_path / "exported" / WEIGHTS
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header["wte.weight"]["dtype"] = "I32"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (size - len(text))  # safetensors pads its header with spaces
    path.write_bytes(data[:8] + text + data[8 + size:])
    with pytest.raises(CharlmError) as e:
        load_safetensors(tmp_path / "exported")
    assert str(e.value) == (f"cannot load exported model {tmp_path / 'exported'}: wte.weight "
                            "holds torch.int32, not floating-point weights; use weights that "
                            "charlm saved")


def test_an_export_whose_json_is_a_fifo_or_a_device_is_one_error(tmp_path):
    """A FIFO named vocab.json blocked `charlm sample EXPORT` forever; config.json as a
    symlink to /dev/zero filled the memory."""
    import os

    from charlm.export import load_safetensors
    from tests.helpers import raised_reading_fifo, random_export

    st = random_export(tmp_path / "st", "abc")
    not_regular = "not a regular file (a directory, FIFO or device); give a regular file"
    (st / "vocab.json").unlink()
    os.mkfifo(st / "vocab.json")
    e = raised_reading_fifo(st / "vocab.json", lambda: load_safetensors(st))
    assert str(e) == (f"cannot load exported model {st}: cannot read export file "
                      f"{st / 'vocab.json'}: {not_regular}")
    (st / "config.json").unlink()
    (st / "config.json").symlink_to("/dev/zero")
    with pytest.raises(CharlmError) as e:
        load_safetensors(st)
    assert str(e.value) == (f"cannot load exported model {st}: cannot read export file "
                            f"{st / 'config.json'}: {not_regular}")


def test_hf_tokenizer_drops_characters_outside_the_vocab(tmp_path):
    """The tokenizer named an unknown token `<unk>` that its vocab lacked: any character
    outside the vocab (`tokenizer("hi 😀")`) raised "WordLevel error: Missing [UNK] token"."""
    tokenizers = pytest.importorskip("tokenizers")
    from charlm.config.schema import RunConfig
    from charlm.data.vocab import Vocab
    from charlm.model.gpt import GPT
    from tests.helpers import tiny_model_config

    cfg = RunConfig(model=tiny_model_config())
    # characters a regex class would need to escape, a run of neighbours, one beyond the BMP
    vocab = Vocab(sorted("\n -]^\\abchié🙂"))
    save_hf(GPT(cfg.model, len(vocab)), vocab, cfg, tmp_path / "hf")
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    text = "hi 😀 [a-c]^\\ d é🙂\r\nZ"
    kept = "".join(c for c in text if c in vocab.index)
    assert kept == "hi  a-c]^\\  é🙂\n"
    assert tok.encode(text).ids == vocab.encode(kept)
    assert tok.decode(tok.encode(text).ids) == kept


def test_export_says_its_context_and_what_the_hf_tokenizer_drops(cli, tmp_path):
    """transformers' generate fails past n_positions where charlm sample slides its window:
    the export says how long its context is."""
    from tests.helpers import random_export

    st = random_export(tmp_path / "st", "abc\n")
    result = cli("export", st, "--out", tmp_path / "hf", "--format", "hf")
    assert (result.code, result.err) == (0, "")
    assert result.out == (
        f"wrote {tmp_path / 'hf'} (hf)\n"
        "context: 16 characters (model.block_size, n_positions): transformers' generate fails "
        "once prompt and new tokens pass it, where charlm sample slides its window\n"
        "tokenizer: characters outside the model's 4 are dropped (it has no unknown token)\n")
    result = cli("export", st, "--out", tmp_path / "again")
    assert result.out == (f"wrote {tmp_path / 'again'} (safetensors)\n"
                          "context: 16 characters (model.block_size)\n")


def _export(d):
    """What an export of the safetensors format writes."""
    for name, data in (("model.safetensors", b"weights"), ("config.json", b"{}"),
                       ("vocab.json", b"[]")):
        (d / name).write_bytes(data)


@pytest.mark.parametrize("theirs", [".git/HEAD", "thesis.tex", "last.pt", "config.json"])
def test_overwrite_refuses_a_dir_that_is_not_an_earlier_export(tmp_path, theirs):
    """`export --overwrite` replaced the whole dir: .git/, a thesis, another run's checkpoints
    (or a lone config.json of someone else's) went with it."""
    out = tmp_path / "v"
    (out / theirs).parent.mkdir(parents=True, exist_ok=True)
    (out / theirs).write_text("t\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(CharlmError) as e:
        write_dir(out, _export, overwrite=True)
    assert str(e.value) == (f"--out {out} holds files that are not an earlier export "
                            f"({theirs.split('/')[0]}); give a new or empty directory, or an "
                            "earlier export to replace")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["v"]


def test_overwrite_replaces_an_earlier_export_whole(tmp_path):
    out = tmp_path / "v"
    out.mkdir()
    _export(out)
    (out / "tokenizer.json").write_text("{}")  # an earlier hf export's
    with pytest.raises(CharlmError) as e:
        write_dir(out, _export, overwrite=False)
    assert str(e.value) == (f"--out {out} holds an earlier export; give a new directory, or "
                            "--overwrite to replace it")
    write_dir(out, lambda d: (d / "model.safetensors").write_bytes(b"new"), overwrite=True)
    assert [p.name for p in out.iterdir()] == ["model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["v"]


@pytest.mark.parametrize("signal", [KeyboardInterrupt, SystemExit(143)], ids=["int", "exit"])
@pytest.mark.parametrize("when", ["writing", "moving"])
def test_an_interrupted_export_leaves_the_earlier_one_and_no_temporary(tmp_path, monkeypatch,
                                                                      signal, when):
    """Ctrl-C or SIGTERM (which the CLI raises as SystemExit or its Interrupt) while writing
    leaves no 75 MB `.OUT.tmp-PID/`; one between moving the earlier export aside and moving
    the new one in deleted both, leaving no --out at all."""
    import os

    out = tmp_path / "v"
    out.mkdir()
    _export(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace = os.replace

    def write(d):
        (d / "model.safetensors").write_bytes(b"half")
        if when == "writing":
            raise signal

    def replace(src, dst):
        if when == "moving" and str(src).endswith(f".v.tmp-{os.getpid()}"):
            raise signal
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(type(signal) if isinstance(signal, BaseException) else signal):
        write_dir(out, write, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["v"]


def test_the_next_export_removes_what_a_killed_export_left(tmp_path):
    """A SIGKILL (or a power loss) during an export leaves `.OUT.tmp-PID/` as big as the
    export, which nothing removed; the next export into that place removes those of dead
    processes, and keeps a running one's."""
    import os

    dead, running = 4_194_305, os.getppid()  # above Linux's largest pid_max; pytest's parent
    left = [tmp_path / f".v.tmp-{dead}", tmp_path / f".v.old-{dead}"]
    kept = tmp_path / f".v.tmp-{running}"
    for d in (*left, kept, tmp_path / "v"):  # v: killed after its second move
        d.mkdir()
        _export(d)
    write_dir(tmp_path / "v", lambda d: (d / "model.safetensors").write_bytes(b"new"),
              overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["v", kept.name])
    assert (tmp_path / "v" / "model.safetensors").read_bytes() == b"new"


def test_an_export_killed_between_its_moves_is_put_back_not_deleted(tmp_path):
    """A SIGKILL between moving the earlier export aside (`.OUT.old-PID/`) and moving the new
    one in left no --out; the next export took the place as new and deleted the earlier one
    with the dead process's leftovers, even without --overwrite."""
    out, aside = tmp_path / "v", tmp_path / ".v.old-4194305"  # a PID no process has
    aside.mkdir()
    _export(aside)
    before = {p.name: p.read_bytes() for p in aside.iterdir()}
    with pytest.raises(CharlmError) as e:
        write_dir(out, lambda d: (d / "model.safetensors").write_bytes(b"new"), overwrite=False)
    assert str(e.value) == (f"--out {out} holds an earlier export; give a new directory, or "
                            "--overwrite to replace it")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["v"]


@pytest.mark.parametrize("earlier", [False, True])
def test_a_full_disk_names_the_export_and_leaves_no_folder_it_made(cli, tmp_path, monkeypatch,
                                                                   earlier):
    """`export --format hf` on a full disk said only "No space left on device" and left the
    folders it had made for --out; it names --out, what is kept, and removes what it made."""
    import errno
    import os

    from charlm import export
    from tests.helpers import files_under, random_export

    st = random_export(tmp_path / "st", "abc\n")
    out = tmp_path / "new" / "deep" / "hf"
    if earlier:
        assert cli("export", st, "--out", out, "--format", "hf").code == 0
    before = files_under(tmp_path)
    folders = sorted(p for p in tmp_path.rglob("*") if p.is_dir())

    def disk_full(path, obj):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(export, "_write_json", disk_full)
    result = cli("export", st, "--out", out, "--format", "hf", "--overwrite")
    kept = f"{out} is as it was" if earlier else "nothing of it is left"
    assert (result.code, result.out, result.err) == (
        2, "", f"error: cannot write export {out}: No space left on device; {kept}; free disk "
               "space (or fix the folder), then export again\n")
    assert files_under(tmp_path) == before
    assert sorted(p for p in tmp_path.rglob("*") if p.is_dir()) == folders

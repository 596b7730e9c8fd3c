import os
import pickle

import pytest
import torch

from charlm import checkpoint
from charlm.errors import CharlmError


def test_save_load_round_trip_leaves_no_temp_files(tmp_path):
    state = {"model": {"w": torch.arange(6.0)}, "vocab": ["a", "b"], "config": {"x": 1}}
    path = tmp_path / "last.pt"
    checkpoint.save(state, path)
    loaded = checkpoint.load(path)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["vocab"] == ["a", "b"] and loaded["version"] == checkpoint.VERSION
    assert os.listdir(tmp_path) == ["last.pt"]


def test_failed_save_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1}, path)
    before = path.read_bytes()

    def disk_full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError):
        checkpoint.save({"step": 2}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.pt"]


class Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickle_payload_is_refused_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"format": checkpoint.FORMAT, "payload": Payload()}, f)
    with pytest.raises(CharlmError, match="cannot load checkpoint .*evil.pt"):
        checkpoint.load(path)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("content", [b"", b"\x00garbage" * 10, pickle.dumps([1, 2], protocol=2)])
def test_garbage_files_give_clear_errors(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CharlmError, match="cannot load checkpoint|not a charlm checkpoint"):
        checkpoint.load(path)


def test_foreign_and_future_checkpoints(tmp_path):
    foreign = tmp_path / "ckpt.pt"  # what nanoGPT writes: no format marker
    torch.save({"model": {}, "model_args": {"n_layer": 1}, "iter_num": 3}, foreign)
    with pytest.raises(CharlmError, match="is not a charlm checkpoint"):
        checkpoint.load(foreign)
    future = tmp_path / "future.pt"
    torch.save({"format": checkpoint.FORMAT, "version": 99}, future)
    with pytest.raises(CharlmError, match="format version 99, this charlm reads version 1"):
        checkpoint.load(future)


def test_resolve_prefers_best_then_last(tmp_path):
    with pytest.raises(CharlmError, match="no checkpoint"):
        checkpoint.resolve(tmp_path)
    (tmp_path / "last.pt").write_bytes(b"x")
    assert checkpoint.resolve(tmp_path) == tmp_path / "last.pt"
    (tmp_path / "best.pt").write_bytes(b"x")
    assert checkpoint.resolve(tmp_path) == tmp_path / "best.pt"
    with pytest.raises(CharlmError, match="no such run dir or checkpoint"):
        checkpoint.resolve(tmp_path / "nope")

"""charlm.training.checkpoint: atomic saves, and loads that refuse garbage, pickled code, FIFOs
and foreign or future checkpoints; the checkpoints a run keeps by step, which files are its own,
pruning to the newest, and finding one by its step."""

import math
import os
import pickle
import threading
import zipfile
import zlib

import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.training import checkpoint
from charlm.training.run_objects import TrainState
from tests.helpers import flip_bytes


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
    with pytest.raises(CharlmError, match=f"cannot write checkpoint {path}: No space left on "
                                          "device; the previous last.pt, if any, is unchanged"):
        checkpoint.save({"step": 2}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.pt"]


def test_a_disk_that_fills_up_inside_torch_save_is_one_error_line(tmp_path, monkeypatch):
    """torch's zip writer turns the OSError of a failed write into a RuntimeError (seen on a full
    tmpfs: `unexpected pos 34944 vs 34896`); it is the same error line, not a traceback."""
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1}, path)
    before = path.read_bytes()

    def zip_writer_on_a_full_disk(obj, f):
        f.write(b"PK")
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError(  # noqa: B904 (raised as torch raises it)
                "[enforce fail at inline_container.cc:672] . unexpected pos 34944 vs 34896")

    monkeypatch.setattr(torch, "save", zip_writer_on_a_full_disk)
    with pytest.raises(CharlmError) as e:
        checkpoint.save({"step": 2}, path)
    assert str(e.value) == (
        f"cannot write checkpoint {path}: No space left on device; the previous last.pt, if "
        "any, is unchanged; free disk space (or fix the run dir), then continue with --resume")
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


def _truncated_checkpoint(tmp_path) -> bytes:
    checkpoint.save({"model": {"w": torch.zeros(1000)}}, tmp_path / "whole.pt")
    whole = (tmp_path / "whole.pt").read_bytes()
    return whole[: len(whole) // 2]


@pytest.mark.parametrize("content", [b"", b"\x00garbage" * 10, pickle.dumps([1, 2], protocol=2),
                                     _truncated_checkpoint])
def test_garbage_files_give_clear_errors(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content(tmp_path) if callable(content) else content)
    with pytest.raises(CharlmError, match="cannot load checkpoint|not a charlm checkpoint"):
        checkpoint.load(path)


@pytest.mark.parametrize("content", [b"hello\n", b"", _truncated_checkpoint])
def test_a_file_that_is_not_a_whole_checkpoint_names_it_in_one_line(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content(tmp_path) if callable(content) else content)
    with pytest.raises(CharlmError) as e:
        checkpoint.load(path)
    assert str(e.value) == (f"cannot load checkpoint {path}: not a readable charlm checkpoint "
                            "(not a complete torch.save file)")


class _RunsCode:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_checkpoint_with_pickled_code_is_refused_in_plain_words(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "x": _RunsCode()},
               path)
    with pytest.raises(CharlmError) as e:
        checkpoint.load(path)
    assert str(e.value) == (f"cannot load checkpoint {path}: not a readable charlm checkpoint (it "
                            "is not a checkpoint, or it holds pickled code, which charlm never "
                            "runs)")
    assert "must never run" not in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_a_fifo_is_refused_without_reading_it(tmp_path):
    """Reading a FIFO (or /dev/zero) as a checkpoint would wait for a writer forever."""
    fifo = tmp_path / "best.pt"
    os.mkfifo(fifo)
    # Without the check, load would block here; a writer that gives EOF after a while makes
    # such a load fail with another message instead of hanging the suite.
    writer = threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True)
    writer.start()
    try:
        with pytest.raises(CharlmError) as e:
            checkpoint.load(fifo)
        assert str(e.value) == (f"cannot read checkpoint {fifo}: not a regular file (a "
                                "directory, FIFO or device); give a regular file")
    finally:  # a reader lets the writer's open return, whenever it comes
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            writer.join(5)
            assert not writer.is_alive()
        finally:
            os.close(reader)


GOOD_TRAIN_STATE = {"step": 20, "best_val": 3.3, "tokens": 5120, "skipped_steps": 0,
                    "bad_streak": 0}


@pytest.mark.parametrize("change", [{"step": 20.5}, {"step": -5}, {"step": True},
                                    {"tokens": float("nan")}, {"best_val": "3.3"},
                                    {"skipped_steps": -1}])
def test_a_train_state_with_a_step_that_is_not_a_count_is_malformed(change):
    """A float step made --resume end in a TypeError traceback; a negative one trained on."""
    checkpoint.check_train_state({"train_state": GOOD_TRAIN_STATE})
    with pytest.raises(ValueError, match="^train_state is missing or malformed$"):
        checkpoint.check_train_state({"train_state": {**GOOD_TRAIN_STATE, **change}})


def test_an_older_versions_time_budget_plan_is_no_end_of_the_run():
    """Versions that planned a budget's steps saved the planned last step as budget_steps and
    the plan beside it: such a checkpoint still loads, and a run resumed from it trains on
    (budget_steps marks the step a budget ended a run at, nothing else)."""
    plan = {"steps": 85, "anchor_step": 5, "anchor_progress": 0.0, "step_s": 1.0,
            "eval_steps": 2.0, "save_s": 0.0}
    older = {**GOOD_TRAIN_STATE, "step": 30, "budget_steps": 85, "budget": plan}
    checkpoint.check_train_state({"train_state": older})
    state = TrainState()
    state.load_state_dict(older)
    assert (state.step, state.budget_steps) == (30, None)
    state.load_state_dict({**older, "step": 85})
    assert state.budget_steps == 85 and state.state_dict()["budget_steps"] == 85


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


def test_torch_save_stores_every_record_uncompressed_with_its_crc32(tmp_path):
    """What `check_records` relies on: torch.save writes a zip whose records carry the CRC-32
    of their bytes, and compresses none of them."""
    path = tmp_path / "last.pt"
    checkpoint.save({"model": {"w": torch.randn(300)}, "step": 3}, path)
    with zipfile.ZipFile(path) as archive:
        records = archive.infolist()
        assert {r.compress_type for r in records} == {zipfile.ZIP_STORED}
        assert all(zlib.crc32(archive.read(r)) == r.CRC for r in records)
        assert any(r.filename.endswith("data/0") and r.file_size == 1200 for r in records)


def test_two_bytes_flipped_inside_a_tensor_make_the_checkpoint_damaged(tmp_path):
    """torch.load checks no CRC: the flipped weights loaded without a word."""
    path = tmp_path / "last.pt"
    checkpoint.save({"model": {"w": torch.randn(300)}}, path)
    record = flip_bytes(path, "data/0")
    with pytest.raises(CharlmError) as e:
        checkpoint.load(path)
    assert str(e.value) == (
        f"checkpoint {path} is damaged or incomplete: record {record} fails its CRC-32 check "
        "(the file changed after it was saved); restore it from a backup, or use the run's "
        "other checkpoint (best.pt or last.pt)")


def test_a_compressed_record_is_refused_before_it_is_inflated(tmp_path):
    """torch.save compresses nothing: a deflated record is a crafted file, which could inflate
    to far more than the file holds while its CRC-32 is checked."""
    path = tmp_path / "last.pt"
    checkpoint.save({"model": {"w": torch.zeros(300)}}, path)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp_path / "packed.pt", "w") as dst:
        for record in src.infolist():
            dst.writestr(record.filename, src.read(record), zipfile.ZIP_DEFLATED)
    with pytest.raises(CharlmError) as e:
        checkpoint.load(tmp_path / "packed.pt")
    assert str(e.value) == (
        f"cannot load checkpoint {tmp_path / 'packed.pt'}: not a readable charlm checkpoint "
        "(record archive/data.pkl is compressed, which torch.save never does)")


@pytest.mark.parametrize("weight, detail", [
    (torch.ones(4, dtype=torch.int32), "w holds torch.int32, not floating-point weights; use "
                                       "weights that charlm saved"),
    (torch.tensor([1.0, math.nan]), "w holds NaN or inf (the weights diverged); use an earlier "
                                    "checkpoint, or train again with a lower optim.lr"),
])
def test_restore_refuses_weights_that_are_not_finite_floats(tmp_path, weight, detail):
    """A resume cast int, bool and complex weights into the model and trained on them."""
    model = torch.nn.Linear(2, 2, bias=False)
    before = model.weight.detach().clone()
    state = {"model": {"w": weight}, "train_state": GOOD_TRAIN_STATE}
    with pytest.raises(CharlmError) as e:
        checkpoint.restore(state, {"model": model}, tmp_path / "last.pt")
    assert str(e.value) == f"checkpoint {tmp_path / 'last.pt'} is damaged or incomplete: {detail}"
    assert torch.equal(model.weight, before)


def test_only_files_of_the_exact_name_are_the_runs_and_prune_keeps_the_newest(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("step-000500.pt", "step-000100.pt", "step-1500000.pt", "step-000900.pt",
                 "step-500.pt", "step-0000100.pt", "step-000200.pt.bak", "notes.txt"):
        (folder / name).write_bytes(b"x")
    (folder / "step-000700.pt").mkdir()
    assert checkpoint.step_path(tmp_path, 500) == folder / "step-000500.pt"
    assert checkpoint.saved_steps(tmp_path) == [100, 500, 900, 1500000]
    checkpoint.prune_steps(tmp_path, 2)
    assert {p.name for p in folder.iterdir()} == {
        "notes.txt", "step-000200.pt.bak", "step-000700.pt", "step-0000100.pt", "step-000900.pt",
        "step-1500000.pt", "step-500.pt"}


def test_a_step_that_is_not_kept_is_one_error_that_lists_those_that_are(tmp_path):
    with pytest.raises(CharlmError) as e:
        checkpoint.find_step(tmp_path, 500)
    assert str(e.value) == (
        f"step 500: {tmp_path} keeps no checkpoints by step (it was trained with "
        "train.keep_checkpoints=0); use its best.pt or last.pt (drop step), or train with "
        "train.keep_checkpoints=N")
    (tmp_path / "checkpoints").mkdir()
    for step in (100, 200):
        checkpoint.step_path(tmp_path, step).write_bytes(b"x")
    assert checkpoint.find_step(tmp_path, 200) == tmp_path / "checkpoints" / "step-000200.pt"
    with pytest.raises(CharlmError) as e:
        checkpoint.find_step(tmp_path, 150)
    assert str(e.value) == (f"step 150: {tmp_path} keeps no checkpoint of step 150; its "
                            "checkpoints/ holds steps 100, 200")

"""The run dir: refusing to clobber a run, the run lock, --overwrite, the resume config and
the temporary files a killed run leaves."""

import os
from pathlib import Path

import pytest

from charlm.core.errors import CharlmError
from charlm.training.loop import train
from charlm.training.run_dir import resume_config
from tests.helpers import with_


def test_resume_refuses_architecture_change_and_missing_checkpoint(tiny_cfg, tmp_path):
    with pytest.raises(CharlmError, match="--resume: no checkpoint"):
        resume_config(tmp_path / "nothing", None, [])
    train(with_(tiny_cfg, train={"max_iters": 20}))
    run = tiny_cfg.train.out_dir
    with pytest.raises(CharlmError) as e:
        resume_config(Path(run), None, ["model.n_layer=3"])
    assert "--resume: model.n_layer=3 conflicts with the checkpoint's 2" in str(e.value)


def test_existing_run_is_not_clobbered(tiny_cfg):
    cfg = with_(tiny_cfg, train={"max_iters": 20})
    train(cfg)
    last_pt = Path(cfg.train.out_dir, "last.pt")
    last = last_pt.read_bytes()
    with pytest.raises(CharlmError, match="already holds a run .* --resume, .* --overwrite"):
        train(cfg)
    assert last_pt.read_bytes() == last
    train(cfg, overwrite=True)  # explicit consent starts over


def test_a_second_train_into_a_run_dir_in_use_is_refused(tiny_cfg):
    """While one `charlm train` holds the run dir (here: this test holds its lock), another,
    fresh or --resume, is refused before it writes anything; the lock ends with its holder."""
    import fcntl

    cfg = with_(tiny_cfg, train={"max_iters": 10})
    train(cfg)
    run = Path(cfg.train.out_dir)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    holder = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for resume in (False, True):
            with pytest.raises(CharlmError) as e:
                train(with_(cfg, train={"max_iters": 20}), resume=resume)
            assert str(e.value) == (f"{run} is in use by another `charlm train`; wait for it to "
                                    "end, or choose another --out")
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    finally:
        os.close(holder)
    assert train(with_(cfg, train={"max_iters": 20}), resume=True).step == 20  # released


def test_run_stopped_before_its_first_checkpoint_is_not_clobbered(tiny_cfg):
    """A run dir with a config and metrics but no checkpoint yet (killed before its first save,
    or --out pointed at the wrong dir) is left alone too, with no --resume hint (there is
    nothing to resume from)."""
    run = Path(tiny_cfg.train.out_dir)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("notes\n")
    (run / "metrics.jsonl").write_text('{"event": "train"}\n')
    with pytest.raises(CharlmError) as e:
        train(tiny_cfg)
    assert str(e.value) == (f"{run} already holds a run (metrics.jsonl, config.yaml); start over "
                            "with --overwrite, or choose another --out")
    assert (run / "config.yaml").read_text() == "notes\n"
    assert (run / "metrics.jsonl").read_text() == '{"event": "train"}\n'


def test_overwrite_with_bad_data_keeps_the_old_run(tiny_cfg, tmp_path):
    cfg = with_(tiny_cfg, train={"max_iters": 20})
    train(cfg)
    run = Path(cfg.train.out_dir)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    bad = with_(cfg, data={"path": str(tmp_path / "missing.txt")})
    with pytest.raises(CharlmError, match="input file not found"):
        train(bad, overwrite=True)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_resume_removes_the_half_saved_checkpoints_of_a_killed_run(tiny_cfg):
    """A run killed inside checkpoint.save leaves its temporary file (as big as a checkpoint)
    beside last.pt / best.pt; the resume, which holds the run lock, removes such files and
    nothing else."""
    cfg = with_(tiny_cfg, train={"max_iters": 2, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0})
    train(cfg)
    run = Path(cfg.train.out_dir)
    left = [run / ".last.pt.tmp-4242", run / ".best.pt.tmp-17", run / ".metrics.jsonl.tmp-5"]
    kept = [run / ".last.pt.tmp-notes", run / "last.pt.tmp-1", run / "notes.txt"]
    for path in left + kept:
        path.write_bytes(b"PK\x03\x04")
    train(with_(cfg, train={"max_iters": 3}), resume=True)
    assert not any(path.exists() for path in left)
    assert all(path.read_bytes() == b"PK\x03\x04" for path in kept)

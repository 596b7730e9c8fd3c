"""The run dir: refusing to clobber a run, the run lock, --overwrite, the resume config and
the temporary files a killed run leaves."""

import os
from pathlib import Path

import pytest

from charlm.config.loading import save_config
from charlm.core.errors import CharlmError
from charlm.training.loop import train
from charlm.training.resume import resume_config
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
    """A run dir with its config and metrics but no checkpoint yet (killed before its first
    save) is left alone too, with no --resume hint (there is nothing to resume from)."""
    run = Path(tiny_cfg.train.out_dir)
    run.mkdir(parents=True)
    save_config(tiny_cfg, run / "config.yaml")
    (run / "metrics.jsonl").write_text('{"event": "train"}\n')
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(CharlmError) as e:
        train(tiny_cfg)
    assert str(e.value) == (f"{run} already holds a run (metrics.jsonl, config.yaml); start over "
                            "with --overwrite, or choose another --out")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


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


def test_overwrite_keeps_the_users_files_and_out_dot_among_them_is_refused(cli, tiny_cfg,
                                                                          monkeypatch):
    """--overwrite deleted tb/notes and any file of a run's names; `--out .` in a folder of
    the user's files (config.yaml, tb/notes, the text) said it "already holds a run" and
    --overwrite then dropped the run among them. Now that folder is refused; a run's
    --overwrite removes only what the run wrote."""
    run = Path(tiny_cfg.train.out_dir)
    args = ["--set", "train.max_iters=2", "--set", "train.eval_interval=2", "--set",
            "train.eval_iters=1", "--set", "train.sample_chars=0"]
    mine = run.parent / "mine"
    (mine / "tb").mkdir(parents=True)
    (mine / "tb" / "notes").write_text("my notes\n")
    (mine / "config.yaml").write_text("model:\n  n_layer: 1  # mine\n")
    text = mine / "my.txt"
    text.write_text(Path(tiny_cfg.data.path).read_text(encoding="utf-8"), encoding="utf-8")
    before = {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    monkeypatch.chdir(mine)
    for more in ([], ["--overwrite"]):
        result = cli("train", "my.txt", "--out", ".", *args, *more)
        assert (result.code, result.err) == (2, "error: . is not empty and holds no charlm run "
                                                "(config.yaml, my.txt, tb); give a new or empty "
                                                "directory as --out, or a run dir to replace\n")
        assert {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before
    assert cli("train", text, "--out", run, *args).code == 0
    (run / "tb" / "notes").write_text("my notes\n")
    (run / "notes.txt").write_text("mine\n")
    old_events = {p.name for p in (run / "tb").glob("events.*")}
    assert cli("train", text, "--out", run, *args, "--overwrite").code == 0
    assert (run / "tb" / "notes").read_text() == "my notes\n"
    assert (run / "notes.txt").read_text() == "mine\n"
    assert not old_events & {p.name for p in (run / "tb").iterdir()}  # the old run's are gone

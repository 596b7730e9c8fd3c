"""charlm.tune.workers: a trial's seeded runs, whether it saved, one GPU per worker, and whether
its run dir is in use."""

from pathlib import Path

import pytest
import torch

from charlm.config.loading import load_config
from charlm.core.errors import CharlmError
from charlm.tune.workers import cuda_slots, repeated, saved
from tests.helpers import TINY


def test_a_repeated_trial_runs_each_seed_in_its_own_dir(tmp_path: Path) -> None:
    cfg = load_config(TINY, [f"train.out_dir={tmp_path / 'trial-0003'}", "train.seed=7"])
    assert repeated(cfg, 1) == [cfg]
    runs = repeated(cfg, 3)
    assert [(r.train.seed, r.train.out_dir) for r in runs] == [
        (seed, str(tmp_path / "trial-0003" / f"seed-{seed}")) for seed in (7, 8, 9)]
    assert cfg.train.seed == 7 and cfg.train.out_dir == str(tmp_path / "trial-0003")
    assert all(r.model == cfg.model and r.optim == cfg.optim for r in runs)


def test_a_trial_has_saved_when_it_or_one_of_its_seeds_has_a_last_pt(tmp_path: Path) -> None:
    assert not saved(tmp_path)
    (tmp_path / "seed-8").mkdir()
    (tmp_path / "seed-8" / "best.pt").write_bytes(b"x")
    assert not saved(tmp_path)
    (tmp_path / "seed-8" / "last.pt").write_bytes(b"x")
    assert saved(tmp_path)


def test_each_worker_gets_a_gpu_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    base = load_config(TINY, ["train.device=cuda"]).to_dict()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_slots(base, 2) == []  # no GPU: the trials share the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_slots(base, 1) == []  # one worker: its trial takes the device as configured
    assert cuda_slots(base, 2) == ["0", "1"]
    assert cuda_slots(load_config(TINY, ["train.device=cpu"]).to_dict(), 2) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert cuda_slots(base, 2) == ["4", "6"]
    with pytest.raises(CharlmError) as e:
        cuda_slots(base, 3)
    assert str(e.value) == ("--workers 3 runs one trial per GPU, and this machine has 2; give "
                            "--workers 2 or fewer")


def test_a_run_dir_is_in_use_while_a_run_holds_its_lock_or_a_seeds(tmp_path: Path) -> None:
    from charlm.training.run_dir import run_lock
    from charlm.tune.workers import in_use

    trial = tmp_path / "trial-0002"
    assert not in_use(trial)  # not made yet
    (trial / "seed-8").mkdir(parents=True)
    for run in (trial, trial / "seed-8"):
        (run / "last.pt").write_bytes(b"x")  # run_lock removes only the dirs it made empty
        with run_lock(run):
            assert in_use(trial)
        assert not in_use(trial)

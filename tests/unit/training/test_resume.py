"""What a resume takes from RUN/config.yaml besides its checkpoint (`training.resume`)."""

from pathlib import Path

import pytest

from charlm.config.loading import save_config
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.training.resume import require_same_average, with_edits


@pytest.mark.parametrize("rank, said", [(None, True), ("0", True), ("1", False)])
def test_an_edit_of_config_yaml_applies_and_rank_0_alone_says_so(tmp_path: Path, monkeypatch,
                                                                  capsys, rank, said):
    """Under torchrun every rank printed the line; each still applies the edit."""
    saved = RunConfig().to_dict()
    edited = RunConfig.from_dict({**saved, "train": {**saved["train"], "max_iters": 7}}, "test")
    save_config(edited, tmp_path / "config.yaml")
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
    raw = with_edits(tmp_path, saved, tmp_path / "last.pt")
    assert raw["train"]["max_iters"] == 7
    line = (f"--resume: applying the edits of {tmp_path / 'config.yaml'}: train.max_iters "
            f"{saved['train']['max_iters']!r} -> 7\n")
    assert capsys.readouterr().err == (line if said else "")


def test_a_resume_that_turns_the_weight_average_on_or_off_is_one_error_line(tmp_path):
    path = tmp_path / "last.pt"
    plain, averaged = RunConfig(), RunConfig.from_dict({"optim": {"ema": 0.9}})
    require_same_average(plain, {"config": plain.to_dict()}, path)  # nothing changes: no error
    with pytest.raises(CharlmError, match=r"^--resume: optim.ema=0.9 cannot apply: the run was "
                       r"trained without a weight average \(optim.ema=0\); resume with --set "
                       r"optim.ema=0, or start a new run$"):
        require_same_average(averaged, {"config": plain.to_dict()}, path)
    with pytest.raises(CharlmError, match=rf"^checkpoint {path} is damaged or incomplete: optim"
                       r".ema of its config is not a number$"):
        require_same_average(plain, {"train_model": {}, "config": {"optim": {"ema": "x"}}}, path)

"""charlm.tune.trial: the Follower of a trial's metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from charlm.tune.trial import Follower
from tests.helpers import write


def test_follower_reads_each_line_once_and_again_after_a_cut_back(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    follower = Follower(path)
    assert follower.events() == []
    write(path, '{"step": 1}\n{"step": 2}\n{"st')
    assert follower.events() == [{"step": 1}, {"step": 2}]
    with open(path, "a") as f:
        f.write('ep": 3}\n')
    assert follower.events() == [{"step": 3}]
    write(path, '{"step": 1}\n')  # a resumed run cut its log back
    assert follower.events() == [{"step": 1}]

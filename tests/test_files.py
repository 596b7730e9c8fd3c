import errno
import os
from pathlib import Path

import pytest

from charlm import cli
from charlm.files import write_text_atomic


def test_a_failed_atomic_write_names_the_target_and_keeps_it(tmp_path, monkeypatch):
    """A full disk while writing config.yaml said `error: No space left on device:
    RUN/.config.yaml.tmp-PID`, a file the user never sees; it names config.yaml now."""
    path = tmp_path / "config.yaml"
    path.write_text("old\n", encoding="utf-8")
    real_write = Path.write_text

    def disk_full(self, *args, **kwargs):
        real_write(self, "half", encoding="utf-8")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError) as e:
        write_text_atomic(path, "new\n")
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(path))
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == "old\n"
    assert os.listdir(tmp_path) == ["config.yaml"]


def test_the_cli_reports_a_failed_atomic_write_with_the_target(tmp_path, monkeypatch, capsys):
    path = tmp_path / "config.yaml"

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "write_text", disk_full)
    monkeypatch.setattr(cli, "app", lambda **kwargs: write_text_atomic(path, "x"))
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: No space left on device: {path}\n"

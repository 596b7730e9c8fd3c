"""`charlm eval` on an export of random weights: the errors of what it reads."""

from __future__ import annotations

from tests.helpers import random_export


def test_eval_of_a_device_is_one_error(fails, tmp_path):
    """`charlm eval RUN /dev/zero` read the device until a MemoryError."""
    st = random_export(tmp_path / "st", "abc")
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    fails("eval", st, zero, message=f"cannot read text file {zero}: not a regular file (a "
                                    "directory, FIFO or device); give a regular file")

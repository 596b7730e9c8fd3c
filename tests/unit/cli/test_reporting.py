"""Error lines under torchrun (charlm.cli.reporting): one per machine, not one per process."""

import pytest

from tests.helpers import ROOT


@pytest.mark.parametrize("rank, local_rank, prints", [(1, 1, False), (8, 0, True)])
def test_bad_input_is_printed_by_the_first_process_of_each_machine(rank, local_rank, prints,
                                                                   cli, monkeypatch):
    """The processes of a torchrun world fail alike: one error line per machine, not one per
    process (rank 8 with local rank 0: the first process of a second machine)."""
    for key, value in {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": 16}.items():
        monkeypatch.setenv(key, str(value))
    result = cli("train", ROOT / "configs" / "tiny.yaml", "--set", "train.max_iters=0")
    message = "error: invalid config value train.max_iters: must be >= 1\n"
    assert (result.code, result.out, result.err) == (2, "", message if prints else "")

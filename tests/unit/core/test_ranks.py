"""charlm.core.ranks: where a process sits in a torchrun world, from its environment alone, and
which processes speak for the run and report its errors."""

import pytest

from charlm.core.ranks import is_main_process, reports_errors, torchrun_place


@pytest.mark.parametrize("env, place, main, reports", [
    ({}, None, True, True),  # not under torchrun
    ({"RANK": "0"}, None, True, True),  # no WORLD_SIZE: not a torchrun world either
    ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}, (0, 0, 4), True, True),
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, (3, 1, 4), False, False),
    # the first process of a second machine: quiet about the run, reports that machine's errors
    ({"RANK": "8", "LOCAL_RANK": "0", "WORLD_SIZE": "16"}, (8, 0, 16), False, True),
    ({"RANK": "2", "WORLD_SIZE": "4"}, (2, 2, 4), False, False),  # local rank: the rank
])
def test_the_place_in_a_torchrun_world_decides_who_speaks(monkeypatch, env, place, main,
                                                          reports):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert (torchrun_place(), is_main_process(), reports_errors()) == (place, main, reports)

"""`charlm serve`'s refusals before it loads anything (charlm.cli.serve)."""

import pytest


@pytest.mark.parametrize("args, message", [
    (["--api-key", ""], "--api-key is empty; give a key, or leave it out"),
    (["--max-n", "8", "--max-concurrent", "4"],
     "--max-n 8 is above --max-concurrent 4: a request for --max-n completions could never "
     "run; lower --max-n"),
])
def test_serve_refuses_settings_that_cannot_work(fails, tmp_path, args, message):
    fails("serve", tmp_path, *args, message=message)


def test_a_limit_below_one_is_a_usage_error(cli, tmp_path):
    result = cli("serve", tmp_path, "--slots", "0")
    assert result.code == 2 and result.err.startswith("error: ")
    assert "--slots" in result.err and result.err.count("\n") == 1

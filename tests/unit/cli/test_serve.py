"""`charlm serve`'s refusals before it loads anything (charlm.cli.serve)."""

import pytest


@pytest.mark.parametrize("args, message", [
    (["--api-key", ""], "--api-key is empty; give a key, or leave it out"),
    (["--host", ""], "--host is empty, which would listen on every network; give an address "
                     "(127.0.0.1, or 0.0.0.0 for every network with --api-key)"),
    (["--host", " ", "--api-key", "k"], "--host is empty, which would listen on every "
     "network; give an address (127.0.0.1, or 0.0.0.0 for every network with --api-key)"),
    (["--max-n", "8", "--max-concurrent", "4"],
     "--max-n 8 is above --max-concurrent 4: a request for --max-n completions could never "
     "run; lower --max-n"),
])
def test_serve_refuses_settings_that_cannot_work(fails, tmp_path, args, message):
    fails("serve", tmp_path, *args, message=message)


def test_an_empty_api_key_in_the_environment_is_refused(fails, tmp_path, monkeypatch):
    """`CHARLM_API_KEY= charlm serve RUN` started with no key while `--api-key ""` was refused;
    `--host ""` listened on 0.0.0.0 without a word."""
    monkeypatch.setenv("CHARLM_API_KEY", "")
    fails("serve", tmp_path, message="CHARLM_API_KEY is set but empty, so the server would "
          "need no key; give a key in it, or unset it")


def test_a_limit_below_one_is_a_usage_error(cli, tmp_path):
    result = cli("serve", tmp_path, "--slots", "0")
    assert result.code == 2 and result.err.startswith("error: ")
    assert "--slots" in result.err and result.err.count("\n") == 1

"""The Python API: charlm.load / sample / generate / score, and the README's example."""

import dataclasses
import re

import pytest
import torch

from charlm.core.errors import CharlmError
from tests.helpers import ROOT, SHAKESPEARE


def test_readme_python_api_example_runs(run_dir, tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "shakespeare_char_cpu").symlink_to(run_dir)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tinyshakespeare.txt").symlink_to(SHAKESPEARE)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert isinstance(namespace["text"], str) and len(namespace["text"]) == 200
    assert namespace["result"].bpc > 0


def test_api_stop_given_as_a_string_is_one_stop_string(run_dir):
    import charlm

    lm = charlm.load(run_dir, "cpu")
    free = charlm.generate(lm, "First", max_new_tokens=40, temperature=0)
    stop = free[10:12]
    end = free.index(stop) + len(stop)
    for given in (stop, [stop]):  # like --stop STR: a str is one stop string, not its characters
        out = charlm.generate(lm, "First", max_new_tokens=40, temperature=0, stop=given,
                              include_stop=True)
        assert out == free[:end]


def test_api_stop_none_is_no_stop_string(run_dir):
    import charlm

    lm = charlm.load(run_dir, "cpu")
    free = charlm.generate(lm, "First", max_new_tokens=20, temperature=0)
    assert charlm.generate(lm, "First", max_new_tokens=20, temperature=0, stop=None) == free
    assert not charlm.sample(lm, "First", max_new_tokens=20, stop=None)[0].stopped


def test_api_generate_is_one_string_and_refuses_num_samples(run_dir):
    import charlm

    lm = charlm.load(run_dir, "cpu")
    once = charlm.generate(lm, "First", max_new_tokens=10, seed=3, num_samples=1)
    assert once == charlm.sample(lm, "First", max_new_tokens=10, seed=3)[0].text
    assert charlm.CharlmError is CharlmError
    with pytest.raises(CharlmError) as e:  # not the first of 3 samples, silently
        charlm.generate(lm, "First", max_new_tokens=10, num_samples=3)
    assert str(e.value) == ("generate() returns one string; use charlm.sample() for "
                            "num_samples > 1")


def test_api_arguments_of_the_wrong_kind_raise_charlm_error(run_dir):
    import charlm

    lm = charlm.load(run_dir, "cpu")
    calls = [
        (lambda: charlm.load(3), "charlm.load() takes a path (str or Path), got int"),
        (lambda: charlm.load(run_dir, device=0), "invalid value for device: 0, expected a string"),
        (lambda: charlm.generate(str(run_dir), "First"),
         "expected a model from charlm.load(), got str"),
        (lambda: charlm.generate(lm, 5), "the prompt must be a str, got int"),
        (lambda: charlm.generate(lm, "First", topk=5),
         "unknown option 'topk' for charlm.sample / charlm.generate, did you mean 'top_k'?"),
        (lambda: charlm.generate(lm, "First", num_samples="1"),
         "invalid value for num_samples: '1', expected an integer"),
        (lambda: charlm.sample(lm, "First", stop=5),
         "invalid value for stop: 5, expected a list, each item a string"),
        (lambda: charlm.score(lm, b"First"), "the text must be a str, got bytes"),
        (lambda: charlm.score(lm, "First Citizen", stride=4.0),
         "invalid value for stride: 4.0, expected an integer or null"),
        (lambda: charlm.score(lm, "First Citizen", strde=2),  # was a bare TypeError
         "unknown option 'strde' for charlm.score, did you mean 'stride'?"),
    ]
    for call, message in calls:
        with pytest.raises(CharlmError) as e:
            call()
        assert str(e.value) == message


def test_api_warns_as_the_cli_does_about_a_skipped_or_cropped_prompt(run_dir):
    import charlm

    lm = charlm.load(run_dir, "cpu")
    with pytest.warns(UserWarning) as caught:
        charlm.generate(lm, "F\u00e9" + "a" * 100, max_new_tokens=1, unknown="skip")
    assert [str(w.message) for w in caught] == [
        "skipped 1 character of the prompt outside the vocabulary: '\u00e9' at position 1",
        "the prompt has 101 characters, more than the context of 16; using its last 16",
    ]


def test_api_score_warns_as_the_cli_does_about_skipped_characters(cli, run_dir, tmp_path):
    import charlm

    lm = charlm.load(run_dir, "cpu")
    text = "\u00e9First Citizen\u00e9\u00e9"
    with pytest.warns(UserWarning) as caught:
        skipped = charlm.score(lm, text, unknown="skip")
    assert [str(w.message) for w in caught] == ["skipped 3 characters outside the vocabulary"]
    assert skipped == dataclasses.replace(charlm.score(lm, "First Citizen"), skipped_unknown=3)
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    result = cli("eval", run_dir, tmp_path / "t.txt", "--unknown", "skip")
    assert (result.code, result.err) == (0, "warning: skipped 3 characters outside the "
                                            "vocabulary\n")


def test_load_casts_the_weights_to_dtype_and_samples_close_to_float32(run_dir):
    import charlm
    from charlm.generation.decoding import CachedDecoder

    full = charlm.load(run_dir, "cpu")
    prompt = torch.tensor([[0, 1, 2, 3]])
    want = CachedDecoder(full.model, 1).prefill(prompt)
    for name, dtype in [("bfloat16", torch.bfloat16), ("float16", torch.float16)]:
        lm = charlm.load(run_dir, "cpu", dtype=name)
        assert {p.dtype for p in lm.model.parameters()} == {dtype}
        decoder = CachedDecoder(lm.model, 1)
        # on the CPU attention runs in float32, and the KV cache is kept in it
        assert decoder.cache.k[0].dtype == torch.float32
        got = decoder.prefill(prompt)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)
        text = charlm.generate(lm, "First", max_new_tokens=40, temperature=0.8, seed=3)
        assert len(text) == 40


def test_an_unknown_dtype_is_one_error_naming_the_choices(cli, run_dir):
    import charlm

    with pytest.raises(CharlmError) as e:
        charlm.load(run_dir, "cpu", dtype="float8")
    assert str(e.value) == "dtype must be one of float32, bfloat16, float16, got 'float8'"
    for command in ("sample", "eval"):
        args = [run_dir, "--dtype", "half"] + (["x.txt"] if command == "eval" else [])
        result = cli(command, *args)
        assert (result.code, result.out, result.err) == (
            2, "", "error: --dtype must be one of float32, bfloat16, float16, got 'half'\n")

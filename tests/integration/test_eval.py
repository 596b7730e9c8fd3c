"""`charlm eval` on a trained run: text it cannot read and options it refuses."""



def test_eval_and_prompt_file_reject_non_utf8(cli, tiny_run, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9".encode("latin-1"))
    result = cli("eval", tiny_run, bad)
    assert (result.code, result.err) == (
        2, f"error: {bad} is not valid UTF-8 text (invalid byte 0xe9 at byte offset 3); charlm "
           "reads text files as UTF-8, convert it first\n")
    prompt = cli("sample", tiny_run, "--prompt-file", bad)
    assert (prompt.code, prompt.err) == (result.code, result.err)
    missing = cli("eval", tiny_run, tmp_path / "nope.txt")
    assert (missing.code, missing.err) == (
        2, f"error: input file not found: {tmp_path / 'nope.txt'}\n")


def test_eval_rejects_an_unknown_policy(cli, tiny_run, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("First Citizen:\n", encoding="utf-8")
    result = cli("eval", tiny_run, text, "--unknown", "drop")
    assert (result.code, result.err, result.out) == (
        2, "error: --unknown must be 'error' or 'skip', got 'drop'\n", "")

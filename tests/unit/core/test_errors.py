"""charlm.core.errors: the one-line forms of a library's exception, and counts of characters and
values cut short in a message."""

import pytest

from charlm.core.errors import CharlmError, characters, first_line, one_line, printable, shown


def test_first_line_is_the_type_and_the_first_line_of_the_message():
    error = RuntimeError("\n  InvalidCxxCompiler: No working C++ compiler found\nmore detail\n")
    assert first_line(error) == "RuntimeError: InvalidCxxCompiler: No working C++ compiler found"
    assert first_line(ValueError()) == "ValueError: "
    assert first_line(CharlmError("x" * 1000)) == ("CharlmError: " + "x" * 1000)[:300]


def test_one_line_joins_every_line_of_the_message_and_cuts_it():
    error = RuntimeError('Error(s) in loading state_dict for GPT:\n\tMissing key(s) in '
                         'state_dict: "wte.weight".\n\tUnexpected key(s):  "x".  ')
    assert one_line(error) == ('Error(s) in loading state_dict for GPT: Missing key(s) in '
                               'state_dict: "wte.weight". Unexpected key(s): "x".')
    assert one_line("a\n\n b \r\n c") == "a b c"
    assert one_line("word " * 100) == ("word " * 60)[:300]
    assert one_line("word " * 100, limit=9) == "word word"


@pytest.mark.parametrize("n, text", [(0, "0 characters"), (1, "1 character"),
                                     (2, "2 characters"), (1_234_567, "1,234,567 characters")])
def test_characters_counts_in_words(n, text):
    assert characters(n) == text


def test_a_charlm_error_is_an_exception_its_message_whole():
    """The CLI catches CharlmError as an Exception and prints str(e) as the line after error:."""
    with pytest.raises(Exception) as e:  # noqa: B017 - the type the CLI catches
        raise CharlmError("input file not found: my.txt")
    assert isinstance(e.value, CharlmError) and str(e.value) == "input file not found: my.txt"


def test_printable_escapes_every_control_character_and_keeps_other_text():
    """C0 and C1 controls, DEL and the Unicode line separators, as Python writes them."""
    assert printable("a\tb\rc\x00d\x1b[2Je\x7ff\x85g\u2028h\u2029i é ✓ \\ ok") == (
        "a\\tb\\rc\\x00d\\x1b[2Je\\x7ff\\x85g\\u2028h\\u2029i é ✓ \\ ok")


def test_a_warning_is_one_line_with_its_control_characters_escaped(capsys):
    """Warnings were printed raw from fifteen places: a path with a newline split the line and
    an escape sequence reached the terminal. All go through `warn` now."""
    from charlm.core.errors import warn

    warn("the prepared dataset data/a\nb\x1b[2J has its own split")
    assert capsys.readouterr().err == (
        "warning: the prepared dataset data/a\\nb\\x1b[2J has its own split\n")


def test_shown_cuts_a_long_value_to_one_short_line():
    assert shown("abc") == "'abc'"
    assert shown("x" * 200) == "'" + "x" * 79 + "... (202 characters)"
    assert shown(list(range(3)), limit=5) == "[0, 1, 2]"[:5] + "... (9 characters)"

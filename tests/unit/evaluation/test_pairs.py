"""charlm.evaluation.pairs: edit distance, exact match and error rates over references."""

import dataclasses

import pytest

from charlm.core.errors import CharlmError
from charlm.evaluation.pairs import Accuracy, accuracy, edit_distance


def chars(text):
    return list(text)


def symbols(text):
    return text.split()


@pytest.mark.parametrize("a, b, distance", [
    ("", "", 0), ("abc", "", 3), ("", "ab", 2), ("kitten", "sitting", 3),
    ("flaw", "lawn", 2), ("abc", "abc", 0), ("ab", "ba", 2),
    (["K", "AH", "Z"], ["K", "AA", "Z", "IH"], 2),
])
def test_edit_distance(a, b, distance):
    assert edit_distance(a, b) == edit_distance(b, a) == distance


def test_multiple_references_with_space_units():
    """Hand-worked: 'cause matches its second reference (extra spaces do not count); 'bout is one
    substitution from its only reference; read is 1 from both references, so the shorter one
    (3 units) counts; the empty output for a word of 4 phonemes is 4 deletions."""
    result = accuracy(
        ["K  AH Z ", "B AW D", "R EH D", ""],
        [["K AA Z", "K AH Z"], ["B AW T"], ["R IY D", "R EH D IH"], ["W ER D Z"]],
        symbols)
    assert result == Accuracy(sources=4, exact_match=0.25, wer=0.75, cer=6 / 13, ref_units=13,
                              errors=6)
    # errors: 0 + 1 + 1 + 4; ref_units: 3 (the matched reference) + 3 + 3 + 4
    assert dataclasses.asdict(result) == {"sources": 4, "exact_match": 0.25, "wer": 0.75,
                                          "cer": 6 / 13, "ref_units": 13, "errors": 6}


def test_char_units():
    """Spaces are units too: 'new york' against 'newyork' is one insertion; 'colour' matches
    its second reference; 'teh' is two substitutions from 'the' and three edits from 'then'."""
    result = accuracy(["new york", "colour", "teh"],
                      [["newyork"], ["color", "colour"], ["then", "the"]], chars)
    assert (result.exact_match, result.errors, result.ref_units) == (1 / 3, 3, 7 + 6 + 3)
    assert result.cer == pytest.approx(3 / 16) and result.wer == pytest.approx(2 / 3)


def test_a_tie_takes_the_shorter_reference():
    # 'ab' is 1 edit from 'a' (1 unit) and from 'abc' (3 units): the shorter counts
    assert accuracy(["ab"], [["abc", "a"]], chars).ref_units == 1


def test_empty_input_is_an_error():
    with pytest.raises(CharlmError, match="no sources to measure accuracy on"):
        accuracy([], [], chars)
    with pytest.raises(ValueError, match="2 hypotheses for 1 sources"):
        accuracy(["a", "b"], [["a"]], chars)
    with pytest.raises(ValueError, match="no reference"):
        accuracy(["a"], [[]], chars)

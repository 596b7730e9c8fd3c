"""charlm.evaluation.scoring: loss and bits per character of a text over overlapping windows."""

import math

import pytest
import torch

from charlm.config.schema import ModelConfig
from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab
from charlm.evaluation.scoring import score_ids, score_text, windows
from charlm.model.gpt import GPT

V = 7
VOCAB = Vocab(list("abcdefg"))


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(block_size=8, n_layer=1, n_head=2, n_embd=16), V).eval()


@pytest.mark.parametrize("n, min_context", [(2, 4), (9, 4), (10, 4), (37, 4), (37, 0), (37, 7)])
def test_every_character_after_the_first_is_scored_once_with_enough_context(n, min_context):
    block = 8
    scored = []
    for start, offset in windows(n, block, min_context):
        end = min(start + block, n - 1)
        for target in range(start + 1 + offset, end + 1):
            context = target - start
            assert context >= min(min_context, target)  # the first window has what there is
            scored.append(target)
    assert scored == list(range(1, n))


def test_score_equals_one_forward_when_the_text_fits(model):
    ids = torch.randint(0, V, (9,))  # 8 inputs, 8 targets: one window
    logits, _ = model(ids[None, :-1])
    expected = -torch.log_softmax(logits[0], -1).gather(-1, ids[1:, None]).sum().item()
    total, count = score_ids(model, ids, min_context=4, progress=False)
    assert count == 8 and total == pytest.approx(expected, rel=1e-5)


def test_long_text_matches_a_per_window_reference(model):
    ids = torch.randint(0, V, (50,))
    total, count = score_ids(model, ids, min_context=4, batch_size=3, progress=False)
    ref = 0.0
    for start, offset in windows(50, 8, 4):
        x = ids[start:start + 9]
        logp = torch.log_softmax(model(x[None, :-1])[0][0], -1)
        ref -= logp.gather(-1, x[1:, None])[offset:].sum().item()
    assert count == 49 and total == pytest.approx(ref, rel=1e-5)


def test_score_text_units_and_unknown_policies(model):
    text = "abcabcgfedcba" * 5
    s = score_text(model, VOCAB, text, progress=False)
    assert s.chars_scored == len(text) - 1
    assert s.bpc == pytest.approx(s.loss / math.log(2))
    assert s.perplexity == pytest.approx(math.exp(s.loss))
    with pytest.raises(CharlmError) as e:
        score_text(model, VOCAB, "abXcY" + text, progress=False)
    assert str(e.value) == ("the text has 2 characters outside the model's vocabulary ('X' at 2,"
                            " 'Y' at 4); pass --unknown skip to drop them")
    skipped = score_text(model, VOCAB, "abXcY" + text, unknown="skip", progress=False)
    assert skipped.skipped_unknown == 2
    assert skipped.notes() == ["skipped 2 characters outside the vocabulary"]
    with pytest.raises(CharlmError) as e:  # one character: not "1 characters"
        score_text(model, VOCAB, "abX" + text, progress=False)
    assert str(e.value) == ("the text has 1 character outside the model's vocabulary ('X' at 2);"
                            " pass --unknown skip to drop them")
    assert score_text(model, VOCAB, "abX" + text, unknown="skip", progress=False).notes() == [
        "skipped 1 character outside the vocabulary"]
    assert skipped.loss == score_text(model, VOCAB, "abc" + text, progress=False).loss
    with pytest.raises(CharlmError, match="--stride must be in"):
        score_text(model, VOCAB, text, min_context=8, progress=False)


def test_score_text_rejects_an_unknown_policy_it_does_not_have(model):
    # "drop" is neither policy: an error even for a text without unknown characters, not a
    # silent skip
    for text in ("abcabc", "abXcabc"):
        with pytest.raises(CharlmError) as e:
            score_text(model, VOCAB, text, unknown="drop", progress=False)
        assert str(e.value) == "--unknown must be 'error' or 'skip', got 'drop'"


def test_a_diverged_model_scores_without_a_traceback_and_as_strict_json(model):
    with torch.no_grad():
        model.wte.weight.mul_(1e4)  # tied head: the logits are huge, the loss is past exp's range
    huge = score_text(model, VOCAB, "abcdefgabc", progress=False)
    assert huge.loss > 1000 and huge.perplexity == math.inf
    assert huge.as_dict()["perplexity"] is None and huge.as_dict()["loss"] == huge.loss



def test_a_model_whose_outputs_are_not_finite_is_refused_as_sample_refuses_it(model):
    """Weights that load (finite floats) but overflow gave `loss nan` and exit 0 (issue 40,
    item 6); the loaders refuse NaN weights themselves, this is the model it lets through."""
    with torch.no_grad():
        model.wte.weight.mul_(3e37)  # finite, but the tied head's logits reach inf
    assert torch.isfinite(model.wte.weight).all()
    with pytest.raises(CharlmError) as e:
        score_text(model, VOCAB, "abcdefgabc", progress=False)
    assert str(e.value) == (
        "the model's next-character probabilities are not finite (NaN or inf): its weights "
        "have diverged; score an earlier checkpoint, or train again with a lower optim.lr")

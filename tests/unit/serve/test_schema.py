"""The request bodies of `charlm serve` (charlm.serve.schema): the chat template, the
completions a request asks for, and pydantic's complaints as OpenAI's error body."""

import pytest

pytest.importorskip("pydantic")

from pydantic import ValidationError  # noqa: E402

from charlm.serve.schema import (  # noqa: E402
    ApiError,
    ChatRequest,
    CompletionRequest,
    Limits,
    jobs_for,
    validation_error,
)


def test_the_chat_template_ends_where_the_reply_starts():
    body = ChatRequest(messages=[{"role": "system", "content": "Terse."},
                                 {"role": "user", "content": "Hi"}])
    assert body.prompt() == "System: Terse.\nUser: Hi\nAssistant: "


def test_n_completions_get_consecutive_seeds_that_wrap_past_torchs_largest():
    body = CompletionRequest(prompt=["a", "b"], n=2, seed=2**64 - 1, max_tokens=3)
    jobs = jobs_for(["a", "b"], body, Limits(), 16, None, (), "prompt")
    assert [(prompt, p.seed, p.max_tokens) for prompt, p in jobs] == [
        ("a", 2**64 - 1, 3), ("a", 0, 3), ("b", 2**64 - 1, 3), ("b", 0, 3)]
    unseeded = jobs_for(["a"], CompletionRequest(prompt="a", n=2), Limits(), 16, None, (), "p")
    assert [p.seed for _, p in unseeded] == [None, None]


def test_an_unknown_field_in_a_message_names_its_place_and_the_nearest_field():
    with pytest.raises(ValidationError) as e:
        ChatRequest(messages=[{"role": "user", "contnt": "x"}])
    error = validation_error(e.value)
    assert isinstance(error, ApiError) and error.status == 400
    assert error.body["error"]["param"] == "messages.0.contnt"
    message = "unknown field 'messages.0.contnt', did you mean 'content'?"
    assert error.body["error"]["message"] == message


@pytest.mark.parametrize("model, field, message", [
    (ChatRequest, "prompt", "unknown field 'prompt': it is a field of /v1/completions, not of "
                            "this endpoint"),
    (CompletionRequest, "messages", "unknown field 'messages': it is a field of "
                                    "/v1/chat/completions, not of this endpoint"),
    (ChatRequest, "promt", "unknown field 'promt', did you mean 'prompt'?"),
])
def test_a_field_of_the_other_endpoint_is_named_as_such(model, field, message):
    """Chat's answer to a `prompt` was "unknown field 'prompt', did you mean 'prompt'?"."""
    body = {"prompt": "a"} if model is CompletionRequest else {
        "messages": [{"role": "user", "content": "a"}]}
    with pytest.raises(ValidationError) as e:
        model(**body, **{field: "a"})
    error = validation_error(e.value).body["error"]
    assert (error["message"], error["param"]) == (message, field)

"""The HTTP app of `charlm serve` (charlm.serve.app) in this process, over FastAPI's test client,
around a fake engine that keeps the engine's interface: request bodies, limits, OpenAI's error
bodies, the API key, CORS, streaming, n, echo, stop, logprobs, 429, /health, /metrics, a client
that goes away and shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("fastapi")  # the serve extra

from fastapi.testclient import TestClient  # noqa: E402

from charlm.core.errors import CharlmError  # noqa: E402
from charlm.serve import app as app_module  # noqa: E402
from charlm.serve.app import Settings, create_app, shutdown  # noqa: E402
from charlm.serve.engine import Engine, Event, FieldError, Params, Stats  # noqa: E402
from charlm.serve.schema import Limits  # noqa: E402
from tests.helpers import random_served  # noqa: E402

LETTERS = "abcdefghijklmnopqrstuvwxyz"
UNKNOWN = "the prompt has '~', which is not in the model's vocabulary; remove it"
FAILS, FAILURE = "<fail>", "RuntimeError: out of memory"  # the fake engine fails a prompt with it


def fake_completion(prompt: str, params: Params) -> tuple[str, str]:
    """What the fake engine generates: letters from a point set by the prompt and the seed,
    cut before the first stop string."""
    start = len(prompt) + (params.seed or 0)
    text = "".join(LETTERS[(start + k) % 26] for k in range(params.max_tokens))
    cuts = [text.index(s) for s in params.stop if s in text]
    return (text[:min(cuts)], "stop") if cuts else (text, "length")


class FakeRequest:
    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


class FakeEngine:
    """The engine's interface without a model: each completion on a thread of its own, one
    character per event (the last one carries finish_reason "length"; a stop ends with an empty
    event). Clear `gate` to hold every completion before its first character."""

    max_logprobs = 5  # a char model's

    def __init__(self, slots: int = 4, delay: float = 0.0):
        self.slots, self.delay = slots, delay
        self.gate, self.closing = threading.Event(), threading.Event()
        self.gate.set()
        self.submitted: list[tuple[str, Params]] = []
        self.requests: list[FakeRequest] = []
        self.active = self.characters = 0
        self.lock = threading.Lock()

    def submit(self, prompt: str, params: Params, on_event) -> FakeRequest:
        if "~" in prompt:
            raise CharlmError(UNKNOWN)
        request = FakeRequest()
        with self.lock:
            self.submitted.append((prompt, params))
            self.requests.append(request)
            self.active += 1
        threading.Thread(target=self.run, args=(prompt, params, on_event, request),
                         daemon=True).start()
        return request

    def run(self, prompt: str, params: Params, on_event, request: FakeRequest) -> None:
        if FAILS in prompt:  # a character, then the engine's error (its log has said why)
            on_event(Event("a"))
            self.finish(on_event, Event("", finish_reason="error", error=FAILURE))
            return
        text, reason = fake_completion(prompt, params)
        ended = self.held(request)
        for i, ch in enumerate(text):
            if ended := ended or self.ended(request):
                break
            top = None if params.logprobs is None else {
                LETTERS[j]: -1.0 - j for j in range(params.logprobs)}
            last = i == len(text) - 1 and reason == "length"
            with self.lock:
                self.characters += 1
            event = Event(ch, None if top is None else -0.25, top, reason if last else None)
            if last:
                self.finish(on_event, event)
            else:
                on_event(event)
            time.sleep(self.delay)
        if ended or reason == "stop" or not text:
            self.finish(on_event, Event("", finish_reason=ended or reason))

    def finish(self, on_event, event: Event) -> None:
        """Free the slot, then send the last event: as the real engine does, so that a client
        that has read its end finds the counts final."""
        with self.lock:
            self.active -= 1
        on_event(event)

    def held(self, request: FakeRequest) -> str | None:
        while not self.gate.wait(0.005):
            if ended := self.ended(request):
                return ended
        return None

    def ended(self, request: FakeRequest) -> str | None:
        if request.cancelled.is_set():
            return "cancelled"
        return "shutdown" if self.closing.is_set() else None

    def stats(self) -> Stats:
        with self.lock:
            return Stats(slots=self.slots, busy=min(self.active, self.slots),
                         queued=max(self.active - self.slots, 0),
                         batch_size=min(self.active, self.slots), characters=self.characters)

    def close(self, grace_s: float = 5.0) -> None:
        self.closing.set()


def make(limits: Limits = Limits(), **settings) -> tuple[TestClient, FakeEngine]:
    engine = FakeEngine(delay=settings.pop("delay", 0.0))
    return TestClient(create_app(engine, Settings("tiny", limits, **settings))), engine


def post(client: TestClient, body: dict, path: str = "/v1/completions", **kw):
    return client.post(path, json=body, **kw)


def events_of(response) -> list:
    """The server-sent events of a stream: each `data:` payload, JSON but for [DONE]."""
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = response.text.split("\n\n")
    assert blocks[-1] == ""
    payloads = [b.removeprefix("data: ") for b in blocks[:-1]]
    assert all(b.startswith("data: ") for b in blocks[:-1])
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def test_a_completion_in_openais_shape_counts_characters():
    client, engine = make()
    r = post(client, {"model": "anything", "prompt": "ab", "max_tokens": 5, "seed": 1,
                      "temperature": 0.5, "top_k": 3, "top_p": 0.9, "min_p": 0.1,
                      "repetition_penalty": 1.2, "user": "u1"})
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("cmpl-") and isinstance(body["created"], int)
    assert {k: body[k] for k in ("object", "model", "choices", "usage")} == {
        "object": "text_completion", "model": "tiny",
        "choices": [{"index": 0, "text": "defgh", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}}
    assert engine.submitted == [("ab", Params(max_tokens=5, temperature=0.5, top_k=3, top_p=0.9,
                                              min_p=0.1, repetition_penalty=1.2, seed=1))]


def test_defaults_are_openais_and_vllms_top_k_off():
    client, engine = make()
    assert post(client, {"prompt": "a", "top_k": -1}).status_code == 200
    assert post(client, {"prompt": "a", "top_k": 0}).status_code == 200
    assert [p for _, p in engine.submitted] == [Params(max_tokens=16)] * 2


def test_prompts_times_n_choices_with_consecutive_seeds():
    client, engine = make()
    body = post(client, {"prompt": ["a", "bb"], "n": 2, "max_tokens": 3, "seed": 3}).json()
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "efg"), (1, "fgh"), (2, "fgh"), (3, "ghi")]
    assert [(prompt, p.seed) for prompt, p in engine.submitted] == [
        ("a", 3), ("a", 4), ("bb", 3), ("bb", 4)]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}


def test_echo_stop_and_logprobs():
    client, engine = make()
    body = post(client, {"prompt": "xy", "max_tokens": 6, "stop": "f", "echo": True}).json()
    assert body["choices"][0] | {"index": 0} == {
        "index": 0, "text": "xycde", "logprobs": None, "finish_reason": "stop"}
    assert engine.submitted[-1][1].stop == ("f",)
    assert body["usage"]["completion_tokens"] == 3  # the echoed prompt is not generated
    body = post(client, {"prompt": "xy", "max_tokens": 3, "logprobs": 2}).json()
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["c", "d", "e"], "token_logprobs": [-0.25] * 3,
        "top_logprobs": [{"a": -1.0, "b": -2.0}] * 3, "text_offset": [0, 1, 2]}
    assert engine.submitted[-1][1].logprobs == 2


def test_a_stream_is_server_sent_events_ending_in_done():
    client, _ = make()
    request = {"prompt": "ab", "max_tokens": 4, "seed": 1, "n": 2, "echo": True}
    whole = post(client, request).json()
    events = events_of(post(client, request | {"stream": True,
                                               "stream_options": {"include_usage": True}}))
    assert events[-1] == "[DONE]"
    *chunks, last = events[:-1]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in events[:-1]}) == 1
    assert all(len(c["choices"]) == 1 for c in chunks)
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == choice["index"]]
        assert "".join(m["text"] for m in mine) == choice["text"]
        assert [m["finish_reason"] for m in mine] == [None] * (len(mine) - 1) + ["length"]
    assert (last["choices"], last["usage"]) == ([], whole["usage"])


def test_chat_renders_the_role_template_and_stops_at_the_next_turn():
    client, engine = make()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And?"}]
    body = post(client, {"messages": messages, "max_tokens": 4, "stop": ["Q"]},
                "/v1/chat/completions").json()
    prompt = "System: Be brief.\nUser: Hi\nAssistant: Hello.\nUser: And?\nAssistant: "
    assert engine.submitted[-1][0] == prompt
    assert engine.submitted[-1][1].stop == ("Q", "\nSystem:", "\nUser:", "\nAssistant:")
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    text = fake_completion(prompt, Params(max_tokens=4))[0]
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": "length"}]
    assert body["usage"]["prompt_tokens"] == len(prompt)
    events = events_of(post(client, {"messages": messages, "max_completion_tokens": 2,
                                     "stream": True, "logprobs": True, "top_logprobs": 1},
                            "/v1/chat/completions"))
    deltas = [e["choices"][0] for e in events[:-1]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(d["delta"].get("content", "") for d in deltas) == text[:2]
    assert deltas[1]["logprobs"] == {"content": [{
        "token": text[0], "logprob": -0.25, "bytes": [ord(text[0])],
        "top_logprobs": [{"token": "a", "logprob": -1.0, "bytes": [97]}]}]}


@pytest.mark.parametrize("body, status, param, message", [
    ({"prompt": "a", "temperature": -1}, 400, "temperature",
     "temperature: Input should be greater than or equal to 0"),
    ({"prompt": "a", "temperature": 1e46}, 400, "temperature",
     "temperature: Input should be less than or equal to 100"),
    ({"prompt": "a", "max_token": 5}, 400, "max_token",
     "unknown field 'max_token', did you mean 'max_tokens'?"),
    ({"prompt": [1, 2]}, 400, "prompt.str", None),
    ({"prompt": []}, 400, "prompt", "prompt: Value error, give at least one prompt"),
    ({"prompt": "a", "logprobs": 6}, 400, "logprobs",
     "logprobs: Input should be less than or equal to 5"),
    ({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop",
     "stop: Value error, at most 4 stop strings, got 5"),
    ({"prompt": "a", "stop": ""}, 400, "stop",
     "stop: Value error, a stop string must not be empty"),
    ({"prompt": "a", "stop": ["a", "x" * 250_000]}, 400, "stop",
     "stop: Value error, a stop string may have at most 1,000 characters, got 250,000"),
    ({"prompt": "a", "max_tokens": 101}, 400, "max_tokens",
     "max_tokens is 101, more than this server's 100 (its --max-tokens)"),
    ({"prompt": ["a", "b"], "n": 2}, 400, "n",
     "2 prompt(s) x n=2 completions, more than this server's 3 per request (its --max-n)"),
    ({"prompt": "a" * 11}, 400, "prompt",
     "the prompt has 11 characters, more than this server's 10 (its --max-prompt)"),
    ({"prompt": "a~"}, 400, "prompt", UNKNOWN),
    ({"prompt": "a", "echo": True, "logprobs": 1}, 400, "logprobs", None),
    ([1], 400, None, None),
])
def test_bad_requests_get_openais_error_body(body, status, param, message):
    client, engine = make(Limits(prompt=10, max_tokens=100, n=3))
    r = post(client, body)
    assert r.status_code == status
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, None)
    assert message is None or error["message"] == message
    assert "Traceback" not in r.text and engine.submitted == []


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": FAILS}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": FAILS}]})])
def test_a_completion_the_engine_fails_is_a_500_error_body_not_a_200(path, body):
    """A failed completion was HTTP 200 with finish_reason "error" and no message."""
    client, engine = make()
    error = {"error": {"message": f"the completion failed: {FAILURE}", "type": "server_error",
                       "param": None, "code": "generation_failed"}}
    r = post(client, {**body, "max_tokens": 5}, path)
    assert (r.status_code, r.json()) == (500, error)
    streamed = post(client, {**body, "max_tokens": 5, "stream": True}, path)
    assert streamed.status_code == 200  # sent before the failure: the stream says it
    assert events_of(streamed)[-2:] == [error, "[DONE]"]
    assert engine.active == 0


NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "temperature": None,
           "n": None, "stream": None}


@pytest.mark.parametrize("path, body, extra", [
    ("/v1/completions", {"prompt": "ab"}, {"best_of": 1, "suffix": None, "echo": None,
                                           "logit_bias": None, "logprobs": None}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab"}]},
     {"logprobs": None, "frequency_penalty": None})])
def test_openais_neutral_fields_are_taken_and_change_nothing(path, body, extra):
    """LangChain's legacy `OpenAI` sends frequency_penalty 0, presence_penalty 0, best_of 1 and
    logit_bias {}; other clients send null for a default: each was a 400."""
    client, engine = make()
    plain = post(client, {**body, "max_tokens": 5, "seed": 3}, path)
    neutral = post(client, {**body, "max_tokens": 5, "seed": 3, **NEUTRAL, **extra}, path)
    assert (plain.status_code, neutral.status_code) == (200, 200), neutral.json()
    assert neutral.json()["choices"] == plain.json()["choices"]
    assert engine.submitted[0] == engine.submitted[1]


@pytest.mark.parametrize("field, value, message", [
    ("frequency_penalty", 0.5, "only 0 is served (charlm has no such penalty); use "
     "repetition_penalty, or leave it out"),
    ("presence_penalty", -1, "only 0 is served (charlm has no such penalty); use "
     "repetition_penalty, or leave it out"),
    ("logit_bias", {"50256": -100}, "only {} is served (the ids are the model's characters, "
     "not OpenAI's tokens); leave it out"),
    ("best_of", 2, "only 1 is served (each completion is returned); ask for n completions "
     "instead"),
    ("suffix", "end", "only null is served (a GPT continues a prompt; it does not fill in "
     "before a suffix); leave it out"),
])
def test_openais_fields_that_would_change_the_output_are_refused(field, value, message):
    client, engine = make()
    r = post(client, {"prompt": "ab", field: value})
    assert (r.status_code, r.json()["error"]["param"]) == (400, field)
    assert r.json()["error"]["message"] == f"{field}: Value error, {message}"
    assert engine.submitted == []


def test_bad_json_unknown_paths_and_methods_get_openais_error_body():
    client, _ = make()
    r = client.post("/v1/completions", content=b'{"prompt": ', headers={
        "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "the body is not valid JSON")
    assert client.get("/v1/nothing").json() == {"error": {
        "message": "Not Found: GET /v1/nothing", "type": "invalid_request_error",
        "param": None, "code": None}}
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["message"].startswith("Method Not Allowed")
    r = post(client, {"messages": [{"role": "robot", "content": "x"}]}, "/v1/chat/completions")
    assert (r.status_code, r.json()["error"]["param"]) == (400, "messages.0.role")
    r = post(client, {"messages": [], "top_logprobs": 1}, "/v1/chat/completions")
    assert (r.status_code, r.json()["error"]["param"]) == (400, "messages")


def test_a_body_over_the_cap_is_refused_with_or_without_its_length():
    client, engine = make(Limits(body=100))
    big = json.dumps({"prompt": "a" * 200}).encode()
    for content in (big, iter([big[:60], big[60:]])):  # the second is sent chunked
        r = client.post("/v1/completions", content=content,
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert r.json()["error"]["message"] == (
            "the request body is larger than this server's 100 bytes (its --max-body)")
    assert engine.submitted == []
    assert post(client, {"prompt": "a", "max_tokens": 1}).status_code == 200


def test_an_api_key_guards_everything_but_health_and_the_page():
    client, _ = make(api_key="s3cret")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        for path in ("/v1/models", "/metrics", "/v1/completions"):
            r = client.post(path, headers=headers) if path.endswith("s") and "compl" in path \
                else client.get(path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/health").status_code == 200
    assert client.get("/").status_code != 401
    ok = {"Authorization": "Bearer s3cret"}
    assert client.get("/v1/models", headers=ok).json()["data"][0]["id"] == "tiny"
    assert post(client, {"prompt": "a", "max_tokens": 1}, headers=ok).status_code == 200


def test_cors_only_for_the_origins_given():
    client, _ = make()
    r = client.get("/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    client, _ = make(cors_origins=("http://app.example",), api_key="k")
    r = client.options("/v1/completions", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    r = client.get("/v1/models", headers={"Origin": "http://evil.example",
                                          "Authorization": "Bearer k"})
    assert "access-control-allow-origin" not in r.headers


STAINLESS = ("authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,"
             "x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime,"
             "x-stainless-runtime-version,x-stainless-timeout")  # the OpenAI JS SDK's headers


def test_cors_lets_a_listed_origin_send_any_header_and_refuses_in_json():
    """The OpenAI JS SDK's preflight (x-stainless-* headers) from a listed origin is allowed,
    and its POST answered; a preflight from another origin, or for another method, is refused
    in OpenAI's error body."""
    client, _ = make(cors_origins=("http://app.example",), api_key="k")
    r = client.options("/v1/completions", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": STAINLESS})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    assert r.headers["access-control-allow-headers"] == STAINLESS
    r = post(client, {"prompt": "ab", "max_tokens": 2}, headers={
        "Origin": "http://app.example", "Authorization": "Bearer k",
        "x-stainless-lang": "js", "x-stainless-retry-count": "0"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "cd"
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    assert "retry-after" in r.headers["access-control-expose-headers"].lower()
    for origin, method, what in (("http://evil.example", "POST", "origin"),
                                 ("http://app.example", "DELETE", "method")):
        r = client.options("/v1/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": STAINLESS})
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        assert r.json() == {"error": {
            "message": f"CORS preflight refused: its {what} is not allowed (this server "
                       "answers the origins of its --cors-origin, with GET and POST)",
            "type": "invalid_request_error", "param": None, "code": "cors_refused"}}
        # a listed origin may read why (the browser shows it a JSON body, not "Failed")
        assert ("access-control-allow-origin" in r.headers) == (what != "origin")


def test_past_the_concurrency_cap_429_with_retry_after():
    client, engine = make(Limits(concurrent=3))
    engine.gate.clear()
    done = []
    held = threading.Thread(target=lambda: done.append(post(client, {"prompt": "a", "n": 2})))
    held.start()
    deadline = time.monotonic() + 30  # a held request that failed must not hang the suite
    while len(engine.submitted) < 2:
        assert time.monotonic() < deadline, (engine.submitted, [r.text for r in done])
        time.sleep(0.005)
    r = post(client, {"prompt": "a", "n": 2})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"] == {
        "message": "the server is busy: 2 completions in flight, at most 3; retry in a second",
        "type": "rate_limit_error", "param": None, "code": "too_many_requests"}
    assert client.get("/health").json()["slots"] == {"total": 4, "busy": 2, "free": 2}
    engine.gate.set()
    held.join(5)
    assert post(client, {"prompt": "a", "n": 3, "max_tokens": 1}).status_code == 200
    assert len(engine.submitted) == 5


@pytest.mark.parametrize("kind, offered", [("char", 5), ("byte", 0), ("encoder_decoder", None)])
def test_models_says_which_logprobs_the_model_offers(kind, offered):
    """GET /v1/models gives each model's `max_logprobs` (what the page reads before it asks):
    a completion asking for that many (none, for None) is answered, one more is refused."""
    model, vocab = random_served(kind)
    engine = Engine(model, vocab, slots=2)
    engine.start()
    try:
        client = TestClient(create_app(engine, Settings("tiny")))
        [card] = client.get("/v1/models").json()["data"]
        assert (card["id"], card["max_logprobs"]) == ("tiny", offered)
        body = {"prompt": "ab", "max_tokens": 3, "temperature": 0}
        if offered is not None:
            body["logprobs"] = offered
        r = post(client, body)
        assert r.status_code == 200, r.text
        [choice] = r.json()["choices"]
        assert choice["text"] and (choice["logprobs"] is None) == (offered is None)
        if offered is not None:
            assert "".join(choice["logprobs"]["tokens"]) == choice["text"]
        r = post(client, {**body, "logprobs": 0 if offered is None else offered + 1})
        assert r.status_code == 400 and r.json()["error"]["param"] in ("logprobs", "prompt")
    finally:
        engine.close()


def test_health_models_and_metrics():
    client, engine = make()
    assert client.get("/health").json() == {
        "status": "ok", "ready": True, "queued": 0, "slots": {"total": 4, "busy": 0, "free": 4}}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    post(client, {"prompt": "a", "max_tokens": 5, "n": 2})
    post(client, {"prompt": "a", "temperature": "hot"})
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = set(r.text.splitlines())
    for line in ['charlm_requests_total{endpoint="/v1/completions",status="200"} 1.0',
                 'charlm_requests_total{endpoint="/v1/completions",status="400"} 1.0',
                 'charlm_requests_total{endpoint="/health",status="200"} 1.0',
                 "charlm_characters_generated_total 10.0", "charlm_queue_depth 0.0",
                 "charlm_slots 4.0", "charlm_slots_busy 0.0", "charlm_batch_size 0.0",
                 "charlm_time_to_first_character_seconds_count 2.0",
                 "charlm_character_latency_seconds_count 8.0"]:
        assert line in lines, line


def test_the_page_is_served_when_installed(tmp_path, monkeypatch):
    (tmp_path / "page.html").write_text("<p>playground</p>", encoding="utf-8")
    monkeypatch.setattr(app_module.resources, "files", lambda package: tmp_path)
    client, _ = make()
    r = client.get("/")
    assert (r.status_code, r.text, r.headers["content-type"]) == (
        200, "<p>playground</p>", "text/html; charset=utf-8")
    (tmp_path / "page.html").unlink()
    client, _ = make()
    assert client.get("/").status_code == 404


async def leave_early(app, stream: bool) -> None:
    """POST a long completion to `app` as uvicorn would (ASGI 2.4: a response learns of a
    disconnect only from `receive`), and go away after its first chunk (streamed) or 50 ms."""
    body = json.dumps({"prompt": "a", "max_tokens": 1000, "stream": stream, "n": 2}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    first_chunk = asyncio.Event()

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await (first_chunk.wait() if stream else asyncio.sleep(0.05))
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            first_chunk.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
             "headers": [(b"content-type", b"application/json")],
             "asgi": {"version": "3.0", "spec_version": "2.4"}}
    await asyncio.wait_for(app(scope, receive, send), 5)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_its_completions(stream):
    """A client that leaves frees its slots at once, long before its completions would end."""
    engine = FakeEngine(delay=0.01)
    app = create_app(engine, Settings("tiny"))
    start = time.monotonic()
    asyncio.run(leave_early(app, stream))
    assert time.monotonic() - start < 2
    assert [r.cancelled.is_set() for r in engine.requests] == [True, True]
    assert engine.characters < 100 and app.state.in_flight == 0


def test_shutdown_ends_streams_and_refuses_new_requests():
    client, engine = make()
    engine.gate.clear()
    got = {}
    held = threading.Thread(target=lambda: got.update(r=post(
        client, {"prompt": "a", "max_tokens": 50, "stream": True})))
    held.start()
    while not engine.submitted:
        time.sleep(0.005)
    shutdown(client.app, 1.0)
    held.join(5)
    events = events_of(got["r"])
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "shutdown"
    r = post(client, {"prompt": "a"})
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    assert client.get("/health").json()["ready"] is False



def test_a_body_sent_without_a_json_content_type_is_named_so():
    """curl -d without -H 'Content-Type: application/json' was told "the body must be a JSON
    object: Input should be a valid dictionary", about a JSON object."""
    client, _ = make()
    r = client.post("/v1/completions", content=b'{"prompt": "a"}')
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "the body was not read as JSON: send it with the header Content-Type: "
             "application/json")
    assert post(client, {"prompt": "a", "max_tokens": 1}).status_code == 200


def test_an_engine_refusal_of_a_field_names_that_field_not_the_prompt(monkeypatch):
    """A byte model's or an encoder-decoder's refusal of logprobs came with param "prompt"."""
    client, engine = make()

    def refuse(prompt, params, on_event):
        raise FieldError("logprobs are not available for an encoder-decoder model; leave "
                         "logprobs out", "logprobs")

    monkeypatch.setattr(engine, "submit", refuse)
    for path, body in (("/v1/completions", {"prompt": "a", "logprobs": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                 "logprobs": True})):
        error = post(client, body, path).json()["error"]
        assert (error["param"], error["message"]) == ("logprobs", (
            "logprobs are not available for an encoder-decoder model; leave logprobs out"))

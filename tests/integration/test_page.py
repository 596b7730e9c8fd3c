"""The playground page (charlm/serve/page.html) in a real headless Chromium through selenium:
a prompt typed, Generate, the text streaming in with each character shaded by its probability
and its top-5 alternatives on hover, Stop ending the stream, a screenshot kept as an artifact.

Chromium and chromedriver are CHARLM_TEST_CHROMIUM / CHARLM_TEST_CHROMEDRIVER (.ci/run's
scripts/chromium.sh installs Debian's and sets them) or found on the PATH; without them the
tests skip. The page is served by a stand-in for `charlm serve` defined here: it serves the page
at / and streams a fixed text with fixed logprobs in OpenAI's completion shape, slowly enough to
press Stop. `page_server` yields its base URL; pointing it at a real `charlm serve RUN --api-key
KEY` runs the same checks (only the `stand_in` assertions about what it received are its own)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, random_served

pytest.importorskip("selenium")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.xdist_group("page")  # one Chromium for the module, on one worker

PAGE = ROOT / "charlm" / "serve" / "page.html"
KEY = "sk-page-test"
PROMPT = "<i>ROMEO</i>:"  # markup that the page must show as text
TEXT = " O, she doth teach the <b>torches</b> to burn bright & fair!\nIt seems she hangs upon"
STEP_S = 0.02  # between two streamed characters
LONG = 1_000_000  # characters of a completion that only Stop ends
SHADE_ALPHA = 0.62  # page.html's .ch background: the shade at alpha (1 - p) * 0.62
# Chromium without a display, a GPU, a sandbox (root in a container) or a network.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--window-size=1100,1000"]


# --- the stand-in server ----------------------------------------------------------------------


def top5(i: int) -> dict[str, float]:
    """The top 5 at the i-th generated character: TEXT's character is the likeliest (greedy
    picks it), at a probability that cycles through four levels; four others share the rest."""
    chosen = TEXT[i % len(TEXT)]
    p = (0.96, 0.7, 0.45, 0.28)[i % 4]
    others = [c for c in "etaoinshr" if c != chosen][i % 4:i % 4 + 4]
    return {chosen: math.log(p), **{c: math.log((1 - p) / 5) for c in others}}


def logprobs(prompt: str, n: int) -> dict:
    """OpenAI's legacy completions logprobs for the first n characters."""
    tops = [top5(i) for i in range(n)]
    return {"tokens": [TEXT[i % len(TEXT)] for i in range(n)],
            "token_logprobs": [t[TEXT[i % len(TEXT)]] for i, t in enumerate(tops)],
            "top_logprobs": tops, "text_offset": [len(prompt) + i for i in range(n)]}


def error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                   "param": None, "code": code}}, status_code=status)


class StandIn:
    """What the page needs of `charlm serve`: the page at /, /v1/models, and POST
    /v1/completions behind an API key, which accepts only the fields the page sends. It keeps
    the streaming requests it got and how each stream ended ("length" or "cancelled")."""

    FIELDS = {"prompt", "max_tokens", "temperature", "top_p", "top_k", "stream", "logprobs"}

    def __init__(self) -> None:
        self.streamed: list[dict] = []
        self.ends: list[str] = []
        self.app = FastAPI()
        self.app.get("/")(self.page)
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/completions")(self.completions)

    async def page(self) -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    async def models(self, request: Request):
        return self.refused(request) or {"object": "list",
                                         "data": [{"id": "stand-in", "object": "model"}]}

    def refused(self, request: Request) -> JSONResponse | None:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return error(401, "Incorrect API key provided", "invalid_api_key")
        return None

    async def completions(self, request: Request):
        body = await request.json()
        if refusal := self.refused(request):
            return refusal
        if not set(body) <= self.FIELDS or body.get("logprobs") != 5 or not isinstance(
                body.get("max_tokens"), int) or not isinstance(body.get("prompt"), str):
            return error(400, f"unexpected request {body}", "bad_request")
        prompt, n = body["prompt"], body["max_tokens"]
        if not body.get("stream"):
            return {"object": "text_completion", "model": "stand-in",
                    "choices": [{"index": 0, "text": "".join(logprobs(prompt, n)["tokens"]),
                                 "logprobs": logprobs(prompt, n), "finish_reason": "length"}]}
        self.streamed.append(body)
        return StreamingResponse(self.stream(prompt, n), media_type="text/event-stream")

    async def stream(self, prompt: str, n: int):
        end = "cancelled"  # unless it gets to the end: the page went away (Stop)
        try:
            for i in range(n):
                one = logprobs(prompt, i + 1)
                piece = {key: values[i:] for key, values in one.items()}
                yield chunk(piece["tokens"][0], piece, None)
                await asyncio.sleep(STEP_S)
            yield chunk("", None, "length")
            yield "data: [DONE]\n\n"
            end = "length"
        finally:
            self.ends.append(end)


def chunk(text: str, logprobs: dict | None, finish_reason: str | None) -> str:
    """One server-sent event with one streamed completion chunk."""
    body = {"id": "cmpl-stand-in", "object": "text_completion", "created": 0,
            "model": "stand-in", "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                                              "finish_reason": finish_reason}]}
    return f"data: {json.dumps(body)}\n\n"


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` under uvicorn on a free loopback port, in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the stand-in server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def stand_in() -> StandIn:
    return StandIn()


@pytest.fixture(scope="module")
def page_server(stand_in: StandIn) -> Iterator[str]:
    """The base URL of a server with the page at / and POST /v1/completions behind KEY."""
    with serving(stand_in.app) as url:
        yield url


# --- the browser -------------------------------------------------------------------------------


def executable(env: str, name: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"no {name}: install Debian's chromium and chromium-driver or set {env} "
                    "(.ci/run does it with scripts/chromium.sh)")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    chromium = executable("CHARLM_TEST_CHROMIUM", "chromium")
    driver_path = executable("CHARLM_TEST_CHROMEDRIVER", "chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="charlm-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(options=options,
                                  service=webdriver.ChromeService(executable_path=driver_path))
        try:
            yield driver
        finally:
            driver.quit()


def open_page(browser: webdriver.Chrome, url: str) -> WebDriverWait:
    """The page afresh (no API key stored); a wait for its conditions."""
    browser.get(url)
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    return WebDriverWait(browser, 10, poll_frequency=0.02)


def fill(browser: webdriver.Chrome, **fields: str) -> None:
    """Type into the page's fields (the API key's is under the closed "API key" details)."""
    for name, value in fields.items():
        if name == "api_key" and not settings_open(browser):
            browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
        box = browser.find_element(By.ID, name.replace("_", "-"))
        box.clear()
        box.send_keys(value)


def settings_open(browser: webdriver.Chrome) -> bool:
    return browser.find_element(By.ID, "settings").get_attribute("open") is not None


def state(browser: webdriver.Chrome) -> str:
    return browser.find_element(By.ID, "status").get_attribute("data-state")


def generated(browser: webdriver.Chrome) -> list[dict]:
    """Each generated character's text, logprob attribute and computed background."""
    return browser.execute_script("""return [...document.querySelectorAll('#output .ch')].map(
        (s) => ({text: s.textContent, logprob: s.dataset.logprob,
                 background: getComputedStyle(s).backgroundColor}));""")


def count(browser: webdriver.Chrome) -> int:
    """How many generated characters the page shows (cheap: no style is computed)."""
    return browser.execute_script("return document.querySelectorAll('#output .ch').length")


def alpha(color: str) -> float:
    """The alpha of a computed `rgb(...)` / `rgba(...)` colour."""
    parts = re.findall(r"[\d.]+", color)
    return float(parts[3]) if len(parts) == 4 else 1.0


def keep_screenshot(browser: webdriver.Chrome, tmp_path: Path) -> Path:
    path = tmp_path / "page.png"
    assert browser.save_screenshot(str(path))
    if os.environ.get("CHARLM_TEST_ARTIFACTS"):
        shutil.copy(path, Path(os.environ["CHARLM_TEST_ARTIFACTS"]) / "page.png")
    return path


def test_page_streams_characters_shaded_by_probability_with_alternatives(
        browser, page_server, stand_in, tmp_path):
    """Without the key the page shows the server's 401 message; with it the text streams in,
    equals the server's own greedy completion, each character's shade follows its probability,
    hovering one shows its top 5, and the key survives a reload."""
    wait = open_page(browser, page_server)
    fill(browser, prompt=PROMPT, temperature="0", max_tokens="40")
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: state(d) == "error")
    assert "Incorrect API key provided" in browser.find_element(By.ID, "status").text
    assert settings_open(browser)  # where the key goes

    fill(browser, api_key=KEY)
    browser.find_element(By.ID, "prompt").send_keys(Keys.CONTROL, Keys.ENTER)
    # streaming: some characters are on the page while the rest are still to come
    wait.until(lambda d: state(d) == "running" and 0 < len(generated(d)) < 40)
    wait.until(lambda d: state(d) == "done")
    assert stand_in.streamed[-1] == {"prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                                     "stream": True, "logprobs": 5}

    expected = httpx.post(page_server + "v1/completions",
                          headers={"Authorization": f"Bearer {KEY}"},
                          json={"prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                                "logprobs": 5}).json()["choices"][0]
    output = browser.find_element(By.ID, "output")
    assert output.get_attribute("textContent") == PROMPT + expected["text"]
    assert output.find_elements(By.CSS_SELECTOR, "i, b") == []  # text is text, never markup
    chars = generated(browser)
    assert [c["text"] for c in chars] == list(expected["text"])
    lps = expected["logprobs"]["token_logprobs"]
    for c, lp in zip(chars, lps, strict=True):
        assert float(c["logprob"]) == pytest.approx(lp)
        assert alpha(c["background"]) == pytest.approx((1 - math.exp(lp)) * SHADE_ALPHA, abs=0.01)
    assert float(browser.find_element(By.ID, "cps").text) > 0

    least = min(range(len(lps)), key=lambda i: (lps[i], -i))
    ActionChains(browser).move_to_element(browser.find_elements(By.CSS_SELECTOR, "#output .ch")
                                          [least]).perform()
    tooltip = browser.find_element(By.ID, "tooltip")
    wait.until(lambda d: tooltip.is_displayed())
    rows = [[cell.get_attribute("textContent") for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in tooltip.find_elements(By.TAG_NAME, "tr")]
    top = sorted(expected["logprobs"]["top_logprobs"][least].items(), key=lambda kv: -kv[1])
    shown = {" ": "␣", "\n": "↵"}
    assert [(r[0], r[2]) for r in rows] == [(shown.get(t, t), f"{100 * math.exp(lp):.1f}%")
                                            for t, lp in top]
    chosen = tooltip.find_element(By.CSS_SELECTOR, "tr.chosen td").get_attribute("textContent")
    assert chosen == shown.get(expected["text"][least], expected["text"][least])
    assert keep_screenshot(browser, tmp_path).read_bytes()[:4] == b"\x89PNG"

    output.send_keys(Keys.HOME)  # the keyboard reaches the same alternatives
    assert tooltip.is_displayed() and expected["text"][0] in tooltip.text.replace("␣", " ")
    browser.refresh()
    assert browser.find_element(By.ID, "api-key").get_attribute("value") == KEY


def test_stop_ends_the_stream(browser, page_server, stand_in):
    """Stop closes the request (the server sees its stream cancelled) and no character arrives
    after it; the controls go back to Generate."""
    wait = open_page(browser, page_server)
    fill(browser, prompt="ROMEO:", temperature="0.8", top_k="5", top_p="0.9",
         max_tokens="1000", api_key=KEY)
    ends = len(stand_in.ends)
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: len(generated(d)) >= 5)
    browser.find_element(By.ID, "stop").click()
    text = browser.find_element(By.ID, "output").get_attribute("textContent")
    wait.until(lambda d: len(stand_in.ends) > ends)
    assert stand_in.ends[-1] == "cancelled"
    time.sleep(10 * STEP_S)
    assert browser.find_element(By.ID, "output").get_attribute("textContent") == text
    assert 5 <= len(text) - len("ROMEO:") < 1000
    assert state(browser) == "stopped"
    assert browser.find_element(By.ID, "generate").is_enabled()
    assert not browser.find_element(By.ID, "stop").is_enabled()
    assert stand_in.streamed[-1] == {"prompt": "ROMEO:", "max_tokens": 1000, "temperature": 0.8,
                                     "top_k": 5, "top_p": 0.9, "stream": True, "logprobs": 5}


# --- the page on charlm's own server ----------------------------------------------------------


@contextlib.contextmanager
def charlm_serving(model, vocab, **settings) -> Iterator[str]:
    """`charlm serve`'s app and engine on `model` (uvicorn on a thread here), its base URL."""
    from charlm.serve.app import Settings, create_app, shutdown
    from charlm.serve.engine import Engine

    engine = Engine(model, vocab, slots=4)
    engine.start()
    app = create_app(engine, Settings("tiny", **settings))
    try:
        with serving(app) as url:
            yield url
    finally:
        shutdown(app, 5)


@pytest.fixture(scope="module")
def charlm_server(tiny_run: Path) -> Iterator[str]:
    """The tiny run served as `charlm serve RUN --api-key KEY` does, its base URL."""
    import charlm
    from charlm.serve.schema import Limits

    lm = charlm.load(tiny_run, "cpu")
    # --max-tokens raised: a completion long enough to be stopped however busy the machine
    with charlm_serving(lm.model, lm.vocab, limits=Limits(max_tokens=LONG), api_key=KEY) as url:
        yield url


def test_the_page_on_charlm_serve_streams_shades_and_stops(browser, charlm_server):
    """The same page on the real server: its greedy text and logprobs are the server's own
    non-streamed answer's, each shade follows its probability, and Stop frees the slot."""
    wait = open_page(browser, charlm_server)
    fill(browser, prompt="ROMEO:", temperature="0", max_tokens="60", api_key=KEY)
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: state(d) == "done")
    expected = httpx.post(charlm_server + "v1/completions",
                          headers={"Authorization": f"Bearer {KEY}"},
                          json={"prompt": "ROMEO:", "max_tokens": 60, "temperature": 0,
                                "logprobs": 5}).json()["choices"][0]
    chars = generated(browser)
    assert "".join(c["text"] for c in chars) == expected["text"] and len(chars) == 60
    for c, lp in zip(chars, expected["logprobs"]["token_logprobs"], strict=True):
        assert float(c["logprob"]) == pytest.approx(lp, abs=1e-4)
        assert alpha(c["background"]) == pytest.approx((1 - math.exp(lp)) * SHADE_ALPHA, abs=0.01)

    fill(browser, temperature="1", max_tokens=str(LONG))
    browser.find_element(By.ID, "generate").click()
    try:
        wait.until(lambda d: count(d) >= 5)
        browser.find_element(By.ID, "stop").click()
        wait.until(lambda d: state(d) == "stopped")
    finally:  # whatever failed, the page lets the stream go
        browser.execute_script("document.getElementById('stop').click()")
    shown = count(browser)
    health = lambda: httpx.get(charlm_server + "health").json()["slots"]["busy"]  # noqa: E731
    wait.until(lambda d: health() == 0)  # the engine let the stopped request go
    assert 5 <= shown < LONG and count(browser) == shown  # nothing came after Stop


@pytest.mark.parametrize("kind, prompt", [("byte", "é"), ("encoder_decoder", "abcab")])
def test_the_page_generates_from_a_byte_model_and_an_encoder_decoder(browser, kind, prompt):
    """The page asks for the logprobs GET /v1/models says the model offers (it used to ask
    every model for 5, which these refuse with a 400): a byte model's characters come shaded
    by their probability, with no alternatives to show; an encoder-decoder's unshaded. Each
    text is the server's own greedy answer."""
    model, vocab = random_served(kind)
    with charlm_serving(model, vocab) as url:
        wait = open_page(browser, url)
        fill(browser, prompt=prompt, temperature="0", max_tokens="12")
        browser.find_element(By.ID, "generate").click()
        wait.until(lambda d: state(d) in ("done", "error"))
        assert browser.find_element(By.ID, "status").text == "Done (length)"
        offered = httpx.get(url + "v1/models").json()["data"][0]["max_logprobs"]
        assert offered == {"byte": 0, "encoder_decoder": None}[kind]
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0}
        expected = httpx.post(url + "v1/completions",
                              json={**body, "logprobs": offered}).json()["choices"][0]
        assert browser.find_element(By.ID, "output").get_attribute("textContent") == (
            prompt + expected["text"])
        chars = generated(browser)
        help_text = browser.find_element(By.ID, "output-help").text
        if kind == "encoder_decoder":
            assert [c["logprob"] for c in chars] == [None]  # one piece, unshaded
            assert help_text == "This model gives no probabilities: its text is not shaded."
            return
        lps = expected["logprobs"]["token_logprobs"]
        assert [c["text"] for c in chars] == expected["logprobs"]["tokens"] and chars
        for c, lp in zip(chars, lps, strict=True):
            assert float(c["logprob"]) == pytest.approx(lp, abs=1e-4)
            assert alpha(c["background"]) == pytest.approx((1 - math.exp(lp)) * SHADE_ALPHA,
                                                           abs=0.01)
        assert help_text.endswith("to see its probability.")
        at = next(i for i, c in enumerate(chars) if c["text"].strip())  # one with a width
        ActionChains(browser).move_to_element(
            browser.find_elements(By.CSS_SELECTOR, "#output .ch")[at]).perform()
        tooltip = browser.find_element(By.ID, "tooltip")
        wait.until(lambda d: tooltip.is_displayed())
        assert tooltip.find_elements(By.TAG_NAME, "tr") == []  # the probability alone
        assert tooltip.text.endswith(f" · logprob {lps[at]:.3f}")

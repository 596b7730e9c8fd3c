"""The tests servers people trust run (llama.cpp's server suite, vLLM's shutdown test, TGI's load
tests), on `charlm serve` as a process: a seed gives the same text with --slots 1, 4 and 16,
streamed or not; /health answers while every slot decodes; a CR or LF in any request field
cannot forge a line of the server's log; 2,000 requests, 32 at once, end with none failed and
resident memory as it was. (SIGTERM with 10 streams in flight: test_serve.py.)"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import Served, stream_events

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")  # the serve extra

pytestmark = pytest.mark.xdist_group("serve")

SEEDED = [{"prompt": prompt, "max_tokens": 40, "temperature": 1.0, "top_k": 20, "seed": seed}
          for seed, prompt in enumerate(["ROMEO:", "A", "Citizen:\nBefore", "O", "the", "\n"])]


@pytest.fixture(scope="module")
def sixteen(tiny_run: Path) -> Iterator[Served]:
    served = Served(tiny_run, "--slots", "16", "--max-concurrent", "64")
    yield served
    assert served.stop()[0] == 0


def complete(client: httpx.Client, url: str, body: dict) -> str:
    r = client.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def streamed(client: httpx.Client, url: str, body: dict) -> str:
    events = list(stream_events(client, url, body))
    assert events[-1] == "[DONE]"
    return "".join(e["choices"][0]["text"] for e in events[:-1])


def seeded_texts(url: str) -> list[str]:
    """Each SEEDED request's text, all sent at once, whole and streamed (12 in flight)."""
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(len(SEEDED) * 2) as pool:
        whole = [pool.submit(complete, client, url, body) for body in SEEDED]
        parts = [pool.submit(streamed, client, url, body) for body in SEEDED]
        return [f.result() for f in whole] + [f.result() for f in parts]


def test_a_seed_gives_the_same_text_with_1_4_and_16_slots_streamed_or_not(tiny_run, sixteen):
    """With one slot the requests take turns; with 4 they share the batch with others that
    come and go; with 16 all decode together: a request's text is its seed's alone."""
    texts = {16: seeded_texts(sixteen.url)}
    for slots in (1, 4):
        served = Served(tiny_run, "--slots", str(slots))
        try:
            texts[slots] = seeded_texts(served.url)
        finally:
            assert served.stop()[0] == 0
    assert len(set(texts[16][:len(SEEDED)])) == len(SEEDED)  # the seeds differ, so do the texts
    assert texts[1] == texts[4] == texts[16] == texts[16][:len(SEEDED)] * 2


def test_health_answers_within_100_ms_while_every_slot_decodes(sixteen):
    """16 streams of 4,000 characters hold every slot; /health, asked 21 times meanwhile, has
    a median under 100 ms (the median, not each one: a loaded 2-core machine can stall any
    one request)."""
    stop = threading.Event()

    def hold() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in stream_events(client, sixteen.url, {"prompt": "A", "max_tokens": 4000}):
                if stop.is_set():
                    break

    holders = [threading.Thread(target=hold) for _ in range(16)]
    for t in holders:
        t.start()
    try:
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 30
            while (health := client.get(f"{sixteen.url}/health").json())["slots"]["busy"] < 16:
                assert time.monotonic() < deadline, health
                time.sleep(0.05)
            seconds = []
            for _ in range(21):
                start = time.perf_counter()
                health = client.get(f"{sixteen.url}/health").json()
                seconds.append(time.perf_counter() - start)
                assert health["slots"]["busy"] == 16  # every slot still decodes
                time.sleep(0.02)
    finally:
        stop.set()
        for t in holders:
            t.join(60)
    assert statistics.median(seconds) < 0.1, sorted(seconds)


FORGED = "\r\nwarning: forged\nerror: forged\r"


def test_a_cr_or_lf_in_any_request_field_cannot_forge_a_log_line(tiny_run):
    """Each field of a completion and a chat, and the path, carries CR and LF before text that
    looks like a log line; the server answers each (200 or an error body) and its log has no
    line that starts with what a client sent."""
    served = Served(tiny_run)
    fields = {"prompt": FORGED, "stop": [FORGED], "model": FORGED, "user": FORGED,
              "seed": FORGED, "temperature": FORGED, "max_tokens": FORGED, "n": FORGED,
              "logit_bias": {FORGED: 1}, "suffix": FORGED, FORGED: 1}
    chat = {"messages": [{"role": FORGED, "content": "A"}], "max_tokens": 2}
    try:
        with httpx.Client(timeout=30) as client:
            statuses = {client.post(f"{served.url}/v1/completions",
                                    json={"prompt": "A", "max_tokens": 2, key: value}).status_code
                        for key, value in fields.items()}
            statuses.add(client.post(f"{served.url}/v1/chat/completions", json=chat).status_code)
            statuses.add(client.post(f"{served.url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": FORGED}], "max_tokens": 2,
                "stop": FORGED}).status_code)
            statuses.add(client.get(f"{served.url}/v1/%0d%0awarning:%20forged").status_code)
            statuses.add(client.post(f"{served.url}/v1/completions", content=FORGED.encode(),
                                     headers={"Content-Type": "application/json"}).status_code)
    finally:
        code = served.stop()[0]
    assert code == 0 and statuses <= {200, 400, 404}
    assert not [line for line in (served.out + served.err).splitlines()
                if "forged" in line and not line.startswith("serving ")], served.err


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory from /proc")
def test_2000_requests_32_at_once_none_fails_and_memory_stays(sixteen):
    """A bounded load loop on loopback (TGI's): 2,000 completions of 2 characters, 32 in
    flight, after 200 to warm up; every one is a 200 with its 2 characters, and the server's
    resident memory ends within 5 % of where it stood after the warm-up."""
    body = json.dumps({"prompt": "A", "max_tokens": 2, "temperature": 0}).encode()
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    with httpx.Client(timeout=60, limits=limits) as client, ThreadPoolExecutor(32) as pool:
        def one(_: int) -> bool:
            r = client.post(f"{sixteen.url}/v1/completions", content=body,
                            headers={"Content-Type": "application/json"})
            return r.status_code == 200 and len(r.json()["choices"][0]["text"]) == 2

        assert all(pool.map(one, range(200)))
        before = rss_kib(sixteen.process.pid)
        results = list(pool.map(one, range(2000)))
        after = rss_kib(sixteen.process.pid)
    assert results.count(False) == 0
    assert after <= before * 1.05, (before, after)

"""`charlm serve` as a process on a free local port: the real `openai` client, streamed and not;
the first event before the generation ends; 429 past --max-concurrent; a client that goes away
frees its slot; SIGTERM during 10 streams ends each and exits 0 within 5 s, leaving no child
process; a run that cannot be loaded is one error line, exit 2, before the port is bound."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Served, stream_events

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")  # the serve extra

# Every test here talks to a server: one worker runs them all, which starts one shared server
pytestmark = pytest.mark.xdist_group("serve")


@pytest.fixture(scope="module")
def server(tiny_run: Path) -> Iterator[Served]:
    """One server on tiny_run for the tests that leave it as they found it."""
    served = Served(tiny_run, "--max-concurrent", "2", "--max-n", "2")
    yield served
    assert served.stop()[0] == 0


def slots_busy(url: str) -> int:
    return httpx.get(f"{url}/health").json()["slots"]["busy"]


def test_the_openai_client_streamed_and_not(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    whole = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=20,
                                      temperature=0, seed=1)
    assert (whole.choices[0].finish_reason, len(whole.choices[0].text)) == ("length", 20)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (6, 20)
    chunks = list(client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=20,
                                            temperature=0, seed=1, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model="tiny", max_tokens=10, temperature=0,
                                          messages=[{"role": "user", "content": "Hello"}])
    assert chat.choices[0].message.role == "assistant"
    assert [m.id for m in client.models.list()] == ["run"]  # the run dir's name


def test_without_slots_every_completion_of_max_concurrent_decodes_at_once(server):
    """The tiny model's keys and values are far under 1 GiB, so --max-concurrent 2 gives 2."""
    assert httpx.get(f"{server.url}/health").json()["slots"]["total"] == 2


def test_the_first_event_comes_before_the_generation_ends(server):
    """Streaming is live: when the first character arrives the completion still holds its
    slot, and a client that then goes away frees it (/metrics shows it)."""
    with httpx.Client(timeout=30) as client:
        events = stream_events(client, server.url, {"prompt": "ROMEO:", "max_tokens": 4000})
        first = next(events)
        assert first["choices"][0]["finish_reason"] is None
        assert slots_busy(server.url) == 1
        events.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 5
    while slots_busy(server.url) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "charlm_slots_busy 0.0" in httpx.get(f"{server.url}/metrics").text.splitlines()


def test_past_max_concurrent_429_with_retry_after(server):
    with httpx.Client(timeout=30) as client:
        events = stream_events(client, server.url, {"prompt": "A", "max_tokens": 4000, "n": 2})
        next(events)
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "A", "max_tokens": 1})
        events.close()
    assert (r.status_code, r.headers["retry-after"]) == (429, "1")
    assert r.json()["error"]["type"] == "rate_limit_error"


def children(pid: int) -> set[int]:
    """The processes `pid` started, and theirs (from /proc: Linux)."""
    found, parents = set(), {pid}
    while parents:
        stats = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit():
                    stats.append((int(entry.name), (entry / "stat").read_text()))
        new = {p for p, stat in stats if int(stat.rpartition(")")[2].split()[1]) in parents}
        parents = new - found
        found |= new
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child processes from /proc")
def test_sigterm_with_10_streams_in_flight_ends_each_and_exits_0_within_5_s(tiny_run):
    """vLLM's shutdown test: 10 streams decoding, SIGTERM; within 5 s the server has exited 0,
    each stream has ended with finish_reason "shutdown" and `data: [DONE]`, and no process
    it started is left."""
    served = Served(tiny_run, "--grace", "2")
    ends: list = []

    def read() -> None:
        with httpx.Client(timeout=30) as client:
            ends.append(list(stream_events(client, served.url, {"prompt": "A",
                                                                 "max_tokens": 4000}))[-2:])

    readers = [threading.Thread(target=read) for _ in range(10)]
    for t in readers:
        t.start()
    while slots_busy(served.url) < 10:
        time.sleep(0.02)
    started = children(served.process.pid)
    code, seconds = served.stop()
    for t in readers:
        t.join(10)
    assert code == 0 and seconds < 5
    assert [[e["choices"][0]["finish_reason"], done] for e, done in ends] == [
        ["shutdown", "[DONE]"]] * 10
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()]


def test_a_run_that_cannot_be_loaded_is_one_error_line_before_the_port(cli, tmp_path):
    """The port is taken: were it bound first, the error would be about the port."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        result = cli("serve", tmp_path / "missing", "--port", taken.getsockname()[1])
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith("error: ") and result.err.count("\n") == 1
    assert "missing" in result.err and "port" not in result.err


def test_sixteen_clients_at_once_get_the_text_each_would_get_alone(tiny_run):
    """Continuous batching changes no request's text: 16 greedy completions sent at once, past
    the context (40 characters, block_size 16), equal `charlm.generate` at temperature 0 on the
    same prompt, and a seeded sampled one gives the text it gave alone."""
    import charlm

    lm = charlm.load(tiny_run, "cpu")
    prompts = ["ROMEO:", "Citizen:\nBefore", "A", "O", "MARCIUS", "\n",
               "What, ho!", "Speak", "I", "the", "MENENIUS:\nWhy", "be", "Hark", "No, no",
               "To be", "she"]
    greedy = {p: charlm.generate(lm, p, max_new_tokens=40, temperature=0) for p in prompts}
    seeded = {"prompt": "JULIET:", "max_tokens": 40, "temperature": 1.0, "top_k": 20,
              "seed": 7}
    served = Served(tiny_run, "--slots", "16", "--max-concurrent", "32")
    try:
        with httpx.Client(timeout=60) as client:
            def complete(body: dict) -> str:
                r = client.post(f"{served.url}/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            alone = complete(seeded)
            results: dict[str, str] = {}
            threads = [threading.Thread(target=lambda p=p: results.__setitem__(p, complete(
                {"prompt": p, "max_tokens": 40, "temperature": 0}))) for p in prompts]
            threads.append(threading.Thread(target=lambda: results.__setitem__(
                "seeded", complete(seeded))))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert {p: results[p] for p in prompts} == greedy
        assert results["seeded"] == alone
    finally:
        assert served.stop()[0] == 0

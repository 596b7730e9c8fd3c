"""`bench.py serve`: streaming completions from `charlm serve` and, on the same weights with the
same load, `transformers serve --continuous-batching`, at each --clients concurrency, in
interleaved rounds after one warm-up request to each server.

The model is the --config's shape with random weights (vocab 65; default the baby GPT of
configs/shakespeare_char.yaml), written once as charlm's safetensors export and as the `hf`
export (`charlm export --format hf` does the same) into a temporary directory. Each server
starts once, on a free local port, and serves every round.

Variants (--variants, in the order given; each compared with the ones before it):

- `transformers`: `HF_HUB_OFFLINE=1 transformers serve HF_DIR --continuous-batching` (needs
  transformers, accelerate, fastapi and uvicorn: `pip install -e ".[hf,serve]" accelerate`).
- `charlm`: `charlm serve EXPORT`. `charlm_compiled`: with `--compile`.
- `engine`: no server: charlm serve's engine in this process, decoding on its main thread as
  `charlm serve` does, the same load submitted straight to it (a client's next request when its
  last one ends): the ceiling that HTTP, the event loop and a load generator on the same cores
  take their share from.

A round at concurrency C runs C streaming clients at once, each sending --requests greedy
requests of --chars characters one after the other. `chars_per_s`: the characters all clients
received over the round's wall time. `ttfc_p50_ms` / `ttfc_p99_ms`: from sending a request to
its first character; `char_p99_ms`: the 99th percentile of the gaps between characters after
the first (a chunk of k characters counts as k gaps of a k-th of its wait each).
`same_text`: whether every greedy completion equals the first variant's.

--memory N: after the rounds, about N requests more to each charlm variant (16 clients): its
resident memory (VmRSS) after the first ~100 and after all of them, and their ratio
(`rss_growth`)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from common import positive

from benchlib.harness import ROOT, Bench, charlm_env
from charlm.api import load as load_run
from charlm.config.loading import load_config
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab
from charlm.export import save_hf, save_safetensors
from charlm.model.gpt import GPT
from charlm.runtime.profile import layout_for
from charlm.serve.engine import KV_BUDGET, Engine, Event, Params, slots_within

VOCAB = Vocab([chr(c) for c in range(32, 97)])  # 65 characters, as tiny-shakespeare has
PROMPTS = ["ROMEO:", "JULIET: O ", "FIRST CITIZEN: BEFORE WE PROCEED", "A"]  # in VOCAB
START_S = 300.0  # a server's start (transformers loads, charlm may compile) may take this long


@dataclass
class Server:
    """A running server: its process, base URL and the model name its requests give."""
    proc: subprocess.Popen
    url: str
    model: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(variant: str, export: Path, hf_dir: Path, log: Path, slots: int | None,
          concurrent: int, dtype: str) -> Server:
    """Start a variant's server, its weights in dtype, and wait until it answers GET
    /v1/models."""
    import httpx

    port = free_port()
    if variant == "transformers":
        cmd = ["transformers", "serve", str(hf_dir), "--continuous-batching", "--port", str(port),
               "--dtype", dtype]
        env, model = {**os.environ, "HF_HUB_OFFLINE": "1"}, str(hf_dir)
    else:
        cmd = [sys.executable, "-m", "charlm", "serve", str(export), "--port", str(port),
               "--max-concurrent", str(concurrent), "--dtype", dtype,
               *(["--slots", str(slots)] if slots else []),
               *(["--compile"] if variant.endswith("compiled") else [])]
        env, model = charlm_env(), "charlm"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CharlmError(f"{variant}'s server exited with {proc.returncode}; see {log}")
        try:
            models = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
            return Server(proc, url, model if variant == "transformers" else models[0]["id"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            time.sleep(0.5)
    proc.kill()
    raise CharlmError(f"{variant}'s server did not answer within {START_S:.0f} s; see {log}")


async def complete(client, server: Server, prompt: str, chars: int) -> dict:
    """One streaming greedy completion: its text, time to first character and the gaps."""
    import json

    body = {"model": server.model, "prompt": prompt, "max_tokens": chars, "temperature": 0,
            "stream": True}
    text, gaps, first = "", [], None
    t0 = last = time.perf_counter()
    async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise CharlmError(f"{server.url}: {response.status_code} "
                              f"{(await response.aread()).decode(errors='replace')[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            piece = json.loads(line[6:])["choices"][0].get("text") or ""
            if not piece:
                continue
            now = time.perf_counter()
            if first is None:
                first = now - t0
            else:
                gaps += [(now - last) / len(piece)] * len(piece)
            text, last = text + piece, now
    return {"text": text, "ttfc": first, "gaps": gaps}


async def load(server: Server, clients: int, requests: int, chars: int) -> tuple[float, list]:
    """C clients at once, each sending `requests` completions in turn: the wall time and each
    completion's result, in the order (client, request)."""
    import httpx

    limits = httpx.Limits(max_connections=clients + 1)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        async def one_client(c: int) -> list[dict]:
            return [await complete(client, server, PROMPTS[(c + r) % len(PROMPTS)], chars)
                    for r in range(requests)]

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one_client(c) for c in range(clients)))
        return time.perf_counter() - t0, [result for results in done for result in results]


def drive(engine: Engine, clients: int, requests: int, chars: int) -> tuple[float, list]:
    """`load`'s work for `engine` itself, decoding on this thread until the last completion
    ends: the wall time and each completion's result, in the order (client, request)."""
    results: list[list[dict]] = [[] for _ in range(clients)]
    left = threading.Semaphore(0)

    def submit(c: int) -> None:
        r = len(results[c])
        result = {"text": "", "ttfc": None, "gaps": [], "t0": time.perf_counter()}
        results[c].append(result)

        def on_event(event: Event) -> None:  # on this thread, inside `engine.run`
            now = time.perf_counter()
            if event.text:
                if result["ttfc"] is None:
                    result["ttfc"] = now - result["t0"]
                else:
                    result["gaps"] += [(now - result["last"]) / len(event.text)] * len(event.text)
                result["text"] += event.text
                result["last"] = now
            if event.finish_reason is not None and r + 1 < requests:
                submit(c)  # the client's next request
            elif event.finish_reason is not None:
                left.release()  # the client is done

        engine.submit(PROMPTS[(c + r) % len(PROMPTS)], Params(max_tokens=chars, temperature=0),
                      on_event)

    def close_when_done() -> None:
        for _ in range(clients):
            left.acquire()
        engine.close()

    t0 = time.perf_counter()
    for c in range(clients):
        submit(c)
    closer = threading.Thread(target=close_when_done, daemon=True)
    closer.start()
    engine.run()
    closer.join()
    return time.perf_counter() - t0, [result for results_c in results for result in results_c]


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def measure(server: Server | Callable[[], Engine], clients: int, requests: int,
            chars: int) -> tuple[dict, list[str]]:
    """A round's figures and texts: from a server, or from a fresh engine (`drive`)."""
    if isinstance(server, Server):
        seconds, results = asyncio.run(load(server, clients, requests, chars))
    else:
        seconds, results = drive(server(), clients, requests, chars)
    ttfc = [r["ttfc"] for r in results if r["ttfc"] is not None]
    gaps = [g for r in results for g in r["gaps"]]
    received = sum(len(r["text"]) for r in results)
    ms = lambda x: None if x is None else round(1000 * x, 2)  # noqa: E731
    return ({"chars_per_s": round(received / seconds, 1), "seconds": round(seconds, 3),
             "ttfc_p50_ms": ms(percentile(ttfc, 50)), "ttfc_p99_ms": ms(percentile(ttfc, 99)),
             "char_p99_ms": ms(percentile(gaps, 99))}, [r["text"] for r in results])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise CharlmError(f"no VmRSS for process {pid}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "shakespeare_char.yaml",
                        help="the model's shape (default: the baby GPT)")
    parser.add_argument("--variants", nargs="+", default=["transformers", "charlm"],
                        choices=["transformers", "charlm", "charlm_compiled", "engine"],
                        metavar="VARIANT", help="transformers, charlm, charlm_compiled, engine "
                        "(default: transformers charlm)")
    parser.add_argument("--clients", nargs="+", type=positive(int), default=[1, 4, 16, 64])
    parser.add_argument("--chars", type=positive(int), default=200,
                        help="characters each request asks for (default 200)")
    parser.add_argument("--requests", type=positive(int), default=2,
                        help="requests each client sends in turn, per round (default 2)")
    parser.add_argument("--slots", type=positive(int),
                        help="charlm serve --slots: completions decoded together (default: "
                        "charlm serve's own)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="both servers' weights (default float32, as exported)")
    parser.add_argument("--memory", type=positive(int, zero=True), default=0,
                        help="requests more to each charlm variant, for its memory (e.g. 1000)")


def figures(args: argparse.Namespace) -> Iterator[dict]:
    cfg = load_config(args.config)
    longest = max(map(len, PROMPTS)) + args.chars
    if "transformers" in args.variants and longest > cfg.model.block_size:
        raise CharlmError(f"{args.config}: transformers' GPT-2 serves no further than its "
                          f"block_size ({cfg.model.block_size}) where charlm slides its window; "
                          f"give --chars {cfg.model.block_size - max(map(len, PROMPTS))} or fewer")
    return run(cfg, args)


def run(cfg: RunConfig, args: argparse.Namespace) -> Iterator[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = GPT(cfg.model, len(VOCAB)).eval()
        export, hf_dir = Path(tmp) / "export", Path(tmp) / "hf"
        export.mkdir()
        save_safetensors(model, VOCAB, cfg, export)
        if "transformers" in args.variants:
            hf_dir.mkdir()
            save_hf(model, VOCAB, cfg, hf_dir)
        from charlm.serve.schema import Limits  # pydantic: the serve extra

        servers: dict[str, Server | Callable[[], Engine]] = {}
        concurrent = max(Limits().concurrent, *args.clients)  # no client gets a 429
        try:
            for variant in args.variants:
                if variant == "engine":
                    lm = load_run(export, "cpu", dtype=args.dtype)
                    slots = args.slots or slots_within(lm.model, KV_BUDGET, concurrent)
                    # decided once, not by each round's fresh engine
                    servers[variant] = functools.partial(Engine, lm.model, lm.vocab,
                                                         slots=slots, layout=layout_for(lm.model))
                else:
                    log = Path(tmp) / f"{variant}.log"
                    servers[variant] = start(variant, export, hf_dir, log, args.slots,
                                             concurrent, args.dtype)
                measure(servers[variant], 1, 1, args.chars)  # warm-up
            yield {"params": sum(p.numel() for p in model.parameters()),
                   "config": args.config.name, "chars": args.chars, "requests": args.requests,
                   "dtype": args.dtype}
            for r in range(1, args.rounds + 1):
                for clients in args.clients:
                    reference = None
                    for variant, server in servers.items():
                        figure, texts = measure(server, clients, args.requests, args.chars)
                        reference = texts if reference is None else reference
                        yield {"clients": clients, "variant": variant, "round": r, **figure,
                               "same_text": texts == reference}
            for variant, server in servers.items():
                if args.memory and variant.startswith("charlm"):
                    yield {"variant": variant, **memory(server, args.memory)}
        finally:
            running = [s for s in servers.values() if isinstance(s, Server)]
            for server in running:
                server.proc.terminate()
            for server in running:
                try:
                    server.proc.wait(30)
                except subprocess.TimeoutExpired:
                    server.proc.kill()


def memory(server: Server, n: int) -> dict:
    """Resident memory after the first ~100 requests and after ~n in all (16 clients at once,
    50 characters each; the counts are rounded up to whole rounds of 16)."""
    first = -(-min(100, n) // 16)
    measure(server, 16, first, 50)
    after_first = rss_kib(server.proc.pid)
    rest = max(-(-n // 16) - first, 0)
    if rest:
        measure(server, 16, rest, 50)
    after_all = rss_kib(server.proc.pid)
    return {"requests_first": 16 * first, "rss_mib_first": round(after_first / 1024, 1),
            "requests_all": 16 * (first + rest), "rss_mib_all": round(after_all / 1024, 1),
            "rss_growth": round(after_all / after_first, 4)}


BENCH = Bench("serve", __doc__, add_arguments, figures, case=("clients",), metric="chars_per_s",
              metrics=("ttfc_p50_ms", "ttfc_p99_ms", "char_p99_ms"), rounds=3)

"""Benchmark generation: tokens/s of KV-cached vs uncached sampling.

For each config (default: the CPU preset and the baby GPT), batch 1 and 8, and 500 and 2000 new
tokens, it generates from random weights (vocab 65) with the default sampling settings and prints
the machine's facts (CPU model, cores, torch threads and version), one JSON line per run, then a
table. Each run's cached path is given at most --cached-seconds and its uncached path at most
--uncached-seconds, so the script ends in bounded time on any CPU (about their sum per run, 8
runs by default). A path that runs out is timed over the tokens it produced, marked "first N":
that flatters it (early tokens see a shorter context), the uncached path far more than the
cached one, so the speed-up shown is then a lower bound.

    python scripts/bench_sample.py [--configs A.yaml B.yaml] [--cached-seconds 20]
        [--uncached-seconds 30] [--compile]

--compile times the cached path with its decode step compiled (`charlm sample --compile`); the
compile itself happens in the warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from common import machine_facts, machine_line, positive, run_script, summary

from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.generation.decoding import generate
from charlm.model.gpt import GPT, param_counts

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = [ROOT / "configs" / "shakespeare_char_cpu.yaml",
                   ROOT / "configs" / "shakespeare_char.yaml"]


def timed(model: GPT, batch: int, new_tokens: int, use_cache: bool,
          budget_s: float, compile: bool = False) -> tuple[int, float]:
    """(tokens generated per sample, seconds), stopping early once budget_s has passed."""
    prompt = torch.zeros(batch, 1, dtype=torch.long)
    opts = SampleConfig(use_cache=use_cache, compile=compile)
    generator = torch.Generator().manual_seed(0)
    done = 0
    t0 = time.perf_counter()
    for ids in generate(model, prompt, new_tokens, opts, generator):
        ids.tolist()  # what streaming does each step: bring the ids to the host
        done += 1
        if time.perf_counter() - t0 > budget_s:
            break
    return done, time.perf_counter() - t0


def partial(row: dict, path: str) -> str:
    """The table's mark " (first N)" where the `path` ("cached", "uncached") of `row` ran out
    of time after N tokens, else nothing."""
    n = row[f"{path}_tokens_measured"]
    return "" if n == row["new_tokens"] else f" (first {n})"


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--configs", nargs="+", type=Path, default=DEFAULT_CONFIGS)
    parser.add_argument("--batches", nargs="+", type=positive(int), default=[1, 8])
    parser.add_argument("--tokens", nargs="+", type=positive(int), default=[500, 2000])
    parser.add_argument("--cached-seconds", type=positive(float), default=20.0,
                        help="time limit of each run's cached path (default 20)")
    parser.add_argument("--uncached-seconds", type=positive(float), default=30.0,
                        help="time limit of each run's uncached path (default 30)")
    parser.add_argument("--compile", action="store_true",
                        help="compile the cached decode step (compile time not counted)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(machine_line(machine_facts()), flush=True)
    rows = []
    for path in args.configs:
        cfg = load_config(path)
        model = GPT(cfg.model, 65).eval()
        n_params = param_counts(model)["total"]
        for batch in args.batches:
            for tokens in args.tokens:
                timed(model, batch, 20, True, 600, args.compile)  # warm-up (and compile)
                row = {"config": path.name, "params_m": round(n_params / 1e6, 2),
                       "block_size": cfg.model.block_size, "batch": batch, "new_tokens": tokens,
                       "threads": torch.get_num_threads(), "compile": args.compile}
                n, s = timed(model, batch, tokens, True, args.cached_seconds, args.compile)
                row["cached_tok_s"] = round(n * batch / s, 1)
                row["cached_tokens_measured"] = n
                n, s = timed(model, batch, tokens, False, args.uncached_seconds)
                row["uncached_tok_s"] = round(n * batch / s, 1)
                row["uncached_tokens_measured"] = n
                row["speedup"] = round(row["cached_tok_s"] / row["uncached_tok_s"], 1)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("\n| config | params | batch | new tokens | cached tok/s | uncached tok/s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['params_m']}M | {r['batch']} | {r['new_tokens']} | "
              f"{r['cached_tok_s']:.0f}{partial(r, 'cached')} | "
              f"{r['uncached_tok_s']:.0f}{partial(r, 'uncached')} | {r['speedup']}x |")


if __name__ == "__main__":
    run_script(main)

"""Benchmark the split-product rule: greedy decoding with every float32 product split over the
threads against charlm's rule (weights under `layers.SPLIT_MIN_WEIGHTS` values keep F.linear).

For each config (default: the two CPU presets and the tiny config) and batch, it decodes
--tokens greedy tokens from random weights (vocab 65) in one process, the split forced on and
the rule alternating for --pairs pairs, checks that both give the same tokens, and prints the
machine's facts, one JSON line per run (medians, and the median of the paired ratios) and a
table.

    python scripts/bench_split.py [--configs A.yaml ...] [--batches 1 8] [--pairs 9]
        [--tokens 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import machine_facts, machine_line, positive, run_script, summary

from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.generation.decoding import generate
from charlm.model import layers
from charlm.model.gpt import GPT

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = [ROOT / "configs" / name for name in
                   ("shakespeare_char_cpu.yaml", "shakespeare_char_cpu_long.yaml", "tiny.yaml")]


def decode(model: GPT, batch: int, tokens: int, split_min: int) -> tuple[float, list]:
    """Tokens per second of a greedy decode with `layers.SPLIT_MIN_WEIGHTS = split_min`, and
    its tokens."""
    rule = layers.SPLIT_MIN_WEIGHTS
    layers.SPLIT_MIN_WEIGHTS = split_min
    try:
        prompt = torch.zeros(batch, 1, dtype=torch.long)
        start = time.perf_counter()
        ids = [step.tolist() for step in generate(model, prompt, tokens,
                                                  SampleConfig(temperature=0))]
        return batch * tokens / (time.perf_counter() - start), ids
    finally:
        layers.SPLIT_MIN_WEIGHTS = rule


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--configs", nargs="+", type=Path, default=DEFAULT_CONFIGS)
    parser.add_argument("--batches", nargs="+", type=positive(int), default=[1, 8])
    parser.add_argument("--pairs", type=positive(int), default=9)
    parser.add_argument("--tokens", type=positive(int), default=300)
    args = parser.parse_args()
    cfgs = [(path, load_config(path)) for path in args.configs]  # a bad config before any run
    print(machine_line(machine_facts()))
    rows = []
    for path, cfg in cfgs:
        model = GPT(cfg.model, 65).eval()
        for batch in args.batches:
            split, rule, ratios = [], [], []
            for _ in range(args.pairs):
                a, a_ids = decode(model, batch, args.tokens, 0)
                b, b_ids = decode(model, batch, args.tokens, layers.SPLIT_MIN_WEIGHTS)
                assert a_ids == b_ids, "the two rules decoded different tokens"
                split.append(a)
                rule.append(b)
                ratios.append(b / a)
            row = {"config": path.name, "batch": batch, "tokens": args.tokens, "pairs": args.pairs,
                   "split_all_tokens_per_s": round(statistics.median(split), 1),
                   "rule_tokens_per_s": round(statistics.median(rule), 1),
                   "speedup": round(statistics.median(ratios), 3),
                   "speedup_range": [round(min(ratios), 2), round(max(ratios), 2)]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("| config | batch | always split, tok/s | rule, tok/s | paired median (range) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        low, high = r["speedup_range"]
        print(f"| {r['config']} | {r['batch']} | {r['split_all_tokens_per_s']} | "
              f"{r['rule_tokens_per_s']} | {r['speedup']}x ({low}-{high}) |")


if __name__ == "__main__":
    run_script(main)

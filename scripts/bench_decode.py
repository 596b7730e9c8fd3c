"""Batch-1 greedy decode of a GPT-2-shaped model against two yardsticks, in one process: the
weight-streaming ceiling (one pass of matrix-vector products over the model's weight matrices,
in the order a decode step reads them) and Hugging Face transformers' `generate` with its KV
cache on the same weights (exported as `charlm export --format hf` does).

    python scripts/bench_decode.py [CONFIG] [--tokens 250] [--repeat 5]
                                   [--dtypes float32 bfloat16 float16] [--compile]

Random weights (vocab 65), eager, greedy. For each of --dtypes, the weights of all three are
cast to it (`charlm sample --dtype`, transformers' `.to(dtype)`), and the float32 ceiling
stays the yardstick. --repeat rounds each time every measure once, in turn, so a ratio is
taken within a round and the median over rounds is printed: the machine's speed drifts, and
on a shared host jumps by a fifth from one run to the next. Prints one JSON line per dtype:
the machine's facts, the best tokens/s of charlm, of transformers, of that dtype's ceiling
(by F.linear) and of the float32 one, and charlm's ratios.
Bounded: about 2 x (--repeat + 1) generations of --tokens tokens per dtype. --compile also
times `charlm sample --compile` (the decode step compiled; the compile, in the warm-up, not
counted).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from common import machine_facts, positive, run_script, summary

from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.data.vocab import Vocab
from charlm.export import save_hf
from charlm.generation.decoding import generate
from charlm.model.gpt import GPT
from charlm.runtime.precision import DTYPES

ROOT = Path(__file__).resolve().parents[1]
VOCAB = Vocab([chr(c) for c in range(32, 97)])  # 65 characters, as tiny-shakespeare has


Runner = Callable[[], None]


def rounds(runners: dict[str, tuple[Runner, int]], repeat: int) -> dict[str, list[float]]:
    """Tokens/s of each runner (a call and the tokens it yields) in each of `repeat` rounds,
    after one warm-up call each. A round times every runner once, back to back, so the
    machine's speed (which drifts, and on a shared host jumps) is alike within a round."""
    for run, _ in runners.values():
        run()
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeat):
        for name, (run, tokens) in runners.items():
            t0 = time.perf_counter()
            run()
            rates[name].append(tokens / (time.perf_counter() - t0))
    return rates


def ceiling(model: GPT) -> tuple[Runner, int]:
    """Twenty passes of one matrix-vector product (F.linear) with each weight matrix of a decode
    step: what a decoder that did nothing else would reach, bound by memory bandwidth."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, m.weight.shape[1], dtype=m.weight.dtype) for m in linears]

    @torch.inference_mode()
    def run() -> None:
        for _ in range(20):
            for m, x in zip(linears, inputs, strict=True):
                F.linear(x, m.weight)

    return run, 20


def charlm_decode(model: GPT, tokens: int, compile: bool = False) -> tuple[Runner, int]:
    opts = SampleConfig(temperature=0, compile=compile)

    def run() -> None:
        prompt = torch.zeros(1, 1, dtype=torch.long)
        for ids in generate(model, prompt, tokens, opts):
            ids.tolist()  # as streaming does

    return run, tokens


def transformers_decode(model: GPT, cfg, tokens: int) -> tuple[Runner, int]:
    from transformers import GPT2LMHeadModel

    with tempfile.TemporaryDirectory() as tmp:  # saved in float32, the weights rounded alike
        save_hf(copy.deepcopy(model).float(), VOCAB, cfg, Path(tmp))
        hf = GPT2LMHeadModel.from_pretrained(tmp).eval().to(model.wte.weight.dtype)
    prompt = torch.zeros(1, 1, dtype=torch.long)

    @torch.inference_mode()
    def run() -> None:
        hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                    max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0)

    return run, tokens


def ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    """The median over the rounds of a's rate over b's in the same round."""
    return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("config", nargs="?", type=Path,
                        default=ROOT / "configs" / "shakespeare_char.yaml")
    parser.add_argument("--tokens", type=positive(int), default=250)
    parser.add_argument("--repeat", type=positive(int), default=5)
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES),
                        default=["float32", "bfloat16", "float16"])
    parser.add_argument("--compile", action="store_true",
                        help="also time the compiled decode step (charlm sample --compile)")
    args = parser.parse_args()
    cfg = load_config(args.config)
    torch.manual_seed(0)
    model = GPT(cfg.model, len(VOCAB)).eval()
    base = copy.deepcopy(model)  # stays float32: the float32 ceiling is timed in every round
    for name in args.dtypes:
        model.to(DTYPES[name])
        runners = {"float32_ceiling": ceiling(base), "ceiling": ceiling(model),
                   "charlm": charlm_decode(model, args.tokens),
                   "transformers": transformers_decode(model, cfg, args.tokens)}
        if args.compile:
            runners["charlm_compiled"] = charlm_decode(model, args.tokens, compile=True)
        rates = rounds(runners, args.repeat)
        compiled = ["charlm_compiled"] if args.compile else []
        print(json.dumps({
            "machine": machine_facts(), "config": args.config.name, "tokens": args.tokens,
            "dtype": name, "rounds": args.repeat,
            **{f"{key}_tokens_per_s": round(max(r), 1) for key, r in rates.items()},
            **{f"{key}_vs_{yardstick}": round(ratio(rates, key, yardstick), 3)
               for key in ["charlm", *compiled]
               for yardstick in ("float32_ceiling", "ceiling", "transformers")},
        }), flush=True)


if __name__ == "__main__":
    run_script(main)

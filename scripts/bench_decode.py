"""Batch-1 greedy decode of a GPT-2-shaped model against two yardsticks, in one process: the
weight-streaming ceiling (one pass of matrix-vector products over the model's weight matrices,
in the order a decode step reads them) and Hugging Face transformers' `generate` with its KV
cache on the same weights (exported as `charlm export --format hf` does).

    python scripts/bench_decode.py [CONFIG] [--tokens 250] [--repeat 3]
                                   [--dtypes float32 bfloat16 float16] [--compile]

Random weights (vocab 65), eager, greedy, the best of --repeat runs of each. For each of
--dtypes, the weights of all three are cast to it (`charlm sample --dtype`, transformers'
`.to(dtype)`), and the float32 ceiling stays the yardstick. Prints one JSON line per dtype:
the machine's facts, tokens/s of charlm, of transformers, of that dtype's ceiling (by
F.linear, and by charlm's own `Linear`) and of the float32 one, and charlm's ratios.
Bounded: about 3 x --repeat generations of --tokens tokens per dtype. --compile also times
`charlm sample --compile` (the decode step compiled; the compile, in the warm-up, not counted).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import machine_facts, positive, run_script, summary

from charlm.config import load_config
from charlm.device import DTYPES
from charlm.export import save_hf
from charlm.generate import generate
from charlm.model import GPT
from charlm.sample_config import SampleConfig
from charlm.vocab import Vocab

ROOT = Path(__file__).resolve().parents[1]
VOCAB = Vocab([chr(c) for c in range(32, 97)])  # 65 characters, as tiny-shakespeare has


def best_rate(run, tokens: int, repeat: int) -> float:
    """Tokens/s of the fastest of `repeat` calls of run() (after one warm-up call)."""
    run()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return tokens / min(times)


@torch.inference_mode()
def ceiling(model: GPT, repeat: int, own: bool = False) -> float:
    """Passes per second of one matrix-vector product with each weight matrix of a decode step:
    what a decoder that did nothing else would reach, bound by memory bandwidth. By F.linear
    (the yardstick issue 19 set), or with own=True by charlm's `Linear` layers themselves,
    whose one-row float32 product runs on every thread (`layers.split_product`)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, m.weight.shape[1], dtype=m.weight.dtype) for m in linears]

    def one_pass() -> None:
        for m, x in zip(linears, inputs, strict=True):
            m(x) if own else F.linear(x, m.weight)

    return best_rate(lambda: [one_pass() for _ in range(20)], 20, repeat)


def charlm_rate(model: GPT, tokens: int, repeat: int, compile: bool = False) -> float:
    opts = SampleConfig(temperature=0, compile=compile)

    def run() -> None:
        prompt = torch.zeros(1, 1, dtype=torch.long)
        for ids in generate(model, prompt, tokens, opts):
            ids.tolist()  # as streaming does

    return best_rate(run, tokens, repeat)


def transformers_rate(model: GPT, cfg, tokens: int, repeat: int) -> float:
    from transformers import GPT2LMHeadModel

    with tempfile.TemporaryDirectory() as tmp:  # saved in float32, the weights rounded alike
        save_hf(copy.deepcopy(model).float(), VOCAB, cfg, Path(tmp))
        hf = GPT2LMHeadModel.from_pretrained(tmp).eval().to(model.wte.weight.dtype)
    prompt = torch.zeros(1, 1, dtype=torch.long)

    @torch.inference_mode()
    def run() -> None:
        hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                    max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0)

    return best_rate(run, tokens, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("config", nargs="?", type=Path,
                        default=ROOT / "configs" / "shakespeare_char.yaml")
    parser.add_argument("--tokens", type=positive(int), default=250)
    parser.add_argument("--repeat", type=positive(int), default=3)
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES),
                        default=["float32", "bfloat16", "float16"])
    parser.add_argument("--compile", action="store_true",
                        help="also time the compiled decode step (charlm sample --compile)")
    args = parser.parse_args()
    cfg = load_config(args.config)
    torch.manual_seed(0)
    model = GPT(cfg.model, len(VOCAB)).eval()
    base = ceiling(model, args.repeat)
    for name in args.dtypes:
        model.to(DTYPES[name])
        rates = {"ceiling": ceiling(model, args.repeat),
                 "own_ceiling": ceiling(model, args.repeat, own=True),
                 "charlm": charlm_rate(model, args.tokens, args.repeat),
                 "transformers": transformers_rate(model, cfg, args.tokens, args.repeat)}
        if args.compile:
            rates["charlm_compiled"] = charlm_rate(model, args.tokens, args.repeat, compile=True)
        print(json.dumps({
            "machine": machine_facts(), "config": args.config.name, "tokens": args.tokens,
            "dtype": name, "float32_ceiling_tokens_per_s": round(base, 1),
            **{f"{key}_tokens_per_s": round(rate, 1) for key, rate in rates.items()},
            "charlm_vs_float32_ceiling": round(rates["charlm"] / base, 3),
            "charlm_vs_ceiling": round(rates["charlm"] / rates["ceiling"], 3),
            "charlm_vs_own_ceiling": round(rates["charlm"] / rates["own_ceiling"], 3),
            "charlm_vs_transformers": round(rates["charlm"] / rates["transformers"], 2),
            **({"charlm_compiled_vs_ceiling": round(rates["charlm_compiled"] / rates["ceiling"], 3),
                "charlm_compiled_vs_transformers": round(
                    rates["charlm_compiled"] / rates["transformers"], 2)} if args.compile else {}),
        }), flush=True)


if __name__ == "__main__":
    run_script(main)

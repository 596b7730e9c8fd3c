"""Batch-1 greedy decode on the same weights: charlm eager, charlm with the compiled decode step
(`charlm sample --compile`) and Hugging Face transformers' `generate` (greedy, use_cache=True) on
the model as `charlm export --format hf` writes it, with the weight-streaming ceiling for scale.

    python scripts/bench_decode.py [CONFIG] [--run RUN] [--set KEY=VALUE ...] [--tokens N]
                                   [--repeat 5] [--dtypes float32 bfloat16 float16]
                                   [--no-compile]

The model is a trained run's (--run: a run dir, checkpoint or export; weights do not matter for
speed, a run of a few steps will do) or CONFIG's with random weights (default: the baby GPT,
configs/shakespeare_char.yaml, vocab 65). Each measure decodes --tokens tokens (default: the
most transformers' GPT-2 takes after a one-token prompt, block_size - 1) once as a warm-up,
then --repeat rounds time every measure once, in turn (eager, compiled, transformers,
ceiling, eager, ...): the machine's speed drifts and on a shared host jumps, so a ratio is
taken within a round and the medians over the rounds are reported. The compile (the first
compiled step, which builds the graph) is timed apart and not counted; torch's compile cache
(TORCHINDUCTOR_CACHE_DIR) makes a later process's compile shorter, so point it at an empty
directory for a cold figure. Prints the machine's facts and the figures as one JSON line per
dtype; `run_decode` returns them as a dict, for a harness.
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
from typing import Any

import torch
import torch.nn.functional as F
from common import machine_facts, positive, run_script, summary

from charlm.api import load
from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab
from charlm.export import save_hf
from charlm.generation.decoding import CachedDecoder, generate
from charlm.model.gpt import GPT
from charlm.runtime.precision import DTYPES

ROOT = Path(__file__).resolve().parents[1]
VOCAB = Vocab([chr(c) for c in range(32, 97)])  # 65 characters, as tiny-shakespeare has

Runner = Callable[[], Any]


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


def ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    """The median over the rounds of a's rate over b's in the same round."""
    return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))


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
    """Greedy decoding as `charlm sample` does it, each step's ids read on the host as
    streaming reads them; the call returns the ids."""
    opts = SampleConfig(temperature=0, compile=compile)

    def run() -> list[int]:
        prompt = torch.zeros(1, 1, dtype=torch.long)
        return [ids.item() for ids in generate(model, prompt, tokens, opts)]

    return run, tokens


def transformers_decode(model: GPT, vocab: Vocab, cfg: RunConfig,
                        tokens: int) -> tuple[Runner, int]:
    """transformers' GPT-2 `generate`, greedy with its KV cache, on the directory `charlm
    export --format hf` writes (`save_hf`) for the same weights; the call returns the ids."""
    from transformers import GPT2LMHeadModel

    with tempfile.TemporaryDirectory() as tmp:  # saved in float32, the weights rounded alike
        save_hf(copy.deepcopy(model).float(), vocab, cfg, Path(tmp))
        hf = GPT2LMHeadModel.from_pretrained(tmp).eval().to(model.wte.weight.dtype)
    prompt = torch.zeros(1, 1, dtype=torch.long)

    @torch.inference_mode()
    def run() -> list[int]:
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                          use_cache=True, max_new_tokens=tokens, min_new_tokens=tokens,
                          pad_token_id=0)
        return out[0, 1:].tolist()

    return run, tokens


def compile_seconds(model: GPT) -> float | None:
    """The wall time of the first compiled decode step at batch 1, which builds its graph (the
    time `charlm sample --compile` prints), or None where the graph cannot be built."""
    with torch.inference_mode():
        decoder = CachedDecoder(model, 1, compile=True)
        decoder.prefill(torch.zeros(1, 1, dtype=torch.long))
        start = time.perf_counter()
        decoder.step(torch.zeros(1, dtype=torch.long))
        seconds = time.perf_counter() - start
    return None if decoder.compiled is None else seconds


def run_decode(model: GPT, vocab: Vocab, cfg: RunConfig, tokens: int, repeat: int = 5,
               compile: bool = True) -> dict[str, Any]:
    """The figures of one model in its current dtype: median tokens/s of each measure over
    `repeat` interleaved rounds (with the range), the medians of the paired ratios, the
    compile's seconds, and whether the compiled step and transformers decode the tokens eager
    charlm does."""
    if tokens + 1 > cfg.model.block_size:
        raise CharlmError(f"--tokens {tokens} does not fit transformers' GPT-2 of "
                          f"{cfg.model.block_size} positions after a one-token prompt: give at "
                          f"most {cfg.model.block_size - 1}, or a larger model.block_size")
    model.eval()
    built = compile_seconds(model) if compile else None
    runners = {"eager": charlm_decode(model, tokens)}
    if built is not None:
        runners["compiled"] = charlm_decode(model, tokens, compile=True)
    runners["transformers"] = transformers_decode(model, vocab, cfg, tokens)
    runners["ceiling"] = ceiling(model)
    same = {name: runners[name][0]() for name in ("eager", "compiled", "transformers")
            if name in runners}
    rates = rounds(runners, repeat)
    figures: dict[str, Any] = {
        "dtype": str(model.wte.weight.dtype).removeprefix("torch."), "tokens": tokens,
        "rounds": repeat, "compile_s": None if built is None else round(built, 2)}
    for name, r in rates.items():
        figures[f"{name}_tokens_per_s"] = round(statistics.median(r), 1)
        figures[f"{name}_tokens_per_s_range"] = [round(min(r), 1), round(max(r), 1)]
    for a, b in [("eager", "transformers"), ("compiled", "transformers"), ("compiled", "eager"),
                 ("eager", "ceiling"), ("compiled", "ceiling")]:
        if a in rates:
            figures[f"{a}_vs_{b}"] = round(ratio(rates, a, b), 3)
    for name in ("compiled", "transformers"):
        if name in same:
            figures[f"{name}_tokens_match_eager"] = same[name] == same["eager"]
    return figures


def load_model(config: Path, run: Path | None, overrides: list[str]
               ) -> tuple[GPT, Vocab, RunConfig, str]:
    """A trained run's model (float32, CPU), or `config`'s with seeded random weights; and a
    name for the report."""
    if run is not None:
        lm = load(run, "cpu")
        if not isinstance(lm.model, GPT):
            raise CharlmError(f"{run} is an encoder-decoder; this benchmark decodes a GPT")
        return lm.model, lm.vocab, lm.config, str(run)
    cfg = load_config(config, overrides)
    torch.manual_seed(0)
    return GPT(cfg.model, len(VOCAB)), VOCAB, cfg, config.name


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("config", nargs="?", type=Path,
                        default=ROOT / "configs" / "shakespeare_char.yaml")
    parser.add_argument("--run", type=Path, help="a trained run dir, checkpoint or export")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override CONFIG (random weights only)")
    parser.add_argument("--tokens", type=positive(int),
                        help="new tokens per decode [default: block_size - 1]")
    parser.add_argument("--repeat", type=positive(int), default=5)
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32"])
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave out the compiled decode step")
    args = parser.parse_args()
    if args.run is not None and args.overrides:
        raise CharlmError("--set applies to CONFIG's random-weight model, not to --run")
    model, vocab, cfg, name = load_model(args.config, args.run, args.overrides)
    tokens = args.tokens or cfg.model.block_size - 1
    for dtype in args.dtypes:
        figures = run_decode(model.to(DTYPES[dtype]), vocab, cfg, tokens, args.repeat,
                             args.compile)
        print(json.dumps({"machine": machine_facts(), "model": name, **figures}), flush=True)


if __name__ == "__main__":
    run_script(main)

"""`bench.py decode`: tokens per second of greedy decoding from random weights (vocab 65), by
variant, for each config, dtype and batch, in interleaved rounds after one warm-up call of each.

Variants (--variants, timed in the order given; each is compared with the ones before it, so
put the yardsticks first):

- `cached`: charlm's decode with its KV cache, as `charlm sample` runs it.
- `uncached`: the same without the cache (`--no-cache`): the whole window every token.
- `compiled`: `cached` with the one-token step compiled (`--compile`; compiled in the warm-up).
- `aoti`: `compiled` with the step built by AOTInductor instead of `torch.compile` (exported by
  `torch.export`, compiled ahead of time into a package of its own per batch, weights inside,
  and run with no Python between kernels: a trial, not a path of charlm's).
- `ceiling`: the weight-streaming ceiling: 20 passes of one matrix-vector product (a row per
  batch row) with each weight matrix of a decode step, by `F.linear`, in the order a step reads
  them; `tokens_per_s` is passes per second. `own_ceiling`: the same through charlm's `Linear`
  (split over the threads as `charlm sample` splits them, `LM.decoding_model`).
  `float32_ceiling`: `ceiling` on the float32 weights whatever the dtype.
- `transformers`: Hugging Face transformers' `generate` with its KV cache on the same weights,
  exported as `charlm export --format hf` does (the `hf` extra; GPT-2-shaped configs only).
- `onnxruntime`: `charlm.onnx` (ONNX Runtime and numpy) on the same weights, exported as
  `charlm export --format onnx` does (the `onnx` extra; float32).

A decode stops after --seconds (at least one token) and is timed over the tokens it made
(`tokens`): that flatters it, early tokens seeing a shorter context. `same_tokens`: whether a
variant decoded the tokens of the first token-making variant of its round (over the tokens both
made). Each variant is a function of a `Case` returning a runner (`MEASURES`), so a new
yardstick is one more entry."""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from common import positive

from benchlib.harness import ROOT, Bench, Runner, interleave
from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab
from charlm.export import save_hf
from charlm.generation import compiled_step
from charlm.generation.compiled_step import decode_one_token
from charlm.generation.decoding import generate
from charlm.model.attention import KVCache
from charlm.model.gpt import GPT
from charlm.model.layers import lay_out_for_decoding
from charlm.runtime.precision import DTYPES
from charlm.runtime.profile import layout_for

VOCAB = Vocab([chr(c) for c in range(32, 97)])  # 65 characters, as tiny-shakespeare has
PASSES = 20  # matrix-vector passes a ceiling's call makes


@dataclass
class Case:
    """What a runner decodes: the model in the case's dtype, its float32 original, the config,
    the batch, the tokens to decode and the time limit of one decode."""
    model: GPT
    base: GPT
    cfg: RunConfig
    batch: int
    tokens: int
    seconds: float


def decoder(case: Case, use_cache: bool = True, compile: bool = False) -> Runner:
    """charlm's greedy decode of `case` (`compile`: the one-token step compiled; the build,
    in the warm-up, says on stderr how long it took)."""
    opts = SampleConfig(temperature=0, use_cache=use_cache, compile=compile)

    def run() -> dict:
        prompt = torch.zeros(case.batch, 1, dtype=torch.long)
        ids = []
        t0 = time.perf_counter()
        for step in generate(case.model, prompt, case.tokens, opts):
            ids.append(step.tolist())  # to the host each step, as streaming does
            if time.perf_counter() - t0 > case.seconds:
                break
        seconds = time.perf_counter() - t0
        return {"tokens": len(ids), "seconds": round(seconds, 4),
                "tokens_per_s": round(len(ids) * case.batch / seconds, 1), "ids": ids}

    return run


class _Step(torch.nn.Module):
    """`decode_one_token` over a cache made of its inputs, which it writes in place."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, pos: torch.Tensor, last_ids: torch.Tensor,
                k: tuple[torch.Tensor, ...], v: tuple[torch.Tensor, ...]) -> torch.Tensor:
        cache = KVCache.__new__(KVCache)
        cache.k, cache.v, cache.pos, cache.last_ids = list(k), list(v), pos, last_ids
        cache.max_len = self.model.cfg.block_size
        return decode_one_token(self.model, idx, cache)


def aoti(case: Case) -> Runner:
    """`decoder(case, compile=True)` with the step of an AOTInductor package."""
    packages: dict[int, Callable] = {}
    built: set[tuple] = set()  # compiled_step.BUILT for this variant's graphs

    def step(model: GPT, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        args = (idx, cache.pos, cache.last_ids, tuple(cache.k), tuple(cache.v))
        if idx.size(0) not in packages:
            program = torch.export.export(_Step(model), args)
            path = torch._inductor.aoti_compile_and_package(program)
            packages[idx.size(0)] = torch._inductor.aoti_load_package(path)
        return packages[idx.size(0)](*args)

    run = decoder(case, compile=True)

    def run_aoti() -> dict:
        with mock.patch.object(compiled_step, "compiled_decode_step", lambda: step), \
                mock.patch.object(compiled_step, "BUILT", built):
            return run()

    return run_aoti


def ceiling(case: Case, own: bool = False, float32: bool = False) -> Runner:
    """PASSES passes of one product with each weight matrix of a decode step."""
    model = case.base if float32 else case.model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(case.batch, m.weight.shape[1], dtype=m.weight.dtype) for m in linears]

    @torch.inference_mode()
    def run() -> dict:
        t0 = time.perf_counter()
        for _ in range(PASSES):
            for m, x in zip(linears, inputs, strict=True):
                m(x) if own else F.linear(x, m.weight)
        seconds = time.perf_counter() - t0
        return {"tokens": PASSES, "seconds": round(seconds, 4),
                "tokens_per_s": round(PASSES * case.batch / seconds, 1), "ids": None}

    return run


def transformers_decode(case: Case) -> Runner:
    """transformers' greedy `generate` of `case.tokens` tokens on the model's weights."""
    from transformers import GPT2LMHeadModel  # the hf extra, for this variant only

    with tempfile.TemporaryDirectory() as tmp:  # saved in float32, the weights rounded alike
        save_hf(copy.deepcopy(case.model).float(), VOCAB, case.cfg, Path(tmp))
        hf = GPT2LMHeadModel.from_pretrained(tmp).eval().to(case.model.wte.weight.dtype)

    @torch.inference_mode()
    def run() -> dict:
        prompt = torch.zeros(case.batch, 1, dtype=torch.long)
        t0 = time.perf_counter()
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                          max_new_tokens=case.tokens, min_new_tokens=case.tokens,
                          pad_token_id=0)
        seconds = time.perf_counter() - t0
        return {"tokens": case.tokens, "seconds": round(seconds, 4),
                "tokens_per_s": round(case.tokens * case.batch / seconds, 1),
                "ids": out[:, 1:].T.tolist()}

    return run


def onnx_decode(case: Case) -> Runner:
    """charlm.onnx's greedy decode of `case` on the model's weights, exported to ONNX."""
    from charlm.onnx import OnnxLM
    from charlm.onnx_export import save_onnx

    if case.model.wte.weight.dtype != torch.float32:
        raise CharlmError("the onnxruntime variant decodes float32 weights: give --dtypes float32")
    tmp = tempfile.mkdtemp()  # the sessions read the files as they load; removed with /tmp
    save_onnx(case.model, VOCAB, case.cfg, Path(tmp))
    lm = OnnxLM(tmp, threads=torch.get_num_threads())

    def run() -> dict:
        t0 = time.perf_counter()
        rows = lm.generate_ids([[0]] * case.batch, case.tokens, temperature=0)
        seconds = time.perf_counter() - t0
        return {"tokens": case.tokens, "seconds": round(seconds, 4),
                "tokens_per_s": round(case.tokens * case.batch / seconds, 1),
                "ids": [list(step) for step in zip(*rows, strict=True)]}

    return run


MEASURES: dict[str, Callable[[Case], Runner]] = {
    "cached": decoder,
    "uncached": lambda case: decoder(case, use_cache=False),
    "compiled": lambda case: decoder(case, compile=True),
    "aoti": aoti,
    "ceiling": ceiling,
    "own_ceiling": lambda case: ceiling(case, own=True),
    "float32_ceiling": lambda case: ceiling(case, float32=True),
    "transformers": transformers_decode,
    "onnxruntime": onnx_decode,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", nargs="+", type=Path,
                        default=[ROOT / "configs" / "shakespeare_char.yaml"],
                        help="model shapes to decode (default: the baby GPT)")
    parser.add_argument("--variants", nargs="+", choices=list(MEASURES),
                        default=["ceiling", "cached"], metavar="VARIANT",
                        help=f"what to time, in this order: {', '.join(MEASURES)} "
                        "(default: ceiling cached)")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32"],
                        help="the weights' dtype (charlm sample --dtype; default float32)")
    parser.add_argument("--batches", nargs="+", type=positive(int), default=[1])
    parser.add_argument("--tokens", type=positive(int), default=250,
                        help="new tokens a decode makes (default 250)")
    parser.add_argument("--seconds", type=positive(float), default=60.0,
                        help="stop a decode after this many seconds (default 60)")


def figures(args: argparse.Namespace) -> Iterator[dict]:
    """The decode figures of `args`; the configs are read now, the decoding done as iterated."""
    cfgs = [(path, load_config(path)) for path in args.configs]
    for path, cfg in cfgs:
        if "transformers" in args.variants and args.tokens >= cfg.model.block_size:
            raise CharlmError(f"{path}: transformers' GPT-2 decodes no further than its "
                              f"block_size ({cfg.model.block_size}) where charlm slides its "
                              f"window; give --tokens {cfg.model.block_size - 1} or fewer")
    return measure(cfgs, args)


def measure(cfgs: list[tuple[Path, RunConfig]], args: argparse.Namespace) -> Iterator[dict]:
    first = args.variants[0]
    for path, cfg in cfgs:
        torch.manual_seed(0)
        base = GPT(cfg.model, len(VOCAB)).eval()
        split = layout_for(base, column_major=False).split_parts  # as `charlm sample` decides
        for dtype in args.dtypes:
            model = copy.deepcopy(base).to(DTYPES[dtype])
            lay_out_for_decoding(model, split, column_major=False)  # float32 weights only
            for batch in args.batches:
                case = Case(model, base, cfg, batch, args.tokens, args.seconds)
                runners = {name: MEASURES[name](case) for name in args.variants}
                reference = None
                for figure in interleave(runners, args.rounds, warmup=1):
                    ids = figure.pop("ids")
                    if figure["variant"] == first:
                        reference = None
                    if ids is not None:
                        reference = ids if reference is None else reference
                        n = min(len(ids), len(reference))
                        figure["same_tokens"] = ids[:n] == reference[:n]
                    yield {"config": path.name, "dtype": dtype, "batch": batch, **figure}


BENCH = Bench("decode", __doc__, add_arguments, figures, case=("config", "dtype", "batch"),
              metric="tokens_per_s", rounds=5)

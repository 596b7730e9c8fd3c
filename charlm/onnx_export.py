"""`charlm export --format onnx`: a GPT's own forward over a `KVCache` as two ONNX graphs that
`charlm.onnx` runs without torch: prefill (one prompt) and decode (one id a row at each row's
own position), with what generating needs beside them (`charlm-onnx.json`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.vocab import Vocab
from charlm.generation.decoding import refill_length
from charlm.generation.utf8 import vocab_transitions
from charlm.model.attention import KVCache
from charlm.model.gpt import GPT

PREFILL, DECODE, META = "prefill.onnx", "decode.onnx", "charlm-onnx.json"
ONNX_FILES = (PREFILL, DECODE, META)
OPSET = 18


class _Graph(torch.nn.Module):
    """The GPT's forward over copies of the graph's input caches, returning them written."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model
        self.layers = model.cfg.n_layer

    def run(self, idx: torch.Tensor, pos: Any, last_ids: torch.Tensor,
            kv: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        cache = KVCache.__new__(KVCache)
        cache.k = [k.clone() for k in kv[:self.layers]]
        cache.v = [v.clone() for v in kv[self.layers:]]
        cache.max_len, cache.pos, cache.last_ids = self.model.cfg.block_size, pos, last_ids.clone()
        logits = self.model(idx, cache=cache)[0][:, -1, :].float()
        return (logits, cache.last_ids, *cache.k, *cache.v)


class _Prefill(_Graph):
    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg = self.model.cfg
        shape = (1, cfg.n_head, cfg.block_size, cfg.head_dim)
        kv = tuple(torch.zeros(shape) for _ in range(2 * self.layers))
        return self.run(idx, 0, torch.zeros(1, dtype=torch.long), kv)


class _Decode(_Graph):
    def forward(self, idx: torch.Tensor, pos: torch.Tensor, last_ids: torch.Tensor,
                kv: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return self.run(idx, pos.clone(), last_ids, kv)


def save_onnx(model: GPT, vocab: Vocab, cfg: RunConfig, out: Path) -> None:
    """Write the two graphs, checked by `onnx.checker`, and charlm-onnx.json into `out`."""
    if cfg.model.arch != "decoder":
        raise CharlmError("--format onnx: an encoder-decoder is not exported to ONNX yet; export "
                          "it as safetensors (--format safetensors)")
    try:
        import onnx
        import onnxscript  # noqa: F401 - torch's dynamo exporter needs it
    except ImportError as e:
        raise CharlmError(f"--format onnx needs the onnx extra ({e.name} is missing): pip "
                          "install 'charlm[onnx]'") from None
    model = model.float().eval()
    m = cfg.model
    layers = m.n_layer
    names = [f"{kind}_{i}" for kind in ("key", "value") for i in range(layers)]
    outputs = ["logits", "new_last_ids", *[f"new_{n}" for n in names]]
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=m.block_size)
    caches = tuple(torch.zeros(2, m.n_head, m.block_size, m.head_dim)  # distinct: not aliased
                   for _ in range(2 * layers))
    ids2 = torch.zeros(2, dtype=torch.long)
    graphs = (
        (PREFILL, _Prefill(model), (torch.zeros(1, 2, dtype=torch.long),), ["ids"],
         ({1: length},)),
        (DECODE, _Decode(model), (ids2[:, None], ids2.clone(), ids2.clone(), caches),
         ["ids", "pos", "last_ids", *names],
         ({0: batch}, {0: batch}, {0: batch}, ({0: batch},) * (2 * layers))),
    )
    with torch.no_grad():
        for name, graph, args, inputs, dynamic in graphs:
            program = torch.onnx.export(graph, args, dynamo=True, dynamic_shapes=dynamic,
                                        input_names=inputs, output_names=outputs,
                                        opset_version=OPSET, verbose=False)
            program.save(str(out / name))
            onnx.checker.check_model(str(out / name), full_check=True)
    meta = {"format": "charlm-onnx", "version": 1,
            "vocab": {"units": vocab.units, "chars": list(vocab.chars),
                      "normalize": vocab.normalize},
            "block_size": m.block_size, "n_layer": layers, "n_head": m.n_head,
            "head_dim": m.head_dim, "keep": refill_length(m.block_size),
            "inputs": names, "outputs": outputs,
            "utf8_next": vocab_transitions(vocab).tolist() if vocab.units == "byte" else None}
    (out / META).write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n",
                            encoding="utf-8")

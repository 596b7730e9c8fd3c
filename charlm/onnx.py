"""A GPT exported by `charlm export --format onnx`, run by ONNX Runtime with numpy alone (no
torch, no other part of charlm): `OnnxLM(path).generate(prompt, ...)`. It decodes as `charlm
sample` does, but samples from numpy's generator: a seed repeats its text here, not torch's."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import onnxruntime as ort

PREFILL, DECODE, META = "prefill.onnx", "decode.onnx", "charlm-onnx.json"


class OnnxLM:
    """The two graphs of an ONNX export and its vocabulary."""

    def __init__(self, path: str | Path, threads: int | None = None):
        path = Path(path)
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        if meta.get("format") != "charlm-onnx" or meta.get("version") != 1:
            raise ValueError(f"{path / META} is not a charlm ONNX export (version 1)")
        vocab = meta["vocab"]
        self.chars, self.units, self.normalize = vocab["chars"], vocab["units"], vocab["normalize"]
        self.ids = {c: i for i, c in enumerate(self.chars)}
        self.block, self.keep, self.inputs = meta["block_size"], meta["keep"], meta["inputs"]
        self.utf8 = np.array(meta["utf8_next"]) if meta.get("utf8_next") else None
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.prefill_graph, self.decode_graph = (
            ort.InferenceSession(str(path / name), options, providers=["CPUExecutionProvider"])
            for name in (PREFILL, DECODE))

    def encode(self, text: str) -> list[int]:
        """`text` as ids; a ValueError names the characters the vocabulary lacks."""
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        units = [chr(b) for b in text.encode("utf-8")] if self.units == "byte" else text
        missing = sorted(set(units) - self.ids.keys())
        if missing:
            raise ValueError(f"the prompt holds characters the model lacks: {missing[:10]}")
        return [self.ids[u] for u in units]

    def decode(self, ids: list[int]) -> str:
        """Ids as text; a byte model's unfinished last character left out, as charlm's is."""
        text = "".join(self.chars[i] for i in ids)
        return bytes(map(ord, text)).decode("utf-8", "ignore") if self.units == "byte" else text

    def prefill(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """One row's ids (at most block_size) -> its next logits (V,), last id and caches."""
        logits, last, *kv = self.prefill_graph.run(None, {"ids": np.array([ids], np.int64)})
        return logits[0], last, kv

    def generate(self, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None) -> str:
        """`prompt` continued by max_new_tokens tokens; the new text."""
        return self.generate_batch([prompt], max_new_tokens, temperature, top_k, top_p, seed)[0]

    def generate_batch(self, prompts: list[str], max_new_tokens: int = 200,
                       temperature: float = 0.8, top_k: int | None = None,
                       top_p: float | None = None, seed: int | None = None) -> list[str]:
        """Each prompt continued as `generate` does, all rows in one batch."""
        rows = self.generate_ids([self.encode(p) for p in prompts], max_new_tokens,
                                 temperature, top_k, top_p, seed)
        return [self.decode(ids) for ids in rows]

    def generate_ids(self, prompts: list[list[int]], max_new_tokens: int,
                     temperature: float = 0.8, top_k: int | None = None,
                     top_p: float | None = None, seed: int | None = None) -> list[list[int]]:
        """The new ids of each row after its prompt's ids (each at least one), in one batch."""
        rng = np.random.default_rng(seed)
        windows = [list(p[-self.block:]) for p in prompts]  # the ids in each row's cache
        rows = [self.prefill(w) for w in windows]
        logits = np.stack([r[0] for r in rows])
        last = np.concatenate([r[1] for r in rows])
        kv = [np.concatenate(parts) for parts in zip(*(r[2] for r in rows), strict=True)]
        state = np.zeros(len(prompts), np.int64)  # UTF-8 state of a byte model's rows
        out: list[list[int]] = [[] for _ in prompts]
        for n in range(max_new_tokens):
            if self.utf8 is not None:
                logits = np.where(self.utf8[state] >= 0, logits, -np.inf)
            ids = choose(logits, temperature, top_k, top_p, rng)
            if self.utf8 is not None:
                state = self.utf8[state, ids]
            for row, i in enumerate(ids):
                out[row].append(int(i))
            if n + 1 < max_new_tokens:
                logits, last, kv = self.advance(windows, ids, last, kv)
        return out

    def advance(self, windows: list[list[int]], ids: np.ndarray, last: np.ndarray,
                kv: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """One id a row (B,) -> logits (B, V), last ids and caches; a row whose cache is full is
        prefilled again from its window's most recent `keep` ids."""
        pos = np.array([min(len(w), self.block - 1) for w in windows], np.int64)
        full = [row for row, w in enumerate(windows) if len(w) == self.block]
        feeds = {"ids": ids[:, None], "pos": pos, "last_ids": last,
                 **dict(zip(self.inputs, kv, strict=True))}
        logits, new_last, *new_kv = self.decode_graph.run(None, feeds)
        for row, i in enumerate(ids):
            windows[row].append(int(i))
        for row in full:
            windows[row] = windows[row][-self.keep:]
            row_logits, row_last, row_kv = self.prefill(windows[row])
            logits[row], new_last[row] = row_logits, row_last[0]
            for cache, part in zip(new_kv, row_kv, strict=True):
                cache[row] = part[0]
        return logits, new_last, new_kv


def choose(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
           rng: np.random.Generator) -> np.ndarray:
    """The next id per row of logits (B, V): argmax for temperature 0, else a draw from the
    softmax after the temperature, top-k and top-p, in charlm's order."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None:
        order = np.argsort(-probs, axis=-1, kind="stable")
        ranked = np.take_along_axis(probs, order, axis=-1)
        past = np.empty(probs.shape, dtype=bool)  # beyond the smallest set with mass >= top_p
        np.put_along_axis(past, order, np.cumsum(ranked, axis=-1) - ranked >= top_p, axis=-1)
        probs = np.where(past, 0.0, probs)
    return np.array([rng.choice(len(p), p=p / p.sum()) for p in probs])

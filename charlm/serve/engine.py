"""The serving engine (nano-vllm's scheduler): a request is prefilled alone, joins the batch at
once as a row of one `Sampler` and a `Row`, and leaves when it ends, is cancelled or the engine
closes. It decodes a copy of the model laid out for decoding; an encoder-decoder's serves one
request at a time."""

from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from charlm.core.errors import CharlmError, first_line, warn
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab, list_unknown
from charlm.generation.decoding import NonFiniteOutput
from charlm.generation.sampler import Sampler
from charlm.generation.seq2seq import translate_ids
from charlm.generation.slots import SlotDecoder
from charlm.generation.text import StopMatcher
from charlm.generation.utf8 import utf8_mask
from charlm.model.attention import attention_dtype
from charlm.model.encoder_decoder import EncoderDecoder, output_limit
from charlm.model.footprint import cache_bytes
from charlm.model.gpt import GPT
from charlm.model.layers import lay_out_for_decoding
from charlm.runtime.device import require_memory
from charlm.runtime.profile import DecodeLayout, layout_for
from charlm.serve.request import MAX_LOGPROBS, REPETITION_WINDOW, Event, Params, Request, Row

KV_BUDGET = 1 << 30  # bytes of keys and values that `charlm serve`'s default slots fit in


def slots_within(model: GPT | EncoderDecoder, budget: int, most: int) -> int:
    return max(1, min(most, budget // slot_bytes(model)))


def slot_bytes(model: GPT | EncoderDecoder) -> int:
    return cache_bytes(model.cfg, 1, attention_dtype(model.wte.weight).itemsize)


class FieldError(CharlmError):
    """A request refused for a field other than the prompt (the HTTP error's `param`)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Stats:
    slots: int
    busy: int
    queued: int
    batch_size: int  # rows in the last decode step
    characters: int  # generated in all

class Engine:
    """`start` runs the decode thread, `submit` queues a request from any thread, `close` ends
    them all. `layout`: how the copy's products are computed (None: `layout_for` decides)."""

    def __init__(self, model: GPT | EncoderDecoder, vocab: Vocab | PairVocab, *,
                 slots: int = 16, compile: bool = False, layout: DecodeLayout | None = None):
        if slots < 1:
            raise CharlmError(f"the engine needs at least one slot, got {slots}")
        if model.cfg.arch != "encoder_decoder":  # refused before it is allocated, not OOM-killed
            require_memory(slots * slot_bytes(model), model.wte.weight.device,
                           f"{slots:,} slots need about {{gib}} for their keys and values",
                           "give fewer --slots (the default fits them in 1 GiB)")
        self.model = copy.deepcopy(model).eval()
        self.layout = layout_for(self.model) if layout is None else layout
        lay_out_for_decoding(self.model, self.layout.split_parts, self.layout.column_major)
        self.vocab = vocab
        self.encdec = model.cfg.arch == "encoder_decoder"
        # most logprobs a request may ask for, on /v1/models (0: the chosen's only; None: none)
        self.max_logprobs = None if self.encdec else 0 if vocab.units == "byte" else MAX_LOGPROBS
        self.slots = 1 if self.encdec else slots  # an encoder-decoder: one request at a time
        self.device = self.model.wte.weight.device
        self.decoder = None if self.encdec else SlotDecoder(self.model, slots, compile)
        self.sampler = Sampler(REPETITION_WINDOW, self.device, utf8_mask(vocab, 0, self.device)
                               if not self.encdec else None)
        self.rows: list[Row] = []
        self.queue: collections.deque[Request] = collections.deque()
        self.cond = threading.Condition()
        self.closing = False
        self.thread: threading.Thread | None = None
        self.running = False  # whether `run` has started; `stopped` is set once it returns
        self.stopped = threading.Event()
        self.batch_size = 0
        self.characters = 0

    def build(self) -> None:
        if self.decoder is not None:
            with torch.inference_mode():
                self.decoder.build()

    def start(self) -> None:
        self.build()
        self.thread = threading.Thread(target=self.run, name="charlm-engine", daemon=True)
        self.thread.start()

    def submit(self, prompt: str, params: Params, on_event: Callable[[Event], None]) -> Request:
        """Queue a completion of `prompt`; bad input is a one-line CharlmError."""
        request = Request(self._encode(prompt, params), params, on_event, self._wake)
        with self.cond:
            if self.closing:
                raise CharlmError("the engine is shutting down; send the request to another "
                                  "server or after the restart")
            self.queue.append(request)
            self.cond.notify()
        return request

    def _encode(self, prompt: str, params: Params) -> list[int]:
        if self.encdec:
            if params.logprobs is not None:
                raise FieldError("logprobs are not available for an encoder-decoder model; "
                                 "leave logprobs out", "logprobs")
            known = set(self.vocab.source)
            bad = [(i, c) for i, c in enumerate(prompt) if c not in known]
        else:
            prompt = self.vocab.normalized(prompt)  # as the model's data was
            if self.vocab.units == "byte" and params.logprobs:  # a character is several draws
                raise FieldError("top logprobs are per character, and this model draws bytes; "
                                 "ask for logprobs 0 (the chosen characters' logprobs)",
                                 "logprobs")
            bad = self.vocab.unknown(prompt)
        if bad:
            raise CharlmError(f"the prompt has characters outside the model's vocabulary: "
                              f"{list_unknown(bad, 'at position')}; remove them")
        if not prompt:
            raise CharlmError("the prompt is empty; give at least one character the model knows")
        block = self.model.cfg.block_size
        if self.encdec:
            if len(prompt) > block:
                raise CharlmError(f"the prompt (the source) is {len(prompt)} characters, over "
                                  f"the model's block_size {block}; shorten it")
            return self.vocab.encode_source(prompt)
        return self.vocab.encode(self.vocab.tail(prompt, block))  # as `charlm sample` crops

    def stats(self) -> Stats:
        with self.cond:
            return Stats(self.slots, len(self.rows), len(self.queue), self.batch_size,
                         self.characters)

    def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting; end what is in flight or queued ("shutdown"), waiting up to grace_s."""
        with self.cond:
            self.closing = True
            self.cond.notify()
            running = self.running
        if running:
            self.stopped.wait(grace_s)
        else:
            self._shut()

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def _shut(self) -> None:
        with self.cond:
            ending = [row.request for row in self.rows] + list(self.queue)
            self.rows.clear()
            self.queue.clear()
        for request in ending:
            request.finish("shutdown")

    def run(self) -> None:
        """The decode loop, on the calling thread, until `close`. `charlm serve` runs it on the
        main thread: on a CPU torch's products are several times slower on a later one."""
        with self.cond:
            if self.closing:
                return
            self.running = True
        try:
            self._loop()
        finally:
            self.stopped.set()

    @torch.inference_mode()
    def _loop(self) -> None:
        while True:
            with self.cond:
                while not (self.rows or self.queue or self.closing):
                    self.cond.wait()
                if self.closing:
                    break
                admitted = []
                while self.queue and len(self.rows) + len(admitted) < self.slots:
                    admitted.append(self.queue.popleft())
            for i in reversed(range(len(self.rows))):
                if self.rows[i].request.cancelled:
                    self._end(i, "cancelled")
            logits = []  # of the rows that go on, then of those admitted: one draw for all
            try:
                if self.rows and not self.encdec:
                    ids = torch.tensor([row.last for row in self.rows], device=self.device)
                    logits.append(self.decoder.step(ids))
                    self.batch_size = len(self.rows)
            except Exception as e:  # the model failed: end what it decoded, serve the rest
                self._fail_all(e)
            for request in admitted:
                try:
                    if (x := self._admit(request)) is not None:
                        logits.append(x[None])
                except Exception as e:  # its prefill or translation failed: the others go on
                    warn(f"a request failed ({first_line(e)})")
                    request.finish("error", first_line(e))
            if logits:
                try:
                    self._choose(torch.cat(logits))
                except Exception as e:  # sampling failed: end every row
                    self._fail_all(e)
        self._shut()

    def _fail_all(self, e: Exception) -> None:
        warn(f"a decode step failed ({first_line(e)})")
        for i in reversed(range(len(self.rows))):
            self._end(i, "error", first_line(e))

    def _end(self, i: int, reason: str, error: str | None = None) -> None:
        """Row i leaves; the last row takes its place, as in the decoder and sampler."""
        row = self.rows[i]
        self.decoder.remove(i)
        self.sampler.remove(i)
        with self.cond:
            self.rows[i] = self.rows[-1]
            self.rows.pop()
        row.request.finish(reason, error)

    def _admit(self, request: Request) -> torch.Tensor | None:
        """Start `request`: its row's logits (V,) when it joins the batch, else None."""
        if request.cancelled:
            request.finish("cancelled")
        elif request.params.max_tokens <= 0:
            request.finish("length")
        elif self.encdec:
            self._translate(request)
        else:
            logits = self.decoder.add(request.ids)
            self.sampler.add(request.opts, torch.tensor([request.ids], device=self.device),
                             request.generator(self.device))
            with self.cond:
                self.rows.append(Row(request, self.vocab))
            return logits
        return None

    def _choose(self, logits: torch.Tensor) -> None:
        """Every row draws its next id (one batched step); those that ended leave."""
        _, ids, ok, x = self.sampler.step(logits)
        for i, row in enumerate(self.rows):
            if not ok[i]:
                row.error = str(NonFiniteOutput())
                continue
            try:
                row.take(ids[i], x[i:i + 1])
            except Exception as e:  # this row alone ends
                row.error = str(e) if isinstance(e, CharlmError) else first_line(e)
        with self.cond:
            self.characters += len(ids)
        for i in reversed(range(len(self.rows))):
            row = self.rows[i]
            if row.error is not None:
                warn(f"a request failed ({row.error})")
                self._end(i, "error", row.error)
            elif (reason := row.done()) is not None:
                self._end(i, reason)

    def _translate(self, request: Request) -> None:
        """An encoder-decoder's completion, whole: its text in one event."""
        ids, opts = request.ids, request.opts
        src = torch.tensor([ids], device=self.device)
        [out] = translate_ids(self.model, src, opts, generator=request.generator(self.device))
        limit = output_limit(len(ids), self.model.cfg.block_size, opts.max_new_tokens)
        matcher = StopMatcher(opts.stop, include_stop=False)
        text = "".join(matcher.feed(c) for c in self.vocab.decode_target(out)
                       if not matcher.done)
        with self.cond:
            self.characters += len(out)
        if text:  # its tokens are target units, as max_tokens counts them (phonemes, say)
            request.send(Event(text, tokens=len(self.vocab.units(text))))
        request.finish("stop" if matcher.done or len(out) < limit else "length")

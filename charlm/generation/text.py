"""The text layer of generation: prompts, stop strings, and `sample_text`, which turns a prompt
into samples and streams their text as it becomes final."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError, Setting, SettingError, characters
from charlm.data.vocab import Vocab, list_unknown, unit_name
from charlm.generation.decoding import beam_search, generate
from charlm.generation.utf8 import utf8_mask
from charlm.model.attention import attention_dtype
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.footprint import sampling_bytes
from charlm.model.gpt import GPT
from charlm.runtime.device import require_memory


class StopMatcher:
    """One sample's text, held back while it may start a stop string: `feed` returns what is safe
    to show, `done` is set once the text ends with one (cut off unless `include_stop`). KMP: each
    stop keeps how much of it the text ends with, so a character costs about one step a stop."""

    def __init__(self, stops: Sequence[str], include_stop: bool):
        # longest first: of stops that end together ("ab" and "b") the longest is cut
        self.stops = sorted(stops, key=len, reverse=True)
        self.fail = [failure(s) for s in self.stops]
        self.matched = [0] * len(self.stops)  # of each stop, the prefix the text ends with
        self.include_stop = include_stop
        self.pending = ""
        self.done = False

    def feed(self, piece: str) -> str:
        for c in piece:
            self.pending += c
            for k, s in enumerate(self.stops):
                n, fail = self.matched[k], self.fail[k]
                while n and s[n] != c:
                    n = fail[n - 1]
                self.matched[k] = n = n + (s[n] == c)
                if n == len(s):  # the longest stop ending here comes first
                    self.done = True
                    out = self.pending if self.include_stop else self.pending[: -len(s)]
                    self.pending = ""
                    return out
        cut = len(self.pending) - max(self.matched, default=0)  # what may start a stop stays
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def failure(s: str) -> list[int]:
    """KMP's failure function: for each s[:i + 1], its longest proper prefix that ends it."""
    fail, n = [0] * len(s), 0
    for i in range(1, len(s)):
        while n and s[i] != s[n]:
            n = fail[n - 1]
        n += s[i] == s[n]
        fail[i] = n
    return fail


@dataclass
class Sample:
    prompt: str  # the prompt as given (after --unknown skip); the model saw its tail
    text: str  # the generated text, without the prompt
    tokens: int  # characters generated (stop string included)
    seconds: float  # from the start of the call until this sample finished
    stopped: bool  # ended by a stop string, not by max_new_tokens


def default_prompt(vocab: Vocab) -> str:
    """A newline, or where the model never saw one, the vocabulary's first whole character."""
    if not vocab.unknown("\n"):
        return "\n"
    return next((c for c in vocab.chars if not vocab.unknown(c)), vocab.chars[0])


def encode_prompt(vocab: Vocab, prompt: str, unknown: str,
                  block_size: int) -> tuple[str, list[int], list[str]]:
    """(prompt as used, the ids the model sees, warnings): normalized as the data was, unknown
    characters an error or dropped (`unknown='skip'`), the ids the tail that fits the context."""
    warnings = []
    prompt = vocab.normalized(prompt)
    bad = vocab.unknown(prompt)
    if bad:
        listed = list_unknown(bad, "at position")
        if unknown == "error":
            raise CharlmError(
                f"prompt has characters outside the model's vocabulary: {listed}; "
                "remove them or pass --unknown skip"
            )
        drop = {i for i, _ in bad}
        prompt = "".join(c for i, c in enumerate(prompt) if i not in drop)
        warnings.append(f"skipped {characters(len(bad))} of the prompt outside the vocabulary: "
                        f"{listed}")
    if not prompt:
        raise CharlmError("the prompt is empty; give at least one character the model knows")
    ids = vocab.encode(prompt)
    if len(ids) > block_size:
        warnings.append(f"the prompt has {len(ids)} {unit_name(vocab.units)}s, more than the "
                        f"context of {block_size}; using its last {block_size}")
        ids = vocab.encode(vocab.tail(prompt, block_size))
    return prompt, ids, warnings


def require_cache_memory(model: GPT | EncoderDecoder, opts: SampleConfig,
                         sources: int = 1) -> None:
    """Refuse decoding opts' beams or samples for each of `sources` sources (an
    encoder-decoder's batch) when their caches and a forward exceed the device's memory."""
    setting = "num_samples" if opts.beams is None else "beams"
    value = getattr(opts, setting)
    weight = model.wte.weight
    encdec = model.cfg.arch == "encoder_decoder"
    vocab = model.target_vocab_size if encdec else model.vocab_size
    need = sampling_bytes(model.cfg, vocab, value * sources, attention_dtype(weight).itemsize)
    head = f"{{setting}} {value:,}" if value > 1 else "one output"
    if sources > 1:
        head += f" for each of {sources:,} sources decoded together"
    held = ("the decoder's keys and values, the sources' cross-attention keys and values"
            if encdec else "the keys and values of the context")
    require_memory(need, weight.device, f"{head} needs about {{gib}} for {held} and a "
                   "forward's activations",
                   "use a smaller {setting}" if value > 1 else "use a device with more memory",
                   setting)


def sample_text(model: GPT, vocab: Vocab, prompt: str, opts: SampleConfig,
                on_text: Callable[[int, str], None] | None = None,
                stop: Callable[[], bool] | None = None) -> list[Sample]:
    """opts.num_samples continuations of `prompt` (checked by `encode_prompt`) as one batch, or
    the best beam with opts.beams. on_text(sample index, text) gets each piece of text once it
    is final. Sampling ends early once stop() says so (asked after every token)."""
    if opts.beams is not None and opts.num_samples != 1:  # an encoder-decoder's give an n-best
        beams = Setting("beams")
        raise SettingError(beams, " returns the single best sequence; use ",
                           Setting("num_samples"), " 1 with ", beams)
    require_cache_memory(model, opts)
    device = model.wte.weight.device
    # the model sees the tail that fits its context (whole characters); the prompt stays whole
    ids = torch.tensor([vocab.encode(vocab.tail(prompt, model.cfg.block_size))], device=device)
    t0 = time.perf_counter()
    emit = on_text or (lambda i, s: None)
    if opts.beams is not None:
        return [best_beam(model, vocab, prompt, ids, opts, emit, t0)]

    K = opts.num_samples
    generator = torch.Generator(device=device).manual_seed(opts.seed)
    drafts = [Draft(vocab, opts, t0) for _ in range(K)]
    steps = generate(model, ids.expand(K, -1), opts.max_new_tokens, opts, generator,
                     utf8_mask(vocab, K, device))
    for step_ids in steps:
        for i, token in enumerate(step_ids.tolist()):
            if not drafts[i].done and (piece := drafts[i].feed(token)):
                emit(i, piece)
        if all(d.done for d in drafts) or (stop is not None and stop()):
            steps.close()
            break
    for i, d in enumerate(drafts):
        if rest := d.finish():
            emit(i, rest)
    return [Sample(prompt, d.text, d.count, d.seconds, d.done) for d in drafts]


class Draft:
    """One sample's text as its ids arrive: decoded, stop strings held back, ids counted, timed."""

    def __init__(self, vocab: Vocab, opts: SampleConfig, t0: float):
        self.matcher = StopMatcher(opts.stop, opts.include_stop)
        self.stream = vocab.stream()
        self.t0, self.text, self.count, self.seconds = t0, "", 0, 0.0

    @property
    def done(self) -> bool:
        return self.matcher.done

    def feed(self, token: int) -> str:
        """Take the next id; the text that became final."""
        self.count += 1
        piece = self.matcher.feed(self.stream.feed(token))
        if self.done:
            self.seconds = time.perf_counter() - self.t0
        self.text += piece
        return piece

    def finish(self) -> str:
        """End it: the text held back."""
        rest = self.matcher.flush()
        self.text += rest
        if not self.done:
            self.seconds = time.perf_counter() - self.t0
        return rest


def best_beam(model: GPT, vocab: Vocab, prompt: str, ids: torch.Tensor, opts: SampleConfig,
              emit: Callable[[int, str], None], t0: float) -> Sample:
    """`sample_text`'s best beam, cut at a stop string, emitted whole."""
    stops = [vocab.encode(s) for s in opts.stop if not vocab.unknown(s)]
    best = beam_search(model, ids, opts.max_new_tokens, opts.beams, stops, opts.use_cache,
                       compile=opts.compile,
                       mask=utf8_mask(vocab, opts.beams, ids.device))
    draft = Draft(vocab, opts, t0)  # a byte model's beam may end inside a character: not shown
    text = "".join(draft.feed(token) for token in best if not draft.done) + draft.finish()
    emit(0, text)
    return Sample(prompt, text, len(best), time.perf_counter() - t0, draft.done)


def preview(model: GPT, vocab: Vocab, chars: int, seed: int,
            stop: Callable[[], bool] | None = None) -> str:
    """A training log's sample: `chars` characters after `default_prompt`, prompt included, or
    fewer once stop() says so; the training RNG and the model's mode are left as they were."""
    was_training = model.training
    prompt = default_prompt(vocab)
    try:
        [sample] = sample_text(model, vocab, prompt, SampleConfig(max_new_tokens=chars, seed=seed),
                               stop=stop)
    finally:
        model.train(was_training)
    return prompt + sample.text

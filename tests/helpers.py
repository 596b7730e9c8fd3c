"""What several test modules share, other than fixtures (those live in conftest.py): the
repository's paths, the tiny models and configs, config edits, file and weight comparisons, pair
data, patches of the training loop, and ways to run a command or a script in this process. Test
modules import from here, never from one another."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.config.schema import MODEL_VARIANTS, ModelConfig, RunConfig
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.export import save_safetensors
from charlm.generation.decoding import generate
from charlm.generation.sampler import Sampler
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT
from charlm.training import checkpoint
from charlm.training import loop as train_module

if TYPE_CHECKING:
    import httpx

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT / "data" / "tinyshakespeare.txt"
TINY = ROOT / "configs" / "tiny.yaml"

# The commands the README documents.
COMMANDS = ["prepare", "train", "sample", "info", "eval", "export", "serve"]

# Each single-option change of the architecture from the default, and one with every option
# changed at once. Keys are `model` config keys.
VARIANTS = {
    **MODEL_VARIANTS,
    "all_changed": {"pos_encoding": "rope", "norm": "rmsnorm", "norm_placement": "post",
                    "activation": "swiglu", "tie_weights": False, "bias": True},
    "levers": {"activation": "relu2", "qk_norm": True, "zero_init": True, "tie_weights": False,
               "logit_softcap": 15.0, "bigram": True, "pos_encoding": "rope"},
}
# Those an encoder-decoder has too (`model.bigram` is a GPT's alone).
PAIR_VARIANTS = {name: {k: v for k, v in keys.items() if k != "bigram"}
                 for name, keys in VARIANTS.items() if keys != {"bigram": True}}

GIB = 2**30


# --- files and configs -----------------------------------------------------------------------


def write(path: Path, content: str | bytes) -> Path:
    """Write `content` to `path` (text as UTF-8); returns `path`."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under `root`, by its path relative to it, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def with_(cfg: RunConfig, **sections) -> RunConfig:
    """`cfg` with some keys of its sections changed: with_(cfg, train={"max_iters": 5})."""
    raw = cfg.to_dict()
    for section, values in sections.items():
        raw[section].update(values)
    return RunConfig.from_dict(raw)


def assert_same_weights(a_path: Path, b_path: Path) -> None:
    """The model weights of two checkpoints are equal, bit for bit."""
    a, b = checkpoint.load(a_path), checkpoint.load(b_path)
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def flip_bytes(path: Path, record: str, at: int = 100) -> str:
    """Invert the two bytes at `at` in the data of the zip record of `path` (a torch.save file)
    whose name ends with `record` (`data/0`: the first tensor's storage), as a bad disk or a
    copy that went wrong would; the CRC-32 stored for it is left as it was. Returns the
    record's full name."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(record))
    data = bytearray(path.read_bytes())
    # the local header: 30 bytes, then the name and an extra field of its own length
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:
                                                    info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len + at
    data[start:start + 2] = bytes(b ^ 0xFF for b in data[start:start + 2])
    path.write_bytes(bytes(data))
    return info.filename


# --- patches of the training loop and the machine ----------------------------------------------


def signal_after_steps(monkeypatch: pytest.MonkeyPatch, signals: dict[int, list[int]]) -> None:
    """Make the training loop send itself `signals[n]` right after its n-th train_step."""
    real, calls = train_module.train_step, [0]

    def step(*args, **kwargs):
        out = real(*args, **kwargs)
        calls[0] += 1
        for sig in signals.get(calls[0], []):
            os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(train_module, "train_step", step)


def fixed_memory(monkeypatch: pytest.MonkeyPatch, gib: float) -> None:
    """The machine has `gib` GiB, whatever it really has (the error lines name it)."""
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: int(gib * GIB))


def no_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step fails the test: a refused batch must never reach one (and without the
    guard, this one would take the machine's memory)."""
    def step(*args, **kwargs):
        raise AssertionError("the first training step ran")

    monkeypatch.setattr(train_module, "train_step", step)


# --- pairs (the encoder-decoder's data) ----------------------------------------------------------

ALPHABET = "abcdefg"


def reversal_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Random strings and their reversals, as space-separated symbols."""
    rng = random.Random(seed)
    words = {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 6))) for _ in range(n)}
    return [(w, " ".join(reversed(w))) for w in sorted(words)]


def write_pairs(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def pairs_config(data: Path, out: Path, max_iters: int = 20) -> RunConfig:
    """configs/tiny.yaml as an encoder-decoder on the pairs in `data`, trained into `out`."""
    return load_config(TINY, [
        "model.arch=encoder_decoder", "model.n_encoder_layer=1", f"data.path={data}",
        "data.target_units=space", "data.val_fraction=0.2", f"train.out_dir={out}",
        f"train.max_iters={max_iters}", "train.eval_interval=10", "train.eval_pairs=8",
        "train.batch_size=8", "optim.lr_decay_iters=20"])


# --- models of random weights --------------------------------------------------------------------

GREEDY = SampleConfig(temperature=0)


def uncached(opts: SampleConfig) -> SampleConfig:
    """`opts` decoding without the KV cache."""
    return SampleConfig(**{**opts.__dict__, "use_cache": False})


def tiny_model_config(**kw) -> ModelConfig:
    """A GPT of 2 layers, 2 heads, 32 dims and a block of 16, with `kw` changed."""
    return ModelConfig(**{"block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, **kw})


def expected_params(cfg: ModelConfig, vocab: int) -> int:
    """The analytic count, written from the definitions rather than from the code."""
    C, L, T = cfg.n_embd, cfg.n_layer, cfg.block_size
    F = cfg.n_ff if cfg.n_ff is not None else (88 if cfg.activation == "swiglu" else 4 * C)
    b = 1 if cfg.bias else 0
    ins = 2 if cfg.activation == "swiglu" else 1  # gate and up, or up alone
    attn = 4 * C * C + b * 4 * C
    mlp = (ins + 1) * C * F + b * (ins * F + C)
    norm = C * (1 + (b if cfg.norm == "layernorm" else 0))  # RMSNorm never has a bias
    final = 0 if cfg.norm_placement == "post" else norm
    pos = T * C if cfg.pos_encoding == "learned" else 0
    head = 0 if cfg.tie_weights else vocab * C
    return vocab * C + pos + L * (attn + mlp + 2 * norm) + final + head


RANDOM_GPT_VOCAB = 13


def random_gpt(**options) -> GPT:
    """A GPT over RANDOM_GPT_VOCAB ids (`tiny_model_config(**options)`) in eval mode, its
    weights seeded and larger than the init, so that greedy output is not constant."""
    torch.manual_seed(1)
    model = GPT(tiny_model_config(**options), RANDOM_GPT_VOCAB).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def random_export(out: Path, chars: str) -> Path:
    """`out`: a safetensors export of a random GPT (`tiny_model_config()`) over `chars`."""
    vocab = Vocab(sorted(set(chars)))
    cfg = RunConfig(model=tiny_model_config())
    save_safetensors(GPT(cfg.model, len(vocab)), vocab, cfg, out)
    return out


def decode_ids(model: GPT, prompt: torch.Tensor, n: int, opts: SampleConfig = GREEDY,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """The (B, n) ids `generate` decodes after `prompt` (B, T)."""
    return torch.stack(list(generate(model, prompt, n, opts, generator)), dim=1)


def sampler_for(opts: SampleConfig, rows: int = 1, recent: list[int] = (), mask=None,
                seed: int = 0) -> Sampler:
    """A `Sampler` of `rows` rows with `opts`, each having seen the ids `recent`, drawing from a
    generator seeded with `seed`."""
    s = Sampler(8, "cpu", mask, torch.Generator().manual_seed(seed))
    s.add(opts, torch.tensor([list(recent)] * rows, dtype=torch.long).view(rows, len(recent)))
    return s


# The encoder-decoder's ids: a source vocabulary of VS ids whose last is its padding, a target
# vocabulary of VT ids ending in pad, bos and eos (`charlm.data.pairs.target_specials`).
VS, SRC_PAD = 8, 7
VT, PAD, BOS, EOS = 12, 9, 10, 11


def seq2seq_config(**options) -> ModelConfig:
    """An encoder-decoder of 3 encoder and 2 decoder layers, 2 heads, 32 dims, block 16."""
    return ModelConfig(**{"arch": "encoder_decoder", "block_size": 16, "n_layer": 2,
                          "n_encoder_layer": 3, "n_head": 2, "n_embd": 32, **options})


def random_seq2seq(**options) -> EncoderDecoder:
    """Larger weights than the init, so decoding is not a constant stream."""
    torch.manual_seed(1)
    model = EncoderDecoder(seq2seq_config(**options), VS, VT, SRC_PAD).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def random_served(kind: str) -> tuple[GPT | EncoderDecoder, Vocab | PairVocab]:
    """A random model and its vocabulary for the serving engine: "char" (13 letters), "byte"
    (the 13 UTF-8 bytes of "ab é漢🙂" and a newline) or "encoder_decoder" (a-g to A-I)."""
    if kind == "encoder_decoder":
        return random_seq2seq(), PairVocab(tuple("abcdefg"), tuple("ABCDEFGHI"))
    chars = ("abcdefghijklm" if kind == "char"
             else sorted(set("ab é漢🙂\n".encode().decode("latin-1"))))
    return random_gpt(), Vocab(chars, kind)


def seq2seq_batch(sources: list[list[int]], targets: list[list[int]], S: int = 0, T: int = 0):
    """src padded with SRC_PAD, tgt_in = [bos] + target padded with PAD, tgt_out = target +
    [eos] padded with -1; at least S and T columns (more padding than the batch needs)."""
    S = max(S, *map(len, sources))
    T = max(T, *(len(t) + 1 for t in targets))
    src = torch.full((len(sources), S), SRC_PAD)
    tgt_in = torch.full((len(targets), T), PAD)
    tgt_out = torch.full((len(targets), T), -1)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        src[i, :len(s)] = torch.tensor(s)
        tgt_in[i, :len(t) + 1] = torch.tensor([BOS, *t])
        tgt_out[i, :len(t) + 1] = torch.tensor([*t, EOS])
    return src, tgt_in, tgt_out


# --- commands and scripts in this process --------------------------------------------------------


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err


def run_main(capsys: pytest.CaptureFixture, call: Callable[[], object]) -> CliResult:
    """Call a command's entry point in this process: its exit code (SystemExit's, as the
    interpreter would make it), stdout and stderr."""
    capsys.readouterr()
    code = 0
    try:
        call()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def import_script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A script of scripts/ as a module (they import their neighbour `common` by name)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return importlib.import_module(name)


def common_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/common.py, which every benchmark script shares."""
    return import_script("common", monkeypatch)



def bench(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *argv: str
          ) -> tuple[list[dict], str]:
    """`python scripts/bench.py ARGV` in this process: its JSON lines and its stderr."""
    import_script("bench", monkeypatch).main(list(argv))
    captured = capsys.readouterr()
    return [json.loads(line) for line in captured.out.splitlines()], captured.err


def kind(records: list[dict], name: str) -> list[dict]:
    """The JSON lines of one kind (machine, round, facts, summary)."""
    return [r for r in records if r["kind"] == name]


# --- files that are not regular files ------------------------------------------------------------


def raised_reading_fifo(fifo: Path, call: Callable[[], object], timeout: float = 10
                        ) -> BaseException | None:
    """What `call`, which reads the FIFO `fifo` (among other things), raises (None if nothing),
    run in a thread so that a read that waits for a writer fails the test instead of hanging
    the suite: after `timeout` seconds a writer that opens and closes the FIFO gives the
    reader its end, and the test fails."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # the caller checks what it is
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        with contextlib.suppress(OSError):  # a reader waits, so this open does not block
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout)
        pytest.fail(f"reading the FIFO {fifo} waited for a writer for {timeout:g} s")
    return raised[0] if raised else None


def endless_stdin(limit: int = 64 << 20):
    """A stdin whose bytes never end (`yes | charlm ...`): its `buffer` serves any read in full,
    and fails the test once a reader has taken more than `limit` bytes."""

    class Endless(io.RawIOBase):
        served = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            Endless.served += len(b)
            assert Endless.served <= limit, f"read more than {limit:,} bytes of an endless stdin"
            b[:] = b"y\n" * (len(b) // 2) + b"y" * (len(b) % 2)
            return len(b)

    return io.TextIOWrapper(io.BufferedReader(Endless()), encoding="utf-8")


# --- the server ------------------------------------------------------------------------------


class Served:
    """A `charlm serve` process and the URL it said it listens on."""

    def __init__(self, run: Path, *args: str, **popen: object):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "charlm", "serve", str(run), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        line = self.process.stdout.readline()  # the server says where once it listens
        assert line.startswith("serving "), (line, self.process.stderr.read())
        self.url = line.split(" on ")[1].split()[0]

    def stop(self, timeout: float = 15) -> tuple[int, float]:
        """SIGTERM; the exit code and the seconds it took. What the server printed after its
        first line is then in `out` and `err`."""
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.out, self.err = self.process.communicate(timeout=timeout)
            return self.process.returncode, time.monotonic() - start
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.out, self.err = self.process.communicate()


def stream_events(client: httpx.Client, url: str, body: dict) -> Iterator[dict | str]:
    """The `data:` payloads of a streamed completion as they arrive."""
    with client.stream("POST", f"{url}/v1/completions", json=body | {"stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                yield data if data == "[DONE]" else json.loads(data)

"""`charlm sample`: a GPT's samples streamed as they are generated, or an encoder-decoder's
outputs for its sources; the prompt and the sources read from options, files or stdin."""

from __future__ import annotations

import codecs
import dataclasses
import io
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from charlm.cli import options
from charlm.cli.options import SAMPLE_DEFAULTS as D
from charlm.cli.options import DeviceOpt, DtypeOpt, StepOpt, TargetArg, sample_option
from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError, warn
from charlm.core.files import missing, read_capped

if TYPE_CHECKING:
    from charlm.data.pairs import PairVocab
    from charlm.data.vocab import Vocab
    from charlm.model.encoder_decoder import EncoderDecoder
    from charlm.model.gpt import GPT

# The most text a prompt (or the sources) may hold, far beyond any context: an endless pipe
# (`yes | charlm sample RUN --prompt -`) would fill the memory
INPUT_LIMIT = 4 << 20


def sample(
    ctx: typer.Context,
    target: TargetArg,
    prompt: Annotated[
        str | None, typer.Option(help="Text to continue; '-' reads it from stdin. [default: a "
                                 "newline, or the first character of a vocabulary without one]",
                                 show_default=False),
    ] = None,
    prompt_file: Annotated[
        Path | None, typer.Option(help="Read the prompt from this UTF-8 file.")
    ] = None,
    source: Annotated[
        str | None, typer.Option(help="Encoder-decoder: the text to transduce; '-' reads one "
                                 "source per line from stdin.")
    ] = None,
    source_file: Annotated[
        Path | None, typer.Option(help="Encoder-decoder: one source per line of this file; one "
                                  "output line each.")
    ] = None,
    max_new_tokens: Annotated[int, sample_option("max_new_tokens")] = D.max_new_tokens,
    num_samples: Annotated[int, sample_option("num_samples")] = D.num_samples,
    temperature: Annotated[float, sample_option("temperature")] = D.temperature,
    top_k: Annotated[int | None, sample_option("top_k")] = D.top_k,
    top_p: Annotated[float | None, sample_option("top_p")] = D.top_p,
    min_p: Annotated[float | None, sample_option("min_p")] = D.min_p,
    repetition_penalty: Annotated[float, sample_option("repetition_penalty")] = (
        D.repetition_penalty),
    repetition_window: Annotated[int, sample_option("repetition_window")] = D.repetition_window,
    beams: Annotated[int | None, sample_option("beams")] = D.beams,
    stop: Annotated[list[str] | None, sample_option("stop")] = None,  # none: D.stop
    include_stop: Annotated[bool, sample_option("include_stop")] = D.include_stop,
    unknown: Annotated[str, sample_option("unknown")] = D.unknown,
    seed: Annotated[int, sample_option("seed")] = D.seed,
    use_cache: Annotated[bool, sample_option("use_cache")] = not D.use_cache,
    compile: Annotated[bool, sample_option("compile")] = D.compile,
    stream: Annotated[bool, typer.Option(help="Print characters as they are generated.")] = True,
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object per sample: text, prompt, tokens, "
                           "seconds, stopped.")
    ] = False,
    interactive: Annotated[
        bool, typer.Option("--interactive", help="Load the model once, then continue prompt "
                           "after prompt typed in the terminal; /help there lists commands "
                           "that change the options.")
    ] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    step: StepOpt = None,
) -> None:
    """Generate text from a checkpoint, streamed to stdout as it is produced."""
    from charlm.api import load
    from charlm.generation.text import default_prompt

    given = locals()
    opts = SampleConfig.from_options({name: given[name] for name in options.SAMPLE_FIELDS})
    if interactive:
        sample_interactively(target, device, dtype, step, opts, stream, {
            "--prompt": prompt is not None, "--prompt-file": prompt_file is not None,
            "--source": source is not None, "--source-file": source_file is not None,
            "--num-samples": opts.num_samples > 1, "--beams": opts.beams is not None,
            "--json": json_out})
        return
    sources_given = source is not None or source_file is not None
    text = None if sources_given else read_input(
        "prompt", "prompt", prompt, prompt_file,
        "; pipe the prompt in, or give --prompt TEXT or --prompt-file")
    lm = load(target, device, dtype, step)
    if lm.config.model.arch == "encoder_decoder" or sources_given:
        if prompt is not None or prompt_file is not None:
            raise CharlmError("--prompt is for a GPT; an encoder-decoder takes --source or "
                              "--source-file")
        sources = read_sources(source, source_file, lm.config.model.arch)
        if opts.compile:
            warn("--compile compiles a GPT's decode step; an encoder-decoder decodes eagerly")
        if options.is_default(ctx, "temperature"):  # a transduction's likeliest output unless asked
            opts = dataclasses.replace(opts, temperature=0.0)
        print_translations(lm.decoding_model(), lm.vocab, sources, opts, json_out)
        return
    text = prompt_text(lm.vocab, default_prompt(lm.vocab) if text is None else text, opts,
                       lm.model.cfg.block_size)
    print_samples(lm.decoding_model(), lm.vocab, text, opts, stream, json_out)


def sample_interactively(target: Path, device: str, dtype: str, step: int | None,
                         opts: SampleConfig, stream: bool, given: dict[str, bool]) -> None:
    """`charlm sample --interactive`, the options it cannot take refused before loading."""
    from charlm.api import load
    from charlm.cli.interactive import prompt_loop, refuse_conflicts

    refuse_conflicts(option for option, set_ in given.items() if set_)
    lm = load(target, device, dtype, step)
    if lm.config.model.arch == "encoder_decoder":
        raise CharlmError(f"--interactive continues prompts with a GPT; {target} is an "
                          "encoder-decoder: drop --interactive and transduce with --source or "
                          "--source-file")
    model = lm.decoding_model()  # laid out once, before the first prompt

    def generate(line: str, opts: SampleConfig, stop: Callable[[], bool]) -> None:
        text = prompt_text(lm.vocab, line, opts, model.cfg.block_size)
        print_samples(model, lm.vocab, text, opts, stream, False, stop)

    prompt_loop(generate, opts)


def prompt_text(vocab: Vocab, text: str, opts: SampleConfig, block_size: int) -> str:
    """The prompt as the model will see it, its warnings said on stderr."""
    from charlm.generation.text import encode_prompt

    text, _, warnings = encode_prompt(vocab, text, opts.unknown, block_size)
    for w in warnings:
        warn(w)
    return text


def print_samples(model: GPT, vocab: Vocab, text: str, opts: SampleConfig, stream: bool,
                  json_out: bool, stop: Callable[[], bool] | None = None) -> None:
    """The first sample streamed after its prompt (unless stream is off, or with --json or
    beams), the others printed when done, between lines of dashes, or one JSON object per
    sample; each ends where it got to once stop() says so."""
    from charlm.generation.text import sample_text

    out = sys.stdout
    live = stream and not json_out and opts.beams is None

    def show(i: int, piece: str) -> None:
        if live and i == 0:
            out.write(piece)
            out.flush()

    if live:
        out.write(text)
        out.flush()
    samples = sample_text(model, vocab, text, opts, show, stop)
    for i, s in enumerate(samples):
        if json_out:
            out.write(json_line({"text": s.text, "prompt": s.prompt, "tokens": s.tokens,
                                 "seconds": round(s.seconds, 4), "stopped": s.stopped}, out))
            continue
        if i > 0:
            out.write("\n" + "-" * 40 + "\n")
        if not (live and i == 0):
            out.write(s.prompt + s.text)
    if not json_out:
        out.write("\n")
    out.flush()


def json_line(obj: dict, out: TextIO) -> str:
    """`obj` as a line of JSON for `out`: a UTF encoding writes every character, another gets
    them as JSON's escapes (its own backslash escapes would not be JSON)."""
    utf = codecs.lookup(getattr(out, "encoding", None) or "utf-8").name.startswith("utf")
    return json.dumps(obj, ensure_ascii=not utf) + "\n"


def read_input(option: str, what: str, text: str | None, file: Path | None,
               advice: str = "") -> str | None:
    """The text of --OPTION TEXT, --OPTION - (stdin) or --OPTION-file FILE (read as `charlm
    prepare` reads one: CRLF kept, no byte order mark), or None for none; `what` names it in
    errors. Stdin holds at most INPUT_LIMIT bytes, as a file does: a pipe may never end."""
    from charlm.data.chunks import decode_chunks, read_text

    if text is not None and file is not None:
        raise CharlmError(f"give the {what} either with --{option} or with --{option}-file, not "
                          "both")
    if file is not None:
        if file.is_dir():
            raise CharlmError(f"{option} file {file} is a directory; give a text file")
        if not file.exists():
            raise missing(file, f"{option} file")
        return read_text(file, f"{option} file", INPUT_LIMIT)
    if text != "-":
        return text
    if sys.stdin is None:  # started with stdin closed (`<&-`)
        raise CharlmError(f"--{option} - reads the {what} from stdin, which is closed{advice}")
    data = read_capped(sys.stdin.buffer, INPUT_LIMIT, f"the {what} on stdin")
    return "".join(piece for _, piece in decode_chunks(io.BytesIO(data), f"the {what} on stdin"))


def read_sources(source: str | None, source_file: Path | None, arch: str) -> list[str]:
    """--source TEXT, or one source a line of --source - (stdin) or --source-file (a final
    newline ends the last line; CRLF is a line end)."""
    if arch != "encoder_decoder":
        raise CharlmError("--source and --source-file are for an encoder-decoder; this model is "
                          "a GPT: give --prompt or --prompt-file")
    text = read_input("source", "sources", source, source_file)
    if text is None:
        raise CharlmError("an encoder-decoder transduces sources: give --source TEXT, --source - "
                          "(one per line on stdin) or --source-file FILE")
    if source not in (None, "-"):
        return [source]
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise CharlmError("there are no sources: the input is empty")
    return lines


def print_translations(model: EncoderDecoder, vocab: PairVocab, sources: Sequence[str],
                       opts: SampleConfig, json_out: bool) -> None:
    """A line per output of each source, or a JSON object per source, printed once decoded."""
    from charlm.generation.seq2seq import translate

    out = sys.stdout
    for t in translate(model, vocab, sources, opts):
        if json_out:
            out.write(json_line(t.as_dict(), out))
        else:
            out.write("".join(text + "\n" for text, _ in t.outputs))
        out.flush()

"""G2P on CMUdict in a fixed wall time: the encoder-decoder (configs/g2p_cmudict.yaml) against a
decoder-only GPT trained on the same pairs as text lines ("word<TAB>PH PH ...", prompted with
"word<TAB>", stopped at the newline), each for --minutes of training, scored on the same
hash-split test words (exact match, WER = 1 - exact match, PER), stress marks removed.

    python scripts/experiments/g2p_cmudict.py [--minutes 30] [--out /tmp/bench_g2p] [--beams 5]
                                              [--skip-decoder] [--sized]

--sized also trains the encoder-decoder `charlm train` sizes to the budget (no config:
`charlm.training.sizing`) on the same pairs and scores it on the same test words.

Each run trains with `charlm train --time`: it times its own first steps and an eval, then sets
its number of steps so that training, evals and checkpoints end within the budget, and the
cosine schedule spans it; scoring the test words after it is fixed work (greedy, cached
decoding of each word, and with --beams also beam search), not part of the budget. Prints the
machine's facts (CPU model, cores, torch threads and version), then one JSON line per model
and a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for common
from common import machine_facts, machine_line, positive, run_script, summary

import charlm
from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.data.pairs import split_of
from charlm.evaluation.pairs import accuracy
from charlm.generation.decoding import generate

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "g2p_cmudict.yaml"
DECODER = ROOT / "configs" / "g2p_cmudict_decoder.yaml"


def charlm_cli(*args: str) -> float:
    """Run `charlm ARGS`; its wall time in seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "charlm", *args], check=True)
    return time.perf_counter() - t0


def train_for(config: Path | None, data: Path, out: Path, seconds: float,
              sets: tuple[str, ...] = ()) -> dict:
    """Train `config` (None: the model `charlm train` sizes to the budget; `sets`: its
    `--set` options) on a time budget of `seconds` (`charlm train --time`, which sets the
    steps to end the run, its evals and its checkpoints within it) and return the run's facts."""
    wall = charlm_cli("train", *([str(config)] if config else []), "--data", str(data),
                      "--out", str(out), "--overwrite", "--time", f"{seconds:g}",
                      *(arg for key in sets for arg in ("--set", key)))
    m = load_config(out / "config.yaml").model
    layers = (f"{m.n_encoder_layer or m.n_layer} + {m.n_layer}" if m.arch == "encoder_decoder"
              else f"{m.n_layer}")
    # the steps it trained: its last metrics line's (config.yaml keeps the config's max_iters)
    last = json.loads((out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    return {"budget_s": seconds, "steps": last["step"], "train_wall_s": round(wall, 1),
            "shape": f"{layers} x {m.n_embd}, dropout {m.dropout:g}"}


def split_pairs(tsv: Path, out: Path, val: float, test: float) -> tuple[Path, dict]:
    """The test words' references, and a text file of the other pairs for the GPT."""
    refs: dict[str, list[str]] = defaultdict(list)
    lines = []
    for line in tsv.read_text(encoding="utf-8").splitlines():
        word, phones = line.split("\t")
        if split_of(word, val, test) == "test":
            refs[word].append(phones)
        else:
            lines.append(line + "\n")
    text = out / "cmudict_train_val.txt"
    text.write_text("".join(lines), encoding="utf-8")
    return text, refs


@torch.inference_mode()
def decoder_outputs(lm, words: list[str], max_chars: int = 120) -> list[str]:
    """The GPT's greedy continuation of "word<TAB>" up to the newline, batched over words of
    equal length (equal prompt lengths need no padding)."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, w in enumerate(words):
        by_len[len(w)].append(i)
    outs = [""] * len(words)
    newline = lm.vocab.encode("\n")[0]
    for idx in by_len.values():
        for first in range(0, len(idx), 256):
            rows = idx[first:first + 256]
            prompt = torch.tensor([lm.vocab.encode(words[i] + "\t") for i in rows])
            ids = torch.stack(list(generate(lm.model, prompt, max_chars,
                                            SampleConfig(temperature=0))), dim=1)
            for r, row in zip(rows, ids.tolist(), strict=True):
                cut = row.index(newline) if newline in row else len(row)
                outs[r] = lm.vocab.decode(row[:cut])
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--minutes", type=positive(float), default=30.0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_g2p"))
    parser.add_argument("--config", type=Path, default=CONFIG,
                        help="the encoder-decoder's config (default: %(default)s)")
    parser.add_argument("--beams", type=positive(int), default=1,
                        help="also score the encoder-decoder with this many beams (default: "
                        "greedy only)")
    parser.add_argument("--skip-decoder", action="store_true",
                        help="train and score the encoder-decoder only")
    parser.add_argument("--sized", action="store_true",
                        help="also train and score the encoder-decoder that `charlm train` "
                        "sizes to the budget (no config; the --config's data keys)")
    args = parser.parse_args()
    print(machine_line(machine_facts()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    tsv = args.out / "cmudict.tsv"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "cmudict_pairs.py"), "--out",
                    str(tsv)], check=True)
    cfg = load_config(args.config)
    text, refs = split_pairs(tsv, args.out, cfg.data.val_fraction, cfg.data.test_fraction)
    test = args.out / "test.tsv"
    test.write_text("".join(f"{w}\t{p}\n" for w, ps in refs.items() for p in ps),
                    encoding="utf-8")
    cpu = torch.backends.cpu.get_cpu_capability()
    rows = []
    data = cfg.data
    sized = ("model.arch=encoder_decoder", f"data.target_units={data.target_units}",
             f"data.val_fraction={data.val_fraction}", f"data.test_fraction={data.test_fraction}")
    for name, config, sets in [("encoder_decoder", args.config, ()),
                               *([("encoder_decoder sized", None, sized)] if args.sized else [])]:
        run = args.out / name.replace(" ", "_")
        facts = train_for(config, tsv, run, args.minutes * 60, sets)
        for beams in sorted({1, args.beams}):
            scored = json.loads(subprocess.run(
                [sys.executable, "-m", "charlm", "eval", str(run), str(test), "--json",
                 *(["--beams", str(beams)] if beams > 1 else [])],
                check=True, capture_output=True, text=True).stdout)
            rows.append({"model": name + (f", {beams} beams" if beams > 1 else ""), **facts,
                         "exact_match": scored["exact_match"], "wer": scored["wer"],
                         "per": scored["cer"], "test_words": scored["sources"],
                         "threads": torch.get_num_threads(), "cpu_capability": cpu})
            print(json.dumps(rows[-1]), flush=True)
    if not args.skip_decoder:
        run = args.out / "decoder"
        facts = train_for(DECODER, text, run, args.minutes * 60)
        lm = charlm.load(run, device="cpu")
        words = list(refs)
        acc = accuracy(decoder_outputs(lm, words), [refs[w] for w in words], str.split)
        rows.append({"model": "decoder (pairs as text)", **facts,
                     "exact_match": acc.exact_match, "wer": acc.wer, "per": acc.cer,
                     "test_words": acc.sources, "threads": torch.get_num_threads(),
                     "cpu_capability": cpu})
        print(json.dumps(rows[-1]), flush=True)
    print("\n| model | layers x width | minutes | steps | test words | exact match | WER | PER |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['shape']} | {r['train_wall_s'] / 60:.1f} | {r['steps']} | "
              f"{r['test_words']:,} | {r['exact_match']:.1%} | {r['wer']:.1%} | "
              f"{r['per']:.2%} |")


if __name__ == "__main__":
    run_script(main)

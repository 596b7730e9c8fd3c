"""Turn CMUdict into pairs for `charlm train`: one "word<TAB>PH PH ..." line per pronunciation.

CMUdict lines read `word PH PH ... # comment`, with variants written `word(2)`. Comments go
(trailing ones, and whole lines of `#` or `;;;`), the variant suffix goes (so variants become
extra references of one word), and stress digits are removed from vowels unless --keep-stress
(AH0 -> AH: published G2P figures are without stress).
A (word, pronunciation) pair that stress removal makes a duplicate is written once.

    python scripts/cmudict_pairs.py [data/cmudict/cmudict.dict] [--out data/cmudict.tsv]
                                    [--keep-stress]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from common import run_script, summary

from charlm.core.errors import CharlmError
from charlm.core.files import write_text_atomic
from charlm.data.chunks import read_text

ROOT = Path(__file__).resolve().parents[1]
VARIANT = re.compile(r"\(\d+\)$")


def cmudict_pairs(text: str, name: str, keep_stress: bool = False) -> list[tuple[str, str]]:
    """(word, pronunciation) pairs of a CMUdict text in its order, each once."""
    pairs: dict[tuple[str, str], None] = {}  # an ordered set
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()  # CMUdict words hold no "#"
        if not fields or fields[0].startswith(";;;"):
            continue  # blank, or a comment line (";;;" in cmudict-0.7b)
        if len(fields) == 1:
            raise CharlmError(f"{name} line {number}: {fields[0]!r} has no pronunciation; give "
                              "`word PH PH ...` lines")
        word = VARIANT.sub("", fields[0])
        phones = fields[1:] if keep_stress else [p.rstrip("012") for p in fields[1:]]
        pairs[word, " ".join(phones)] = None
    return list(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("dict", nargs="?", type=Path,
                        default=ROOT / "data" / "cmudict" / "cmudict.dict",
                        help="the CMUdict file (default: data/cmudict/cmudict.dict)")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "cmudict.tsv",
                        help="the pairs file to write (default: data/cmudict.tsv)")
    parser.add_argument("--keep-stress", action="store_true",
                        help="keep the stress digits of vowels (AH0, AH1, AH2)")
    args = parser.parse_args()
    pairs = cmudict_pairs(read_text(args.dict), str(args.dict), args.keep_stress)
    write_text_atomic(args.out, "".join(f"{w}\t{p}\n" for w, p in pairs))
    words = len({w for w, _ in pairs})
    print(f"wrote {len(pairs):,} pairs of {words:,} words to {args.out}")


if __name__ == "__main__":
    run_script(main)

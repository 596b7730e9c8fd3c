"""Write docs/config.md, the config reference, from the schema's dataclasses (each key's type,
default and help, see `charlm.config.reference`). Run it after changing a key of
charlm/config/schema.py; tests/unit/config/test_reference.py fails until docs/config.md matches.

    python scripts/config_docs.py [--check]

--check writes nothing and exits 1 when docs/config.md is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from charlm.config.reference import config_reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/config.md is out of date; write nothing")
    args = parser.parse_args()
    text = config_reference()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else None
        if current != text:
            print(f"{DOC} is out of date; run python scripts/config_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Quoted globs (`src/**/*.py`) expanded by charlm, as the folder walk reads a folder: the tree
under the glob's literal head is walked once with `os.walk`, which never descends a symlink to
a folder, so a link back up (`sub/up -> ..`) cannot make `**` loop, and a folder is left as soon
as no path below it can match. A wildcard matches no hidden name (one starting with `.`) unless
its pattern starts with a dot, and `**` (a whole segment) matches any number of folders, none
hidden, as `glob.glob(recursive=True)` does.
"""

from __future__ import annotations

import fnmatch
import os

GLOB_CHARS = frozenset("*?[")


def expand_glob(spec: str) -> tuple[str, list[tuple[str, bool]]]:
    """(the folder the matches are taken under, the matches sorted by path, each with whether
    it is a folder). A matched folder is not walked further: its files are all the caller's."""
    parts = spec.split("/")
    dirs_only = len(parts) > 1 and parts[-1] == ""  # `src/*/`: folders alone, as glob
    parts = [p for i, p in enumerate(parts) if p or i == 0]  # `a//b` is `a/b`
    head = 0
    while head < len(parts) - 1 and not GLOB_CHARS & set(parts[head]):
        head += 1
    prefix, pattern = parts[:head], parts[head:]
    root = "/".join(prefix) or ("/" if prefix else ".")
    found: list[tuple[str, bool]] = []
    for top, dirs, names in os.walk(root):
        rel = [] if top == root else os.path.relpath(top, root).split(os.sep)
        kept = []
        for d in sorted(dirs):
            if os.path.islink(os.path.join(top, d)):
                continue  # as the folder walk: a linked folder is not read
            if _match(pattern, [*rel, d], partial=False):
                found.append((_shown(prefix, [*rel, d]), True))
            elif _match(pattern, [*rel, d], partial=True):
                kept.append(d)
        dirs[:] = kept
        found += [(_shown(prefix, [*rel, n]), False) for n in names
                  if not dirs_only and _match(pattern, [*rel, n], partial=False)]
    return root, sorted(found)


def _shown(prefix: list[str], rel: list[str]) -> str:
    """The path as glob.glob gives it: the spec's literal head, then the path under it."""
    return "/".join([*prefix, *rel])


def _match(pattern: list[str], segments: list[str], partial: bool) -> bool:
    """Whether the path `segments` matches `pattern` (segment by segment); `partial`: whether
    a path below the folder `segments` may."""
    if not segments:
        return partial or all(p == "**" for p in pattern)
    if not pattern:
        return False
    first, rest = pattern[0], pattern[1:]
    if first == "**":
        return (_match(rest, segments, partial)
                or (not segments[0].startswith(".") and _match(pattern, segments[1:], partial)))
    return _segment(first, segments[0]) and _match(rest, segments[1:], partial)


def _segment(pattern: str, name: str) -> bool:
    if name.startswith(".") and not pattern.startswith("."):
        return False  # a hidden name is matched only by a pattern that starts with a dot
    return fnmatch.fnmatchcase(name, pattern)

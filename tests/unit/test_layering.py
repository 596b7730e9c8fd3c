"""The layers of charlm: every import in charlm/, read with `ast` wherever it sits (at the top,
inside a function, under TYPE_CHECKING), goes to the importer's own package or to a lower layer,
and no charlm modules import one another in a cycle. LAYERS is the one place the order is
written; a new package gets a row there."""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path

from tests.helpers import ROOT

# Lowest first. A package may import its own modules and those of the rows above it; packages
# of one row may not import one another (but for the edges of ALLOWED). `api` is charlm/api.py,
# `export` charlm/export.py (`onnx_export`, `onnx`: charlm/onnx_export.py, onnx.py), `__init__`
# and `__main__` charlm/__init__.py and __main__.py.
LAYERS = [
    {"core", "onnx"},  # imports nothing of charlm (onnx: an ONNX export run without torch)
    {"config"},
    {"data", "model", "runtime"},  # model.encoder_decoder reads data.vocab: see ALLOWED
    {"generation"},
    {"evaluation"},
    {"training"},
    {"onnx_export"},  # the ONNX graphs, which `export` writes as one of its formats
    {"info", "export", "tune", "serve"},  # serve: the engine, the HTTP app and the page
    {"api"},  # the Python API
    {"cli"},  # the commands call the API's `load`
    {"__init__", "__main__"},
]
RANK = {package: rank for rank, row in enumerate(LAYERS) for package in row}

# Imports between packages of one row that the code makes today, each with its reason.
ALLOWED = {
    ("charlm.model.encoder_decoder", "charlm.data.pairs"):
        "the encoder-decoder's pad, bos and eos ids are the target vocabulary's last three "
        "(target_specials), a layout written in one place; data imports nothing of model",
    ("charlm.runtime.profile", "charlm.model.layers"):
        "the profile times the products that model.layers computes, to choose between them "
        "once; model imports nothing of runtime",
}

CHARLM = ROOT / "charlm"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(CHARLM.rglob("*.py"))}


def package_of(module: str) -> str:
    """The layer name of a charlm module: "charlm.model.gpt" -> "model", "charlm" -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, charlm module) of every import of charlm in `source`, the source of `module`,
    wherever the import sits, relative imports resolved; `from P import name` is module P.name
    when that is a module, else P."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.append((node.lineno, name if name in MODULES else base))
    return sorted((line, name) for line, name in found
                  if name == "charlm" or name.startswith("charlm."))


@functools.cache  # the parse of every module, done once for the three uses of this module
def edges() -> tuple[tuple[str, str, str], ...]:
    """(importer, imported, "charlm/file.py:line") for every import between charlm modules."""
    out = []
    for module, path in MODULES.items():
        source = path.read_text(encoding="utf-8")
        for line, imported in imports_of(source, module, path.name == "__init__.py"):
            if imported != module:
                out.append((module, imported, f"{path.relative_to(ROOT)}:{line}"))
    return tuple(out)


def test_imports_are_found_inside_functions_and_under_type_checking():
    source = textwrap.dedent("""\
        from typing import TYPE_CHECKING
        import torch
        from charlm.core import errors
        from . import loading
        if TYPE_CHECKING:
            from charlm.model.gpt import GPT
        def build():
            import charlm.training.loop
            from ..data.vocab import Vocab
            from charlm import api
        """)
    assert imports_of(source, "charlm.config.values") == [
        (3, "charlm.core.errors"), (4, "charlm.config.loading"), (6, "charlm.model.gpt"),
        (8, "charlm.training.loop"), (9, "charlm.data.vocab"), (10, "charlm.api")]
    assert [package_of(m) for m in ("charlm.data.vocab", "charlm.api", "charlm")] == [
        "data", "api", "__init__"]


def test_every_package_and_top_level_module_has_a_layer():
    assert {package_of(module) for module in MODULES} == set(RANK)


def test_no_import_goes_up_a_layer_or_across_one():
    wrong = []
    for importer, imported, where in edges():
        a, b = package_of(importer), package_of(imported)
        if a == b or (importer, imported) in ALLOWED:
            continue
        if RANK[b] > RANK[a]:
            wrong.append(f"{where}: {importer} imports {imported}, but {a} (layer {RANK[a]}) "
                         f"is below {b} (layer {RANK[b]})")
        elif RANK[b] == RANK[a]:
            wrong.append(f"{where}: {importer} imports {imported}, but {a} and {b} share layer "
                         f"{RANK[a]} and may not import each other (see ALLOWED)")
    assert not wrong, "imports against LAYERS:\n" + "\n".join(wrong)
    made = {(importer, imported) for importer, imported, _ in edges()}
    assert set(ALLOWED) <= made, f"ALLOWED lists imports the code no longer makes: " \
                                 f"{sorted(set(ALLOWED) - made)}"


def cycle_through(start: str, graph: dict[str, dict[str, str]]) -> list[str] | None:
    """The edges ("importer -> imported (file:line)") of one cycle from `start` back to it."""
    stack, seen = [(start, [])], set()
    while stack:
        node, path = stack.pop()
        for nxt, where in sorted(graph.get(node, {}).items()):
            step = [*path, f"{node} -> {nxt} ({where})"]
            if nxt == start:
                return step
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, step))
    return None


def test_no_modules_import_each_other_in_a_cycle():
    graph: dict[str, dict[str, str]] = {}
    for importer, imported, where in edges():
        graph.setdefault(importer, {}).setdefault(imported, where)
    cycles, in_one = [], set()
    for module in sorted(graph):
        if module in in_one:
            continue
        cycle = cycle_through(module, graph)
        if cycle:
            in_one.update(step.split(" -> ")[0] for step in cycle)
            cycles.append("\n  ".join(cycle))
    assert not cycles, "import cycles:\n  " + "\n\n  ".join(cycles)

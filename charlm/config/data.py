"""The `data` section of a run's config (`DataConfig`), and the keys of it that `prepare` reads
text by (`TextOptions`), which a text dataset's meta.json records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from charlm.config.values import require, setting


@dataclass
class DataConfig:
    """What a run trains on: a text file, paired text or a prepared dataset dir."""

    path: str | tuple[str, ...] = setting(
        "data/tinyshakespeare.txt", "the text: a file, a folder (every file under it, hidden "
        "ones skipped), a quoted glob (`src/**/*.py`), `-` for stdin, a `.gz`, `.bz2` or `.xz` "
        "file, or a list of these; a `.tsv` of pairs; or a dataset dir made by `charlm prepare`")
    val_fraction: float = setting(
        0.1, "held out for validation, in (0, 1): the last fraction of each text (see `split`); "
        "pairs: a share of the sources, by their hash")
    split: Literal["tail", "files"] = setting(
        "tail", "text: where validation comes from: `tail`, the last `val_fraction` of each "
        "file; `files`, whole files, chosen by a hash of their path (a code corpus never has "
        "half a file in each split; a warning when that holds out under half or over twice "
        "`val_fraction` of the text)")
    skip_invalid: bool = setting(
        False, "text: skip (and count) input files that are empty or not UTF-8 text, instead "
        "of stopping at the first")
    include: tuple[str, ...] = setting(
        (), "text: of the files a folder or glob brings, only those that match one of these "
        "patterns (`*.py`; a pattern with a `/` matches the path under the folder)")
    exclude: tuple[str, ...] = setting(
        (), "text: of the files a folder or glob brings, leave out those that match one of "
        "these patterns (`tests/*`)")
    unicode_normalize: Literal["NFC", "NFKC", "NFD", "NFKD"] | None = setting(
        None, "text: put the text in this Unicode normal form (and prompts and eval text "
        "alike), so `é` typed as e + U+0301 is the `é` of the model; null: as written")
    format: Literal["auto", "text", "pairs"] = setting(
        "auto", "`auto`: pairs for a `.tsv` file, else text; `text` or `pairs` say so for any "
        "name")
    units: Literal["char", "byte"] = setting(
        "char", "text: a model's symbols, the characters (`char`) or the bytes of the text's "
        "UTF-8 (`byte`: at most 256, any script; eval gives bits per byte); a prepared dataset "
        "dir keeps its own")
    separator: str = setting("\t", "pairs: what separates a line's source from its target")
    target_units: Literal["char", "space"] = setting(
        "char", "pairs: a target's units, its characters (`char`) or its space-separated "
        "symbols such as phonemes (`space`)")
    test_fraction: float = setting(
        0.0, "pairs: the share of sources held out for `charlm eval`, in [0, 1)")
    max_source_len: int | None = setting(
        None, "pairs: the longest source in characters; null: `model.block_size`")
    max_target_len: int | None = setting(
        None, "pairs: the longest target in units; null: `model.block_size` - 1")
    skip_bad_pairs: bool = setting(
        False, "pairs: skip (and count) bad lines instead of stopping at the first")

    def __post_init__(self) -> None:
        if isinstance(self.path, tuple) and len(self.path) == 1:
            self.path = self.path[0]  # one input is a string, as it was before lists
        require(bool(self.path) and all(self.inputs), "data.path", "must not be empty")
        require(0 < self.val_fraction < 1, "data.val_fraction",
                f"{self.val_fraction} is outside (0, 1)")
        require(0 <= self.test_fraction < 1 and self.val_fraction + self.test_fraction < 1,
               "data.test_fraction", f"{self.test_fraction} must be in [0, 1) and leave "
               f"training pairs beside data.val_fraction={self.val_fraction}")
        require(self.units == "char" or self.unicode_normalize is None, "data.unicode_normalize",
               "applies to data.units=char only: bytes are taken as they are; remove it")
        require(bool(self.separator) and self.separator != "\n", "data.separator",
               "must be a non-empty string other than a newline")
        for key in ("max_source_len", "max_target_len"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"data.{key}", "must be >= 1, or null")

    @property
    def pairs(self) -> bool:
        """Whether data.path holds pairs: data.format, or for auto a .tsv file."""
        if self.format != "auto":
            return self.format == "pairs"
        return isinstance(self.path, str) and self.path.lower().endswith(".tsv")

    @property
    def inputs(self) -> list[str]:
        """data.path as a list: its one input, or its several."""
        return [self.path] if isinstance(self.path, str) else list(self.path)

    @property
    def shown(self) -> str:
        """data.path as a message shows it."""
        return ", ".join(self.inputs)


@dataclass(frozen=True)
class TextOptions:
    """How `prepare` finds, reads and splits its inputs: DataConfig's keys of these names."""

    split: str = "tail"  # "tail": the last val_fraction of each input; "files": whole files
    skip_invalid: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    normalize: str | None = None
    units: str = "char"  # "byte": the ids are the files' bytes (`charlm.data.vocab`)

    def to_dict(self) -> dict[str, Any]:
        return {"units": self.units, "split": self.split, "skip_invalid": self.skip_invalid,
                "include": list(self.include), "exclude": list(self.exclude),
                "unicode_normalize": self.normalize}


def text_options(data: DataConfig) -> TextOptions:
    return TextOptions(split=data.split, skip_invalid=data.skip_invalid, include=data.include,
                       exclude=data.exclude, normalize=data.unicode_normalize,
                       units=data.units)

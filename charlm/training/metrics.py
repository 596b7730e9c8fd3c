"""The logger of a training run: each event goes to `metrics.jsonl`, TensorBoard and the progress
bar. Only rank 0 logs: the other DDP ranks hold a disabled logger."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from charlm.core.durations import format_duration
from charlm.core.files import run_write_error, write_text_atomic
from charlm.evaluation.scoring import finite_or_none

TB_EVENTS = "events.out.tfevents.*"  # TensorBoard's event files in tb/
PROGRESS_S = 30.0  # without a progress bar, a line at a log step this long after the last line

# metrics.jsonl key -> TensorBoard tag, per event kind.
TB_TAGS = {
    "train": {"train_loss": "train/loss", "lr": "lr", "grad_norm": "grad_norm",
              "tokens_per_s": "tokens_per_s", "skipped_steps": "train/skipped_steps"},
    "eval": {"val_loss": "val/loss", "val_bpc": "val/bpc", "train_loss": "train/eval_loss",
             "val_exact_match": "val/exact_match", "val_cer": "val/cer"},  # the last two: pairs
}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1}} -> {"train.lr": 1}, values hparams cannot hold (None, lists) as text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = (value if isinstance(value, bool | int | float | str)
                                  else str(value))
    return flat


def cut_back(path: Path, step: int) -> None:
    """Drop metrics.jsonl's events past `step` (a resume logs them again) and half-written lines."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("step", 0) <= step:
            kept.append(line + "\n")
    write_text_atomic(path, "".join(kept))


def wait_to_sort_last(tb_dir: Path) -> None:
    """Wait, if need be, until a new TensorBoard event file's name sorts after every one in
    tb_dir: TensorBoard reads them in name order, and a resume's `purge_step` drops only the
    events read before it. A name starts with its creation second, then the pid as text, so a
    file of the same second may sort either way (a stamp ahead of that: a clock set back)."""
    stamps = [int(part) for p in tb_dir.glob(TB_EVENTS)
              if (part := p.name.split(".")[3]).isdigit()]
    wait = max(stamps, default=0) + 1 - time.time()
    if 0 < wait <= 2:
        time.sleep(wait)


class MetricsLogger:
    def __init__(self, run_dir: Path, total_steps: int | None, initial_step: int = 0,
                 progress: bool | None = None, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # slow import, only when training

        if initial_step:  # a resume: forget what was logged after the checkpoint it starts from
            cut_back(run_dir / "metrics.jsonl", initial_step)
            wait_to_sort_last(run_dir / "tb")
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=initial_step + 1 if initial_step
                                else None)
        # progress=None: a bar only when stderr is a terminal.
        self.bar = tqdm(total=total_steps, initial=initial_step, desc="train", unit="step",
                        dynamic_ncols=True, disable=None if progress is None else not progress)
        self.deadline: float | None = None  # a budget's end on `now`'s clock: for the bar and lines
        self.now = time.perf_counter
        self.rate: float | None = None  # tokens/s of the last train event
        self.said = self.now()  # when the last progress line was printed (no bar: `log`)

    def set_deadline(self, deadline: float, now=time.perf_counter) -> None:
        if self.enabled:
            self.deadline, self.now = deadline, now
            self.bar.refresh()

    def log(self, kind: str, **values: Any) -> None:
        """Record one event: a line of metrics.jsonl and its scalars in TensorBoard."""
        if not self.enabled:
            return
        event = {"event": kind, **{k: finite_or_none(v) for k, v in values.items()}}
        try:
            self.jsonl.write(json.dumps(event, allow_nan=False) + "\n")
            self.jsonl.flush()
        except OSError as e:  # a full disk: say which file, and that the run can go on later
            raise run_write_error(self.jsonl.name, e, Path(self.jsonl.name).parent) from None
        for key, tag in TB_TAGS.get(kind, {}).items():
            if values.get(key) is not None:
                self.tb.add_scalar(tag, values[key], values["step"])
        if kind == "train":
            self.rate = values["tokens_per_s"]
            left = {} if self.deadline is None else {"left": self.left()}
            self.bar.set_postfix(loss=f"{values['train_loss']:.4f}", lr=f"{values['lr']:.2e}",
                                 tok_s=f"{self.rate:.0f}", **left, refresh=False)
            if self.bar.disable and self.now() - self.said >= PROGRESS_S:  # nohup, CI logs
                total = "" if self.bar.total is None else f"/{self.bar.total}"
                self.message(f"step {values['step']}{total}: train {values['train_loss']:.4f}"
                             f"{self.status()}")

    def left(self) -> str:
        assert self.deadline is not None
        return format_duration(max(self.deadline - self.now(), 0.0))

    def status(self) -> str:
        """", 12,345 tok/s, 1m30s left" for a line of the log (empty before either is known)."""
        rate = "" if self.rate is None else f", {self.rate:,.0f} tok/s"
        return rate + ("" if self.deadline is None else f", {self.left()} left")

    def sample(self, text: str, step: int) -> None:
        """A sample as TensorBoard text, indented as a markdown code block: shown as generated."""
        if self.enabled:
            self.tb.add_text("sample", "".join(f"    {line}\n" for line in text.split("\n")),
                             step)

    def hparams(self, config: dict[str, Any], metrics: dict[str, float], step: int) -> None:
        """Flattened config and final metrics for HParams; run_name ".": no timestamped sub-run."""
        if self.enabled:
            self.tb.add_hparams(flatten(config), metrics, run_name=".", global_step=step)

    def message(self, text: str) -> None:
        """A line for the user that does not break the progress bar."""
        if self.enabled:
            self.bar.write(text, file=sys.stdout)
            self.said = self.now()

    def advance(self) -> None:
        if self.enabled:
            self.bar.update()

    def close(self) -> None:
        if self.enabled:
            self.bar.close()
            self.tb.close()
            with contextlib.suppress(OSError):  # a failed write was reported when it failed
                self.jsonl.close()

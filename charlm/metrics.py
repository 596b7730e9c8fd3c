"""One logger for a training run that fans each event out to `metrics.jsonl`, TensorBoard and
the tqdm progress bar."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

# metrics.jsonl key -> TensorBoard tag, per event kind.
TB_TAGS = {
    "train": {"train_loss": "train/loss", "lr": "lr", "grad_norm": "grad_norm",
              "tokens_per_s": "tokens_per_s", "skipped_steps": "train/skipped_steps"},
    "eval": {"val_loss": "val/loss", "val_bpc": "val/bpc", "train_loss": "train/eval_loss"},
}


class MetricsLogger:
    def __init__(self, run_dir: Path, total_steps: int, initial_step: int = 0,
                 progress: bool | None = None):
        from torch.utils.tensorboard import SummaryWriter  # slow import, only when training

        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.tb = SummaryWriter(str(run_dir / "tb"))
        # progress=None: a bar only when stderr is a terminal.
        self.bar = tqdm(total=total_steps, initial=initial_step, desc="train", unit="step",
                        dynamic_ncols=True, disable=None if progress is None else not progress)

    def log(self, kind: str, **values: Any) -> None:
        """Record one event: a line of metrics.jsonl and its scalars in TensorBoard."""
        event = {"event": kind, **values}
        self.jsonl.write(json.dumps(event) + "\n")
        self.jsonl.flush()
        for key, tag in TB_TAGS.get(kind, {}).items():
            if values.get(key) is not None:
                self.tb.add_scalar(tag, values[key], values["step"])
        if kind == "train":
            self.bar.set_postfix(loss=f"{values['train_loss']:.4f}", lr=f"{values['lr']:.2e}",
                                 tok_s=f"{values['tokens_per_s']:.0f}", refresh=False)

    def message(self, text: str) -> None:
        """A line for the user that does not break the progress bar."""
        self.bar.write(text, file=sys.stdout)

    def advance(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
        self.tb.close()
        self.jsonl.close()

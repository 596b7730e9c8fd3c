"""An exponential moving average of a run's weights (`optim.ema`, Polyak averaging): torch's
`AveragedModel` with its EMA update, taken after every optimizer step.

What a run shows and hands on is the average: its evaluations (hence `best.pt`), the samples
they log, and the "model" of every checkpoint, which `charlm sample`, `eval`, `export` and a
fine-tune read. The weights training goes on from are saved beside it as "train_model", and the
average's update count as "average", so a resume continues bitwise.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class WeightAverage:
    """The EMA of `model`'s parameters with `decay` (its first update copies them)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.averaged.module.requires_grad_(False)

    @property
    def module(self) -> torch.nn.Module:
        """The averaged model, shaped as the trained one."""
        return self.averaged.module

    def update(self, model: torch.nn.Module) -> None:
        self.averaged.update_parameters(model)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.averaged.n_averaged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.n_averaged.copy_(state["updates"])

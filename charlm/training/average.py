"""An exponential moving average of a run's weights (`optim.ema`): torch's `AveragedModel`,
updated after every optimizer step. The average is what a run evaluates, samples and saves as a
checkpoint's "model"; the trained weights are saved beside it (see `Run.stateful`)."""

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
        return self.averaged.module

    def update(self, model: torch.nn.Module) -> None:
        self.averaged.update_parameters(model)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.averaged.n_averaged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.n_averaged.copy_(state["updates"])

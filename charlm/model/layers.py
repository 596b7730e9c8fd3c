"""What the models add to torch's layers: `Embedding`, whose initial draw skips the meta device
(`normal_`), and `maybe_dropout`, which skips dropout's call where it does nothing.

Everything else the models build from is torch's own (`nn.Linear`, `nn.LayerNorm`, plain
`nn.Module` children).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def maybe_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, minus the call when it is the identity (decoding runs this per layer per
    token)."""
    return F.dropout(x, p, training) if training and p > 0 else x


class Embedding(nn.Embedding):
    """`nn.Embedding`, whose `reset_parameters` draws by `normal_` (the same values)."""

    def reset_parameters(self) -> None:
        normal_(self.weight)
        if self.padding_idx is not None and not self.weight.is_meta:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()


def normal_(t: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """nn.init.normal_(t, 0, std), the same draws, except on the meta device: there a tensor has
    no values to draw, and torch's normal_ for it imports the compiler (torch._dynamo), which
    counting a model's parameters on that device (`charlm train`, `sample`, `info`) would pay
    at every start."""
    return t if t.is_meta else nn.init.normal_(t, 0.0, std)

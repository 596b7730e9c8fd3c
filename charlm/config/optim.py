"""The `optim` section of a run's config: the optimizer and its learning-rate schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from charlm.config.values import require, setting


@dataclass
class OptimConfig:
    """The optimizer (AdamW, or Muon with AdamW) and its learning rate: a linear warmup, then
    warmup-stable-decay (or a cosine) to `min_lr` (`charlm.training.schedule`)."""

    name: Literal["adamw", "muon"] = setting(
        "adamw", "`adamw` for every weight, or `muon`: Muon for the weight matrices inside the "
        "blocks (attention, MLP), AdamW for embeddings, the head, norms and biases")
    lr: float = setting(4e-3, "peak learning rate (AdamW's)")
    min_lr: float = setting(
        4e-4, "the rate the schedule decays to, in [0, `lr`] (a lower `lr` needs a lower "
        "`min_lr`)")
    weight_decay: float = setting(
        0.1, "AdamW weight decay, on weights of two or more dimensions only")
    embedding_weight_decay: float | None = setting(
        None, "AdamW weight decay of the token and position tables, the bigram table and the "
        "head; null: `weight_decay` (which then decays the blocks' matrices alone)")
    beta1: float = setting(0.9, "AdamW's beta1, in [0, 1)")
    beta2: float = setting(0.99, "AdamW's beta2, in [0, 1)")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this; 0: no clipping")
    warmup_iters: int = setting(50, "steps of the linear warmup to `lr`")
    schedule: Literal["wsd", "cosine"] = setting(
        "wsd", "after warmup, `wsd`: the peak `lr`, then a linear decay to `min_lr` over the "
        "final `decay_frac` of the run (of its steps, or of a time budget); `cosine`: a half "
        "cosine from `lr` to `min_lr`")
    decay_frac: float = setting(0.2, "`wsd`: the share of the run its decay takes, in (0, 1]")
    lr_decay_iters: int | None = setting(
        None, "the step where the schedule reaches `min_lr`; null: `train.max_iters` (or the "
        "end of a time budget)")
    muon_lr: float = setting(
        0.02, "`muon`: Muon's peak learning rate; its schedule is `lr`'s scaled by `muon_lr / lr`")
    muon_momentum: float = setting(0.95, "`muon`: Muon's (Nesterov) momentum, in [0, 1)")
    muon_weight_decay: float = setting(
        0.0, "`muon`: Muon's decoupled weight decay, applied as `muon_lr` x this a step")
    muon_ns_steps: int = setting(
        5, "`muon`: Newton-Schulz iterations that orthogonalise each update (fewer: cheaper "
        "steps, a rougher orthogonalisation)")
    ema: float = setting(
        0.0, "decay of an exponential moving average of the weights, updated every step, that "
        "evaluations, `best.pt`, samples and exports use (e.g. 0.99); 0: none")

    def __post_init__(self) -> None:
        require(self.lr > 0, "optim.lr", f"{self.lr} must be > 0")
        require(0 <= self.min_lr <= self.lr, "optim.min_lr",
               f"{self.min_lr} must be in [0, lr], and lr is {self.lr}; set optim.min_lr to at "
               f"most lr, e.g. lr / 10 = {self.lr / 10:g}")
        require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            require(0 <= value < 1, f"optim.{key}", f"{value} is outside [0, 1)")
        require(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)")
        require(self.warmup_iters >= 0, "optim.warmup_iters", "must be >= 0")
        require(0 < self.decay_frac <= 1, "optim.decay_frac", f"{self.decay_frac} is outside "
               "(0, 1]")
        require(  # the decay runs from the end of the warmup to lr_decay_iters
            self.lr_decay_iters is None or self.lr_decay_iters > max(self.warmup_iters, 0),
            "optim.lr_decay_iters", f"must be more than optim.warmup_iters ({self.warmup_iters}), "
            "or null")
        require(self.muon_lr > 0, "optim.muon_lr", f"{self.muon_lr} must be > 0")
        require(0 <= self.muon_momentum < 1, "optim.muon_momentum",
               f"{self.muon_momentum} is outside [0, 1)")
        require(self.muon_weight_decay >= 0, "optim.muon_weight_decay", "must be >= 0")
        require(self.embedding_weight_decay is None or self.embedding_weight_decay >= 0,
               "optim.embedding_weight_decay", "must be >= 0, or null for optim.weight_decay")
        require(self.muon_ns_steps >= 1, "optim.muon_ns_steps", "must be >= 1")
        require(0 <= self.ema < 1, "optim.ema", f"{self.ema} is outside [0, 1) (0: no average)")

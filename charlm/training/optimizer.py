"""The optimizer (torch's AdamW, or for `optim.name: muon` torch's Muon for the blocks' weight
matrices and AdamW for the rest), `train_step`, one update, which a non-finite step skips (on the
device, where the fused AdamW runs: `step_if`), and the weight average (`WeightAverage`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from charlm.config.schema import OptimConfig, RunConfig
from charlm.core.errors import CharlmError
from charlm.data.batches import BatchSampler, PairBatchSampler
from charlm.model.gpt import Block
from charlm.runtime.distributed import Dist, sync_grads
from charlm.runtime.precision import autocast


def has_fused_kernel(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW runs on every (device, dtype) of `params`, tried on a scratch
    tensor of each: torch checks only at the first step, and lists no devices."""
    for device, dtype in {(p.device, p.dtype) for p in params}:
        try:
            probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
            probe.grad = torch.zeros_like(probe)
            torch.optim.AdamW([probe], fused=True).step()
        except RuntimeError:  # NotImplementedError (no kernel for the backend) is one too
            return False
    return True


class MuonWithAdamW:
    """Muon and AdamW as the one optimizer the loop, GradScaler and checkpoints see: AdamW's
    param groups then Muon's (the owners' own dicts), and each one's state under its name."""

    def __init__(self, adamw: torch.optim.Optimizer, muon: torch.optim.Optimizer):
        self.parts: dict[str, torch.optim.Optimizer] = {"adamw": adamw, "muon": muon}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # read afresh each time: torch's load_state_dict replaces an optimizer's group dicts
        return [group for opt in self.parts.values() for group in opt.param_groups]

    def step(self) -> None:
        for opt in self.parts.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.parts.items()}


Optimizer = torch.optim.Optimizer | MuonWithAdamW


def make_optimizer(model: torch.nn.Module, optim: OptimConfig) -> Optimizer:
    """The run's optimizer; each param group keeps its peak lr as "peak_lr", for `set_lr`. AdamW
    decays >= 2-D parameters only (decayed group first); with `optim.embedding_weight_decay`,
    the tables and head in a group of their own after the matrices. Fused: see `step_if`."""
    # the weight matrices inside the blocks: what Muon trains (not embeddings, head, norms, biases)
    matrices = [p for module in model.modules() if isinstance(module, Block)
                for p in module.parameters() if p.dim() == 2 and p.requires_grad]
    chosen = {id(p) for p in matrices} if optim.name == "muon" else set()
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    tables = {id(p) for p in model.parameters() if p.dim() >= 2} - {id(p) for p in matrices}
    split = optim.embedding_weight_decay is not None
    groups = [
        {"params": [p for p in params if p.dim() >= 2 and not (split and id(p) in tables)],
         "weight_decay": optim.weight_decay},
        *([{"params": [p for p in params if id(p) in tables],
            "weight_decay": optim.embedding_weight_decay}] if split else []),
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kernel: dict[str, bool] = {"fused": True} if has_fused_kernel(params) else {"foreach": True}
    adamw = torch.optim.AdamW([{**group, "peak_lr": optim.lr} for group in groups], lr=optim.lr,
                              betas=(optim.beta1, optim.beta2), **kernel)
    if optim.name == "adamw":
        return adamw
    # torch's default lr adjustment ("original", Keller Jordan's): the update of an A x B
    # matrix is scaled by sqrt(max(1, A / B)), as nanochat's and modded-nanogpt's Muon do
    muon = torch.optim.Muon([{"params": matrices, "peak_lr": optim.muon_lr}], lr=optim.muon_lr,
                            momentum=optim.muon_momentum, weight_decay=optim.muon_weight_decay,
                            ns_steps=optim.muon_ns_steps)
    return MuonWithAdamW(adamw, muon)


def set_lr(optimizer: Optimizer, lr: float, optim: OptimConfig) -> None:
    """Set each param group's lr to the fraction of its own peak that `lr` is of `optim.lr`."""
    for group in optimizer.param_groups:
        # the ratio first: it is 1.0 for AdamW's groups, so their lr is `lr` to the bit
        group["lr"] = lr * (group["peak_lr"] / optim.lr)


def _check_fits(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """ValueError unless `state_dict` holds this optimizer's state for its parameters: torch
    checks the group sizes but not the shapes, which would fail only at the next step."""
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups) or any(
            len(s["params"]) != len(g["params"])
            for s, g in zip(saved_groups, optimizer.param_groups, strict=True)):
        raise ValueError("the optimizer state has other parameter groups than this model's")
    if any(s.get("amsgrad") for s in saved_groups):
        raise ValueError("the optimizer state is AMSGrad's")
    moment = "momentum_buffer" if isinstance(optimizer, torch.optim.Muon) else "exp_avg"
    for saved, group in zip(saved_groups, optimizer.param_groups, strict=True):
        for i, p in zip(saved["params"], group["params"], strict=True):
            entry = state_dict["state"].get(i)
            if entry is not None and entry[moment].shape != p.shape:
                raise ValueError(f"the optimizer state of parameter {i} has shape "
                                 f"{tuple(entry[moment].shape)}, not {tuple(p.shape)}")


def load_state(optimizer: Optimizer, state_dict: dict[str, Any]) -> None:
    """Load a checkpoint's moments and step counts, keeping the optimizer's settings (a resume may
    change betas, decays and peak lrs, or need foreach, not fused). ValueError: not this model's."""
    saved_name = "muon" if "muon" in state_dict else "adamw"
    name = "muon" if isinstance(optimizer, MuonWithAdamW) else "adamw"
    if saved_name != name:
        raise CharlmError(f"--resume: the checkpoint's optimizer state is optim.name={saved_name}'s"
                          f", but the run's config has optim.name={name}; a run keeps its "
                          f"optimizer: resume with optim.name={saved_name}, or start a new run")
    parts = optimizer.parts if isinstance(optimizer, MuonWithAdamW) else {"adamw": optimizer}
    saved_parts = state_dict if isinstance(optimizer, MuonWithAdamW) else {"adamw": state_dict}
    for key, part in parts.items():
        saved = saved_parts[key]
        _check_fits(part, saved)
        ours = [{k: v for k, v in g.items() if k != "params"} for g in part.param_groups]
        groups = [{**saved_group, **settings}
                  for saved_group, settings in zip(saved["param_groups"], ours, strict=True)]
        part.load_state_dict({**saved, "param_groups": groups})


def step_if(optimizer: Optimizer, ok: torch.Tensor) -> None:
    """`optimizer.step()` only if `ok` (a 0-d bool tensor on the device). A fused AdamW is
    handed `found_inf`, as GradScaler hands it, and skips on the device; any other optimizer
    (foreach, or Muon, which reads no `found_inf`) waits for `ok`, one host sync a step."""
    if not all(group.get("fused") for group in optimizer.param_groups):
        if ok.item():
            optimizer.step()
        return
    optimizer.found_inf = (~ok).float()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, sampler: BatchSampler | PairBatchSampler,
               cfg: RunConfig, device: torch.device, dtype: torch.dtype, dist: Dist = Dist(),
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One update over `grad_accum` micro-batches, skipped when the loss or gradient norm is not
    finite: (mean loss, grad norm, ok) as tensors, so a step that does not log never waits for
    the device. Under DDP the gradients are all-reduced on the last micro-batch only."""
    accum = cfg.train.grad_accum
    total = torch.zeros((), device=device)
    for i in range(accum):
        batch = sampler.batch()  # (x, y), or pairs' (src, tgt_in, tgt_out)
        with sync_grads(model, sync=i == accum - 1):
            with autocast(device, dtype):
                _, loss = model(*batch)
            loss = loss / accum
            scaler.scale(loss).backward()
        total += loss.detach()
    dist.mean_(total)
    scaler.unscale_(optimizer)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    # The norm is taken after unscaling, so it is non-finite whenever GradScaler (fp16) would
    # skip the step: `ok` covers its check, and its update() still lowers the scale.
    ok = torch.isfinite(total) & torch.isfinite(norm)
    step_if(optimizer, ok)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total, norm, ok


class WeightAverage:
    """The EMA of `model`'s parameters with `decay` (`optim.ema`; its first update copies them),
    which a run evaluates, samples and saves (see `Run.stateful`)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.module: torch.nn.Module = self.averaged.module.requires_grad_(False)

    def update(self, model: torch.nn.Module) -> None:
        self.averaged.update_parameters(model)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.averaged.n_averaged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.n_averaged.copy_(state["updates"])

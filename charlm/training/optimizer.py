"""The optimizer: torch's AdamW with weight decay on matrices and embeddings only, and `step_if`,
the update that a non-finite step skips without the host waiting for the device.

`make_optimizer` asks for torch's fused kernel where it runs on the parameters' device and dtype
(CUDA, and the CPU since torch 2.4), else for its foreach implementation. The fused step reads the
`found_inf` attribute that `torch.amp.GradScaler` sets on an optimizer; `step_if` uses the same
attribute to skip an update on the device.
"""

from __future__ import annotations

from typing import Any

import torch

from charlm.config.schema import OptimConfig


def has_fused_kernel(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW runs on every (device, dtype) of `params`.

    Tried out on a scratch one-element tensor of each kind: torch checks the device only at the
    first step (and only at construction before 2.4), and has no public list of the devices."""
    for device, dtype in {(p.device, p.dtype) for p in params}:
        try:
            probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
            probe.grad = torch.zeros_like(probe)
            torch.optim.AdamW([probe], fused=True).step()
        except RuntimeError:  # NotImplementedError (no kernel for the backend) is one too
            return False
    return True


def make_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """`torch.optim.AdamW` with weight decay on matrices and embeddings (>= 2-D) only, in two
    param groups (decayed first). Fused where torch has the kernel (besides speed, its step can
    be skipped on the device without a host sync, see `step_if`), else foreach."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kernel: dict[str, bool] = {"fused": True} if has_fused_kernel(params) else {"foreach": True}
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), **kernel)


def _check_fits(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """ValueError unless `state_dict` holds AdamW state for this optimizer's parameters: torch
    checks the group sizes but not the shapes, which would fail only at the next step."""
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups) or any(
            len(s["params"]) != len(g["params"])
            for s, g in zip(saved_groups, optimizer.param_groups, strict=True)):
        raise ValueError("the optimizer state has other parameter groups than this model's")
    if any(s.get("amsgrad") for s in saved_groups):
        raise ValueError("the optimizer state is AMSGrad's")
    for saved, group in zip(saved_groups, optimizer.param_groups, strict=True):
        for i, p in zip(saved["params"], group["params"], strict=True):
            entry = state_dict["state"].get(i)
            if entry is not None and entry["exp_avg"].shape != p.shape:
                raise ValueError(f"the optimizer state of parameter {i} has shape "
                                 f"{tuple(entry['exp_avg'].shape)}, not {tuple(p.shape)}")


def load_state(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state (moments, step counts) into an optimizer of
    `make_optimizer`, keeping every setting it was made with (ValueError when the state is not
    this model's). A resumed run's config may change the betas and weight decay, and a run
    resumed on another device may need foreach where the checkpoint says fused; torch places the
    step counts by the settings it is given, so it is given ours (the lr is set at every step)."""
    _check_fits(optimizer, state_dict)
    ours = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    groups = [{**saved, **settings}
              for saved, settings in zip(state_dict["param_groups"], ours, strict=True)]
    optimizer.load_state_dict({**state_dict, "param_groups": groups})


def step_if(optimizer: torch.optim.Optimizer, ok: torch.Tensor) -> None:
    """`optimizer.step()` only if `ok` (a 0-d bool tensor on the device).

    A fused AdamW is handed `found_inf`, as GradScaler hands it, and then leaves weights,
    moments and step counts as they were, all on the device; the attribute is removed at once so
    that it skips no later step. Any other optimizer waits for `ok`."""
    if not all(group.get("fused") for group in optimizer.param_groups):
        if ok.item():
            optimizer.step()
        return
    optimizer.found_inf = (~ok).float()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]

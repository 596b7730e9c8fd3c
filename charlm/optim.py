"""The optimizer: AdamW with weight decay on matrices and embeddings only, and `step_if`, the
update that a non-finite step skips without the host waiting for the device.

`FusedAdamW` runs the kernel that `torch.optim.AdamW(fused=True)` runs, with the same state, so
it updates weights bitwise as torch's does and their `state_dict`s load into each other. It
exists because torch's `Optimizer` imports `torch._dynamo` on first use (about 1 s of the 2-core
CPU preset's 20 s to val 1.88) and regroups every tensor by device and dtype at every step.
Where torch has no fused kernel for the device, `make_optimizer` falls back to torch's
foreach AdamW.
"""

from __future__ import annotations

from typing import Any

import torch

from charlm.config import OptimConfig

# The keys of a torch.optim.AdamW param group besides params and the hyperparameters, with the
# values of a fused AdamW, so a saved state_dict reads as torch's.
_TORCH_GROUP_FLAGS = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                      "differentiable": False, "fused": True, "decoupled_weight_decay": True}


class FusedAdamW:
    """AdamW (decoupled weight decay) over torch's fused multi-tensor kernel.

    `param_groups` are dicts with `params`, `lr`, `betas`, `eps` and `weight_decay`, as in torch
    (set `group["lr"]` to schedule). `step(found_inf)` leaves weights, moments and step counts
    as they were when the 0-d float tensor `found_inf` is nonzero, all on the device."""

    def __init__(self, groups: list[dict[str, Any]], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.param_groups = [{"params": list(g["params"]), "lr": lr, "betas": tuple(betas),
                              "eps": eps, "weight_decay": g["weight_decay"], **_TORCH_GROUP_FLAGS}
                             for g in groups]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = {  # as torch's fused AdamW: a float32 step on the device
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }

    @torch.no_grad()
    def step(self, found_inf: torch.Tensor | None = None) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self.state[p] for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adamw_(
                params, [p.grad for p in params], [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=group["lr"],
                beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                maximize=False, grad_scale=None, found_inf=found_inf,
            )
            if found_inf is not None:
                torch._foreach_sub_(steps, [found_inf] * len(steps))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Optimizer's layout: params as their index across the groups."""
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        return {
            "state": {index[p]: dict(s) for p, s in self.state.items()},
            "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                              "params": [index[p] for p in g["params"]]}
                             for g in self.param_groups],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state_dict of this class or of torch.optim.AdamW over the same parameters
        (ValueError or KeyError when it does not fit)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"])
                for s, g in zip(saved_groups, self.param_groups, strict=True)):
            raise ValueError("the optimizer state has other parameter groups than this model's")
        if any(s.get("amsgrad") for s in saved_groups):
            raise ValueError("the optimizer state is AMSGrad's")
        state = {}
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            for i, p in zip(saved["params"], group["params"], strict=True):
                entry = state_dict["state"].get(i)
                if entry is None:  # torch keeps no state for a parameter it never stepped
                    continue
                moments = {k: entry[k] for k in ("exp_avg", "exp_avg_sq")}
                if any(m.shape != p.shape for m in moments.values()):
                    raise ValueError(f"the optimizer state of parameter {i} has shape "
                                     f"{tuple(entry['exp_avg'].shape)}, not {tuple(p.shape)}")
                state[p] = {
                    "step": torch.as_tensor(entry["step"], dtype=torch.float32).to(p.device),
                    **{k: m.to(p.device, p.dtype, copy=True) for k, m in moments.items()},
                }
        self.state.update(state)
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            group.update({k: saved[k] for k in ("lr", "eps", "weight_decay")},
                         betas=tuple(saved["betas"]))


def fused_devices() -> list[str]:
    """Device types with a fused AdamW kernel in this torch (CUDA, and the CPU since 2.4)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices
    except ImportError:  # an older torch: CUDA only
        return ["cuda"]
    return _get_fused_kernels_supported_devices()


def make_optimizer(model: torch.nn.Module, optim: OptimConfig) -> FusedAdamW | torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings (>= 2-D) only: `FusedAdamW` where
    torch has the fused kernel for the device (besides speed, its step can be skipped on the
    device without a host sync, see `step_if`), else torch's foreach AdamW."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    betas = (optim.beta1, optim.beta2)
    fused = fused_devices()
    if all(p.device.type in fused and p.is_floating_point() for p in params):
        return FusedAdamW(groups, lr=optim.lr, betas=betas)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=betas, foreach=True)


def load_state(optimizer: FusedAdamW | torch.optim.AdamW, state_dict: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state (moments, step counts) into an optimizer of
    `make_optimizer`, keeping every setting it was made with: `load_state_dict` takes the saved
    ones, but a resumed run's config may change the betas and weight decay, and a run resumed
    on another device may need torch's foreach AdamW where the checkpoint says `fused` (the lr is
    set at every step)."""
    kept = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    optimizer.load_state_dict(state_dict)
    for group, settings in zip(optimizer.param_groups, kept, strict=True):
        group.update(settings)


def step_if(optimizer: FusedAdamW | torch.optim.Optimizer, ok: torch.Tensor) -> None:
    """`optimizer.step()` only if `ok` (a 0-d bool tensor on the device).

    `FusedAdamW` takes `found_inf` and then leaves weights, moments and step counts untouched,
    all on the device; any other optimizer waits for `ok`."""
    if isinstance(optimizer, FusedAdamW):
        optimizer.step(found_inf=(~ok).float())
    elif ok.item():
        optimizer.step()

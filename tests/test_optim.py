import copy
import subprocess
import sys

import pytest
import torch

from charlm import optim
from charlm.config import load_config
from charlm.model import GPT
from charlm.optim import FusedAdamW, load_state, make_optimizer, step_if

from .conftest import ROOT


def two_groups(seed: int = 0) -> list[dict]:
    torch.manual_seed(seed)
    return [{"params": [torch.nn.Parameter(torch.randn(5, 3)),
                        torch.nn.Parameter(torch.randn(4, 6))], "weight_decay": 0.1},
            {"params": [torch.nn.Parameter(torch.randn(7))], "weight_decay": 0.0}]


def params_of(groups: list[dict]) -> list[torch.Tensor]:
    return [p for g in groups for p in g["params"]]


def run_steps(opt, params: list[torch.Tensor], steps: list[tuple[float, bool]], seed: int) -> None:
    """Steps with (lr, skipped) from the same seeded gradients, for either optimizer."""
    gen = torch.Generator().manual_seed(seed)
    for lr, skipped in steps:
        for g in opt.param_groups:
            g["lr"] = lr
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        step_if(opt, torch.tensor(not skipped))
        opt.zero_grad(set_to_none=True)


def torch_fused(groups: list[dict]) -> torch.optim.AdamW:
    return torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), fused=True)


def test_fused_adamw_updates_bitwise_as_torch_fused_adamw():
    """Two groups (with and without weight decay), a changing lr and a skipped step: the same
    weights, moments and step counts as torch.optim.AdamW(fused=True) skipping through the
    found_inf that GradScaler hands it."""
    ours_groups, theirs_groups = two_groups(), two_groups()
    ours = FusedAdamW(ours_groups, lr=1e-2, betas=(0.9, 0.95))
    theirs = torch_fused(theirs_groups)
    steps = [(1e-2, False), (5e-3, True), (5e-3, False), (2e-3, False)]
    before = [p.detach().clone() for p in params_of(ours_groups)]
    run_steps(ours, params_of(ours_groups), steps, seed=1)
    gen = torch.Generator().manual_seed(1)
    for lr, skipped in steps:
        for g in theirs.param_groups:
            g["lr"] = lr
        for p in params_of(theirs_groups):
            p.grad = torch.randn(p.shape, generator=gen)
        theirs.grad_scale, theirs.found_inf = None, torch.tensor(float(skipped))
        theirs.step()
        theirs.zero_grad()
    assert not any(torch.equal(a, b) for a, b in zip(before, params_of(ours_groups), strict=True))
    assert int(ours.state[params_of(ours_groups)[0]]["step"]) == 3
    for p, q in zip(params_of(ours_groups), params_of(theirs_groups), strict=True):
        assert torch.equal(p, q)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ours.state[p][key], theirs.state[q][key]), key


@pytest.mark.parametrize("direction", ["ours to torch", "torch to ours"])
def test_state_dicts_load_across_torch_adamw_and_go_on_identically(direction):
    """Checkpoints written before charlm had its own AdamW resume with it, and the other way."""
    src_groups, dst_groups = two_groups(), two_groups()
    make_src = (lambda g: FusedAdamW(g, lr=1e-2, betas=(0.9, 0.95))) \
        if direction == "ours to torch" else torch_fused
    src = make_src(src_groups)
    run_steps(src, params_of(src_groups), [(1e-2, False), (3e-3, False)], seed=3)
    for p, q in zip(params_of(src_groups), params_of(dst_groups), strict=True):
        q.data.copy_(p.data)
    dst = torch_fused(dst_groups) if direction == "ours to torch" else \
        FusedAdamW(dst_groups, lr=0.5, betas=(0.5, 0.5))
    dst.load_state_dict(copy.deepcopy(src.state_dict()))  # as through torch.save and load
    assert dst.param_groups[0]["betas"] == (0.9, 0.95) and dst.param_groups[0]["lr"] == 3e-3
    run_steps(src, params_of(src_groups), [(2e-3, False)], seed=4)
    run_steps(dst, params_of(dst_groups), [(2e-3, False)], seed=4)
    for p, q in zip(params_of(src_groups), params_of(dst_groups), strict=True):
        assert torch.equal(p, q)


def test_load_state_dict_of_other_parameters_is_a_value_error():
    groups = two_groups()
    opt = FusedAdamW(groups, lr=1e-2)
    other = two_groups()
    other[0]["params"].pop()
    with pytest.raises(ValueError, match="other parameter groups"):
        opt.load_state_dict(FusedAdamW(other, lr=1e-2).state_dict())
    swapped = two_groups()
    swapped[0]["params"].reverse()
    with pytest.raises(ValueError, match=r"parameter 0 has shape \(4, 6\), not \(5, 3\)"):
        opt.load_state_dict(FusedAdamW(swapped, lr=1e-2).state_dict())


@pytest.mark.parametrize("kind", ["ours", "torch foreach"])
def test_step_if_leaves_a_skipped_update_out(kind):
    p = torch.nn.Parameter(torch.ones(3, 2))
    groups = [{"params": [p], "weight_decay": 0.1}]
    opt = FusedAdamW(groups, lr=0.1) if kind == "ours" else \
        torch.optim.AdamW(groups, lr=0.1, foreach=True)
    for ok, moved in [(True, True), (False, False), (True, True)]:
        before = p.detach().clone()
        p.grad = torch.ones_like(p)
        step_if(opt, torch.tensor(ok))
        assert (not torch.equal(before, p)) == moved
    assert int(opt.state[p]["step"]) == 2


def test_make_optimizer_decays_matrices_only_and_does_not_import_dynamo():
    """torch.optim's Optimizer imports torch._dynamo (about 1 s) on first use; ours does not."""
    code = (
        "import sys, torch\n"
        "from charlm.config import load_config\n"
        "from charlm.model import GPT\n"
        "from charlm.optim import FusedAdamW, make_optimizer, step_if\n"
        f"cfg = load_config({str(ROOT / 'configs' / 'tiny.yaml')!r}, [])\n"
        "model = GPT(cfg.model, 10)\n"
        "opt = make_optimizer(model, cfg.optim)\n"
        "model(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))[1]"
        ".backward()\n"
        "step_if(opt, torch.tensor(True))\n"
        "opt.zero_grad()\n"
        "print(type(opt).__name__, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out == "FusedAdamW False\n"
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [])
    model = GPT(cfg.model, 10)
    opt = make_optimizer(model, cfg.optim)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == cfg.optim.weight_decay and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"])
    assert all(p.dim() < 2 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_grad_scaler_unscales_our_optimizer_and_a_skipped_step_lowers_the_scale():
    """The float16 (CUDA) path, on the CPU: GradScaler unscales FusedAdamW's gradients (scaling by
    a power of two is exact, so the weights match an unscaled run bitwise), and an inf gradient
    skips the step on the device and halves the scale."""
    def run(scaled: bool, inf_at: int | None) -> tuple[list[torch.Tensor], float]:
        groups = two_groups()
        opt = FusedAdamW(groups, lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", enabled=scaled, init_scale=2.0**10)
        gen = torch.Generator().manual_seed(5)
        for i in range(3):
            loss = sum((p * torch.randn(p.shape, generator=gen)).sum()
                       for p in params_of(groups))
            if i == inf_at:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params_of(groups)]))
            step_if(opt, torch.isfinite(norm))
            scaler.update()
            opt.zero_grad()
        return [p.detach() for p in params_of(groups)], scaler.get_scale() if scaled else 0.0

    plain, _ = run(False, None)
    scaled, scale = run(True, None)
    assert all(torch.equal(a, b) for a, b in zip(plain, scaled, strict=True)) and scale == 2.0**10
    skipped, scale = run(True, 1)
    assert scale == 2.0**9
    two_steps, _ = run(False, 1)  # the unscaled inf step is skipped by step_if alike
    assert all(torch.equal(a, b) for a, b in zip(two_steps, skipped, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(plain, skipped, strict=True))


def test_a_fused_state_resumed_where_torch_has_no_fused_kernel_steps_with_foreach(monkeypatch):
    """A run trained on CUDA (FusedAdamW, whose state_dict says fused=True) resumed on a device
    without a fused kernel (the CPU before torch 2.4): make_optimizer gives torch's foreach AdamW,
    and load_state must not switch it to the fused kernel the checkpoint names (a traceback from
    torch._fused_adamw_ at the first step)."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [])
    torch.manual_seed(0)
    model = GPT(cfg.model, 10)
    saved = make_optimizer(model, cfg.optim).state_dict()
    monkeypatch.setattr(optim, "fused_devices", lambda: ["cuda"])

    def no_cpu_kernel(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_fused_adamw_' with arguments from the "
                                  "'CPU' backend")

    monkeypatch.setattr(torch, "_fused_adamw_", no_cpu_kernel)
    opt = make_optimizer(model, cfg.optim)
    assert type(opt) is torch.optim.AdamW
    load_state(opt, saved)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))[1].backward()
    step_if(opt, torch.tensor(True))
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

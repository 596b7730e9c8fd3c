"""charlm.training.optimizer: torch's AdamW, bitwise as the old fused AdamW, and Muon with
AdamW; `set_lr`, `step_if` and the state it loads; the weight average of `optim.ema`: torch's
EMA of the parameters, a tie kept tied."""

import copy
import io
from typing import Any

import pytest
import torch

from charlm.config.loading import load_config
from charlm.config.schema import ModelConfig, OptimConfig
from charlm.core.errors import CharlmError
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT
from charlm.training.optimizer import (
    WeightAverage,
    has_fused_kernel,
    load_state,
    make_optimizer,
    set_lr,
    step_if,
)
from tests.helpers import ROOT, tiny_model_config


class ReferenceFusedAdamW:
    """Test-only reference: the core of charlm's own `FusedAdamW` as it was before charlm used
    torch's AdamW (init, step, state_dict), to show that updates and old checkpoints carry over.
    It calls torch's private fused kernel, as that class did."""

    def __init__(self, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float]):
        flags = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                 "differentiable": False, "fused": True, "decoupled_weight_decay": True}
        self.param_groups = [{"params": list(g["params"]), "lr": lr, "betas": tuple(betas),
                              "eps": 1e-8, "weight_decay": g["weight_decay"], **flags}
                             for g in groups]
        self.state = {p: {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                          "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                      for g in self.param_groups for p in g["params"]}

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

    def state_dict(self) -> dict[str, Any]:
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        return {"state": {index[p]: dict(s) for p, s in self.state.items()},
                "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                  "params": [index[p] for p in g["params"]]}
                                 for g in self.param_groups]}


OPTIM = OptimConfig(lr=1e-2, beta1=0.9, beta2=0.95, weight_decay=0.1)


class Params(torch.nn.Module):
    """Two matrices (decayed) and a vector (not decayed), seeded."""

    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(5, 3, generator=gen))
        self.b = torch.nn.Parameter(torch.randn(7, generator=gen))
        self.c = torch.nn.Parameter(torch.randn(4, 6, generator=gen))


def reference_for(model: torch.nn.Module) -> ReferenceFusedAdamW:
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": OPTIM.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return ReferenceFusedAdamW(groups, lr=OPTIM.lr, betas=(OPTIM.beta1, OPTIM.beta2))


def run_steps(opt, model: torch.nn.Module, steps: list[tuple[float, bool]], seed: int) -> None:
    """Steps with (lr, skipped) from the same seeded gradients: through `step_if` for an
    optimizer of ours, through `found_inf` for the reference."""
    gen = torch.Generator().manual_seed(seed)
    for lr, skipped in steps:
        for g in opt.param_groups:
            g["lr"] = lr
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        if isinstance(opt, ReferenceFusedAdamW):
            opt.step(found_inf=torch.tensor(float(skipped)))
        else:
            step_if(opt, torch.tensor(not skipped))
        for p in model.parameters():
            p.grad = None


def assert_same(model_a, opt_a, model_b, opt_b) -> None:
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(p, q)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_a.state[p][key].cpu(), opt_b.state[q][key].cpu()), key


def test_adamw_updates_bitwise_as_the_old_fused_adamw():
    """Two groups (with and without weight decay), a changing lr and a step skipped through
    step_if: the same weights, moments and step counts as charlm's FusedAdamW had."""
    ours_model, ref_model = Params(), Params()
    ours, ref = make_optimizer(ours_model, OPTIM), reference_for(ref_model)
    assert all(g["fused"] for g in ours.param_groups)
    before = [p.detach().clone() for p in ours_model.parameters()]
    steps = [(1e-2, False), (5e-3, True), (5e-3, False), (2e-3, False), (2e-3, True)]
    run_steps(ours, ours_model, steps, seed=1)
    run_steps(ref, ref_model, steps, seed=1)
    assert not any(torch.equal(a, b) for a, b in zip(before, ours_model.parameters(), strict=True))
    assert int(ours.state[ours_model.a]["step"]) == 3
    assert_same(ours_model, ours, ref_model, ref)


def test_an_old_fused_adamw_checkpoint_resumes_bitwise():
    """An optimizer state written by charlm's FusedAdamW, through torch.save and a
    weights_only load as in a checkpoint, loads with load_state and goes on as the old one."""
    ref_model = Params()
    ref = reference_for(ref_model)
    run_steps(ref, ref_model, [(1e-2, False), (3e-3, True), (3e-3, False)], seed=3)
    buffer = io.BytesIO()
    torch.save(ref.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, map_location="cpu", weights_only=True)
    ours_model = Params()
    ours_model.load_state_dict(ref_model.state_dict())
    ours = make_optimizer(ours_model, OPTIM)
    load_state(ours, saved)
    assert int(ours.state[ours_model.a]["step"]) == 2 and ours.param_groups[0]["fused"]
    more = [(2e-3, False), (2e-3, True), (1e-3, False)]
    run_steps(ref, ref_model, more, seed=4)
    run_steps(ours, ours_model, more, seed=4)
    assert int(ours.state[ours_model.a]["step"]) == 4
    assert_same(ours_model, ours, ref_model, ref)


def test_load_state_keeps_the_optimizers_settings_and_continues_identically():
    """A resumed run's config may change betas and weight decay: load_state keeps the ones the
    optimizer was made with, and moments and step counts carry over exactly."""
    src_model, dst_model = Params(), Params()
    src = make_optimizer(src_model, OPTIM)
    run_steps(src, src_model, [(1e-2, False), (3e-3, False)], seed=3)
    dst_model.load_state_dict(src_model.state_dict())
    other = OptimConfig(lr=0.5, beta1=0.5, beta2=0.5, weight_decay=0.3)
    dst = make_optimizer(dst_model, other)
    load_state(dst, copy.deepcopy(src.state_dict()))
    assert dst.param_groups[0]["betas"] == (0.5, 0.5)
    assert dst.param_groups[0]["weight_decay"] == 0.3
    assert_same(src_model, src, dst_model, dst)
    for opt in (src, dst):
        opt.param_groups[0].update(betas=(0.9, 0.95), weight_decay=0.1)
        opt.param_groups[1].update(betas=(0.9, 0.95))
    run_steps(src, src_model, [(2e-3, False)], seed=4)
    run_steps(dst, dst_model, [(2e-3, False)], seed=4)
    assert_same(src_model, src, dst_model, dst)


def test_load_state_of_other_parameters_is_a_value_error():
    opt = make_optimizer(Params(), OPTIM)

    class Fewer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(5, 3))
            self.b = torch.nn.Parameter(torch.zeros(7))

    with pytest.raises(ValueError, match="other parameter groups"):
        load_state(opt, reference_for(Fewer()).state_dict())
    swapped = Params()
    swapped.a, swapped.c = swapped.c, swapped.a  # registered in the same order, other shapes
    with pytest.raises(ValueError, match=r"parameter 0 has shape \(4, 6\), not \(5, 3\)"):
        load_state(opt, reference_for(swapped).state_dict())
    amsgrad = reference_for(Params()).state_dict()
    amsgrad["param_groups"][0]["amsgrad"] = True
    with pytest.raises(ValueError, match="AMSGrad"):
        load_state(opt, amsgrad)


@pytest.mark.parametrize("kind", ["fused", "foreach"])
def test_step_if_leaves_a_skipped_update_out_and_skips_no_later_step(kind):
    """A skipped step leaves weights, moments and step counts alone, and the next good step is
    taken (the found_inf handed to the fused step must not stay on the optimizer)."""
    p = torch.nn.Parameter(torch.ones(3, 2))
    opt = torch.optim.AdamW([p], lr=0.1, **{kind: True})
    for ok, moved in [(True, True), (False, False), (True, True), (False, False), (True, True)]:
        before = p.detach().clone()
        moments = copy.deepcopy(opt.state[p]) if opt.state else None
        p.grad = torch.ones_like(p)
        step_if(opt, torch.tensor(ok))
        assert (not torch.equal(before, p)) == moved
        if not moved:
            assert all(torch.equal(v, opt.state[p][k]) for k, v in moments.items())
        assert not hasattr(opt, "found_inf") and not hasattr(opt, "grad_scale")
    assert int(opt.state[p]["step"]) == 3
    assert set(opt.state_dict()) == {"state", "param_groups"}
    assert set(opt.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def test_step_if_on_a_fused_optimizer_does_not_read_ok_on_the_host(monkeypatch):
    p = torch.nn.Parameter(torch.ones(3, 2))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    opt.step()  # torch's first step sets up the state; the ones after it are the loop's

    def host_sync(self, *args):
        raise AssertionError("step_if read a tensor on the host")

    for ok, moved in [(False, False), (True, True)]:
        before = p.detach().clone()
        p.grad = torch.ones_like(p)
        with monkeypatch.context() as m:
            for name in ("item", "__bool__", "tolist", "cpu"):
                m.setattr(torch.Tensor, name, host_sync)
            step_if(opt, torch.tensor(ok))
        assert (not torch.equal(before, p)) == moved


def test_make_optimizer_decays_matrices_only():
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [])
    model = GPT(cfg.model, 10)
    opt = make_optimizer(model, cfg.optim)
    assert type(opt) is torch.optim.AdamW
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == cfg.optim.weight_decay and plain["weight_decay"] == 0.0
    assert decayed["betas"] == (cfg.optim.beta1, cfg.optim.beta2)
    assert all(p.dim() >= 2 for p in decayed["params"])
    assert all(p.dim() < 2 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))
    assert decayed["fused"] and plain["fused"]  # torch has a CPU kernel since 2.4


def test_embedding_weight_decay_is_the_tables_and_heads_own():
    """`optim.embedding_weight_decay` gives the token, position and bigram tables and an
    untied head a group of their own; the blocks' matrices keep `weight_decay`."""
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, tie_weights=False,
                      bigram=True)
    model = GPT(cfg, 10)
    opt = make_optimizer(model, OptimConfig(weight_decay=0.5, embedding_weight_decay=0.0))
    matrices, tables, plain = opt.param_groups
    assert (matrices["weight_decay"], tables["weight_decay"], plain["weight_decay"]) == (
        0.5, 0.0, 0.0)
    named = {id(p): n for n, p in model.named_parameters()}
    assert sorted(named[id(p)] for p in tables["params"]) == [
        "bigram.weight", "head.weight", "wpe.weight", "wte.weight"]
    assert all(named[id(p)].startswith("blocks.") for p in matrices["params"])


def test_muon_takes_its_newton_schulz_steps_from_the_config():
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8), 10)
    opt = make_optimizer(model, OptimConfig(name="muon", muon_ns_steps=2))
    assert opt.parts["muon"].param_groups[0]["ns_steps"] == 2


def test_grad_scaler_unscales_our_optimizer_and_a_skipped_step_lowers_the_scale():
    """The float16 (CUDA) path, on the CPU: GradScaler unscales the optimizer's gradients
    (scaling by a power of two is exact, so the weights match an unscaled run bitwise), and an
    inf gradient skips the step on the device and halves the scale."""
    def run(scaled: bool, inf_at: int | None) -> tuple[list[torch.Tensor], float]:
        model = Params()
        opt = make_optimizer(model, OPTIM)
        scaler = torch.amp.GradScaler("cpu", enabled=scaled, init_scale=2.0**10)
        gen = torch.Generator().manual_seed(5)
        for i in range(3):
            loss = sum((p * torch.randn(p.shape, generator=gen)).sum()
                       for p in model.parameters())
            if i == inf_at:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm()
                                                         for p in model.parameters()]))
            step_if(opt, torch.isfinite(norm))
            scaler.update()
            opt.zero_grad()
        assert int(opt.state[model.a]["step"]) == (3 if inf_at is None else 2)
        return [p.detach() for p in model.parameters()], scaler.get_scale() if scaled else 0.0

    plain, _ = run(False, None)
    scaled, scale = run(True, None)
    assert all(torch.equal(a, b) for a, b in zip(plain, scaled, strict=True)) and scale == 2.0**10
    skipped, scale = run(True, 1)
    assert scale == 2.0**9
    two_steps, _ = run(False, 1)  # the unscaled inf step is skipped by step_if alike
    assert all(torch.equal(a, b) for a, b in zip(two_steps, skipped, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(plain, skipped, strict=True))


def test_a_fused_state_resumed_where_torch_has_no_fused_kernel_steps_with_foreach(monkeypatch):
    """A run trained where torch has a fused kernel (its state_dict says fused=True) resumed on
    a device without one (the CPU before torch 2.4): make_optimizer gives foreach, and load_state
    must not switch it to the fused kernel the checkpoint names."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [])
    torch.manual_seed(0)
    model = GPT(cfg.model, 10)
    fused = make_optimizer(model, cfg.optim)
    batch = torch.zeros(2, 4, dtype=torch.long)
    model(batch, batch)[1].backward()
    step_if(fused, torch.tensor(True))
    model.zero_grad()
    saved = copy.deepcopy(fused.state_dict())

    def no_kernel(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_fused_adamw_' with arguments from the "
                                  "'CPU' backend")

    monkeypatch.setattr(torch, "_fused_adamw_", no_kernel)
    assert not has_fused_kernel(list(model.parameters()))
    opt = make_optimizer(model, cfg.optim)
    assert type(opt) is torch.optim.AdamW
    load_state(opt, saved)
    assert all(g["foreach"] and not g["fused"] for g in opt.param_groups)
    before = [p.detach().clone() for p in model.parameters()]
    model(batch, batch)[1].backward()
    step_if(opt, torch.tensor(True))
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(int(s["step"]) == 2 for s in opt.state.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_if_skips_on_cuda_as_the_old_fused_adamw():
    """On CUDA, with float16 loss scaling as train.py does it: the same weights and state as the
    old FusedAdamW, an overflowing step skipped on the device."""
    dev = torch.device("cuda")
    ours_model, ref_model = Params().to(dev), Params().to(dev)
    ours, ref = make_optimizer(ours_model, OPTIM), reference_for(ref_model)
    assert all(g["fused"] for g in ours.param_groups)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**8)
    gen = torch.Generator(device=dev).manual_seed(6)
    for i in range(4):
        grads = [torch.randn(p.shape, generator=gen, device=dev) for p in ours_model.parameters()]
        loss = sum((p * g).sum() for p, g in zip(ours_model.parameters(), grads, strict=True))
        scaler.scale(loss * (float("inf") if i == 2 else 1.0)).backward()
        scaler.unscale_(ours)
        ok = torch.isfinite(torch.stack([p.grad.norm() for p in ours_model.parameters()]).sum())
        step_if(ours, ok)
        scaler.update()
        ours.zero_grad()
        for p, g in zip(ref_model.parameters(), grads, strict=True):
            p.grad = g.clone()
        ref.step(found_inf=torch.tensor(float(i == 2), device=dev))
    assert scaler.get_scale() == 2.0**7
    assert int(ours.state[ours_model.a]["step"]) == 3
    assert_same(ours_model, ours, ref_model, ref)


MUON = OptimConfig(name="muon", lr=1e-2, min_lr=1e-3, muon_lr=0.05, muon_momentum=0.9,
                   muon_weight_decay=0.01)


def muon_model(arch: str = "decoder", **model: Any) -> torch.nn.Module:
    cfg = ModelConfig(arch=arch, n_layer=2, n_embd=16, n_head=2, block_size=8, **model)
    torch.manual_seed(0)
    return GPT(cfg, 11) if arch == "decoder" else EncoderDecoder(cfg, 9, 11, 0)


def names_of(model: torch.nn.Module, params: list[torch.Tensor]) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize("arch, model, muon_names", [
    ("decoder", {}, {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"}),
    ("decoder", {"tie_weights": False, "bias": True, "activation": "swiglu"},
     {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"}),
    ("encoder_decoder", {"bias": True, "tie_weights": False},
     {"attn.qkv", "attn.proj", "cross_attn.q", "cross_attn.kv", "cross_attn.proj", "mlp.fc",
      "mlp.proj"}),
])
def test_muon_trains_the_blocks_matrices_and_adamw_the_rest(arch, model, muon_names):
    """Muon: the 2-D weights inside the blocks (the encoder's and decoder's, cross-attention
    too). AdamW: embeddings and an untied head (decayed), norms and biases (not decayed)."""
    net = muon_model(arch, **model)
    opt = make_optimizer(net, MUON)
    adamw, muon = opt.parts["adamw"], opt.parts["muon"]
    assert type(adamw) is torch.optim.AdamW and type(muon) is torch.optim.Muon
    stacks = ("blocks", "encoder") if arch == "encoder_decoder" else ("blocks",)
    layers = {f"{stack}.{i}" for stack in stacks for i in range(2)}
    expected = {f"{layer}.{name}.weight" for layer in layers for name in muon_names
                if not (layer.startswith("encoder") and name.startswith("cross"))}
    (group,) = muon.param_groups
    assert names_of(net, group["params"]) == expected
    decayed, plain = adamw.param_groups
    embeddings = {n for n, _ in net.named_parameters() if "wte" in n or "wpe" in n}
    head = {"head.weight"} if not model.get("tie_weights", True) else set()
    assert names_of(net, decayed["params"]) == embeddings | head
    assert names_of(net, plain["params"]) == {n for n, p in net.named_parameters() if p.dim() < 2}
    assert any(n.endswith(".bias") for n in names_of(net, plain["params"])) == model.get("bias",
                                                                                          False)
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.05, 0.9, 0.01)
    assert decayed["weight_decay"] == MUON.weight_decay and decayed["fused"]
    assert opt.param_groups == [decayed, plain, group]


def test_set_lr_follows_the_schedule_as_a_fraction_of_each_groups_peak():
    """AdamW's groups get the schedule's lr itself (bitwise, as the loop set it before); Muon's
    the same fraction of optim.muon_lr."""
    opt = make_optimizer(muon_model(), MUON)
    for lr in (1e-2, 7.3e-3, 1e-3, 1e-2 / 3):
        set_lr(opt, lr, MUON)
        adamw_lrs = [g["lr"] for g in opt.parts["adamw"].param_groups]
        assert adamw_lrs == [lr, lr]
        assert opt.parts["muon"].param_groups[0]["lr"] == pytest.approx(lr * 5)
    plain = make_optimizer(muon_model(), OPTIM)
    set_lr(plain, 1e-2 / 3, OPTIM)
    assert [g["lr"] for g in plain.param_groups] == [1e-2 / 3] * 2


def muon_steps(opt, model: torch.nn.Module, oks: list[bool], seed: int,
               scaler: torch.amp.GradScaler | None = None) -> None:
    """Seeded gradients (scaled by `scaler` when given) stepped through step_if."""
    gen = torch.Generator().manual_seed(seed)
    for ok in oks:
        loss = sum((p * torch.randn(p.shape, generator=gen)).sum() for p in model.parameters())
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss * (1.0 if ok else float("inf"))).backward()
            scaler.unscale_(opt)
        set_lr(opt, 5e-3, MUON)
        step_if(opt, torch.tensor(ok))
        if scaler is not None:
            scaler.update()
        opt.zero_grad(set_to_none=True)


def test_a_muon_state_through_a_checkpoint_goes_on_bitwise():
    """The state dict of Muon with AdamW, saved and loaded weights_only as a checkpoint is,
    continues exactly as the optimizer that never stopped; a config's new Muon settings apply."""
    a, b = muon_model(), muon_model()
    opt_a = make_optimizer(a, MUON)
    muon_steps(opt_a, a, [True, True], seed=1)
    buffer = io.BytesIO()
    torch.save(opt_a.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, map_location="cpu", weights_only=True)
    assert set(saved) == {"adamw", "muon"}
    b.load_state_dict(a.state_dict())
    opt_b = make_optimizer(b, OptimConfig(**{**MUON.__dict__, "muon_momentum": 0.5}))
    load_state(opt_b, saved)
    assert opt_b.parts["muon"].param_groups[0]["momentum"] == 0.5
    opt_b.parts["muon"].param_groups[0]["momentum"] = 0.9
    muon_steps(opt_a, a, [True, False, True], seed=2)
    muon_steps(opt_b, b, [True, False, True], seed=2)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert same_state(opt_a.state_dict(), opt_b.state_dict())


def same_state(a: Any, b: Any) -> bool:
    """Equal nested state dicts, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_step_if_skips_a_muon_step_and_grad_scaler_unscales_it():
    """A skipped step leaves weights and both optimizers' state alone (Muon's with one host
    check); under GradScaler (float16 on CUDA, here on the CPU) the weights match an unscaled
    run bitwise and an inf step halves the scale."""
    runs = {}
    for scaled in (False, True):
        model = muon_model()
        opt = make_optimizer(model, MUON)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if scaled else None
        muon_steps(opt, model, [True], seed=3, scaler=scaler)
        before = copy.deepcopy((model.state_dict(), opt.state_dict()))
        muon_steps(opt, model, [False], seed=4, scaler=scaler)
        after = (model.state_dict(), opt.state_dict())
        assert all(torch.equal(v, after[0][k]) for k, v in before[0].items())
        assert same_state(before[1], after[1])
        muon_steps(opt, model, [True], seed=5, scaler=scaler)
        assert not all(torch.equal(v, model.state_dict()[k]) for k, v in before[0].items())
        runs[scaled] = model.state_dict()
        if scaler is not None:
            assert scaler.get_scale() == 2.0**9
    assert all(torch.equal(v, runs[True][k]) for k, v in runs[False].items())


def test_a_state_of_the_other_optim_name_is_one_error_line():
    muon_state = make_optimizer(muon_model(), MUON).state_dict()
    adamw_state = make_optimizer(muon_model(), OPTIM).state_dict()
    with pytest.raises(CharlmError) as e:
        load_state(make_optimizer(muon_model(), OPTIM), muon_state)
    assert str(e.value) == (
        "--resume: the checkpoint's optimizer state is optim.name=muon's, but the run's config "
        "has optim.name=adamw; a run keeps its optimizer: resume with optim.name=muon, or start "
        "a new run")
    with pytest.raises(CharlmError, match="state is optim.name=adamw's, but the run's config "
                                          "has optim.name=muon"):
        load_state(make_optimizer(muon_model(), MUON), adamw_state)


def test_a_muon_state_of_other_shapes_is_a_value_error():
    """Muon's momentum buffers are checked as AdamW's moments are."""
    model = muon_model()
    opt = make_optimizer(model, MUON)
    muon_steps(opt, model, [True], seed=6)
    state = copy.deepcopy(opt.state_dict())
    first = min(state["muon"]["state"])
    state["muon"]["state"][first]["momentum_buffer"] = torch.zeros(3, 3)
    shape = tuple(opt.parts["muon"].param_groups[0]["params"][0].shape)
    with pytest.raises(ValueError, match=rf"parameter {first} has shape \(3, 3\), not "
                                         rf"\({shape[0]}, {shape[1]}\)"):
        load_state(make_optimizer(muon_model(), MUON), state)


def test_the_average_is_the_exponential_moving_one_of_the_updates():
    model = GPT(tiny_model_config(), 11)
    average = WeightAverage(model, 0.75)
    snapshots = []
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        snapshots.append(model.wte.weight.detach().clone())
        average.update(model)
    first, second, third = snapshots  # the first update copies
    expected = 0.75 * (0.75 * first + 0.25 * second) + 0.25 * third
    torch.testing.assert_close(average.module.wte.weight, expected)
    assert average.module.head.weight is average.module.wte.weight
    assert int(average.state_dict()["updates"]) == 3

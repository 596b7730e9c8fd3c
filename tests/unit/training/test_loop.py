"""charlm.training.loop: one train step with gradient accumulation and clipping, and a batch
that does not split over the ranks."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.model.gpt import GPT
from charlm.runtime.distributed import Dist
from charlm.runtime.precision import grad_scaler
from charlm.training import loop as train_module
from charlm.training.loop import train_step
from charlm.training.optimizer import make_optimizer
from tests.helpers import with_


def test_batch_size_must_split_over_the_ranks(tiny_cfg):
    cfg = with_(tiny_cfg, train={"batch_size": 9})
    with pytest.raises(CharlmError) as e:
        train_module._train(cfg, Dist(rank=0, world_size=2), torch.device("cpu"), False, False,
                            False)
    assert str(e.value) == ("train.batch_size 9 does not split over 2 processes; make it a "
                            "multiple of the number of processes (nproc_per_node x nnodes)")
    assert not Path(cfg.train.out_dir).exists()


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_grad_accum_steps_as_one_batch_and_clips_the_accumulated_gradient(clip, tiny_cfg):
    """4 micro-batches of 2 rows give the update of one batch of 8 (to float rounding); the
    returned norm is the accumulated gradient's before clipping, and AdamW's first moment after
    one step is (1 - beta1) times the gradient clipped to optim.grad_clip."""
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 20, (8, 16), generator=gen) for _ in range(2))
    torch.manual_seed(1)
    reference = GPT(tiny_cfg.model, 20)
    reference(x, y)[1].backward()
    pre_clip = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in reference.parameters()]))
    dev = torch.device("cpu")
    results = []
    for accum in (1, 4):
        cfg = with_(tiny_cfg, train={"grad_accum": accum, "batch_size": 8 // accum},
                    optim={"grad_clip": clip})
        torch.manual_seed(1)
        model = GPT(cfg.model, 20)
        optimizer = make_optimizer(model, cfg.optim)
        batches = list(zip(x.chunk(accum), y.chunk(accum), strict=True))
        sampler = SimpleNamespace(batch=lambda b=batches: b.pop(0))
        loss, norm, ok = train_step(model, optimizer, grad_scaler(dev, torch.float32), sampler,
                                    cfg, dev, torch.float32)
        assert bool(ok) and not batches
        assert norm.item() == pytest.approx(pre_clip.item(), rel=1e-5)
        moment = torch.linalg.vector_norm(torch.stack(
            [s["exp_avg"].norm() for s in optimizer.state.values()]))
        expected = min(pre_clip.item(), clip) if clip else pre_clip.item()
        assert moment.item() == pytest.approx((1 - cfg.optim.beta1) * expected, rel=1e-5)
        results.append((loss.item(), [optimizer.state[p]["exp_avg"] for p in model.parameters()],
                        [p.detach() for p in model.parameters()]))
    (loss_1, moments_1, weights_1), (loss_4, moments_4, weights_4) = results
    assert loss_4 == pytest.approx(loss_1, rel=1e-6)
    # The moments are the clipped gradients themselves. AdamW's first update, lr * g / (|g| +
    # eps), turns a rounding-sized change of a gradient near eps into up to lr / 4 of a weight
    # (seen on an AVX-512 EPYC: 1.25e-5 in one of 4,096 values), so the weights get lr / 10.
    for a, b in zip(moments_1, moments_4, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-9)
    for a, b in zip(weights_1, weights_4, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=cfg.optim.lr / 10)

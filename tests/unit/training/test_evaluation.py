"""charlm.training.evaluation: `evaluate` is pure, and batches stacked into fewer forwards score
as one batch a forward does."""

import pytest
import torch

from charlm.data.datasets import dataset_for
from charlm.model.gpt import GPT
from charlm.runtime.precision import resolve_dtype
from charlm.training.evaluation import batches_that_fit, eval_batches_per_forward, evaluate
from charlm.training.tasks import TextTask


def test_evaluate_is_pure_and_restores_train_mode(tiny_cfg, tmp_path):
    data = dataset_for(tiny_cfg.data.path, 0.1, tmp_path / "ds")
    model = GPT(tiny_cfg.model, len(data.vocab)).train()
    rng = torch.get_rng_state()
    dev = torch.device("cpu")
    a = evaluate(model, TextTask(tiny_cfg, data), dev, resolve_dtype("float32", dev))
    b = evaluate(model, TextTask(tiny_cfg, data), dev, resolve_dtype("float32", dev))
    assert a == b and model.training
    assert torch.equal(rng, torch.get_rng_state())


@pytest.mark.parametrize("per_forward", [2, 3, 4, 9])
def test_evaluate_stacks_batches_into_fewer_forwards_with_the_same_losses(per_forward, tiny_cfg,
                                                                          tmp_path):
    """Stacked eval batches (CUDA's fewer, larger forwards) score the same windows: the same
    means as one batch per forward, with the remainder (4 = 3 + 1) and more per forward than
    there are batches (9) included."""
    data = dataset_for(tiny_cfg.data.path, 0.1, tmp_path / "ds")
    model = GPT(tiny_cfg.model, len(data.vocab))
    dev = torch.device("cpu")
    calls = []
    model.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape[0]))
    one = evaluate(model, TextTask(tiny_cfg, data), dev, torch.float32)
    assert calls == [16] * 8  # eval_iters 4 batches of 16, each split
    calls.clear()
    stacked = evaluate(model, TextTask(tiny_cfg, data), dev, torch.float32,
                       batches_per_forward=per_forward)
    expected = {2: [32, 32], 3: [48, 16], 4: [64], 9: [64]}[per_forward]
    assert calls == expected * 2
    assert stacked["train"] == pytest.approx(one["train"], rel=1e-6)
    assert stacked["val"] == pytest.approx(one["val"], rel=1e-6)


def test_eval_batches_per_forward_fit_the_memory_budget(tiny_cfg):
    # tiny: T 16, C 32, F 128, H 2, V 65 -> 4 * 16 * (512 + 195 + 256 + 32) = 63,680 bytes a row
    per_batch = 63_680 * 16
    assert batches_that_fit(3 * per_batch, tiny_cfg, 65, 16) == 3
    assert batches_that_fit(3 * per_batch - 1, tiny_cfg, 65, 16) == 2
    assert batches_that_fit(10, tiny_cfg, 65, 16) == 1  # never less than one batch
    assert batches_that_fit(10**12, tiny_cfg, 65, 16) == 4  # never more than eval_iters
    assert eval_batches_per_forward(tiny_cfg, None, torch.device("cpu"), 16) == 1

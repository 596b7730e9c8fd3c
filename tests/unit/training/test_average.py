"""The weight average of `optim.ema`: torch's EMA of the parameters, a tie kept tied."""

import torch

from charlm.model.gpt import GPT
from charlm.training.average import WeightAverage
from tests.helpers import tiny_model_config


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

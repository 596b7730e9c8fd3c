"""charlm.training.tasks: the checks every loader runs on stored weights before it builds a
model from them."""

import math

import pytest
import torch

from charlm.training.tasks import check_weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_finite_floating_point_weights_of_any_width_pass(dtype):
    check_weights({"wte.weight": torch.randn(3, 4).to(dtype)})


@pytest.mark.parametrize("weight, detail", [
    (torch.ones(3, dtype=torch.int32), "holds torch.int32, not floating-point weights"),
    (torch.ones(3, dtype=torch.bool), "holds torch.bool, not floating-point weights"),
    (torch.ones(3, dtype=torch.complex64), "holds torch.complex64, not floating-point weights"),
    ([1.0, 2.0], "holds list, not floating-point weights"),
])
def test_weights_that_are_not_floating_point_are_refused(weight, detail):
    """load_state_dict cast them into the float parameters: sample printed `ROMEOKKKK...`."""
    with pytest.raises(ValueError) as e:
        check_weights({"wte.weight": torch.zeros(2), "head.weight": weight})
    assert str(e.value) == f"head.weight {detail}; use weights that charlm saved"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_weights_that_are_not_finite_are_refused(bad):
    """eval printed `loss nan` with exit code 0."""
    weight = torch.zeros(3, 4, dtype=torch.bfloat16)
    weight[2, 1] = bad
    with pytest.raises(ValueError) as e:
        check_weights({"wte.weight": weight})
    assert str(e.value) == ("wte.weight holds NaN or inf (the weights diverged); use an earlier "
                            "checkpoint, or train again with a lower optim.lr")

"""torch.compile of the one-token decode step (charlm.generation.compiled_step): tracing costs
seconds, so these live here rather than beside the eager decoding tests in tests/unit."""

import torch

from charlm.config.sampling import SampleConfig
from charlm.generation import compiled_step
from tests.helpers import RANDOM_GPT_VOCAB, decode_ids, random_gpt

V = RANDOM_GPT_VOCAB


def test_the_compiled_step_is_one_graph_for_every_position(monkeypatch):
    """One graph, traced once, serves every step of a decode and of a later one: the position
    is a device tensor, so no step changes what the compiler guards on (a stand-in backend
    that runs the traced graph counts the traces)."""
    model = random_gpt()
    traces = []

    def backend(gm, example_inputs):
        traces.append(gm)
        return gm.forward

    step = torch.compile(compiled_step.decode_one_token, backend=backend, dynamic=False,
                         fullgraph=True)
    monkeypatch.setattr(compiled_step, "compiled_decode_step", lambda: step)
    prompt = torch.randint(0, V, (1, 3))
    for _ in range(2):  # 30 tokens: past a full window of 16 and its re-prefill
        assert torch.equal(decode_ids(model, prompt, 30, SampleConfig(temperature=0, compile=True)),
                           decode_ids(model, prompt, 30))
    assert len(traces) == 1

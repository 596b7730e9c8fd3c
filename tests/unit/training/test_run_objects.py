"""charlm.training.run_objects: the presets' batches pass the memory guard of an 8 GiB laptop."""

from __future__ import annotations

import pytest
import torch

from charlm.config.loading import load_config
from charlm.model.footprint import training_bytes
from charlm.training.run_objects import require_batch_memory
from charlm.training.tasks import task_for
from tests.helpers import (
    GIB,
    ROOT,
    fixed_memory,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("config", [None, "shakespeare_char_cpu.yaml", "shakespeare_char.yaml"])
def test_the_presets_pass_the_guard_of_an_8_gib_laptop(config, corpus, tmp_path, monkeypatch):
    """On the CPU, float32: the default, the CPU preset, and the GPU preset (whose dropout takes
    the attention's math path, T x T weights and all) need well under 8 GiB."""
    cfg = load_config(None if config is None else ROOT / "configs" / config,
                      [f"data.path={corpus}"])
    task = task_for(cfg, tmp_path / "dataset")
    need = training_bytes(cfg.model, len(task.vocab), cfg.train.batch_size, torch.float32, CPU)
    assert need < (6 if config == "shakespeare_char.yaml" else 0.1) * GIB  # 5.0 estimated
    fixed_memory(monkeypatch, 8)
    require_batch_memory(task, CPU, torch.float32, cfg.train.batch_size)

"""charlm.runtime.distributed: the rows of the seeded global batch that each rank keeps."""

import numpy as np
import torch

from charlm.data.batches import BatchSampler
from charlm.runtime.distributed import Dist


def test_each_rank_keeps_its_rows_of_the_same_global_batch():
    data = np.arange(1000, dtype=np.uint16)
    cpu = torch.device("cpu")
    full = BatchSampler(data, 8, 6, cpu, seed=5)
    shards = [BatchSampler(data, 8, 6, cpu, seed=5, rows=Dist(rank=r, world_size=3).rows(6))
              for r in range(3)]
    for _ in range(3):
        x, y = full.batch()
        parts = [s.batch() for s in shards]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
    assert all(torch.equal(s.generator.get_state(), full.generator.get_state()) for s in shards)

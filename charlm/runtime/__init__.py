"""Runtime: where and how a run computes: the device and its memory, precision (the dtype,
autocast, GradScaler, torch.compile), and torchrun's process group. May import: core, config."""

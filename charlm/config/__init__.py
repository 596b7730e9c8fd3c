"""Config: the run schema (typed dataclasses with their validation), its YAML reader, `--set`
overrides, and the sampling options. Torch-free. May import: core."""

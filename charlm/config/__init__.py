"""Config: the run schema (typed dataclasses with their validation), the YAML reader that keeps
every scalar as text until its field types it, `--set` overrides, and the sampling options.
Torch-free. May import: core."""

"""The pieces of `scripts/bench.py`: the harness every subcommand shares (`harness`: interleaved
rounds, statistics, JSON lines; `trees`: the same rounds over other checkouts) and one module per
measurement: `decode`, `train` (with `peak` for MFU), `presets` (with `loss`, the wall time to a
val loss) and `prepare`."""

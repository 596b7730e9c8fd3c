"""Training: `train(cfg)` and its loop, the run's objects, checkpoints, the run dir, the
optimizer, the time budget, stop signals, metrics and the validation loss; `tasks` holds what
differs between a GPT on text and an encoder-decoder on pairs.
May import: core, config, data, model, runtime, generation, evaluation."""

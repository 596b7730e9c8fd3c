"""Training: `train(cfg)` and its loop, the run's objects, checkpoints, the run dir, the
optimizer, the schedule, faults, metrics and the eval loss; `tasks` holds what differs between
text and pairs. May import: core, config, data, model, runtime, generation, evaluation."""

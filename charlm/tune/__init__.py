"""Tune: `charlm tune`'s library: the search space, the Optuna study and its storage, trials as
child `charlm train` processes, the runner over them and what a study reports.
May import: everything below it (core up to training)."""

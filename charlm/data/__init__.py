"""Data: the vocabularies, text and paired-text preparation into dataset dirs (chunked reading,
hashing on a second thread), loading those dirs, and the batch samplers training draws from.
May import: core, config."""

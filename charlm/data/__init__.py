"""Data: the vocabularies, text and paired text prepared into dataset dirs and loaded back, and
the batch samplers training draws from. May import: core, config."""

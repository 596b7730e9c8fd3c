"""Evaluation: bits per character of a text (windows that score each character once), and
exact match, WER and CER / PER of an encoder-decoder's outputs against references.
May import: core, config, data, model, runtime, generation."""

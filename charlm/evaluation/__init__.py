"""Evaluation: a text's bits per character, and an encoder-decoder's exact match, WER and CER /
PER against references. May import: core, config, data, model, runtime, generation."""

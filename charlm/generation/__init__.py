"""Generation: decoding ids (logits processors, the cached decode loop, beam search), the text
layer over it (prompts, stop strings, samples), and the encoder-decoder's decoding of sources.
May import: core, config, data, model, runtime."""

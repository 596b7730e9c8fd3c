"""Models: the layers, attention with its KV cache, the GPT, the encoder-decoder, and the memory
footprint of a model's batches estimated from its config. May import: core, config."""

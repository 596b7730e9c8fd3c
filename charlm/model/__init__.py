"""Models: the layers, attention with its KV cache, the GPT, the encoder-decoder, and the memory
footprint of a model's batches estimated from its config. May import: core, config.

Shapes in the models: B batch, T new tokens (positions), S source or key length, L a cache's
length, C n_embd, H n_head, D head_dim = C // H, F the MLP's hidden width, V the vocabulary."""

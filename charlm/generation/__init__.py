"""Generation: decoding ids (sampling, beams, the compiled step), its text layer, and the
encoder-decoder's decoding. May import: core, config, data, model, runtime."""

"""Core: the error type users see, writes that are never left half-done, durations, and which
process of a torchrun world speaks. Torch-free; imports nothing else of charlm."""

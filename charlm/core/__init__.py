"""Core: the error type users see, writes that are never left half-done, durations, which
process of a torchrun world speaks, and the parent-death signal. Torch-free; imports nothing
else of charlm."""

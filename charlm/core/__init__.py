"""Core: the error type users see, writes never left half-done, durations, which torchrun process
speaks, and the parent-death signal. Torch-free; imports nothing else of charlm."""

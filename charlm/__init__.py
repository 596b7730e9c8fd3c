"""charlm: train character-level GPT language models on any text file, and sample from them.
The Python API lives in `charlm.api`, imported on first use so `charlm --help` skips torch."""

__version__ = "0.1.0"
__all__ = ["load", "generate", "sample", "score", "translate", "LM", "CharlmError"]


def __getattr__(name: str):
    if name in __all__:
        from charlm import api

        return getattr(api, name)
    raise AttributeError(f"module 'charlm' has no attribute {name!r}")

"""charlm: train character-level GPT language models on any text file, and sample from them.

The Python API (`load`, `generate`, `sample`, `score`, `translate`) lives in `charlm.api`; it is
imported on first use so that `charlm --help` does not pay for importing torch.
"""

import sys
import types

__version__ = "0.1.0"
__all__ = ["load", "generate", "sample", "score", "translate", "LM", "CharlmError"]


def __getattr__(name: str):
    if name in __all__:
        from charlm import api

        return getattr(api, name)
    raise AttributeError(f"module 'charlm' has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps `charlm.generate` the API function: importing the submodule `charlm.generate`
    would otherwise bind the module over it (the module stays in `sys.modules`)."""

    def __setattr__(self, name: str, value) -> None:
        if name == "generate" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

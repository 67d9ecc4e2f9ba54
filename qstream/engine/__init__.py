"""The streaming engine: plans blocks (one destination chunk each) and runs them on workers
with bounded memory, merging their statistics in block order."""

from __future__ import annotations

import importlib


def __getattr__(name: str):  # (the submodules named in __all__, loaded on demand)
    if name in __all__:
        module = importlib.import_module(f"qstream.engine.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'qstream.engine' has no attribute {name!r}")


# the names the folders above may use; the submodules named here are loaded on demand
__all__ = ["warmup"]

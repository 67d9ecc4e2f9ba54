"""Compatibility profiles: each reproduces one framework's quantize/dequantize exactly.

``qstream.compat.onnx``, ``.tensorflow``, ``.onednn``, ``.ngraph`` and ``.torch`` turn their
framework's attributes into core parameters; only the places where the arithmetic really differs
(TensorFlow's range modes, torch's reciprocal) are written out here. ``.gguf`` reproduces
gguf-py's block types (their own scale derivations, float16 scales and nibble layout).
"""

from __future__ import annotations

import importlib

PROFILES = ("onnx", "tensorflow", "onednn", "ngraph", "torch", "gguf")


def __getattr__(name: str):
    if name in PROFILES:
        module = importlib.import_module(f"qstream.compat.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'qstream.compat' has no attribute {name!r}")


# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "PROFILES",
    "gguf",
    "gguf_legacy",
    "gguf_names",
]

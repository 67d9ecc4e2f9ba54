"""Files for other loaders: safetensors, compressed-tensors folders, GGUF."""

from .safetensors import FORMATS, export_safetensors, source_config
from .targets import check_targets, finished_export, shard_pattern

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "FORMATS",
    "check_targets",
    "compressed_tensors",
    "export_safetensors",
    "finished_export",
    "safetensors",
    "shard_pattern",
    "source_config",
]

"""Files for other loaders: safetensors, compressed-tensors folders, GGUF."""

from .entries import exported_nbytes, recorded_db
from .model_files import MODEL_FILES, files_to_copy, find_model_files, plan_copies
from .safetensors import FORMATS, describe_export, export_safetensors, source_config
from .targets import check_targets, finished_export, job_digest, shard_pattern

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "FORMATS",
    "MODEL_FILES",
    "check_targets",
    "compressed_tensors",
    "describe_export",
    "export_safetensors",
    "exported_nbytes",
    "files_to_copy",
    "find_model_files",
    "finished_export",
    "job_digest",
    "plan_copies",
    "recorded_db",
    "safetensors",
    "scheme_export",
    "shard_pattern",
    "source_config",
]

"""Model checkpoints read tensor by tensor, one module per format.

The GGUF readers (:mod:`.gguf_header`, :mod:`.gguf_metadata`, :mod:`.gguf_source`) are
imported from their modules where they are used: a conversion of safetensors loads none.
"""

from .ct_formats import check_quant_config, is_activation_param
from .dtypes import dtype_facts
from .export_meta import CONFIG, export_metadata, qstream_meta, read_json, source_config
from .exported import DequantizedTensor
from .fp8 import pair_scales
from .open import CheckpointSource, describe_stored, open_checkpoint, source_locations
from .remote import is_url
from .tensor import TensorLike, map_file_run, read_file_run, read_rows

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "CONFIG",
    "CheckpointSource",
    "DequantizedTensor",
    "TensorLike",
    "check_quant_config",
    "describe_stored",
    "dtype_facts",
    "export_metadata",
    "gguf_metadata",
    "gguf_source",
    "is_activation_param",
    "is_url",
    "map_file_run",
    "open_checkpoint",
    "pair_scales",
    "qstream_meta",
    "read_file_run",
    "read_json",
    "read_rows",
    "source_config",
    "source_locations",
]

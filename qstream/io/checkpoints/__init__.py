"""Model checkpoints read tensor by tensor, one module per format."""

from .ct_formats import check_quant_config, is_activation_param
from .dtypes import dtype_facts
from .export_meta import CONFIG, export_metadata, qstream_meta, read_json, source_config
from .exported import DequantizedTensor
from .fp8 import pair_scales
from .gguf_header import GGUFHeader, read_header
from .gguf_metadata import describe_gguf, gguf_config
from .gguf_source import KNOWN, architecture
from .open import CheckpointSource, describe_stored, open_checkpoint, source_locations
from .remote import is_url
from .tensor import TensorLike, map_file_run, read_file_run, read_rows

# the names the folders above may use
__all__ = [
    "CONFIG",
    "KNOWN",
    "CheckpointSource",
    "DequantizedTensor",
    "GGUFHeader",
    "TensorLike",
    "architecture",
    "check_quant_config",
    "describe_gguf",
    "describe_stored",
    "dtype_facts",
    "export_metadata",
    "gguf_config",
    "is_activation_param",
    "is_url",
    "map_file_run",
    "open_checkpoint",
    "pair_scales",
    "qstream_meta",
    "read_file_run",
    "read_header",
    "read_json",
    "read_rows",
    "source_config",
    "source_locations",
]

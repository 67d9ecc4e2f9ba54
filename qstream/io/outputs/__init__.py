"""qstream's own outputs: their layout, life and readers."""

from .cleanup import remove_output
from .destination import (
    Action,
    Destination,
    Lease,
    check_separate,
    check_writable,
    is_local_node,
    locked,
)
from .existing import Existing, inspect_destination, is_checkpoint
from .ondisk import FLAT_KEYS, check_writer
from .pack_layout import ERROR_COLUMNS
from .progress_log import ProgressLog
from .qarray import exported_checkpoint, open_quantized
from .quantized import QuantizedArray
from .reader import QuantizedCheckpoint
from .rootindex import ERROR_KEYS, RootIndex, compact
from .scientific import (
    carried_attrs,
    codes_attrs,
    coordinates,
    copy_coords,
    copy_coords_beside,
    drop_progress,
    source_attrs,
    source_dims,
)

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "ERROR_COLUMNS",
    "ERROR_KEYS",
    "FLAT_KEYS",
    "Action",
    "Destination",
    "Existing",
    "Lease",
    "ProgressLog",
    "QuantizedArray",
    "QuantizedCheckpoint",
    "RootIndex",
    "carried_attrs",
    "check_separate",
    "check_writable",
    "check_writer",
    "codec",
    "codes_attrs",
    "compact",
    "coordinates",
    "copy_coords",
    "copy_coords_beside",
    "destination",
    "drop_progress",
    "exported_checkpoint",
    "inspect_destination",
    "is_checkpoint",
    "is_local_node",
    "locked",
    "open_quantized",
    "pack_layout",
    "publish",
    "qarray",
    "remove_output",
    "source_attrs",
    "source_dims",
]

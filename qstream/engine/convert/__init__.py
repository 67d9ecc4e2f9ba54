"""A whole checkpoint: tensors grouped into units and packs, resumable."""

from .convert_checkpoint import convert, prepare
from .events import TensorEvent, describe_target
from .restoring import look_restore, restore

# the names the folders above may use
__all__ = [
    "TensorEvent",
    "convert",
    "describe_target",
    "look_restore",
    "prepare",
    "restore",
]

"""Zarr v3 without zarr-python, stores and URLs, chunk codecs."""

from .arraydoc import auto_chunks, is_plain_dtype, plain_array
from .backends import one_line, store_errors, with_backend
from .chunks import PARTIAL, chunk_files
from .columns import float_column, float_values, listed_floats
from .compression import NONE
from .inplace import map_bytes
from .localgroup import LocalGroup, open_local, read_all
from .localmeta import encode_doc, group_doc, read_local_doc, write_doc
from .locations import MEMORY_STORES, display, imported_zarr, inside, location
from .names import check_key, tensor_key
from .removal import (
    ARRAY_KEY,
    delete_keys,
    entry_kind,
    is_array_doc,
    is_array_doc_at,
    is_plain_dir,
    remove_array_files,
    remove_if_empty,
    remove_partials,
)
from .required import require_chunks
from .sources import ArrayWriter, Source
from .stores import (
    ALL_CHUNKS,
    all_chunks,
    open_group,
    open_source,
    open_store,
    read_region,
    stored_sizes,
)
from .suffixes import check_destination_suffix

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "ALL_CHUNKS",
    "ARRAY_KEY",
    "MEMORY_STORES",
    "NONE",
    "PARTIAL",
    "ArrayWriter",
    "LocalGroup",
    "Source",
    "all_chunks",
    "auto_chunks",
    "check_destination_suffix",
    "check_key",
    "chunk_files",
    "compression",
    "delete_keys",
    "display",
    "encode_doc",
    "entry_kind",
    "float_column",
    "float_values",
    "group_doc",
    "imported_zarr",
    "inside",
    "is_array_doc",
    "is_array_doc_at",
    "is_plain_dir",
    "is_plain_dtype",
    "listed_floats",
    "localmeta",
    "location",
    "map_bytes",
    "one_line",
    "open_group",
    "open_local",
    "open_source",
    "open_store",
    "plain_array",
    "read_all",
    "read_local_doc",
    "read_region",
    "remove_array_files",
    "remove_if_empty",
    "remove_partials",
    "require_chunks",
    "store_errors",
    "stored_sizes",
    "tensor_key",
    "with_backend",
    "write_doc",
]

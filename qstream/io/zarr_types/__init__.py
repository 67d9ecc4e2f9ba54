"""qstream's Zarr data types and packbits codec for zarr-python (loaded through its entry points
at every zarr open where qstream is installed), and the byte sizes of packed values: a folder
of its own so that loading them imports nothing else of qstream."""

# the submodules the folders above may use, loaded on demand
__all__ = ["packing", "zarr_ext"]

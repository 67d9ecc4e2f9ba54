"""The lowest layer: array layouts, the affine core, buffers."""

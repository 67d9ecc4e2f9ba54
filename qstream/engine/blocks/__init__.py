"""qstream/engine/blocks."""

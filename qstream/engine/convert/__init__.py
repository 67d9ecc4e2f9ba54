"""qstream/engine/convert."""

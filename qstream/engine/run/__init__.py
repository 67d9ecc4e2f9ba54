"""qstream/engine/run."""

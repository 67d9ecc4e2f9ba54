"""qstream/io/checkpoints."""

"""qstream/io/outputs."""

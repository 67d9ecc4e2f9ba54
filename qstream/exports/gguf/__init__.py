"""qstream/exports/gguf."""

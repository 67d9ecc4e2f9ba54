"""qstream/io/storage."""

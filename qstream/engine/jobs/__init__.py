"""qstream/engine/jobs."""

"""The streaming engine: plans blocks (one destination chunk each) and runs them on workers
with bounded memory, merging their statistics in block order."""

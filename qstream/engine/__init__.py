"""The streaming engine: plans blocks aligned to the destination's chunks and runs them with
bounded memory (reads ahead, computes, writes behind)."""

"""Stores and sources: opening inputs, creating outputs, the on-disk layout."""

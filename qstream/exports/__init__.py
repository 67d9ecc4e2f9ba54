"""Exports to formats other tools load (GGUF for llama.cpp)."""

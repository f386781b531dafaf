"""Flax models (the BERT-style encoder, the decoder LMs, their key/value cache), their weights (safetensors, GGUF,
part packages), tokenizers and the registry of names the command line knows.

Layer: imports `parallel` and `base` alone.
"""

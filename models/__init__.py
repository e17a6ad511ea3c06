"""Flax NNX decoder-only Transformers (installed as ``jaxmem.models``)."""

"""Inference and closed forms: ``infer`` (prefill and decode with a KV cache), ``quant`` (weight
formats) and ``estimate`` (the rules of thumb, with their sources)."""

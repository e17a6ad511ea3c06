"""Inference: ``infer`` (prefill and decode with a KV cache), ``quant`` (weight formats),
``serving`` (the largest serving workload that fits) and ``versus`` (training against inference).
The closed forms (the rules of thumb, with their sources) are :mod:`jaxmem.planning.estimate`."""

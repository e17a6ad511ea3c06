"""Compiling for a target and reading what the compiler says.

``startup`` (starting JAX for what jaxmem does), ``accelerators`` (compile-only TPU and GPU
devices), ``targets`` (named device sets and their capacity), ``analysis`` (:func:`analyze`),
``report`` (reading ``memory_analysis()``; a refused compile), ``flops`` (counting from the jaxpr).
"""

"""Compiling for a target and reading what the compiler says.

``startup`` (starting JAX for what jaxmem does), ``tpu`` and ``gpu`` (compile-only TPU and GPU
devices), ``cuda_plugin`` (registering the CUDA plugin late), ``availability`` (whether a
target's compiler works here), ``capacity`` (usable memory per device), ``oom`` (reading
out-of-memory messages), ``targets`` (named device sets and their capacity), ``analysis`` (:func:`analyze`),
``report`` (reading ``memory_analysis()``; a refused compile), ``flops`` (counting from the jaxpr).
"""

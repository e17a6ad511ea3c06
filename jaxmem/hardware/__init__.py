"""The hardware catalogue: what a target is, and what this machine can compile for.

``targets`` (named device sets and their kinds: devices, capacity, peaks, host memory, runtime
terms), ``tpu`` and ``gpu`` (the parts' specifications and their compile-only devices),
``cuda_plugin`` (registering the CUDA plugin late), ``startup`` (starting JAX for what jaxmem
does), ``availability`` (whether a target's compiler works here), ``capacity`` (usable memory per
device, read from the TPU compiler's out-of-memory message, ``oom``), ``peaks`` (published peak
figures per device), ``hostmem`` (host RAM per device), ``margin`` (what a runtime holds beside
the program, and the verdict at the edge of capacity).
"""

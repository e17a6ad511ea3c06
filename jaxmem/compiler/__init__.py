"""Compiling for a target and reading what the compiler says.

``analysis`` (:func:`analyze`), ``figures`` (one compile and its figures), ``report`` (reading
``memory_analysis()``; a refused compile), ``flops`` (counting from the jaxpr), ``steptime`` and
``optimes`` (step time from the compiler's figures and the target's peaks). What a target is lives
in :mod:`jaxmem.hardware`; the one call of XLA's compiler in :mod:`jaxmem.xla`.
"""

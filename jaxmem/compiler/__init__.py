"""Compiling for a target and reading what the compiler says.

``analysis`` (:func:`analyze`), ``figures`` (one compile and its figures), ``report`` (reading
``memory_analysis()``; a refused compile), ``flops`` (counting from the jaxpr). ``report`` and
``flops`` sit a layer below :mod:`jaxmem.steptime` (the step time, which reads the report), and
``figures`` a layer above it (it forms each compile's step time). What a target is lives in
:mod:`jaxmem.hardware`; the one call of XLA's compiler in :mod:`jaxmem.xla`.
"""

"""Sweeps and planning: ``sweep`` (compiling a task into a row; ``compare``), ``runner`` (running
tasks from the cache, in processes or on Dask), ``fit`` (the largest workload that fits),
``scale`` (growth with the workload), ``search`` (``plan``: the fastest configuration that fits),
``estimate`` (the closed forms, with their sources) and ``validate`` (prediction against a
measured peak). A workload's names are resolved into a :class:`~jaxmem.resolve.Plan` by
:mod:`jaxmem.resolve`; rows on disk are :mod:`jaxmem.cache`."""

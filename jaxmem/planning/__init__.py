"""Sweeps and planning: ``plan`` (a validated sweep and its tasks), ``sweep`` (compiling a task
into a row; ``compare``), ``runner`` (running tasks from the cache, in processes or on Dask),
``cache`` (rows on disk), ``fit`` (the largest workload that fits), ``scale`` (growth with the
workload) and ``validate`` (prediction against a measured peak)."""

"""MaxText in jaxmem: its own train step as a step source, and jaxmem's options spelt as its
options through one table.

- :mod:`~jaxmem.maxtext.table`: the one mapping, every jaxmem axis and configuration field to
  MaxText's options or a typed refusal (:class:`~jaxmem.maxtext.table.NoMaxTextMapping`);
- :mod:`~jaxmem.maxtext.step`: MaxText's train step, built as ``train_compile`` builds it (the
  ``maxtext`` extra), a factory like any user's step;
- :mod:`~jaxmem.maxtext.emit`: a compiled configuration as MaxText's overrides (``plan --emit maxtext``);
- :mod:`~jaxmem.maxtext.plan`: a ``maxtext`` workload resolved into a plan (``--maxtext``),
  registered with :data:`jaxmem.resolve.STEP_PLANNERS`;
- :mod:`~jaxmem.maxtext.search`: ``plan --maxtext``'s search.

One package across the library's layers (tests/test_layers.py): the table, the step and emit sit
with the program, the planner with resolve, the search with planning, each importing only
downward. Nothing here imports MaxText until a workload names it.
"""

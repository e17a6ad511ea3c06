"""``jaxmem.plan``: the fastest configuration that fits, searched for the workload's step:
jaxmem's own model (:func:`jaxmem.planning.search.plan`) or MaxText's own step
(:func:`jaxmem.maxtext.search.plan`, a workload with ``maxtext``). The choice is made
here, above both searches, so neither imports the other."""

from __future__ import annotations

from typing import Any

from jaxmem.errors import JaxmemError
from jaxmem.options import RunOptions
from jaxmem.maxtext import search as maxtext_search
from jaxmem.planning import search
from jaxmem.planning.search import DEFAULT_BUDGET, PlanResult
from jaxmem.workload import Workload


def plan(
    workload: Workload | None = None,
    /,
    *,
    budget: int = DEFAULT_BUDGET,
    run: RunOptions | None = None,
    **fields: Any,
) -> PlanResult:
  """The fastest configuration of ``workload`` (with ``fields`` replaced: ``model``, ``target``,
  ``batch``, ``seq``, ``optimizer``..., or ``maxtext``) that fits, from at most ``budget``
  compiles (:mod:`jaxmem.planning.search` says how). ``run`` (or its fields as keywords,
  :class:`jaxmem.options.RunOptions`): ``on_start`` is told the number of candidates to compile,
  before the first; ``on_row`` each compiled (or cached) row; ``jobs`` compiles that many at
  once (``scheduler``: on that cluster)."""
  run = RunOptions.of(run, fields)
  if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
    raise JaxmemError(f"`budget` must be a whole number of compiles, at least 1 (got {budget!r})")
  w = Workload.of(workload, **fields)
  if w.maxtext:
    return maxtext_search.plan(w, budget=budget, run=run)
  return search.plan(w, budget=budget, run=run)

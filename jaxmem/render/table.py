"""``jaxmem.table``: any result of the Python API as the CLI would print it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxmem.errors import JaxmemError


def table(result: Any, fmt: str = "table", *, totals: bool = False) -> str:
  """``result`` (what :func:`jaxmem.compare`, ``fit``, ``plan``, ``scale``, ``explain``, ``infer``,
  ``estimate`` or ``diff`` returned) as the matching command prints it: ``fmt`` is table, markdown,
  json or csv (a diff: not csv, as ``jaxmem diff``); ``totals`` adds the compare table's total
  columns.

  >>> import jaxmem
  >>> rows = jaxmem.compare(model="tiny", batch=2, seq=16, target="cpu", remat="full")
  >>> print(jaxmem.table(rows, "csv").splitlines()[0][:30])
  model,target,mesh,batch,num_de
  """
  # Imported here: each renderer imports the result type it renders, and those import jax.
  from jaxmem.buffers.analyse import Explanation
  from jaxmem.buffers.diff import ResultDiff
  from jaxmem.planning.estimate import Estimate
  from jaxmem.inference.infer import InferRow
  from jaxmem.planning.fit import FitResult
  from jaxmem.planning.scale import Scaling
  from jaxmem.planning.search import PlanResult
  from jaxmem.planning.sweep import Row
  from jaxmem.render import tables
  from jaxmem.render.diff import render_diff
  from jaxmem.render.explain import render_explain
  from jaxmem.render.inference import render_estimates, render_infer
  from jaxmem.render.plan import render_plan

  tables.check_format(fmt)
  if isinstance(result, Explanation):
    return render_explain(result, fmt)
  if isinstance(result, ResultDiff):
    return render_diff(result, fmt)
  if isinstance(result, PlanResult):
    return render_plan(result, fmt)
  if isinstance(result, Scaling):
    return tables.render_scale(result.rows, result.growth, fmt, totals=totals)
  items: Sequence[Any] = list(result) if isinstance(result, (list, tuple)) else [result]
  kinds = {type(r) for r in items}
  if not items or len(kinds) > 1:
    raise JaxmemError(f"jaxmem.table takes the result of one call (got {', '.join(sorted(k.__name__ for k in kinds)) or 'nothing'})")
  kind = kinds.pop()
  if issubclass(kind, Row):
    return tables.render_compare(items, fmt, totals=totals)
  if issubclass(kind, FitResult):
    return tables.render_fit(items, fmt)
  if issubclass(kind, InferRow):
    return render_infer(items, fmt)
  if issubclass(kind, Estimate):
    return render_estimates(items, fmt)
  raise JaxmemError(f"jaxmem.table cannot render {kind.__name__}; give it what compare, fit, scale, explain, infer, estimate or diff returned")

"""``jaxmem.table``: any result of the Python API as the CLI would print it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxmem.errors import JaxmemError


def table(result: Any, fmt: str = "table", *, totals: bool = False, columns: str | Sequence[str] | None = None) -> str:
  """``result`` (what :func:`jaxmem.compare`, ``fit``, ``plan``, ``scale``, ``explain``, ``infer``,
  ``estimate`` or ``diff`` returned) as the matching command prints it: ``fmt`` is table, markdown,
  json or csv (a diff: not csv, as ``jaxmem diff``); ``totals`` adds the compare table's total
  columns; ``columns`` chooses the table's columns as ``--columns`` does (sets such as ``all``,
  ``memory``, ``time``, or columns by their JSON names; default: the figures that decide a
  launch), in a table or markdown only (JSON and CSV carry every field).

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
  from jaxmem.render import columns as cols
  from jaxmem.render import tables
  from jaxmem.render.diff import render_diff
  from jaxmem.render.explain import render_explain
  from jaxmem.render.inference import render_estimates, render_infer
  from jaxmem.render.plan import render_plan

  tables.check_format(fmt)

  def chosen(*registries: list[cols.Column], name: str = type(result).__name__) -> frozenset[str]:
    """``columns`` read against the result's tables (refused where it has none, as the CLI does)."""
    if columns is not None and fmt in ("json", "csv"):
      raise JaxmemError(f"`columns` chooses a table's columns; {fmt} writes every field")
    if columns is not None and not registries:
      raise JaxmemError(f"`columns` chooses a table's columns; a {name}'s output has none to choose")
    return cols.choose(columns, *registries)

  if isinstance(result, Explanation):
    return render_explain(result, fmt, columns=chosen(cols.EXPLAIN_BUFFERS))
  if isinstance(result, ResultDiff):
    chosen()
    return render_diff(result, fmt)
  if isinstance(result, PlanResult):
    return render_plan(result, fmt, columns=chosen(cols.PLAN))
  if isinstance(result, Scaling):
    return tables.render_scale(result.rows, result.growth, fmt, totals=totals, columns=chosen(cols.COMPARE, cols.GROWTH))
  items: Sequence[Any] = list(result) if isinstance(result, (list, tuple)) else [result]
  kinds = {type(r) for r in items}
  if not items or len(kinds) > 1:
    raise JaxmemError(f"jaxmem.table takes the result of one call (got {', '.join(sorted(k.__name__ for k in kinds)) or 'nothing'})")
  kind = kinds.pop()
  if issubclass(kind, Row):
    return tables.render_compare(items, fmt, totals=totals, columns=chosen(cols.COMPARE))
  if issubclass(kind, FitResult):
    return tables.render_fit(items, fmt, columns=chosen(cols.FIT))
  if issubclass(kind, InferRow):
    return render_infer(items, fmt, columns=chosen(cols.INFER))
  if issubclass(kind, Estimate):
    chosen(name=kind.__name__)
    return render_estimates(items, fmt)
  raise JaxmemError(f"jaxmem.table cannot render {kind.__name__}; give it what compare, fit, scale, explain, infer, estimate or diff returned")

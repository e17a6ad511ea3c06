"""How an entry point runs, apart from what it compiles: :class:`RunOptions`.

The workload (:class:`jaxmem.workload.Workload`) says what is compiled and is part of a row's
cache key; the run options say how the compiles are carried out (in how many processes, on which
cluster, with which row cache) and who hears about their progress. They never change a figure.
Every entry point (``compare``, ``fit``, ``rank_configurations``, ``scale``, ``plan``,
``remat_search``, ``infer``, ``fit_serving``, ``explain``, ``validate``) takes one as ``run=``, or
its fields as keywords beside the workload's (``compare(model="tiny", jobs=2)``), as
:meth:`RunOptions.of` splits them. An option an entry point cannot honour is refused in one line
(:meth:`RunOptions.refuse`), never ignored.

The callbacks mean the same everywhere:

- ``on_start(Started)``: the input was checked and compiling begins; ``Started.total`` is the
  number of compiles planned (``None`` for a search, whose count is known only at its end) and
  ``Started.model`` the model's resolved config (a :class:`jaxmem.models.ModelConfig`).
- ``on_row(row)``: one configuration finished (compiled, refused or answered by the cache); its
  result record (a ``Row``, an ``InferRow``, a ``Measurement``).
- ``on_round(round, compiles)``: a search finished its ``round``-th round of ``compiles``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jaxmem.errors import JaxmemError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Started:
  """What ``on_start`` is told: ``total`` compiles follow (``None``: a search, counted at its
  end) of ``model`` (the model's resolved config; ``None`` for a user's own step)."""

  total: int | None
  model: Any = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
  """How to run: ``jobs`` compiles at once, each in its own process (1: in this one);
  ``scheduler`` a Dask scheduler's address to compile on instead; ``cache`` a
  :class:`jaxmem.cache.RowCache` that answers configurations compiled before and keeps
  new ones (``None`` or ``False``: compile everything afresh, keep nothing); and the progress
  callbacks (the module docstring says what each is told)."""

  jobs: int = 1
  scheduler: str | None = None
  cache: Any = None
  on_start: Callable[[Started], None] | None = None
  on_row: Callable[[Any], None] | None = None
  on_round: Callable[[int, int], None] | None = None

  def __post_init__(self):
    if not isinstance(self.jobs, int) or isinstance(self.jobs, bool) or self.jobs < 1:
      raise JaxmemError(f"`jobs` must be a whole number of at least 1 (got {self.jobs!r})")
    if self.cache is False:
      object.__setattr__(self, "cache", None)

  @classmethod
  def of(cls, run: RunOptions | None, fields: dict[str, Any]) -> RunOptions:
    """``run`` (default options where ``None``) with any of its fields given among ``fields``
    (an entry point's keywords) taken out of ``fields`` and put in: what is left is the
    workload's. ``compare(model="tiny", jobs=2)`` is ``compare(model="tiny", run=RunOptions(jobs=2))``."""
    given = {f.name: fields.pop(f.name) for f in dataclasses.fields(cls) if f.name in fields}
    base = run if run is not None else cls()
    return dataclasses.replace(base, **given) if given else base

  def refuse(self, entry: str, why: str, *names: str) -> None:
    """One line naming the first option of ``names`` set away from its default, which ``entry``
    cannot honour (``why``)."""
    defaults: Mapping[str, Any] = {f.name: f.default for f in dataclasses.fields(self)}
    for name in names:
      if getattr(self, name) != defaults[name]:
        raise JaxmemError(f"{entry} does not take `{name}`: {why}")

  def start(self, total: int | None, model: Any = None) -> None:
    """Tells ``on_start`` that ``total`` compiles of ``model`` begin."""
    if self.on_start is not None:
      self.on_start(Started(total=total, model=model))

  def row(self, row: Any) -> None:
    """Tells ``on_row`` that ``row`` finished."""
    if self.on_row is not None:
      self.on_row(row)

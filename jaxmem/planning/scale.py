"""How memory grows with batch and sequence length, from the compiler, with fitted exponents.

The seeds' claims made measurable: parameters and optimizer state do not move with the
workload; activations (the temporaries) double when the batch doubles and at least double when
the sequence does, faster where attention scores of size T^2 are materialised. For each
component, the growth exponent is the least-squares slope of log(bytes) against log(batch) and
log(seq) over the grid: 0 means constant, 1 linear, 2 quadratic.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxmem.axes import group_fields, key, with_fields
from jaxmem.errors import JaxmemError
from jaxmem.events import notice
from jaxmem.options import RunOptions
from jaxmem.resolve import Plan, Task, plan
from jaxmem.planning.sweep import Row, run_rows, with_overheads
from jaxmem.program.train import moe_summary
from jaxmem.records import SWEPT_FIELDS, Record
from jaxmem.workload import Workload

COMPONENTS = (
    "param_bytes",
    "optimizer_state_bytes",
    "argument_size_in_bytes",
    "temp_size_in_bytes",
    "peak_memory_in_bytes",
    "total_bytes",
)
VARIABLES = ("batch", "seq")


def parse_over(specs: Sequence[str]) -> dict[str, list[int]]:
  """``["seq=1024,2048", "batch=8,16"]`` to ``{"seq": [1024, 2048], "batch": [8, 16]}``."""
  out: dict[str, list[int]] = {}
  for spec in specs:
    name, eq, values = spec.partition("=")
    name = name.strip()
    if not eq or name not in VARIABLES:
      raise JaxmemError(f"bad `over` {spec!r}: write seq=1024,2048 or batch=8,16")
    try:
      nums = sorted({int(v) for v in values.split(",") if v.strip()})
    except ValueError:
      raise JaxmemError(f"bad `over` {spec!r}: values must be whole numbers") from None
    if len(nums) < 2 or nums[0] < 1:
      raise JaxmemError(f"bad `over` {spec!r}: give at least two positive values to fit a growth rate")
    if name in out:
      raise JaxmemError(f"`over` {name} given twice")
    out[name] = nums
  return out


def default_over(w: Workload) -> dict[str, list[int]]:
  """The grid where ``over`` is not given: the sequence the plan takes (the default fitted to the
  model, or MaxText's config's) at a quarter, a half and whole; where ``seq`` is given, the batch
  the plan takes at once, twice and four times. Said in a notice."""
  if w.seq is not None and w.batch is not None:
    raise JaxmemError("scale needs `over` where `batch` and `seq` are both given, e.g. seq=512,1024,2048")
  p = plan(w)
  name, values = ("seq", [p.seq // 4, p.seq // 2, p.seq]) if w.seq is None else ("batch", [p.batch, 2 * p.batch, 4 * p.batch])
  if values[0] < 1:
    raise JaxmemError(f"scale needs `over` for seq {p.seq}, e.g. seq={p.seq},{2 * p.seq}")
  notice(f"over {name}={','.join(map(str, values))}: no `over` given (the {name} at "
         f"{'a quarter, a half and whole' if name == 'seq' else 'once, twice and four times'})")
  return {name: values}


def check_fixed(w: Workload, over: dict[str, list[int]]) -> None:
  """One line for a ``batch`` or ``seq`` given that ``over`` varies (the grid's values win)."""
  for name in over:
    if getattr(w, name) is not None:
      raise JaxmemError(f"`{name}` is what `over` {name} varies; drop one of them")


def grid(over: dict[str, list[int]], batch: int, seq: int) -> list[tuple[int, int]]:
  batches = over.get("batch", [batch])
  seqs = over.get("seq", [seq])
  return list(itertools.product(batches, seqs))


@dataclasses.dataclass(frozen=True, kw_only=True)
@with_fields("summary")
class Growth(Record):
  """A component's fitted growth exponents for one (mesh, optimizer, attention, microbatches, remat)."""

  mesh: str
  optimizer: str
  remat: str
  component: str
  batch_exponent: float | None  # None where the batch did not vary or the component is 0/missing
  seq_exponent: float | None
  attention: str | None = None
  microbatches: int = 1
  moe: str | None = None  # an MoE model's experts ("dropless", "capacity 1.25"); None when dense
  # (the group's swept fields, jaxmem.records.SWEPT_FIELDS, as its rows record them)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scaling(Record):
  """``scale``'s answer: one row per grid point and configuration, and the growth exponents."""

  rows: tuple[Row, ...]
  growth: tuple[Growth, ...]
  over: tuple[str, ...] = ()  # the variables the grid varies ("batch", "seq"), for plot()


def tasks(workload: Workload, over: dict[str, list[int]]) -> tuple[Plan, list[Task]]:
  """A task per grid point and configuration, and the plan that runs them (the first grid
  point's; every point is planned, so checked, once). ``scale`` measures what the user named:
  the no-remat baseline only if asked for."""
  out: list[Task] = []
  first = None
  for batch, seq in grid(over, workload.batch, workload.seq):
    p = plan(workload, batch=batch, seq=seq)
    first = first or p
    # MaxText's step: its plan holds the policies asked (or MaxText's own), never a baseline.
    named = workload.maxtext is not None or "all" in workload.remat
    out += [t for t in p.tasks() if named or t.remat in workload.remat]
  return first, out


def scale(
    workload: Workload | None = None,
    /,
    *,
    over: Sequence[str] | dict[str, list[int]] | None = None,
    run: RunOptions | None = None,
    **fields: Any,
) -> Scaling:
  """Compiles ``workload`` (``fields`` replaced; remat ``none`` unless named) at every point of
  ``over`` (``["seq=1024,2048"]`` or ``{"seq": [1024, 2048]}``; not given: :func:`default_over`)
  and fits growth exponents.
  Every point is checked before the first compile. ``run`` (or its fields as keywords,
  :class:`jaxmem.options.RunOptions`): ``on_start`` is then told the number of configurations,
  and ``on_row`` each row as it finishes."""
  run = RunOptions.of(run, fields)
  w = Workload.of(workload, defaults={"remat": "none"}, **fields)
  grid_over = over if isinstance(over, dict) else parse_over(over or [])
  grid_over = grid_over or default_over(w)
  check_fixed(w, grid_over)
  p, todo = tasks(w, grid_over)
  run.start(len(todo), p.cfg)
  rows = with_overheads(run_rows(p, todo, jobs=run.jobs, scheduler=run.scheduler, cache=run.cache, on_row=run.on_row))
  return Scaling(rows=tuple(rows), growth=tuple(growth_exponents(rows, grid_over)), over=tuple(grid_over))


def growth_exponents(rows: Sequence[Row], over: dict[str, list[int]]) -> list[Growth]:
  """Least-squares log-log slopes per (mesh, optimizer, attention, microbatches, remat) and
  component. Rows group by the attention implementation they used, so grid points where
  ``auto`` fell back to another kernel (at shapes its kernel cannot take) are fitted apart."""
  out = []
  groups: dict[tuple, list[Row]] = {}
  fields = group_fields()  # a configuration's: everything but the batch and the sequence
  for r in rows:
    groups.setdefault(key(r, fields), []).append(r)
  varying = [v for v in VARIABLES if v in over]
  for values, rs in groups.items():
    g = dict(zip(fields, values, strict=True))
    moe = moe_summary(g["moe_impl"], g["capacity_factor"], g["fsdp_shard_on_exp"])
    for comp in COMPONENTS:
      pts = [(r, getattr(r, comp)) for r in rs if r.error is None and getattr(r, comp)]
      exps: dict[str, float | None] = dict.fromkeys(VARIABLES)
      if len(pts) >= 2:
        x = np.array([[1.0] + [np.log(getattr(r, v)) for v in varying] for r, _ in pts])
        y = np.log(np.array([float(val) for _, val in pts]))
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        for v, c in zip(varying, coef[1:], strict=True):
          exps[v] = round(float(c), 3)
      out.append(
          Growth(
              mesh=g["mesh"], optimizer=g["optimizer"], remat=g["remat"], component=comp, batch_exponent=exps["batch"],
              seq_exponent=exps["seq"], attention=g["attention"], microbatches=g["microbatches"], moe=moe,
              **{k: g[k] for k in SWEPT_FIELDS},
          )
      )
  return out

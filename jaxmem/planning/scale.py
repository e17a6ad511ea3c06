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

from jaxmem.errors import JaxmemError
from jaxmem.options import RunOptions
from jaxmem.planning.plan import Plan, Task, plan
from jaxmem.planning.sweep import Row, run_rows, with_overheads
from jaxmem.records import SWEPT_FIELDS, Record
from jaxmem.render.figures import save_figure
from jaxmem.render.units import GiB
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
  if not out:
    raise JaxmemError("scale needs `over`, e.g. seq=1024,2048,4096")
  return out


def grid(over: dict[str, list[int]], batch: int, seq: int) -> list[tuple[int, int]]:
  batches = over.get("batch", [batch])
  seqs = over.get("seq", [seq])
  return list(itertools.product(batches, seqs))


@dataclasses.dataclass(frozen=True, kw_only=True)
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
  vocab_tiles: int = 1
  context_strategy: str | None = None
  # The group's swept fields (jaxmem.records.SWEPT_FIELDS), as its rows record them.
  param_dtype: str | None = None
  dtype: str | None = None
  dropout: float | None = None
  sequence_parallel: bool | None = None
  pipeline_microbatches: int | None = None
  pipeline_repeats: int | None = None
  qk_dtype: str | None = None
  master_dtype: str | None = None
  moments_dtype: str | None = None
  grad_reduce_dtype: str | None = None


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
    out += [t for t in p.tasks() if t.remat in workload.remat or "all" in workload.remat]
  return first, out


def scale(
    workload: Workload | None = None,
    /,
    *,
    over: Sequence[str] | dict[str, list[int]],
    run: RunOptions | None = None,
    **fields: Any,
) -> Scaling:
  """Compiles ``workload`` (``fields`` replaced; remat ``none`` unless named) at every point of
  ``over`` (``["seq=1024,2048"]`` or ``{"seq": [1024, 2048]}``) and fits growth exponents.
  Every point is checked before the first compile. ``run`` (or its fields as keywords,
  :class:`jaxmem.options.RunOptions`): ``on_start`` is then told the number of configurations,
  and ``on_row`` each row as it finishes."""
  run = RunOptions.of(run, fields)
  grid_over = over if isinstance(over, dict) else parse_over(over)
  w = Workload.of(workload, defaults={"remat": "none"}, **fields)
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
  for r in rows:
    moe = r.moe_impl and r.moe_impl + ("" if r.capacity_factor is None else f" {r.capacity_factor:g}")
    dtypes = tuple(getattr(r, k) for k in SWEPT_FIELDS)
    key = (r.mesh, r.optimizer, r.remat, r.attention, r.microbatches, r.vocab_tiles, moe, r.context_strategy, dtypes)
    groups.setdefault(key, []).append(r)
  varying = [v for v in VARIABLES if v in over]
  for (mesh, opt, remat, attention, mb, tiles, moe, strategy, dtypes), rs in groups.items():
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
              mesh=mesh, optimizer=opt, remat=remat, component=comp, batch_exponent=exps["batch"],
              seq_exponent=exps["seq"], attention=attention, microbatches=mb, moe=moe, vocab_tiles=tiles,
              context_strategy=strategy, **dict(zip(SWEPT_FIELDS, dtypes, strict=True)),
          )
      )
  return out


def plot(rows: Sequence[Row], over: dict[str, list[int]] | Sequence[str], path: str) -> None:
  """Each component against the varying workload (log-log), the capacity as a line; ``over``
  names the variables varied (a grid, or :attr:`Scaling.over`)."""
  # matplotlib is slow to import and needs its file-only backend chosen before pyplot.
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  var = "seq" if "seq" in over else "batch"
  other = "batch" if var == "seq" else "seq"
  fig, ax = plt.subplots(figsize=(8, 5))
  for (mesh, opt, remat, fixed, moe), rs in _series(rows, var, other).items():
    rs = [r for r in rs if r.error is None]
    xs = [getattr(r, var) for r in rs]
    label = f"{remat}" + (f" {opt}" if len({r.optimizer for r in rows}) > 1 else "") + (f" {mesh}" if len({r.mesh for r in rows}) > 1 else "")
    label += f" ({other} {fixed})" if len({getattr(r, other) for r in rows}) > 1 else ""
    label += f" {moe[0]} {moe[1] or ''}".rstrip() if len({(r.moe_impl, r.capacity_factor) for r in rows}) > 1 else ""
    for comp, style in (("temp_size_in_bytes", "-"), ("argument_size_in_bytes", ":"), ("peak_memory_in_bytes", "--")):
      ys = [getattr(r, comp) for r in rs]
      if all(y for y in ys):
        ax.plot(xs, [y / GiB for y in ys], style, marker="o", label=f"{comp.split('_')[0]} · {label}")
  caps = {r.capacity_bytes for r in rows if r.capacity_bytes}
  for cap in caps:
    ax.axhline(cap / GiB, color="red", linewidth=1)
    ax.annotate("capacity", (ax.get_xlim()[0], cap / GiB), color="red", va="bottom")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log", base=2)
  ax.set_xlabel(var)
  ax.set_ylabel("GiB per device")
  r0 = rows[0]
  ax.set_title(f"{r0.model} on {r0.target}: memory against {var}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  try:
    save_figure(fig, path)
  finally:
    plt.close(fig)


def _series(rows, var, other):
  out: dict[tuple, list[Row]] = {}
  for r in sorted(rows, key=lambda r: getattr(r, var)):
    key = (r.mesh, r.optimizer, f"{r.remat} {r.attention}", getattr(r, other), (r.moe_impl, r.capacity_factor))
    out.setdefault(key, []).append(r)
  return out

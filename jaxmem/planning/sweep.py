"""The sweep behind ``compare``: the train step under each remat policy, optimizer and mesh, one row each.

>>> rows = compare(model="tiny", remat="dots_saveable", batch=2, seq=16)  # doctest: +SKIP
>>> [r.remat for r in rows]  # doctest: +SKIP
['none', 'dots_saveable']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxmem._quiet import quiet
from jaxmem.compiler.analysis import compile_timed
from jaxmem.compiler.flops import jaxpr_flops
from jaxmem.compiler.report import MemoryReport, Refusal, fits, read_compiled
from jaxmem.compiler.startup import start_jax
from jaxmem.hlo.comms import collectives
from jaxmem.planning.cache import RowCache
from jaxmem.planning.plan import Plan, Task, plan
from jaxmem.planning.runner import run_tasks
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import Optimizer
from jaxmem.program.remat import REMAT_POLICIES, RematPolicy
from jaxmem.program.train import build_train_program
from jaxmem.records import CompilerFigures, Configuration
from jaxmem.versions import compiler_versions
from jaxmem.workload import Workload


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row(CompilerFigures, Configuration):
  """One configuration's per-device figures. Byte fields are per device; ``None`` means the
  figure cannot be had on this target, and ``notes`` says why.

  ``required_bytes`` is what must fit in ``capacity_bytes``: the compiler's peak where the
  backend gives one, else ``total_bytes``; for a compile refused for lack of memory, the
  figure from the compiler's message. ``fits`` compares the two (``None`` without a capacity).
  ``param_bytes_global`` is the parameters' size summed over the whole model, unsharded.
  ``comm_*_bytes`` are the bytes one device sends per step in each kind of collective, read from
  the optimized HLO under ring-algorithm costs (:mod:`jaxmem.hlo.comms`); ``comm_bytes`` is their sum.
  """

  param_bytes: int | None = None
  param_bytes_global: int | None = None
  optimizer_state_bytes: int | None = None
  recompute_overhead_pct: float | None = None
  comm_bytes: int | None = None
  comm_all_gather_bytes: int | None = None
  comm_reduce_scatter_bytes: int | None = None
  comm_all_reduce_bytes: int | None = None
  comm_all_to_all_bytes: int | None = None
  comm_collective_permute_bytes: int | None = None
  capacity_bytes: int | None = None
  required_bytes: int | None = None
  fits: bool | None = None
  error: str | None = None
  notes: tuple[str, ...] = ()


def run_config(p: Plan, mesh: shd.MeshSpec, opt: Optimizer, rp: RematPolicy) -> Row:
  """Compiles one configuration. A compile the backend refuses (out of memory, an unsupported
  feature) becomes a row with ``error`` set rather than an exception, so a sweep goes on."""
  base = dict(
      model=p.cfg.name,
      target=p.target.name,
      mesh=shd.format_mesh(mesh),
      remat=rp.name,
      optimizer=opt.name,
      batch=p.batch,
      seq=p.seq,
      param_dtype=p.cfg.param_dtype,
      dtype=p.cfg.dtype,
      num_devices=p.target.num_devices,
      capacity_bytes=p.target.capacity_bytes,
      **moe_fields(p.cfg),
  )
  program = build_train_program(
      p.cfg, remat=rp, optimizer=opt, batch=p.batch, seq=p.seq, target=p.target, mesh=mesh
  )
  base.update(
      param_bytes=program.param_bytes,
      param_bytes_global=program.param_bytes_global,
      optimizer_state_bytes=program.optimizer_state_bytes,
  )
  notes = [] if p.target.capacity_note is None else [f"capacity_bytes: {p.target.capacity_note}"]
  notes += p.moe_notes + p.cfg.notes
  if dict(mesh).get("expert", 1) > 1 and not p.cfg.is_moe:
    notes.append(f"mesh axis expert: {p.cfg.name} has no experts, so it only splits the batch (data parallelism)")
  traced = program.trace()
  # Counted from the program, not the executable, so a configuration the compiler refuses
  # still has its FLOPs (and so its recompute overhead).
  program_flops = jaxpr_flops(traced.jaxpr.jaxpr)
  try:
    with quiet():  # the GPU compiler logs to fd 2 when arguments near the device's memory
      compiled, seconds = compile_timed(traced.lower())
  except jax.errors.JaxRuntimeError as e:
    return Row(
        **base, **Refusal.of(e).as_dict(), flops=program_flops / p.target.num_devices,
        versions=compiler_versions(p.target.platform), notes=tuple(notes),
    )
  report: MemoryReport = read_compiled(compiled, compile_seconds=seconds, program_flops=program_flops)
  comm = collectives(compiled)
  return Row(
      **base,
      **report.figures(),
      required_bytes=report.required_bytes,
      fits=fits(report.required_bytes, p.target.capacity_bytes),
      comm_bytes=comm.total_bytes,
      **{f"comm_{k}_bytes": v for k, v in comm.bytes_by_kind.items()},
      notes=tuple(notes) + report.notes + tuple(f"comm: {n}" for n in comm.notes),
  )


def moe_fields(cfg: Any) -> dict[str, Any]:
  """A row's ``moe_impl`` and ``capacity_factor`` (this one for capacity only); None for a dense model."""
  if not cfg.is_moe:
    return dict(moe_impl=None, capacity_factor=None)
  return dict(moe_impl=cfg.moe_impl, capacity_factor=cfg.capacity_factor if cfg.moe_impl == "capacity" else None)


def run_task(task: Task) -> dict[str, Any]:
  """Compiles one task and returns its row as a dict (picklable, JSON-able): the run function
  :func:`jaxmem.planning.runner.run_tasks` is given, in this process or a worker."""
  start_jax(task.cpu_devices)
  p = plan(task.workload)
  (config,) = [c for c in p.configs() if c[2].name == task.remat]
  return run_config(p, *config).as_dict()


def with_overheads(rows: list[Row]) -> list[Row]:
  """Fills ``recompute_overhead_pct``: FLOPs over the ``none`` row of the same target, mesh,
  optimizer and workload (rows without one keep ``None``)."""
  key = lambda r: (r.target, r.mesh, r.optimizer, r.batch, r.seq, r.moe_impl, r.capacity_factor)  # noqa: E731
  base = {key(r): r.flops for r in rows if r.remat == "none" and r.flops}
  out = []
  for r in rows:
    b = base.get(key(r))
    pct = None if (b is None or r.flops is None) else 100.0 * (r.flops - b) / b
    out.append(dataclasses.replace(r, recompute_overhead_pct=pct))
  return out


def compare(
    workload: Workload | None = None,
    /,
    *,
    jobs: int = 1,
    scheduler: str | None = None,
    cache: RowCache | None = None,
    on_row: Callable[[Row], None] | None = None,
    **fields: Any,
) -> list[Row]:
  """Compiles the train step for every (mesh, optimizer, remat) of ``workload`` (with
  ``fields`` replaced: ``compare(model="tiny", batch=2)`` works) and returns one row each.

  ``none`` (no remat) is always included as the baseline. Everything is validated before the
  first compile, so bad input raises :class:`JaxmemError` without wasting work. ``on_row`` is
  called after each configuration (for progress and for saving partial results). ``jobs``
  compiles in that many processes, ``scheduler`` on a Dask cluster at that address, and
  ``cache`` (a :class:`jaxmem.planning.cache.RowCache`) answers configurations compiled before.
  """
  p = plan(workload, **fields)
  callback = None if on_row is None else (lambda i, d, cached: on_row(row_from_dict(d)))
  dicts = run_tasks(p.tasks(), run_task, jobs=jobs, scheduler=scheduler, cache=cache, on_row=callback)
  return with_overheads([row_from_dict(d) for d in dicts])


def row_from_dict(d: dict[str, Any]) -> Row:
  """A row back from its ``as_dict()`` (from a worker process or the cache)."""
  return Row(**{**d, "notes": tuple(d.get("notes") or ())})


def baseline_flops(p: Plan, row: Row) -> float | None:
  """FLOPs per device of the no-remat program at ``row``'s workload: traced, not compiled."""
  mesh = shd.parse_mesh(row.mesh)
  opt = next(o for o in p.optimizers if o.name == row.optimizer)
  cfg = p.cfg
  if row.moe_impl is not None:  # the row's own MoE variant, which a sweep's plan.cfg may not be
    cfg = dataclasses.replace(cfg, moe_impl=row.moe_impl, capacity_factor=row.capacity_factor or cfg.capacity_factor)
  program = build_train_program(
      cfg, remat=REMAT_POLICIES["none"], optimizer=opt, batch=row.batch, seq=row.seq, target=p.target, mesh=mesh
  )
  return jaxpr_flops(program.trace().jaxpr.jaxpr) / p.target.num_devices

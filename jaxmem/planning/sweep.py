"""The sweep behind ``compare``: the train step under each remat policy, optimizer and mesh, one row each.

>>> rows = compare(model="tiny", remat="dots_saveable", batch=2, seq=16)  # doctest: +SKIP
>>> [r.remat for r in rows]  # doctest: +SKIP
['none', 'dots_saveable']
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxmem.program import sharding as shd
from jaxmem._quiet import quiet
from jaxmem.records import Record
from jaxmem.compiler.analysis import compile_timed
from jaxmem.planning.cache import RowCache
from jaxmem.hlo.comms import collectives
from jaxmem.errors import JaxmemError
from jaxmem.compiler.flops import jaxpr_flops
from jaxmem.models import ModelConfig, get_config
from jaxmem.program.optimizers import Optimizer, parse_optimizers
from jaxmem.program.remat import REMAT_POLICIES, RematPolicy, parse_remat
from jaxmem.compiler.report import COMPILER_FIELDS, MemoryReport, fits, read_compiled, refused
from jaxmem.planning.runner import Task, run_tasks
from jaxmem.compiler.targets import (
  Target,
  cpu_devices_needed,
  get_target,
  start_jax,
  with_capacity,
)
from jaxmem.program.train import build_train_program, check_batch


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row(Record):
  """One configuration's per-device figures. Byte fields are per device; ``None`` means the
  figure cannot be had on this target, and ``notes`` says why.

  ``required_bytes`` is what must fit in ``capacity_bytes``: the compiler's peak where the
  backend gives one, else ``total_bytes``; for a compile refused for lack of memory, the
  figure from the compiler's message. ``fits`` compares the two (``None`` without a capacity).
  ``param_bytes_global`` is the parameters' size summed over the whole model, unsharded.
  ``comm_*_bytes`` are the bytes one device sends per step in each kind of collective, read from
  the optimized HLO under ring-algorithm costs (:mod:`jaxmem.comms`); ``comm_bytes`` is their sum.
  """

  model: str
  target: str
  mesh: str
  remat: str
  optimizer: str
  batch: int
  seq: int
  param_dtype: str
  dtype: str
  num_devices: int
  argument_size_in_bytes: int | None = None
  output_size_in_bytes: int | None = None
  alias_size_in_bytes: int | None = None
  temp_size_in_bytes: int | None = None
  generated_code_size_in_bytes: int | None = None
  host_temp_size_in_bytes: int | None = None
  peak_memory_in_bytes: int | None = None
  total_bytes: int | None = None
  param_bytes: int | None = None
  param_bytes_global: int | None = None
  optimizer_state_bytes: int | None = None
  flops: float | None = None
  compiler_flops: float | None = None
  recompute_overhead_pct: float | None = None
  compile_seconds: float | None = None
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


@dataclasses.dataclass(frozen=True)
class Plan:
  """A validated sweep: every name resolved and every mesh checked before anything compiles."""

  cfg: ModelConfig
  target: Target
  meshes: tuple[shd.MeshSpec, ...]
  optimizers: tuple[Optimizer, ...]
  remats: tuple[RematPolicy, ...]
  batch: int
  seq: int
  target_name: str = "cpu"  # as given, so another process can rebuild the target
  slices: int = 1

  def configs(self) -> list[tuple[shd.MeshSpec, Optimizer, RematPolicy]]:
    return list(itertools.product(self.meshes, self.optimizers, self.remats))

  def tasks(self) -> list[Task]:
    """The configurations as picklable, cacheable tasks, in ``configs()`` order."""
    cpu = cpu_devices_needed([self.target_name])
    return [
        Task(
            cfg=self.cfg,
            target=self.target_name,
            slices=self.slices,
            mesh=mesh,
            remat=rp.name,
            optimizer=opt.name,
            batch=self.batch,
            seq=self.seq,
            cpu_devices=cpu,
        )
        for mesh, opt, rp in self.configs()
    ]


def _as_list(v: str | Sequence[str] | None) -> list[str]:
  if v is None:
    return []
  if isinstance(v, str):
    return [v]
  return list(v)


def plan(
    *,
    model: str | ModelConfig = "gpt2-small",
    remat: str | Sequence[str] = "none,dots_saveable,full",
    optimizer: str | Sequence[str] = "adamw",
    batch: int = 8,
    seq: int = 1024,
    target: str | Target = "cpu",
    mesh: str | Sequence[str] | None = None,
    param_dtype: str | None = None,
    dtype: str | None = None,
    slices: int = 1,
) -> Plan:
  """Resolves and checks a sweep; raises :class:`JaxmemError` on any bad input."""
  start_jax(cpu_devices_needed([target]) if isinstance(target, str) else 1)
  overrides = {k: v for k, v in (("param_dtype", param_dtype), ("dtype", dtype)) if v is not None}
  if isinstance(model, ModelConfig):
    cfg = dataclasses.replace(model, **overrides)
  else:
    cfg = get_config(model, **overrides)
  tgt = with_capacity(get_target(target, slices=slices) if isinstance(target, str) else target)
  remats = parse_remat(",".join(_as_list(remat)), host_memory=tgt.has_host_memory)
  optimizers = parse_optimizers(",".join(_as_list(optimizer)))
  meshes = tuple(shd.parse_mesh(m) for m in _as_list(mesh)) or (shd.default_mesh(tgt.num_devices),)
  for m in meshes:
    if shd.mesh_size(m) != tgt.num_devices:
      raise JaxmemError(
          f"mesh {shd.format_mesh(m)} has {shd.mesh_size(m)} devices but target {tgt.name} has "
          f"{tgt.num_devices}; make the axis sizes multiply to {tgt.num_devices}"
      )
    check_batch(batch, seq, m, cfg)
  name = target if isinstance(target, str) else tgt.name
  return Plan(cfg, tgt, meshes, tuple(optimizers), tuple(remats), batch, seq, name, slices)


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
  traced = program.trace()
  # Counted from the program, not the executable, so a configuration the compiler refuses
  # still has its FLOPs (and so its recompute overhead).
  program_flops = jaxpr_flops(traced.jaxpr.jaxpr)
  try:
    with quiet():  # the GPU compiler logs to fd 2 when arguments near the device's memory
      compiled, seconds = compile_timed(traced.lower())
  except jax.errors.JaxRuntimeError as e:
    return Row(**base, flops=program_flops / p.target.num_devices, **refused(e), notes=tuple(notes))
  report: MemoryReport = read_compiled(compiled, compile_seconds=seconds, program_flops=program_flops)
  comm = collectives(compiled)
  return Row(
      **base,
      **{f: getattr(report, f) for f in COMPILER_FIELDS},
      required_bytes=report.required_bytes,
      fits=fits(report.required_bytes, p.target.capacity_bytes),
      comm_bytes=comm.total_bytes,
      **{f"comm_{k}_bytes": v for k, v in comm.bytes_by_kind.items()},
      flops=report.flops,
      compiler_flops=report.compiler_flops,
      compile_seconds=report.compile_seconds,
      notes=tuple(notes) + report.notes + tuple(f"comm: {n}" for n in comm.notes),
  )


def with_overheads(rows: list[Row]) -> list[Row]:
  """Fills ``recompute_overhead_pct``: FLOPs over the ``none`` row of the same target, mesh,
  optimizer and workload (rows without one keep ``None``)."""
  key = lambda r: (r.target, r.mesh, r.optimizer, r.batch, r.seq)  # noqa: E731
  base = {key(r): r.flops for r in rows if r.remat == "none" and r.flops}
  out = []
  for r in rows:
    b = base.get(key(r))
    pct = None if (b is None or r.flops is None) else 100.0 * (r.flops - b) / b
    out.append(dataclasses.replace(r, recompute_overhead_pct=pct))
  return out


def compare(
    *,
    model: str | ModelConfig = "gpt2-small",
    remat: str | Sequence[str] = "none,dots_saveable,full",
    optimizer: str | Sequence[str] = "adamw",
    batch: int = 8,
    seq: int = 1024,
    target: str | Target = "cpu",
    mesh: str | Sequence[str] | None = None,
    param_dtype: str | None = None,
    dtype: str | None = None,
    slices: int = 1,
    jobs: int = 1,
    scheduler: str | None = None,
    cache: RowCache | None = None,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
  """Compiles the train step for every (mesh, optimizer, remat) and returns one row each.

  ``none`` (no remat) is always included as the baseline. Everything is validated before the
  first compile, so bad input raises :class:`JaxmemError` without wasting work. ``on_row`` is
  called after each configuration (for progress and for saving partial results). ``jobs``
  compiles in that many processes, ``scheduler`` on a Dask cluster at that address, and
  ``cache`` (a :class:`jaxmem.cache.RowCache`) answers configurations compiled before.
  """
  p = plan(
      model=model,
      remat=remat,
      optimizer=optimizer,
      batch=batch,
      seq=seq,
      target=target,
      mesh=mesh,
      param_dtype=param_dtype,
      dtype=dtype,
      slices=slices,
  )
  callback = None if on_row is None else (lambda i, d, cached: on_row(row_from_dict(d)))
  dicts = run_tasks(p.tasks(), jobs=jobs, scheduler=scheduler, cache=cache, on_row=callback)
  return with_overheads([row_from_dict(d) for d in dicts])


def row_from_dict(d: dict[str, Any]) -> Row:
  """A row back from its ``as_dict()`` (from a worker process or the cache)."""
  return Row(**{**d, "notes": tuple(d.get("notes") or ())})


def baseline_flops(p: Plan, row: Row) -> float | None:
  """FLOPs per device of the no-remat program at ``row``'s workload: traced, not compiled."""
  mesh = shd.parse_mesh(row.mesh)
  opt = next(o for o in p.optimizers if o.name == row.optimizer)
  program = build_train_program(
      p.cfg, remat=REMAT_POLICIES["none"], optimizer=opt, batch=row.batch, seq=row.seq, target=p.target, mesh=mesh
  )
  return jaxpr_flops(program.trace().jaxpr.jaxpr) / p.target.num_devices

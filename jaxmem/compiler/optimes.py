"""The time per op: each top-level op's compute, memory and communication time at the target's
rates, the term that bounds it and what it adds to the step (:class:`OpTimes`), from the same walk
of the compiled schedule that sets a row's ``step_time_s`` (:mod:`jaxmem.hlo.schedule`).

Per op (figures from :mod:`jaxmem.hlo.ops`, per device per step, all its executions):

  compute_time_s = matrix FLOPs, each matmul rounded up to the matrix unit's tile, / peak_flops;
                   on a GPU in XLA's GEMM throughput table, each matmul's FLOPs / the achieved
                   rate for its shape (jaxmem.hardware.matmul_rates), as the walk times them
  memory_time_s  = bytes_accessed / hbm_bandwidth
  comm_time_s    = its transfers on their link (latency + bytes sent / bandwidth)
  time_s         = what it adds to the simulated step: its time on the device's stream, and for
                   an asynchronous collective the wait its done causes (exposed_comm_time_s)
  bound          = the term that sets its time (``comm`` for a collective whose transfer does)

Three step-level figures come of them (:class:`OpTimes`):

- ``simulated_step_time_s``: the walk's step (the ops' ``time_s`` summed), collectives overlapping
  the work scheduled between their start and done.
- ``op_time_s`` = the sum over ops of each op's largest term: every op at its own bound, one
  after another, nothing overlapped (an asynchronous collective's whole transfer counted).
- ``step_time_s`` = max(sum of compute, sum of memory, sum of comm): the step-level roofline of
  the same per-op terms, every term hidden under the largest across the whole step.

``op_time_s >= step_time_s`` always (a sum of maxima is at least the maximum of the sums).
Without the walk (no parsed module) the per-op terms are the plain roofline's.
"""

from __future__ import annotations

import dataclasses

from typing import Any

from jaxmem.compiler.steptime import timeline
from jaxmem.hardware.peaks import Peaks
from jaxmem.hardware.targets import Target, get_target, target_peaks
from jaxmem.errors import JaxmemError
from jaxmem.compiler.report import MemoryReport, read_compiled
from jaxmem.hlo.ops import HloCosts, OpCost
from jaxmem.hlo.schedule import OpRun, Timeline
from jaxmem.records import Record

TERMS = ("compute", "memory", "comm")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpTime(Record):
  """One op's figures (:class:`jaxmem.hlo.ops.OpCost`'s) and its roofline terms, ESTIMATED at
  the target's peaks. ``None``: no published figure for that term (the notes say why)."""

  cost: OpCost
  compute_time_s: float | None
  memory_time_s: float | None
  comm_time_s: float | None
  time_s: float
  bound: str
  exposed_comm_time_s: float | None = None
  padded_flops: float | None = None

  def as_dict(self) -> dict:
    return {**self.cost.as_dict(), **{k: v for k, v in super().as_dict().items() if k != "cost"}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpTimes(Record):
  """Every op's :class:`OpTime`, largest first, and the step's two rooflines from them (see the
  module docstring). ``time_by_bound``: the summed ``time_s`` of the ops each term bounds (where
  the step's sum-over-ops time goes)."""

  ops: tuple[OpTime, ...] = ()
  op_time_s: float | None = None
  step_time_s: float | None = None
  simulated_step_time_s: float | None = None
  exposed_comm_time_s: float | None = None
  compute_time_s: float | None = None
  memory_time_s: float | None = None
  comm_time_s: float | None = None
  time_by_bound: dict[str, float] = dataclasses.field(default_factory=dict)
  flops: float = 0.0
  bytes_accessed: int = 0
  comm_bytes: int = 0
  notes: tuple[str, ...] = ()

  def top(self, n: int) -> OpTimes:
    """These times with only the ``n`` slowest ops listed (the totals stay the whole step's)."""
    return dataclasses.replace(self, ops=self.ops[:n])


def per_op(costs: HloCosts, target: Target | None, num_devices: int, *, walk: Timeline | None = None) -> OpTimes:
  """The time per op of ``costs`` on ``target`` (``num_devices``: the program's devices; on one
  device nothing is sent, so every comm term is 0), from ``walk`` (the schedule simulated:
  :func:`jaxmem.compiler.steptime.timeline`, walked here when not given). Without the target's
  peaks: no times, a note."""
  peaks, why = target_peaks(target)
  notes = list(costs.notes)
  if peaks is None:
    return OpTimes(flops=costs.flops, bytes_accessed=costs.bytes_accessed, comm_bytes=costs.comm_bytes,
                   notes=tuple(notes + [f"op times: {why}"]))
  walk = timeline(costs, target) if walk is None else walk
  runs = {} if walk is None else {(o.computation, o.name): o for o in walk.ops}
  link = peaks.link_bandwidth
  if link is None and num_devices > 1 and costs.comm_bytes:
    notes.append(f"comm_time_s: no published per-chip interconnect bandwidth for {peaks.part}; op times leave "
                 "communication out")
  ops = [_op_time(c, runs.get((c.computation, c.name)), peaks, num_devices, walk is not None) for c in costs.ops]
  ops.sort(key=lambda o: -o.time_s)
  sums = {t: sum(getattr(o, f"{t}_time_s") or 0.0 for o in ops) for t in TERMS}
  largest = [max(v for v in (o.compute_time_s, o.memory_time_s, o.comm_time_s) if v is not None) for o in ops]
  return OpTimes(
      ops=tuple(ops), op_time_s=sum(largest), step_time_s=max(sums.values()),
      simulated_step_time_s=None if walk is None else walk.step_time_s,
      exposed_comm_time_s=None if walk is None else walk.exposed_comm_time_s,
      compute_time_s=sums["compute"], memory_time_s=sums["memory"], comm_time_s=sums["comm"],
      time_by_bound={t: sum(o.time_s for o in ops if o.bound == t) for t in TERMS},
      flops=costs.flops, bytes_accessed=costs.bytes_accessed, comm_bytes=costs.comm_bytes,
      notes=tuple(notes) + (() if walk is None else tuple(n for n in walk.notes if n not in notes)),
  )


def _op_time(c: OpCost, run: OpRun | None, peaks: Peaks, num_devices: int, walked: bool) -> OpTime:
  """One op's times: the walk's where it ran the op (an op it did not run, in a branch not taken
  or a loop of no trips, takes no time), else the plain roofline's."""
  if walked:
    if run is None:
      return OpTime(cost=c, compute_time_s=0.0, memory_time_s=0.0, comm_time_s=0.0, time_s=0.0, bound="memory")
    comm = 0.0 if num_devices <= 1 else run.comm_time_s
    return OpTime(cost=c, compute_time_s=run.compute_time_s, memory_time_s=run.memory_time_s, comm_time_s=comm,
                  time_s=run.time_s, bound=run.bound, exposed_comm_time_s=run.exposed_comm_time_s,
                  padded_flops=run.padded_flops)
  link = peaks.link_bandwidth
  terms = {
      "compute": c.flops / peaks.peak_flops,
      "memory": c.bytes_accessed / peaks.hbm_bandwidth,
      "comm": 0.0 if num_devices <= 1 or not c.comm_bytes else (None if link is None else c.comm_bytes / link),
  }
  known = {k: v for k, v in terms.items() if v is not None}
  bound = max(known, key=known.__getitem__)
  return OpTime(cost=c, compute_time_s=terms["compute"], memory_time_s=terms["memory"], comm_time_s=terms["comm"],
                time_s=known[bound], bound=bound)


def op_times(source: Any, target: str | Target | None = None, *, top: int | None = None) -> OpTimes:
  """The roofline per op of a compiled program: ``source`` a :class:`jaxmem.MemoryReport`
  (``jaxmem.analyze``'s), a :class:`jaxmem.Explanation` (``jaxmem.explain``'s: its target is
  the default) or a ``jax.stages.Compiled``; ``target`` the peaks to time it at (a name or a
  :class:`Target`; needed for a report or an executable, whose target is not recorded; without
  one there are no times, a note says so); ``top``: list only the slowest ``top`` ops (the totals
  stay the whole step's).

  >>> import jax, jax.numpy as jnp, jaxmem
  >>> x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
  >>> t = jaxmem.op_times(jaxmem.analyze(lambda a: a @ a, x, target="tpu:v5e-1"), "tpu:v5e-1")
  >>> t.ops[0].bound, t.flops == 2 * 1024**3
  ('compute', True)
  """
  if top is not None and top < 1:
    raise JaxmemError(f"`top` must be at least 1 (got {top})")
  if isinstance(getattr(source, "report", None), MemoryReport):  # an Explanation: its report, its target
    target = source.target if target is None else target
    source = source.report
  if not isinstance(source, MemoryReport) and hasattr(source, "as_text") and hasattr(source, "memory_analysis"):
    source = read_compiled(source)  # a jax.stages.Compiled
  if not isinstance(source, MemoryReport) or source.hlo_costs is None:
    raise JaxmemError(f"op_times takes a MemoryReport, an Explanation or a compiled executable (got {type(source).__name__})")
  if isinstance(target, str):
    target = None if target in ("cpu", "gpu", "tpu") else get_target(target)
  walk = timeline(source.hlo_costs, target, source.placement)
  times = per_op(source.hlo_costs, target, source.num_devices, walk=walk)
  return times if top is None else times.top(top)


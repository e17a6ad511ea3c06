"""The time per op: each top-level op's compute, memory and communication time on the target, the
term that bounds it and what it adds to the step (:class:`OpTimes`), read off the same walk of
the compiled schedule that sets a row's ``step_time_s`` (:mod:`jaxmem.steptime.walk`).

Per op (figures from :mod:`jaxmem.hlo.ops`, per device per step, all its executions):

  compute_time_s = matrix FLOPs, each matmul rounded up to the matrix unit's tile, / peak_flops;
                   on a GPU in XLA's GEMM throughput table, each matmul's FLOPs / the achieved
                   rate for its shape (jaxmem.hardware.matmul_rates), as the walk times them
  memory_time_s  = bytes_accessed / hbm_bandwidth
  comm_time_s    = its transfers on their link (``link``: latency + bytes sent / bandwidth)
  time_s         = what it adds to the simulated step: its time on the device's stream, and for
                   an asynchronous collective the wait its done causes (exposed_comm_time_s)
  bound          = the term that sets its time (``comm`` for a collective whose transfer does)

The step-level figures (:class:`OpTimes`):

- ``step_time_s``: the walk's step (the ops' ``time_s`` summed), collectives overlapping the work
  scheduled between their start and done: the row's ``step_time_s`` (where the roofline bound
  does not stand in for it).
- ``op_time_s`` = the sum over ops of each op's largest term: every op at its own bound, one
  after another, nothing overlapped (an asynchronous collective's whole transfer counted).
- ``compute_time_s``, ``memory_time_s``, ``comm_time_s``: the ops' terms summed (communication
  over every link), and each link's share under the field named for it (``ici_comm_time_s``...).
- ``ops_roofline_step_time_s`` = max of those three sums: the roofline of the ops' own terms,
  every term hidden under the largest across the whole step. (The row's ``roofline_step_time_s``
  divides the step's totals by the datasheet peaks instead: no tile, no measured rate, every byte
  on the fast link's whole bandwidth.)

``op_time_s >= ops_roofline_step_time_s`` always (a sum of maxima is at least the maximum of the
sums).
"""

from __future__ import annotations

import dataclasses

from jaxmem.hardware.machine import host_link
from jaxmem.hardware.peaks import Peaks
from jaxmem.hlo.ops import HloCosts, OpCost
from jaxmem.records import Record
from jaxmem.steptime.walk import TERMS, OpRun, Timeline


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpTime(Record):
  """One op's figures (:class:`jaxmem.hlo.ops.OpCost`'s) and its terms in the simulated step,
  ESTIMATED at the target's rates. ``link``: the link its transfer crossed (``"ICI"``,
  ``"NVLink"``, ``"DCN"``, ``"network"``; ``None`` for an op that sends nothing)."""

  cost: OpCost
  compute_time_s: float
  memory_time_s: float
  comm_time_s: float
  time_s: float
  bound: str
  exposed_comm_time_s: float | None = None  # None: an op the walk did not run
  padded_flops: float | None = None
  link: str | None = None

  def as_dict(self) -> dict:
    return {**self.cost.as_dict(), **{k: v for k, v in super().as_dict().items() if k != "cost"}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpTimes(Record):
  """Every op's :class:`OpTime`, largest first, and the step's figures from them (see the module
  docstring). ``time_by_bound``: the summed ``time_s`` of the ops each term bounds (where the
  step's sum-over-ops time goes). ``None``: no times (no published figures for the target; the
  notes say why)."""

  ops: tuple[OpTime, ...] = ()
  op_time_s: float | None = None
  step_time_s: float | None = None
  ops_roofline_step_time_s: float | None = None
  exposed_comm_time_s: float | None = None
  compute_time_s: float | None = None
  memory_time_s: float | None = None
  comm_time_s: float | None = None
  # Each link's share of comm_time_s, where the target has that link (jaxmem.records.StepTime's).
  ici_comm_time_s: float | None = None
  dcn_comm_time_s: float | None = None
  nvlink_comm_time_s: float | None = None
  network_comm_time_s: float | None = None
  host_comm_time_s: float | None = None
  time_by_bound: dict[str, float] = dataclasses.field(default_factory=dict)
  flops: float = 0.0
  bytes_accessed: int = 0
  comm_bytes: int = 0
  notes: tuple[str, ...] = ()

  def top(self, n: int) -> OpTimes:
    """These times with only the ``n`` slowest ops listed (the totals stay the whole step's)."""
    return dataclasses.replace(self, ops=self.ops[:n])


def per_op(costs: HloCosts, peaks: Peaks | None, num_devices: int, walk: Timeline | None, *,
           why: str | None = None) -> OpTimes:
  """The time per op of ``costs`` from ``walk`` (its schedule simulated on the target:
  :func:`jaxmem.steptime.model.timeline`; ``num_devices``: the program's devices; on one device
  nothing is sent, so every comm term is 0). Without the target's peaks or a walk: no times, a
  note (``why``)."""
  totals = dict(flops=costs.flops, bytes_accessed=costs.bytes_accessed, comm_bytes=costs.comm_bytes)
  notes = list(costs.notes)
  if peaks is None or walk is None:
    return OpTimes(**totals, notes=tuple(notes + [f"op times: {why or 'the schedule was not walked'}"]))
  if peaks.link_bandwidth is None and num_devices > 1 and costs.comm_bytes:
    notes.append(f"comm_time_s: no published per-chip interconnect bandwidth for {peaks.part}; op times leave "
                 "communication out")
  runs = {(o.computation, o.name): o for o in walk.ops}
  ops = [_op_time(c, runs.get((c.computation, c.name)), num_devices) for c in costs.ops]
  ops.sort(key=lambda o: -o.time_s)
  sums = {t: sum(getattr(o, f"{t}_time_s") for o in ops) for t in TERMS}
  largest = [max(o.compute_time_s, o.memory_time_s, o.comm_time_s) for o in ops]
  # On one device nothing is sent; host offload's transfers still cross the host link.
  host = host_link(None)
  links = {k: v if num_devices > 1 or k == host.field else 0.0 for k, v in walk.link_comm_time_s.items()}
  return OpTimes(
      ops=tuple(ops), op_time_s=sum(largest), ops_roofline_step_time_s=max(sums.values()), step_time_s=walk.step_time_s,
      exposed_comm_time_s=walk.exposed_comm_time_s,
      compute_time_s=sums["compute"], memory_time_s=sums["memory"], comm_time_s=sums["comm"], **links,
      time_by_bound={t: sum(o.time_s for o in ops if o.bound == t) for t in TERMS}, **totals,
      notes=tuple(notes) + tuple(n for n in walk.notes if n not in notes),
  )


def _op_time(c: OpCost, run: OpRun | None, num_devices: int) -> OpTime:
  """One op's times: the walk's, or none where the walk did not run the op (in a branch not
  taken or a loop of no trips)."""
  if run is None:
    return OpTime(cost=c, compute_time_s=0.0, memory_time_s=0.0, comm_time_s=0.0, time_s=0.0, bound="memory")
  comm = 0.0 if num_devices <= 1 and run.link != host_link(None).name else run.comm_time_s
  return OpTime(cost=c, compute_time_s=run.compute_time_s, memory_time_s=run.memory_time_s, comm_time_s=comm,
                time_s=run.time_s, bound=run.bound, exposed_comm_time_s=run.exposed_comm_time_s,
                padded_flops=run.padded_flops, link=run.link)

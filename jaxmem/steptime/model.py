"""One compiled program's step time on a target: the schedule walked once on the target's machine
(:mod:`jaxmem.steptime.walk`), the roofline bound beside it (:mod:`jaxmem.steptime.roofline`),
and the time per op read off the same walk (:mod:`jaxmem.steptime.ops`), as one
:class:`Estimate` (:func:`step_time`, what every compiled row and :func:`op_times` take).

The row's fields (:class:`jaxmem.records.StepTime`; formulas in docs/fields.md):

  step_time_s    = the compiled schedule simulated, never below the roofline bound; the roofline
                   bound where there is no schedule to walk
  roofline_*     = the bound's terms and their maximum (``roofline_step_time_s``)
  <link>_comm_time_s = the walk's transfer time on each of the target's links, named by it
                   (``ici_``, ``dcn_`` on TPU slices; ``nvlink_``, ``network_`` on GPUs)
  fast_link_step_time_s = the same schedule with the slow link as fast as the fast one
  exposed_comm_time_s, *_bound_share = the simulated step's communication nothing overlapped,
                   and the fractions of it bound by compute, memory and communication
  bound          = the term with the largest share (the roofline's largest term without a walk)
  tokens_per_s_per_device = tokens / devices / step_time_s
  mfu            = model_flops / (step_time_s * peak_flops)   (model FLOPs: jaxmem.models.model_flops)
  arithmetic_intensity = flops / bytes_accessed;  ridge_point = peak_flops / hbm_bandwidth
  op_time_s      = the sum over the program's ops of each op's largest term (OpTimes.op_time_s)
  moe_time_s     = a mixture-of-experts step's time by term (MoeTerms, jaxmem.steptime.moe), where
                   the walk found grouped matmul kernels
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jaxmem.compiler.report import MemoryReport, read_compiled
from jaxmem.errors import JaxmemError
from jaxmem.inputs import Whole, optional
from jaxmem.hardware.targets import Target, get_target, target_machine, target_peaks
from jaxmem.hlo.ops import HloCosts
from jaxmem.records import Record, StepTime
from jaxmem.steptime.moe import TERMS as MOE_TERMS
from jaxmem.steptime.moe import MoeTerms
from jaxmem.steptime.ops import OpTimes, per_op
from jaxmem.steptime.roofline import Work, roofline
from jaxmem.steptime.walk import TERMS, Timeline
from jaxmem.steptime.walk import timeline as walk_schedule
from jaxmem.units import seconds


def timeline(costs: HloCosts | None, target: Target | None,
             coords: Sequence[Sequence[int]] | None = None) -> Timeline | None:
  """The compiled schedule of ``costs`` walked on ``target``'s machine (its kind's:
  :func:`jaxmem.hardware.targets.target_machine`; :func:`jaxmem.steptime.walk.timeline`); ``None``
  without a parsed module or the target's figures. ``coords``: where the program's devices sit
  (``MemoryReport.placement``)."""
  machine, _ = target_machine(target, coords)
  if costs is None or costs.module is None or machine is None:
    return None
  return walk_schedule(costs, machine)


def estimate(
    *, flops: float | None, bytes_accessed: int | None, comm_bytes: int | None, num_devices: int,
    target: Target | None, work: Work | None, walk: Timeline | None = None,
) -> tuple[StepTime, list[str]]:
  """The step-time fields of one compiled program, and notes for those that are ``None``;
  ``walk``: its schedule simulated (:func:`timeline`), which sets ``step_time_s``."""
  work = work or Work(note="mfu: the caller gave no model FLOPs or tokens")
  n = max(1, num_devices)
  model_flops = None if work.model_flops is None else work.model_flops / n
  notes = [] if work.note is None else [work.note]
  peaks, why = target_peaks(target)
  if peaks is None:
    notes.append(f"step time: {why}")
    return StepTime(bytes_accessed=bytes_accessed, model_flops=model_flops), notes
  bound = roofline(flops=flops, bytes_accessed=bytes_accessed, comm_bytes=comm_bytes, num_devices=n, peaks=peaks,
                   floor_flops=None if work.floor_flops is None else work.floor_flops / n, notes=notes,
                   fp8_flops=0.0 if walk is None else walk.fp8_flops)
  step, simulated = _simulated(bound.roofline_step_time_s, walk, n, notes)
  term = bound.bound
  if simulated:
    term = max(TERMS, key=lambda t: simulated[f"{t}_bound_share"] or 0.0)
  return StepTime(
      bytes_accessed=bytes_accessed,
      model_flops=model_flops,
      roofline_compute_time_s=bound.roofline_compute_time_s,
      roofline_memory_time_s=bound.roofline_memory_time_s,
      roofline_comm_time_s=bound.roofline_comm_time_s,
      roofline_step_time_s=bound.roofline_step_time_s,
      step_time_s=step,
      **simulated,
      bound=term,
      tokens_per_s_per_device=None if not step or work.tokens is None else work.tokens / n / step,
      mfu=None if not step or model_flops is None else model_flops / (step * peaks.peak_flops),
      arithmetic_intensity=None if bound.flops is None or not bytes_accessed else bound.flops / bytes_accessed,
      ridge_point=peaks.ridge_point,
  ), notes


def _simulated(bound: float | None, walk: Timeline | None, n: int, notes: list[str]) -> tuple[float | None, dict]:
  """The step time and the walk's fields: the walk's step, never below the roofline bound."""
  if walk is None or not walk.step_time_s:  # no schedule to walk: the roofline bound stands in
    return bound, {}
  notes += [n_ for n_ in walk.notes if n_ not in notes]
  step = walk.step_time_s
  if bound is not None and bound > step:
    notes.append(
        f"step_time_s: the simulated schedule ({step:.4g} s) is below the roofline bound ({bound:.4g} s), whose "
        "compute term counts FLOPs the walk does not time (XLA's cost analysis or the model's weight matmuls); "
        "the bound stands in"
    )
    step = bound
  across, slow = walk.across(), walk.slow_link
  if across and slow is not None:
    notes.append(
        f"{slow.field}: the collectives that cross {slow.between}, on {slow.name}: "
        + ", ".join(f"{kind} {seconds(t)}" for kind, t in across.items())
        + f" (of {seconds(walk.comm_time_s)} of communication); fast_link_step_time_s: the same schedule with that "
        f"link as fast as the one inside, {seconds(walk.fast_link_step_time_s)}"
    )
  return step, {
      **walk.link_comm_time_s,
      "fast_link_step_time_s": walk.fast_link_step_time_s,
      # On one device nothing is sent: what the stream waited for is host offload's transfers alone.
      "exposed_comm_time_s": walk.exposed_host_time_s if n == 1 else walk.exposed_comm_time_s,
      **{f"{t}_bound_share": walk.share(t) for t in TERMS},
  }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimate(Record):
  """One program's step time on a target: the row's fields (``step``), its ops' times (``ops``;
  ``None`` without the program's ops), and the notes for what is left out."""

  step: StepTime
  ops: OpTimes | None = None
  notes: tuple[str, ...] = ()
  # A mixture-of-experts step's time by term (jaxmem.steptime.moe), from the same walk; None
  # without grouped matmul kernels or a walk.
  moe: MoeTerms | None = None


def step_time(costs: HloCosts | None, target: Target | None, *, flops: float | None, bytes_accessed: int | None,
              comm_bytes: int | None, num_devices: int, coords: Sequence[Sequence[int]] | None = None,
              work: Work | None = None) -> Estimate:
  """The step time of a compiled program of ``costs`` (its ops; the totals ``flops``,
  ``bytes_accessed`` and ``comm_bytes`` per device, as its report gives them) on ``target``:
  one walk of its schedule (``coords``: where its devices sit) sets ``step_time_s``, the link
  fields and the op times; the roofline bound is formed beside it; ``work``: the step's tokens
  and model FLOPs, for throughput and MFU."""
  walk = timeline(costs, target, coords)
  step, notes = estimate(flops=flops, bytes_accessed=bytes_accessed, comm_bytes=comm_bytes, num_devices=num_devices,
                         target=target, work=work, walk=walk)
  if costs is None:
    return Estimate(step=step, notes=tuple(notes))
  peaks, why = target_peaks(target)
  ops = per_op(costs, peaks, num_devices, walk, why=why)
  if step.step_time_s is not None:
    step = dataclasses.replace(step, op_time_s=ops.op_time_s)
  moe = None if walk is None else walk.moe
  if moe is not None:  # on the row too, so a search can say which MoE term sets two rows apart
    step = dataclasses.replace(step, moe_time_s=moe_times(moe))
  return Estimate(step=step, ops=ops, notes=tuple(notes), moe=moe)


def moe_times(moe: MoeTerms) -> dict[str, float]:
  """A row's ``moe_time_s``: each MoE term's time on the stream (:data:`jaxmem.steptime.moe.TERMS`)."""
  return {t: getattr(moe, f"{t}_time_s") for t in MOE_TERMS}


def op_times(source: Any, target: str | Target | None = None, *, top: int | None = None) -> OpTimes:
  """The time per op of a compiled program: ``source`` a :class:`jaxmem.MemoryReport`
  (``jaxmem.analyze``'s), a :class:`jaxmem.Explanation` (``jaxmem.explain``'s: its target is
  the default) or a ``jax.stages.Compiled``; ``target`` the target to time it on (a name or a
  :class:`Target`; needed for a report or an executable, whose target is not recorded; without
  one there are no times, a note says so); ``top``: list only the slowest ``top`` ops (the totals
  stay the whole step's).

  >>> import jax, jax.numpy as jnp, jaxmem
  >>> x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
  >>> t = jaxmem.op_times(jaxmem.analyze(lambda a: a @ a, x, target="tpu:v5e-1"), "tpu:v5e-1")
  >>> t.ops[0].bound, t.flops == 2 * 1024**3
  ('compute', True)
  """
  top = optional(Whole(), top, "`top`")
  if isinstance(getattr(source, "report", None), MemoryReport):  # an Explanation: its report, its target
    target = source.target if target is None else target
    source = source.report
  if not isinstance(source, MemoryReport) and hasattr(source, "as_text") and hasattr(source, "memory_analysis"):
    source = read_compiled(source)  # a jax.stages.Compiled
  if not isinstance(source, MemoryReport) or source.hlo_costs is None:
    raise JaxmemError(f"op_times takes a MemoryReport, an Explanation or a compiled executable (got {type(source).__name__})")
  if isinstance(target, str):
    target = None if target in ("cpu", "gpu", "tpu") else get_target(target)
  times = step_time(source.hlo_costs, target, flops=source.flops, comm_bytes=source.comm_bytes,
                    bytes_accessed=None if source.traffic is None else source.traffic.bytes_accessed,
                    num_devices=source.num_devices, coords=source.placement).ops
  return times if top is None else times.top(top)

"""The roofline bound of a compiled step per device: each resource's work at its datasheet peak,
the step no faster than the slowest of them.

  roofline_compute_time_s = flops / peak_flops    (the row's flops: the program's, remat included)
  roofline_memory_time_s  = bytes_accessed / hbm_bandwidth    (HBM traffic: :mod:`jaxmem.hlo.traffic`)
  roofline_comm_time_s    = comm_bytes / link_bandwidth       (bytes sent: :mod:`jaxmem.hlo.comms`)
  roofline_step_time_s    = max of the three                  (every term at its peak rate, the
                                                               others hidden under the largest)

Why the maximum stays beside the simulated step (:mod:`jaxmem.steptime.walk`): XLA overlaps
collectives with compute (async collectives, collective matmuls) and a fusion's memory traffic
with its arithmetic, so the sum of the terms is an upper bound only for a program that overlaps
nothing; the maximum is what no schedule can beat. Peaks are bf16 matrix rates: the vector work
(softmax, norms) and fp32 matmuls run slower than that, one more way the figure is a lower bound.
The comm term sends every byte over the chip's whole fast link (every ICI link of the chip at
once, NVLink in a node), a true lower bound even where some collectives cross the slower DCN or
hosts' network; the walk times each collective on the link it crosses (the ``*_comm_time_s``
field named for that link).
"""

from __future__ import annotations

import dataclasses

from jaxmem.hardware.peaks import Peaks
from jaxmem.records import Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class Work(Record):
  """What a step does for the model, given by the caller that knows the model: ``tokens`` (the
  whole step's, all devices) and ``model_flops`` (the whole step's model FLOPs, all devices);
  ``None`` with ``note`` saying why where the caller cannot know (a user's own step)."""

  tokens: int | None = None
  model_flops: float | None = None
  # The FLOPs any program of the model must run (its weight matmuls, all devices): a per-device
  # count below them is an undercount, and the compute term times these instead. Only where the
  # per-device share came from XLA's cost analysis (compile_figures drops it where the optimized
  # HLO's matrix FLOPs gave the share: those count the compiler's loops with their trips).
  floor_flops: float | None = None
  note: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Roofline(Record):
  """The bound's terms as the rows name them (``None``: not published for the target, or the
  figure unknown), their largest and which term it is (``bound``), and the FLOPs the compute
  term timed (the program's, or the model's floor)."""

  roofline_compute_time_s: float | None = None
  roofline_memory_time_s: float | None = None
  roofline_comm_time_s: float | None = None
  roofline_step_time_s: float | None = None
  bound: str | None = None
  flops: float | None = None


def roofline(*, flops: float | None, bytes_accessed: int | None, comm_bytes: int | None, num_devices: int,
             peaks: Peaks, floor_flops: float | None, notes: list[str], fp8_flops: float = 0.0) -> Roofline:
  """The bound of a step of ``flops``, ``bytes_accessed`` and ``comm_bytes`` per device on
  ``peaks``; ``floor_flops``: the model's weight matmuls per device (see :func:`compute_flops`);
  ``fp8_flops``: of ``flops``, the matmuls of two fp8 operands, at the part's fp8 peak where it has
  one (so the bound stays one under ``--quantization fp8_full``). Appends a note for each term it
  leaves out."""
  if peaks.link_note:
    notes.append(f"roofline_comm_time_s: {peaks.link_note}")
  flops = compute_flops(flops, floor_flops, notes)
  terms = {
      "compute": None if flops is None else _compute_time(flops, fp8_flops, peaks),
      "memory": None if bytes_accessed is None else bytes_accessed / peaks.hbm_bandwidth,
      "comm": _comm_time(comm_bytes, max(1, num_devices), peaks.link_bandwidth, peaks.part, notes),
  }
  known = {k: v for k, v in terms.items() if v is not None}
  step = max(known.values()) if known else None
  if step is not None and "compute" not in known:
    notes.append("step_time_s: the program's FLOPs are unknown, so the compute term is left out")
  return Roofline(roofline_compute_time_s=terms["compute"], roofline_memory_time_s=terms["memory"],
                  roofline_comm_time_s=terms["comm"], roofline_step_time_s=step,
                  bound=max(known, key=known.__getitem__) if step else None, flops=flops)


def _compute_time(flops: float, fp8_flops: float, peaks: Peaks) -> float:
  fp8 = min(fp8_flops, flops) if peaks.peak_fp8_flops else 0.0
  return (flops - fp8) / peaks.peak_flops + (fp8 and fp8 / peaks.peak_fp8_flops)


def compute_flops(flops: float | None, floor: float | None, notes: list[str]) -> float | None:
  """The FLOPs the compute term times: the program's, but never fewer than the model's weight
  matmuls (``floor``, per device). A per-device figure below them is an undercount (the share the
  compiler's cost analysis gives misses loops the compiler adds itself, such as TPU's collective
  matmuls under a tensor axis, whose bodies it counts once), so the floor stands in. Compiled
  rows take their share from the optimized HLO's matrix FLOPs instead and pass no floor; it
  stays for a program whose HLO has no matrix ops to count (jaxmem.compiler.flops)."""
  if flops is None or floor is None or flops >= floor:
    return flops
  notes.append(
      f"roofline_compute_time_s: the program's FLOPs per device ({flops:.4g}) are below its weight matmuls' "
      f"({floor:.4g}), an undercount of loops the compiler adds (collective matmuls, counted once by its cost "
      "analysis); the compute term and arithmetic_intensity use the weight matmuls' FLOPs"
  )
  return floor


def _comm_time(comm_bytes: int | None, n: int, link: float | None, part: str, notes: list[str]) -> float | None:
  if comm_bytes is None:
    return None
  if comm_bytes == 0 or n == 1:
    return 0.0
  if link is None:
    notes.append(f"roofline_comm_time_s: no published per-chip interconnect bandwidth for {part}; step_time_s "
                 "leaves communication out")
    return None
  return comm_bytes / link

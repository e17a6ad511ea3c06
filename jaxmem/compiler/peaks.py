"""A target's published peak figures per device: what the step-time estimate divides by.

The figures themselves live with each part's specification, each with its datasheet cited:
TPU generations in :data:`jaxmem.compiler.tpu.TPU_GENERATIONS` (per chip, from the Cloud TPU
pages), NVIDIA parts in :data:`jaxmem.compiler.gpu.GPU_SPECS` (dense tensor-core peaks). This
module turns them into one device's share (a TPU7x chip is two JAX devices, each with half the
chip) and says which link a collective crosses:

- ``link_bandwidth``: bytes per second one device can send over the interconnect inside a slice
  (TPU ICI) or a node (NVLink). Both are quoted bidirectional (both directions summed), and the
  communication record counts bytes *sent*, so the sending rate is half the quoted figure.
- Multi-slice TPU targets and GPU targets over several hosts cross DCN / the hosts' network for
  part of their collectives; the estimate still uses the fast link, which makes it a lower
  bound, and a note says so (``link_note``).

A target without figures (``cpu``, ``attached`` devices of an unknown kind) has ``None``, and
the reason (:func:`target_peaks`).
"""

from __future__ import annotations

import dataclasses

from jaxmem.compiler.gpu import GPU_SPECS
from jaxmem.compiler.targets import Target
from jaxmem.compiler.tpu import TPU_GENERATIONS
from jaxmem.hlo.ops import MatrixTile
from jaxmem.hlo.schedule import Link, Machine
from jaxmem.records import Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class Peaks(Record):
  """One device's peak figures. ``None``: not published for the part."""

  part: str  # "TPU v5p", "NVIDIA H100"
  peak_flops: float  # bf16 dense matrix FLOP/s
  peak_8bit_ops: float | None  # fp8 or int8 dense ops/s
  hbm_bandwidth: float  # bytes per second
  link: str  # "ICI" or "NVLink"
  link_bandwidth: float | None  # bytes per second one device sends (half the bidirectional figure)
  link_note: str | None = None  # where the link figure understates the path (multi-slice, multi-host)

  @property
  def ridge_point(self) -> float:
    """FLOPs per byte of HBM traffic above which a program is compute-bound (Williams et al.,
    "Roofline", CACM 2009): peak FLOP/s over bandwidth."""
    return self.peak_flops / self.hbm_bandwidth


def target_peaks(target: Target | None) -> tuple[Peaks | None, str | None]:
  """``target``'s per-device peaks, or ``None`` and why not."""
  if target is None:
    return None, "no target: no peak figures"
  if target.source == "tpu":
    return _tpu_peaks(target)
  if target.source == "gpu":
    return _gpu_peaks(target)
  if target.source == "attached":
    return _attached_peaks(target)
  return None, f"target {target.name}: no published peak figures for this machine's CPU"


def _tpu_peaks(target: Target) -> tuple[Peaks | None, str | None]:
  gen = TPU_GENERATIONS[target.key]
  if gen.peak_bf16_flops_per_chip is None or gen.hbm_bandwidth_per_chip is None:
    return None, f"TPU {gen.name}: no published peak FLOP/s or HBM bandwidth"
  share = gen.devices_per_chip
  ici = gen.ici_bandwidth_per_chip
  note = None
  if target.slices > 1:
    note = (f"{target.slices} slices: collectives across slices cross DCN, slower than ICI; all are timed at "
            "ICI bandwidth, so comm_time_s is a lower bound")
  return Peaks(
      part=f"TPU {gen.name}", peak_flops=gen.peak_bf16_flops_per_chip / share,
      peak_8bit_ops=None if gen.peak_8bit_ops_per_chip is None else gen.peak_8bit_ops_per_chip / share,
      hbm_bandwidth=gen.hbm_bandwidth_per_chip / share, link="ICI",
      link_bandwidth=None if ici is None else ici / 2 / share, link_note=note,
  ), None


def _gpu_peaks(target: Target) -> tuple[Peaks | None, str | None]:
  spec = GPU_SPECS[target.key]
  if spec.peak_bf16_flops is None:
    return None, f"GPU {spec.name}: no published peak FLOP/s"
  note = None
  if target.hosts > 1:
    note = (f"{target.hosts} hosts: collectives across hosts cross the hosts' network, slower than NVLink; "
            "all are timed at NVLink bandwidth, so comm_time_s is a lower bound")
  return Peaks(
      part=spec.description, peak_flops=spec.peak_bf16_flops, peak_8bit_ops=spec.peak_8bit_ops,
      hbm_bandwidth=float(spec.memory_bandwidth), link="NVLink", link_bandwidth=spec.nvlink_bandwidth / 2,
      link_note=note,
  ), None


def _attached_peaks(target: Target) -> tuple[Peaks | None, str | None]:
  kind = target.device_kind
  for gen in TPU_GENERATIONS.values():
    if kind == gen.device_kind:
      return _tpu_peaks(dataclasses.replace(target, source="tpu", key=gen.name))
  for spec in GPU_SPECS.values():
    if kind == spec.description:
      return _gpu_peaks(dataclasses.replace(target, source="gpu", key=spec.name))
  return None, f"attached devices {kind!r}: no published peak figures known to jaxmem"


# Collective latencies (jaxmem.hlo.schedule's Link), each from its source:
# - ICI: "Each hop over an ICI link has some intrinsic overhead regardless of the data volume. This
#   is typically around 1us" (J. Austin et al., "How to Scale Your Model", Part 3 "Sharding", a note
#   on ICI latency: jax-ml.github.io/scaling-book/sharding); a ring step is one hop.
# - NVLink and the hosts' network: NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc, ring
#   algorithm, Simple protocol): a base latency of 8.4 us per collective, 3.4 us a step over NVLink
#   and 9.6 us a step over the network.
# - DCN between TPU slices: no latency is published; it is left at 0 (a note says so).
ICI_STEP_LATENCY_S = 1e-6
NCCL_BASE_LATENCY_S = 8.4e-6
NVLINK_STEP_LATENCY_S = 3.4e-6
NET_STEP_LATENCY_S = 9.6e-6
# The rows a TPU matmul's left-hand side streams through the MXU at once: it "performs one
# bfloat16[8,128] @ bf16[128,128] -> f32[8,128] matrix multiply every 8 cycles" (How to Scale Your
# Model, Part 2 "TPUs"), so a matmul's rows are rounded up to 8.
MXU_ROWS = 8


def machine(target: Target | None) -> tuple[Machine | None, str | None]:
  """``target``'s rates as the schedule walk (:func:`jaxmem.hlo.schedule.simulate`) times ops, or
  ``None`` and why not."""
  peaks, why = target_peaks(target)
  if peaks is None:
    return None, why
  if target.source == "attached":
    target = _attached_as_catalogued(target)
  notes = []
  if target.source == "tpu":
    gen = TPU_GENERATIONS[target.key]
    tile = None if gen.mxu_size is None else MatrixTile(rows=MXU_ROWS, contracted=gen.mxu_size, columns=gen.mxu_size)
    if tile is None:
      notes.append(f"step_time_s: TPU {gen.name}'s matrix unit size is not published; matmuls are not rounded up to it")
    fast = Link(name="ICI", bandwidth=peaks.link_bandwidth, step_latency_s=ICI_STEP_LATENCY_S)
    slow = None
    if target.slices > 1:
      dcn = None if gen.dcn_bandwidth_per_chip is None else gen.dcn_bandwidth_per_chip / gen.devices_per_chip
      slow = Link(name="DCN", bandwidth=dcn)
      notes.append("step_time_s: no latency is published for DCN; collectives across slices are timed by bandwidth alone")
    per_unit = target.num_devices // max(1, target.slices)
  else:
    spec = GPU_SPECS[target.key]
    tile = None
    notes.append("step_time_s: matmuls on GPU are not rounded up to a tile (no single tile is published for its tensor cores)")
    fast = Link(name="NVLink", bandwidth=peaks.link_bandwidth, base_latency_s=NCCL_BASE_LATENCY_S,
                step_latency_s=NVLINK_STEP_LATENCY_S)
    slow = None
    if target.hosts > 1:
      slow = Link(name="network", bandwidth=spec.network_bandwidth, base_latency_s=NCCL_BASE_LATENCY_S,
                  step_latency_s=NET_STEP_LATENCY_S)
    per_unit = target.num_devices // max(1, target.hosts)
  return Machine(part=peaks.part, peak_flops=peaks.peak_flops, hbm_bandwidth=peaks.hbm_bandwidth, tile=tile, fast=fast,
                 slow=slow, devices_per_unit=per_unit, notes=tuple(notes)), None


def _attached_as_catalogued(target: Target) -> Target:
  for gen in TPU_GENERATIONS.values():
    if target.device_kind == gen.device_kind:
      return dataclasses.replace(target, source="tpu", key=gen.name)
  for spec in GPU_SPECS.values():
    if target.device_kind == spec.description:
      return dataclasses.replace(target, source="gpu", key=spec.name)
  return target

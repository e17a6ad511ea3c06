"""A target's published peak figures per device: what the step-time estimate divides by.

The figures themselves live with each part's specification, each with its datasheet cited:
TPU generations in :data:`jaxmem.hardware.tpu.TPU_GENERATIONS` (per chip, from the Cloud TPU
pages), NVIDIA parts in :data:`jaxmem.hardware.gpu.GPU_SPECS` (dense tensor-core peaks). This
module turns them into one device's share (a TPU7x chip is two JAX devices, each with half the
chip) and says which link a collective crosses:

- ``link_bandwidth``: bytes per second one device can send over the interconnect inside a slice
  (TPU ICI) or a node (NVLink). Both are quoted bidirectional (both directions summed), and the
  communication record counts bytes *sent*, so the sending rate is half the quoted figure.
- Multi-slice TPU targets and GPU targets over several hosts cross DCN / the hosts' network for
  part of their collectives; the roofline bound still sends every byte over the fast link, which
  keeps it a lower bound, and a note says so (``link_note``). The schedule walk times those
  collectives on the slow link (:mod:`jaxmem.hardware.machine`, :mod:`jaxmem.steptime`).

A target without figures (``cpu``, ``attached`` devices of an unknown kind) has ``None``, and
the reason. Which figures a target has is its kind's to say
(:func:`jaxmem.hardware.targets.target_peaks`).
"""

from __future__ import annotations

import dataclasses

from jaxmem.hardware.gpu import GPU_SPECS, GpuSpec
from jaxmem.hardware.tpu import TPU_GENERATIONS, TpuGeneration
from jaxmem.records import Record

# The first NVIDIA compute capability with fp8 tensor cores: Ada (8.9; "Ada Lovelace ... fourth-generation
# Tensor Cores with FP8", NVIDIA Ada GPU Architecture whitepaper) and Hopper (9.0) on; Ampere (8.0, 8.6) has
# none, and its 8-bit figure is int8 (jaxmem.hardware.gpu).
FP8_CAPABILITY = (8, 9)


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
  # fp8 dense matrix FLOP/s where the part multiplies fp8 operands (the 8-bit figure, where it is an fp8
  # one: TpuGeneration.eight_bit, an NVIDIA part of compute capability 8.9 or later); None: no fp8 matmul.
  peak_fp8_flops: float | None = None

  @property
  def ridge_point(self) -> float:
    """FLOPs per byte of HBM traffic above which a program is compute-bound (Williams et al.,
    "Roofline", CACM 2009): peak FLOP/s over bandwidth."""
    return self.peak_flops / self.hbm_bandwidth


def tpu_peaks(gen: TpuGeneration, *, slices: int = 1) -> tuple[Peaks | None, str | None]:
  """One device's share of TPU generation ``gen``'s chip, or ``None`` and why not."""
  if gen.peak_bf16_flops_per_chip is None or gen.hbm_bandwidth_per_chip is None:
    return None, f"TPU {gen.name}: no published peak FLOP/s or HBM bandwidth"
  share = gen.devices_per_chip
  ici = gen.ici_bandwidth_per_chip
  note = None
  if slices > 1:
    note = (f"{slices} slices: collectives across slices cross DCN, slower than ICI; the bound times all at "
            "ICI bandwidth, a lower bound (dcn_comm_time_s: the simulated time of those that cross, on DCN)")
  return Peaks(
      part=f"TPU {gen.name}", peak_flops=gen.peak_bf16_flops_per_chip / share,
      peak_8bit_ops=None if gen.peak_8bit_ops_per_chip is None else gen.peak_8bit_ops_per_chip / share,
      hbm_bandwidth=gen.hbm_bandwidth_per_chip / share, link="ICI",
      link_bandwidth=None if ici is None else ici / 2 / share, link_note=note,
      peak_fp8_flops=gen.peak_8bit_ops_per_chip / share if gen.eight_bit == "fp8" and gen.peak_8bit_ops_per_chip else None,
  ), None


def gpu_peaks(spec: GpuSpec, *, hosts: int = 1) -> tuple[Peaks | None, str | None]:
  """One GPU's peaks, or ``None`` and why not."""
  if spec.peak_bf16_flops is None:
    return None, f"GPU {spec.name}: no published peak FLOP/s"
  note = None
  if hosts > 1:
    note = (f"{hosts} hosts: collectives across hosts cross the hosts' network, slower than NVLink; the bound "
            "times all at NVLink bandwidth, a lower bound (network_comm_time_s: the simulated time of those that "
            "cross, on the network)")
  return Peaks(
      part=spec.description, peak_flops=spec.peak_bf16_flops, peak_8bit_ops=spec.peak_8bit_ops,
      hbm_bandwidth=float(spec.memory_bandwidth), link=spec.interconnect, link_bandwidth=spec.nvlink_bandwidth / 2,
      link_note=note, peak_fp8_flops=spec.peak_8bit_ops if spec.compute_capability >= FP8_CAPABILITY else None,
  ), None


def device_kind_peaks(kind: str) -> tuple[Peaks | None, str | None]:
  """The peaks of a device by its ``device_kind`` (an attached device): the TPU generation or GPU
  part of that name, one slice or host."""
  for gen in TPU_GENERATIONS.values():
    if kind == gen.device_kind:
      return tpu_peaks(gen)
  for spec in GPU_SPECS.values():
    if kind == spec.description:
      return gpu_peaks(spec)
  return None, f"attached devices {kind!r}: no published peak figures known to jaxmem"


"""One device's rates as the step time times its ops (:class:`Machine`): the matrix peak and its
tile, a matmul's achieved rate by shape, the vector unit's rate, HBM bandwidth, and the links its
collectives cross, each named (:class:`Link`). Which machine a target is belongs to its kind
(``TargetKind.machine``, :mod:`jaxmem.hardware.targets`), built here from the part's catalogue
entry: :func:`tpu_machine` for a TPU slice (or several over DCN), :func:`gpu_machine` for GPUs in
hosts of up to 8. :mod:`jaxmem.steptime` walks a compiled schedule on it.

Collective latencies (a :class:`Link`'s), each from its source:

- ICI: "Each hop over an ICI link has some intrinsic overhead regardless of the data volume. This
  is typically around 1us" (J. Austin et al., "How to Scale Your Model", Part 3 "Sharding", a note
  on ICI latency: jax-ml.github.io/scaling-book/sharding); a ring step is one hop.
- NVLink and the hosts' network: NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc, ring
  algorithm, Simple protocol): a base latency of 8.4 us per collective, 3.4 us a step over NVLink
  and 9.6 us a step over the network.
- DCN between TPU slices: no latency is published; it is left at 0 (a note says so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from jaxmem.hardware.gpu import GpuSpec, GpuSystem
from jaxmem.hardware.matmul_rates import SOURCE as MATMUL_RATES_SOURCE
from jaxmem.hardware.matmul_rates import profile_name, rate_function
from jaxmem.hardware.peaks import Peaks
from jaxmem.hardware.tpu import TpuGeneration, slice_shape, slice_wrap
from jaxmem.records import Record

ICI_STEP_LATENCY_S = 1e-6
NCCL_BASE_LATENCY_S = 8.4e-6
NVLINK_STEP_LATENCY_S = 3.4e-6
NET_STEP_LATENCY_S = 9.6e-6
# The rows a TPU matmul's left-hand side streams through the MXU at once: it "performs one
# bfloat16[8,128] @ bf16[128,128] -> f32[8,128] matrix multiply every 8 cycles" (How to Scale Your
# Model, Part 2 "TPUs"), so a matmul's rows are rounded up to 8.
MXU_ROWS = 8

# A matmul's achieved FLOP/s from its shape: (batch, rows, columns, contracted, dtype) -> FLOP/s,
# or None where nothing is published for it. ``dtype`` is XLA's key, the operands' and the result's
# element types: "bf16xbf16->bf16" (jaxmem.hardware.matmul_rates.achieved_flops, bound to a part).
MatmulRate = Callable[[int, int, int, int, str], "float | None"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixTile:
  """The granule a matrix unit works in: a matmul's rows, contracted size and columns are each
  rounded up to a multiple of theirs (a TPU MXU holds a ``contracted x columns`` block of the
  right-hand side and streams the left-hand side through in blocks of ``rows``)."""

  rows: int
  contracted: int
  columns: int

  def padded(self, rows: int, contracted: int, columns: int) -> int:
    """``rows x contracted x columns`` once each is rounded up to the tile."""
    up = lambda n, t: -(-n // t) * t  # noqa: E731
    return up(rows, self.rows) * up(contracted, self.contracted) * up(columns, self.columns)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Link(Record):
  """A path collectives cross: the bytes per second one device sends over it (``None``: not
  published), and its latency per collective (``base_latency_s``) and per ring step
  (``step_latency_s``). ``field``: the step-time field that carries the time collectives spend on
  it (:class:`jaxmem.records.StepTime`), so a link's time is always named by its link."""

  name: str  # as notes name it: "ICI", "DCN", "NVLink", "network" (the hosts')
  field: str  # "ici_comm_time_s", "dcn_comm_time_s", "nvlink_comm_time_s", "network_comm_time_s", "host_comm_time_s"
  bandwidth: float | None
  between: str | None = None  # what a slow link joins: "slices" (DCN), "hosts" (the hosts' network)
  base_latency_s: float = 0.0
  step_latency_s: float = 0.0


def ici(bandwidth: float | None) -> Link:
  """A TPU slice's inter-chip interconnect."""
  return Link(name="ICI", field="ici_comm_time_s", bandwidth=bandwidth, step_latency_s=ICI_STEP_LATENCY_S)


def dcn(bandwidth: float | None) -> Link:
  """The data-center network between TPU slices."""
  return Link(name="DCN", field="dcn_comm_time_s", bandwidth=bandwidth, between="slices")


def nvlink(bandwidth: float | None) -> Link:
  """NVLink, between the GPUs of one host."""
  return Link(name="NVLink", field="nvlink_comm_time_s", bandwidth=bandwidth, base_latency_s=NCCL_BASE_LATENCY_S,
              step_latency_s=NVLINK_STEP_LATENCY_S)


def network(bandwidth: float | None) -> Link:
  """The hosts' network, between GPUs of different hosts (each GPU's own NIC)."""
  return Link(name="network", field="network_comm_time_s", bandwidth=bandwidth, between="hosts",
              base_latency_s=NCCL_BASE_LATENCY_S, step_latency_s=NET_STEP_LATENCY_S)


def host_link(bandwidth: float | None) -> Link:
  """The link between a device and its host's memory (PCIe): what host offload's transfers
  cross (remat offload's copies to and from pinned host memory), ``bandwidth`` each way."""
  return Link(name="host", field="host_comm_time_s", bandwidth=bandwidth)


# Every link a machine may have, by name and field (bandwidth aside): what the step-time records
# declare a field for, and what tables name them by.
LINKS: tuple[Link, ...] = (ici(None), dcn(None), nvlink(None), network(None), host_link(None))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Torus(Record):
  """A TPU slice's ICI as its links: the chip grid (``dims``), which axes close into rings
  (``wrap``), what one device sends over one link in one direction (``link_bandwidth``), and the
  chip coordinates of each device of the compiled program (``coords[i]``: partition ``i``'s, the
  program's device assignment)."""

  dims: tuple[int, ...]
  wrap: tuple[bool, ...]
  link_bandwidth: float
  coords: tuple[tuple[int, ...], ...]

  def links(self, group: list[int]) -> int | None:
    """How many of each device's links a collective over ``group`` (partition ids) drives: for
    each axis of the grid the group spans, two where it covers the whole axis and the axis wraps
    (a ring, both directions), one otherwise (a line; "without wraparounds ... it typically
    doubles the time of most communication": How to Scale Your Model, Part 2 "TPUs"; a collective
    over several axes uses each axis's links: Part 3 "Sharding"). 0: the group is on one chip.
    ``None``: a device id outside the assignment."""
    if any(not 0 <= i < len(self.coords) for i in group):
      return None
    links = 0
    for axis, size in enumerate(self.dims):
      seen = {self.coords[i][axis] for i in group}
      if len(seen) > 1:
        links += 2 if self.wrap[axis] and len(seen) == size else 1
    return links


@dataclasses.dataclass(frozen=True, kw_only=True)
class Machine(Record):
  """One device's rates, as the walk times ops: the matrix peak and its tile (``None``: matmuls
  are not rounded up), a matmul's achieved rate by shape (``matmul_rate``, :data:`MatmulRate`;
  ``None``: matmuls run at the peak), the HBM bandwidth, the fast link inside a slice or host,
  the slow link across (``None`` where the target is one slice or host), and how many devices a
  slice or host holds (device ids ``0..n-1`` in the mesh's order, a slice or host after another)."""

  part: str
  peak_flops: float
  hbm_bandwidth: float
  # The matrix peak of a matmul whose operands are both fp8 (Peaks.peak_fp8_flops); None: no fp8 matmul.
  peak_fp8_flops: float | None = None
  tile: MatrixTile | None = None
  matmul_rate: MatmulRate | None = dataclasses.field(default=None, repr=False, compare=False,
                                                      metadata={"as_dict": False})
  fast: Link
  slow: Link | None = None
  devices_per_unit: int = 1 << 30
  # A TPU slice's links and where the program's devices sit on them: a collective inside the slice
  # is then timed over the links its group drives, not the chip's whole ICI (``fast.bandwidth``,
  # what it falls back to where the placement or the groups are not known).
  torus: Torus | None = None
  # Elementwise operations per second the vector unit runs (one an ALU or FP32 lane a cycle; None:
  # not published for the part, and vector work is timed by its HBM traffic alone).
  vector_rate: float | None = None
  # The device's link to its host's memory, what host offload's copies cross (a TPU's PCIe, per
  # device; its bandwidth None where the part publishes none); None: not modelled (GPUs).
  host: Link | None = None
  # Why the host link has no bandwidth, where it has none (the part's catalogue note).
  host_note: str | None = None
  notes: tuple[str, ...] = ()

  @property
  def links(self) -> tuple[Link, ...]:
    """The links its transfers may cross: the fast one first, the slow one, the host link."""
    return tuple(link for link in (self.fast, self.slow, self.host) if link is not None)


def tpu_machine(gen: TpuGeneration, *, size: int, slices: int, num_devices: int, peaks: Peaks,
                coords: Sequence[Sequence[int]] | None) -> Machine:
  """A TPU slice of ``gen`` (``size`` as its accelerator type counts), ``slices`` of them over DCN:
  matmuls at the peak, rounded up to the MXU's tile (no per-shape throughput is published for
  TPU); collectives inside a slice on the links their groups drive where ``coords`` place the
  devices (:func:`torus`), across slices on DCN."""
  notes = []
  tile = None if gen.mxu_size is None else MatrixTile(rows=MXU_ROWS, contracted=gen.mxu_size, columns=gen.mxu_size)
  if tile is None:
    notes.append(f"step_time_s: TPU {gen.name}'s matrix unit size is not published; matmuls are not rounded up to it")
  slow = None
  if slices > 1:
    slow = dcn(None if gen.dcn_bandwidth_per_chip is None else gen.dcn_bandwidth_per_chip / gen.devices_per_chip)
    notes.append("step_time_s: no latency is published for DCN; collectives across slices are timed by bandwidth alone")
  per_slice = num_devices // max(1, slices)
  vector = None if gen.vector_ops_per_chip is None else gen.vector_ops_per_chip / gen.devices_per_chip
  if vector is None:
    notes.append(f"step_time_s: no vector-unit rate is published for TPU {gen.name}; its elementwise work is timed "
                 "by its HBM traffic alone")
  links = torus(gen, size, coords, per_slice)
  if links is None and gen.ici_bandwidth_per_chip is not None and gen.ici_links_per_chip is None:
    notes.append(f"step_time_s: TPU {gen.name}'s ICI links a chip are not published; collectives in a slice are "
                 "timed at the chip's whole ICI bandwidth, every link at once (a lower bound)")
  elif links is None:
    notes.append("step_time_s: the devices' chip coordinates are not known; collectives in a slice are timed at "
                 "the chip's whole ICI bandwidth, every link at once (a lower bound)")
  if gen.devices_per_chip > 1:
    notes.append(f"step_time_s: the link between the {gen.devices_per_chip} devices of a TPU {gen.name} chip is not "
                 "published; collectives between them are timed at the device's share of the chip's ICI bandwidth")
  # PCIe is the chip's; its devices (two on v7x) share it, as they share the chip's other links.
  pcie = gen.host_link_bandwidth_per_chip
  host = host_link(None if pcie is None else pcie / gen.devices_per_chip)
  return Machine(part=peaks.part, peak_flops=peaks.peak_flops, peak_fp8_flops=peaks.peak_fp8_flops,
                 hbm_bandwidth=peaks.hbm_bandwidth, tile=tile,
                 fast=ici(peaks.link_bandwidth), slow=slow, devices_per_unit=per_slice, torus=links,
                 vector_rate=vector, host=host, host_note=gen.host_link_note, notes=tuple(notes))


def torus(gen: TpuGeneration, size: int, coords: Sequence[Sequence[int]] | None, per_slice: int) -> Torus | None:
  """The slice's links (:class:`Torus`) where ``coords`` place each of its devices on its chip
  grid, else ``None``. A link's one-way rate is the chip's bidirectional ICI over both directions
  of its links (``ici_links_per_chip``: six on a 3-D torus, four on a 2-D one; the Cloud figure
  counts them all: v5p's 1200 GBps is six links of 100 GB/s each way, How to Scale Your Model's
  table), shared by the chip's devices. ``None`` also where the part's link count is not published."""
  if coords is None or gen.ici_bandwidth_per_chip is None or gen.ici_links_per_chip is None:
    return None
  shape = slice_shape(gen, size)
  dims = tuple(int(d) for d in shape.split("x"))
  coords = tuple(tuple(int(c) for c in xyz)[:len(dims)] for xyz in coords)
  if len(coords) < per_slice or any(len(c) != len(dims) for c in coords):
    return None
  link = gen.ici_bandwidth_per_chip / 2 / gen.ici_links_per_chip / gen.devices_per_chip
  return Torus(dims=dims, wrap=slice_wrap(shape), link_bandwidth=link, coords=coords)


def gpu_machine(spec: GpuSpec, *, system: GpuSystem | None, hosts: int, num_devices: int, peaks: Peaks) -> Machine:
  """GPUs of ``spec`` in ``hosts`` hosts (of ``system``'s machine type; ``None``: NVIDIA's DGX):
  each GEMM at XLA's measured throughput for its shape where XLA has a table for the part, else at
  the peak; vector work on the CUDA cores; collectives on NVLink inside a host, on the hosts'
  network across them."""
  notes = []
  # Elementwise work on the CUDA cores: one FP32 operation a lane a cycle (the datasheets' FP32
  # TFLOPS count a fused multiply-add as two: H100 SXM's 67 is 2 x 132 SMs x 128 lanes x 1.98 GHz).
  vector = spec.core_count * spec.fpus_per_core * spec.clock_rate_ghz * 1e9
  rate = rate_function(spec)
  if rate is None:
    notes.append(f"step_time_s: XLA's GEMM throughput table has no {profile_name(spec)} entries; matmuls on "
                 f"{spec.description} are timed at the datasheet peak, not rounded up to a tile (no single tile is "
                 "published for its tensor cores)")
  else:
    notes.append(f"step_time_s: matmuls timed at XLA's measured GEMM throughput for their shape "
                 f"({profile_name(spec)}; XLA's table as shipped in {MATMUL_RATES_SOURCE}); roofline_step_time_s at the "
                 "datasheet peak")
  slow = None
  if hosts > 1:
    bandwidth = spec.network_bandwidth if system is None else system.network_bandwidth
    slow = network(bandwidth)
    where = (f"{system.description}'s {system.network}" if system is not None
             else f"NVIDIA's reference system for {spec.description} (DGX), one NIC a GPU")
    notes.append(f"step_time_s: the hosts' network is {where}: "
                 + ("not published" if bandwidth is None else f"{bandwidth * 8 / 1e9:g} Gb/s a GPU"))
  return Machine(part=peaks.part, peak_flops=peaks.peak_flops, peak_fp8_flops=peaks.peak_fp8_flops,
                 hbm_bandwidth=peaks.hbm_bandwidth, matmul_rate=rate,
                 fast=nvlink(peaks.link_bandwidth), slow=slow, devices_per_unit=num_devices // max(1, hosts),
                 vector_rate=vector, notes=tuple(notes))

"""The roofline estimate of a compiled step's time per device (:class:`jaxmem.records.StepTime`).

Terms (per device; peaks: :mod:`jaxmem.hardware.peaks`):

  compute_time_s = flops / peak_flops          (the row's flops: the program's, remat included)
  memory_time_s  = bytes_accessed / hbm_bandwidth   (HBM traffic: :mod:`jaxmem.hlo.traffic`)
  comm_time_s    = comm_bytes / link_bandwidth      (bytes sent: :mod:`jaxmem.hlo.comms`)
  roofline_step_time_s = max(compute, memory, comm) (a lower bound: every term at its peak rate,
                                                     and the others hidden under the largest)
  step_time_s    = the compiled schedule simulated (jaxmem.hlo.schedule: each op at its own
                   roofline in the device's order; on TPU matmuls at the peak, rounded up to the
                   matrix unit's tile; on GPU each GEMM at XLA's measured throughput for its
                   shape (jaxmem.hardware.matmul_rates; the peak where XLA has no table for the
                   part); collectives on their links with their latency, an asynchronous collective
                   overlapping the work scheduled between its start and done), never below the
                   roofline bound; the roofline bound where there is no schedule to walk
  exposed_comm_time_s, *_bound_share = the simulated step's communication nothing overlapped,
                   and the fractions of it bound by compute, memory and communication
  bound          = the term with the largest share (the roofline's largest term without a walk)
  tokens_per_s_per_device = tokens / devices / step_time_s
  mfu            = model_flops / (step_time_s * peak_flops)   (model FLOPs: jaxmem.models.model_flops)
  arithmetic_intensity = flops / bytes_accessed;  ridge_point = peak_flops / hbm_bandwidth
  op_time_s      = the sum over the program's ops of each op's largest term (jaxmem.compiler.optimes,
                   set by compile_figures): the tighter estimate, ops one after another

Why the roofline maximum stays beside the simulation: XLA overlaps collectives with compute (async collectives,
collective matmuls) and a fusion's memory traffic with its arithmetic, so the sum of the terms
is an upper bound only for a program that overlaps nothing; the maximum is what no schedule can
beat. Real steps land between, nearer the maximum for a well-overlapped program (the calibration
against MaxText's published MFU in docs/examples.md says how near). Peaks are bf16 matrix rates:
the vector work (softmax, norms) and fp32 matmuls run slower than that, which is one more way the
figure is a lower bound. The roofline's comm term sends over the chip's whole link (every ICI link
of the chip at once, NVLink in a node), a true lower bound; the walk times a TPU slice's
collectives over the links their groups drive (jaxmem.hlo.schedule.Torus), and across slices or
hosts over the slower path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxmem.hardware.gpu import GPU_SPECS, GPU_SYSTEMS
from jaxmem.hardware.matmul_rates import SOURCE as MATMUL_RATES_SOURCE
from jaxmem.hardware.matmul_rates import profile_name, rate_function
from jaxmem.hardware.targets import Attached, Gpu, Target, Tpu, target_peaks
from jaxmem.hardware.tpu import TPU_GENERATIONS, slice_shape, slice_wrap
from jaxmem.hlo.ops import HloCosts, MatrixTile
from jaxmem.hlo.schedule import Link, Machine, Timeline, Torus, simulate
from jaxmem.records import Record, StepTime
from jaxmem.units import seconds

TERMS = ("compute", "memory", "comm")


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



def machine(target: Target | None, coords: Sequence[Sequence[int]] | None = None) -> tuple[Machine | None, str | None]:
  """``target``'s rates as the schedule walk (:func:`jaxmem.hlo.schedule.simulate`) times ops, or
  ``None`` and why not. Attached devices are timed as the catalogued part of their ``device_kind``.
  ``coords``: the chip coordinates of the program's devices in its device assignment's order
  (:func:`jaxmem.compiler.report.placement`), which time a TPU slice's collectives over the links
  they drive."""
  peaks, why = target_peaks(target)
  if peaks is None:
    return None, why
  kind = target.kind
  if isinstance(kind, Attached):
    kind = _catalogued(target.device_kind)
  notes = []
  rate = None  # TPU: no per-shape matmul throughput is published; its matmuls run at the peak, tiled
  torus = None  # a TPU slice's links, where its devices' placement is known
  if isinstance(kind, Tpu):
    gen = TPU_GENERATIONS[kind.generation]
    tile = None if gen.mxu_size is None else MatrixTile(rows=MXU_ROWS, contracted=gen.mxu_size, columns=gen.mxu_size)
    if tile is None:
      notes.append(f"step_time_s: TPU {gen.name}'s matrix unit size is not published; matmuls are not rounded up to it")
    fast = Link(name="ICI", bandwidth=peaks.link_bandwidth, step_latency_s=ICI_STEP_LATENCY_S)
    slow = None
    if kind.slices > 1:
      dcn = None if gen.dcn_bandwidth_per_chip is None else gen.dcn_bandwidth_per_chip / gen.devices_per_chip
      slow = Link(name="DCN", bandwidth=dcn)
      notes.append("step_time_s: no latency is published for DCN; collectives across slices are timed by bandwidth alone")
    per_unit = target.num_devices // max(1, kind.slices)
    vector = None if gen.vector_ops_per_chip is None else gen.vector_ops_per_chip / gen.devices_per_chip
    if vector is None:
      notes.append(f"step_time_s: no vector-unit rate is published for TPU {gen.name}; its elementwise work is timed "
                   "by its HBM traffic alone")
    torus = _torus(gen, kind, coords, per_unit)
    if torus is None:
      notes.append("step_time_s: the devices' chip coordinates are not known; collectives in a slice are timed at "
                   "the chip's whole ICI bandwidth, every link at once (a lower bound)")
  elif isinstance(kind, Gpu):
    spec = GPU_SPECS[kind.part]
    tile = None
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
    fast = Link(name="NVLink", bandwidth=peaks.link_bandwidth, base_latency_s=NCCL_BASE_LATENCY_S,
                step_latency_s=NVLINK_STEP_LATENCY_S)
    slow = None
    if kind.hosts > 1:
      system = None if kind.system is None else GPU_SYSTEMS[kind.system]
      bandwidth = spec.network_bandwidth if system is None else system.network_bandwidth
      slow = Link(name="network", bandwidth=bandwidth, base_latency_s=NCCL_BASE_LATENCY_S,
                  step_latency_s=NET_STEP_LATENCY_S)
      where = (f"{system.description}'s {system.network}" if system is not None
               else f"NVIDIA's reference system for {spec.description} (DGX), one NIC a GPU")
      notes.append(f"step_time_s: the hosts' network is {where}: "
                   + ("not published" if bandwidth is None else f"{bandwidth * 8 / 1e9:g} Gb/s a GPU"))
    per_unit = target.num_devices // max(1, kind.hosts)
  else:
    return None, f"target {target.name}: no catalogued part to time its ops on"
  return Machine(part=peaks.part, peak_flops=peaks.peak_flops, hbm_bandwidth=peaks.hbm_bandwidth, tile=tile,
                 matmul_rate=rate, fast=fast, slow=slow, devices_per_unit=per_unit,
                 torus=torus, vector_rate=vector, notes=tuple(notes)), None


def _torus(gen, kind: Tpu, coords: Sequence[Sequence[int]] | None, per_slice: int) -> Torus | None:
  """The slice's links (:class:`jaxmem.hlo.schedule.Torus`) where ``coords`` place each of its
  devices on its chip grid, else ``None``. A link's one-way rate is the chip's bidirectional ICI
  over both directions of its links: six on a 3-D grid, four on a 2-D one (the Cloud figure
  counts them all: v5p's 1200 GBps is six links of 100 GB/s each way, How to Scale Your Model's
  table), shared by the chip's devices."""
  if coords is None or gen.ici_bandwidth_per_chip is None:
    return None
  shape = slice_shape(gen, kind.size)
  dims = tuple(int(d) for d in shape.split("x"))
  coords = tuple(tuple(int(c) for c in xyz)[:len(dims)] for xyz in coords)
  if len(coords) < per_slice or any(len(c) != len(dims) for c in coords):
    return None
  link = gen.ici_bandwidth_per_chip / 2 / (2 * len(dims)) / gen.devices_per_chip
  return Torus(dims=dims, wrap=slice_wrap(shape), link_bandwidth=link, coords=coords)


def _catalogued(device_kind: str) -> Tpu | Gpu | None:
  """The catalogued kind of an attached device, one slice or host, by its ``device_kind``."""
  for gen in TPU_GENERATIONS.values():
    if device_kind == gen.device_kind:
      return Tpu(generation=gen.name, size=1)
  for spec in GPU_SPECS.values():
    if device_kind == spec.description:
      return Gpu(part=spec.name, per_host=1)
  return None



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


def timeline(costs: HloCosts | None, target: Target | None,
             coords: Sequence[Sequence[int]] | None = None) -> Timeline | None:
  """The compiled schedule of ``costs`` walked on ``target`` (:func:`jaxmem.hlo.schedule.simulate`);
  ``None`` without a parsed module or the target's figures. ``coords``: where the program's
  devices sit (``MemoryReport.placement``)."""
  rates, _ = machine(target, coords)
  if costs is None or costs.module is None or rates is None:
    return None
  walk = simulate(costs, rates)
  if rates.slow is None or not walk.slow_link_comm_time_s:
    return walk
  # The slow link given the fast one's rates, its collectives keeping their hierarchical rings
  # and their own queue: never slower than the walk, so the difference is what the slow link costs.
  as_fast = dataclasses.replace(rates.slow, bandwidth=rates.fast.bandwidth, base_latency_s=rates.fast.base_latency_s,
                                step_latency_s=rates.fast.step_latency_s)
  fast = simulate(costs, dataclasses.replace(rates, slow=as_fast))
  return dataclasses.replace(walk, fast_link_step_time_s=fast.step_time_s)


def estimate(
    *, flops: float | None, bytes_accessed: int | None, comm_bytes: int | None, num_devices: int,
    target: Target | None, work: Work | None, walk: Timeline | None = None,
) -> tuple[StepTime, list[str]]:
  """The step-time terms of one compiled program, and notes for the terms that are ``None``;
  ``walk``: its schedule simulated (:func:`timeline`), which sets ``step_time_s``."""
  work = work or Work(note="mfu: the caller gave no model FLOPs or tokens")
  n = max(1, num_devices)
  model_flops = None if work.model_flops is None else work.model_flops / n
  notes = [] if work.note is None else [work.note]
  peaks, why = target_peaks(target)
  if peaks is None:
    notes.append(f"step time: {why}")
    return StepTime(bytes_accessed=bytes_accessed, model_flops=model_flops), notes
  if peaks.link_note:
    notes.append(f"comm_time_s: {peaks.link_note}")
  flops = _compute_flops(flops, None if work.floor_flops is None else work.floor_flops / n, notes)
  terms = {
      "compute": None if flops is None else flops / peaks.peak_flops,
      "memory": None if bytes_accessed is None else bytes_accessed / peaks.hbm_bandwidth,
      "comm": _comm_time(comm_bytes, n, peaks.link_bandwidth, peaks.part, notes),
  }
  known = {k: v for k, v in terms.items() if v is not None}
  roofline = max(known.values()) if known else None
  bound = max(known, key=known.__getitem__) if roofline else None
  if roofline is not None and "compute" not in known:
    notes.append("step_time_s: the program's FLOPs are unknown, so the compute term is left out")
  step, simulated = _simulated(roofline, walk, n, notes)
  if simulated:
    bound = max(TERMS, key=lambda t: simulated[f"{t}_bound_share"] or 0.0)
  return StepTime(
      bytes_accessed=bytes_accessed,
      model_flops=model_flops,
      compute_time_s=terms["compute"],
      memory_time_s=terms["memory"],
      comm_time_s=terms["comm"],
      step_time_s=step,
      roofline_step_time_s=roofline,
      **simulated,
      bound=bound,
      tokens_per_s_per_device=None if not step or work.tokens is None else work.tokens / n / step,
      mfu=None if not step or model_flops is None else model_flops / (step * peaks.peak_flops),
      arithmetic_intensity=None if flops is None or not bytes_accessed else flops / bytes_accessed,
      ridge_point=peaks.ridge_point,
  ), notes


def _simulated(roofline: float | None, walk: Timeline | None, n: int, notes: list[str]) -> tuple[float | None, dict]:
  """The step time and the walk's fields: the walk's step, never below the roofline bound."""
  if walk is None or not walk.step_time_s:  # no schedule to walk: the roofline bound stands in
    return roofline, {}
  notes += [n_ for n_ in walk.notes if n_ not in notes]
  step = walk.step_time_s
  if roofline is not None and roofline > step:
    notes.append(
        f"step_time_s: the simulated schedule ({step:.4g} s) is below the roofline bound ({roofline:.4g} s), whose "
        "compute term counts FLOPs the walk does not time (XLA's cost analysis or the model's weight matmuls); "
        "the bound stands in"
    )
    step = roofline
  exposed = 0.0 if n == 1 else walk.exposed_comm_time_s
  across = walk.across()
  if across:
    notes.append(
        f"slow_link_comm_time_s: the collectives that cross {'slices' if walk.slow_link == 'DCN' else 'hosts'}, "
        f"on {walk.slow_link}: " + ", ".join(f"{kind} {seconds(t)}" for kind, t in across.items())
        + f" (of {seconds(walk.comm_time_s)} of communication); fast_link_step_time_s: the same schedule with that "
        f"link as fast as the one inside, {seconds(walk.fast_link_step_time_s)}"
    )
  return step, {
      "slow_link_comm_time_s": walk.slow_link_comm_time_s,
      "fast_link_step_time_s": walk.fast_link_step_time_s,
      "exposed_comm_time_s": exposed,
      **{f"{t}_bound_share": getattr(walk, f"{t}_bound_time_s") / walk.step_time_s for t in TERMS},
  }


def _compute_flops(flops: float | None, floor: float | None, notes: list[str]) -> float | None:
  """The FLOPs the compute term times: the program's, but never fewer than the model's weight
  matmuls (``floor``, per device). A per-device figure below them is an undercount (the share the
  compiler's cost analysis gives misses loops the compiler adds itself, such as TPU's collective
  matmuls under a tensor axis, whose bodies it counts once), so the floor stands in. Compiled
  rows take their share from the optimized HLO's matrix FLOPs instead and pass no floor; it
  stays for a program whose HLO has no matrix ops to count (jaxmem.compiler.flops)."""
  if flops is None or floor is None or flops >= floor:
    return flops
  notes.append(
      f"compute_time_s: the program's FLOPs per device ({flops:.4g}) are below its weight matmuls' ({floor:.4g}), an "
      "undercount of loops the compiler adds (collective matmuls, counted once by its cost analysis); the compute "
      "term and arithmetic_intensity use the weight matmuls' FLOPs"
  )
  return floor


def _comm_time(comm_bytes: int | None, n: int, link: float | None, part: str, notes: list[str]) -> float | None:
  if comm_bytes is None:
    return None
  if comm_bytes == 0 or n == 1:
    return 0.0
  if link is None:
    notes.append(f"comm_time_s: no published per-chip interconnect bandwidth for {part}; step_time_s leaves "
                 "communication out")
    return None
  return comm_bytes / link

"""Compile-only Cloud TPU devices: the generations, their slice names and libtpu topologies.

What was established (jax/jaxlib 0.10.2, libtpu 0.0.42.1, 2-core x86-64, no accelerator,
``JAX_PLATFORMS=cpu`` set before jax was imported):

  * ``jax.experimental.topologies.get_topology_desc(platform="tpu", ...)`` works in a
    ``JAX_PLATFORMS=cpu`` process, repeatedly. Topologies are cached per key anyway so that the
    same devices (hence equal meshes and jit cache hits) come back on every call.
  * A ``jax.sharding.Mesh`` over the returned devices, ``jax.jit(f, in_shardings, out_shardings)
    .lower(ShapeDtypeStructs carrying NamedShardings).compile().memory_analysis()`` works; argument
    bytes are per device (divided by the shard count). A successful TPU ``compile()`` prints
    nothing, and neither does a TPU compile that runs out of memory (the error is the exception).
  * Timings (2 cores): first topology 0.12 s (libtpu start-up), later ones about 1 ms, the largest
    (v5p-17920, 8960 chips) 0.2 s. A 1024x4096 @ 4096x8192 bf16 matmul sharded over v5e-4 (2x2
    mesh) compiled in 0.45 s.
  * libtpu names: ``v4:AxBxC``, ``v5e:AxB``, ``v5p:AxBxC`` (``v5:`` works too), ``v6e:AxB`` and
    ``tpu7x:AxBxC``; ``v7x:`` and ``v7:`` are refused ("Invalid TPU external name").
  * Single-chip slices (``v5e:1x1``) need ``chips_per_host_bounds=(1,1,1)``: the default host is
    2x2x1 and libtpu rejects a topology smaller than one host.
  * v4 yields one device per TensorCore (8 for ``v4:2x2x1``, 15.25 GiB each) unless
    ``chip_config_name="megacore"`` is passed (4 devices, 30.75 GiB each), which is how v4 runs
    under JAX on Cloud. v5p is megacore by default. tpu7x has no megacore config ("megacore ...
    does not exist"): each of its two TensorCores is a device with its own half of the HBM.
  * ``num_slices=N`` is accepted (devices carry ``slice_index``); unknown keyword arguments make
    libtpu answer "Unexpected arguments: NAME", which is how an older libtpu without multi-slice
    would say so.
  * libtpu locks /tmp/libtpu_lockfile at start-up; a second process loading it meanwhile fails
    "ABORTED: ... libtpu multi-process lockfile" unless ALLOW_MULTIPLE_LIBTPU_LOAD=1, which is set
    while libtpu loads when JAX's platforms leave out tpu (such a process never opens a chip).
  * Every size in the tables below was accepted by libtpu 0.0.42.1 and gave the expected device
    count (tests/test_accelerators.py checks each one).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import jax
from jax.experimental import topologies

from jaxmem.hardware.availability import AVAILABLE, CompilerAvailability, first_line, quietly
from jaxmem.hardware.hostmem import GB, HostSpec
from jaxmem.hardware.startup import start_jax
from jaxmem.errors import JaxmemError

_GiB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class TpuGeneration:
  """One TPU generation: its Cloud slice names, the libtpu topology for each, its memory."""
  name: str                  # the user-facing name: "v5e"
  libtpu_name: str           # the prefix libtpu accepts in topology names: "v5e", "tpu7x"
  device_kind: str           # Device.device_kind as libtpu reports it
  hbm_bytes_per_chip: int    # public specification (see the table's comments for sources)
  cores_per_chip: int        # TensorCores per chip
  devices_per_chip: int      # JAX devices per chip: 1 under megacore or with one core, 2 on v7x
  slice_counts_cores: bool   # Cloud's "v5p-8" counts TensorCores (4 chips); "v5e-8" counts chips
  sizes: tuple[int, ...]     # valid numbers after the dash in Cloud slice names
  shapes: tuple[str, ...]    # chip grid for each size, in the same order: "2x4", "4x4x8"
  chip_config_name: str | None = None  # passed to libtpu when not None ("megacore" for v4)
  aliases: tuple[str, ...] = field(default=())  # other names users type: "v5litepod"
  # Peak figures per chip, as the generation's Cloud TPU page publishes them (cited in the table
  # below); what the step-time estimate divides by (jaxmem.hardware.peaks). None: not published.
  peak_bf16_flops_per_chip: float | None = None
  peak_8bit_ops_per_chip: float | None = None  # int8 TOPS (v5e, v6e) or fp8 TFLOPS (v5p, v7x)
  # What the 8-bit figure counts, as the page names it: "fp8" (a matrix unit that takes fp8 operands: v5p,
  # v7x) or "int8" (v4, v5e, v6e: no fp8 figure published, and no fp8 matmul for --quantization fp8_full).
  eight_bit: str = "int8"
  hbm_bandwidth_per_chip: float | None = None  # bytes per second
  ici_bandwidth_per_chip: float | None = None  # bytes per second, both directions together
  dcn_bandwidth_per_chip: float | None = None  # bytes per second
  # The side of the matrix unit's systolic array (MXU), what a matmul's contracted size and columns
  # are rounded up to (jaxmem.steptime.walk). https://cloud.google.com/tpu/docs/system-architecture-tpu-vm
  # ("An MXU is composed of either 256 x 256 (TPU v6e) or 128 x 128 (TPU versions prior to v6e)
  # multiply-accumulators"); the v6e page: "two 256x256 matrix-multiply units". None: not published.
  mxu_size: int | None = None
  # Elementwise operations per second the chip's vector units (VPU) run, one an ALU a cycle (the
  # schedule walk times vector work at it). None: not published.
  vector_ops_per_chip: float | None = None
  # The ICI links a chip drives to its neighbours, one a neighbour (a link carries both
  # directions): what a slice's collectives are timed over, ``ici_bandwidth_per_chip`` shared by
  # them (jaxmem.hardware.machine.torus). None: not published, and collectives are timed at the
  # chip's whole ICI figure.
  ici_links_per_chip: int | None = None
  # Bytes per second each way between the host and one chip (PCIe): what host offload crosses.
  # None: not published for the part; ``host_link_note`` says where the figure is published or why
  # there is none.
  host_link_bandwidth_per_chip: float | None = None
  host_link_note: str | None = None
  # The TPU VM that carries the slice's chips: chips per host and its RAM, with the page that
  # publishes them (jaxmem.hardware.hostmem: what offloaded bytes are held against).
  host: HostSpec | None = None

  def __post_init__(self):
    if len(self.sizes) != len(self.shapes):
      raise ValueError(f"{self.name}: sizes and shapes differ in length")
    for size, shape in zip(self.sizes, self.shapes):
      if _product(shape) != self.chips(size):
        raise ValueError(f"{self.name}-{size}: {shape} is not {self.chips(size)} chips")

  def chips(self, size: int) -> int:
    return size // self.cores_per_chip if self.slice_counts_cores else size

  @property
  def hbm_bytes_per_device(self) -> int:
    return self.hbm_bytes_per_chip // self.devices_per_chip


def _product(shape: str) -> int:
  n = 1
  for part in shape.split("x"):
    n *= int(part)
  return n


TPU_GENERATIONS: dict[str, TpuGeneration] = {g.name: g for g in (
    # https://cloud.google.com/tpu/docs/v4 : 32 GiB HBM2 per chip, two TensorCores run as one
    # megacore device; accelerator types v4-8 (2x2x1) ... v4-4096 (8x16x16) count TensorCores.
    TpuGeneration(
        name="v4", libtpu_name="v4", mxu_size=128, device_kind="TPU v4", hbm_bytes_per_chip=32 * _GiB,
        cores_per_chip=2, devices_per_chip=1, slice_counts_cores=True, chip_config_name="megacore",
        # The same page: "Peak compute per chip 275 teraflops (bf16 or int8)", "HBM2 capacity and
        # bandwidth 32 GiB, 1200 GBps"; it gives no per-chip ICI figure (only the pod's all-reduce
        # and bisection bandwidth), so none is assumed.
        peak_bf16_flops_per_chip=275e12, peak_8bit_ops_per_chip=275e12, hbm_bandwidth_per_chip=1200e9,
        # "TPU v4 and TPU v5p are connected to the nearest 6 neighbors (forming a 3D torus)"; "PCIe
        # bandwidth for TPU v4 is 16GB / second each way" (How to Scale Your Model, Part 2 "TPUs").
        ici_links_per_chip=6, host_link_bandwidth_per_chip=16e9,
        host_link_note="How to Scale Your Model, Part 2 \"TPUs\": \"PCIe bandwidth for TPU v4 is 16GB / second each way\"",
        # v4-8 (2x2x1, 4 chips) is one host, the same page; it publishes no RAM figure per host.
        host=HostSpec(machine="TPU v4 VM", accelerators=4, ram_bytes=None, source="https://cloud.google.com/tpu/docs/v4",
                      why="Cloud's TPU v4 page publishes no RAM per host (https://cloud.google.com/tpu/docs/v4)"),
        # v4-2 is one chip (1x1x1), which libtpu compiles for; Cloud sells no such slice.
        sizes=(2, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 1536, 2048, 4096),
        shapes=("1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x4x12", "4x8x8", "8x8x8",
                "8x8x12", "8x8x16", "8x16x16")),
    # https://cloud.google.com/tpu/docs/v5e : 16 GiB HBM2 per chip, one TensorCore; v5litepod-1
    # ... v5litepod-256 (16x16) count chips.
    TpuGeneration(
        name="v5e", libtpu_name="v5e", mxu_size=128, device_kind="TPU v5 lite", hbm_bytes_per_chip=16 * _GiB,
        cores_per_chip=1, devices_per_chip=1, slice_counts_cores=False, aliases=("v5litepod",),
        # The same page: peak 197 TFLOPs bf16 and 393 TOPs int8 per chip, "HBM2 capacity and
        # bandwidth 16 GB, 819 GBps", bidirectional ICI 400 GBps per chip; 2 x 100 Gbps NICs per
        # 8-chip host (25 Gbps of DCN a chip).
        peak_bf16_flops_per_chip=197e12, peak_8bit_ops_per_chip=393e12, hbm_bandwidth_per_chip=819e9,
        ici_bandwidth_per_chip=400e9, dcn_bandwidth_per_chip=25e9 / 8,
        # "inference chips (e.g., TPU v5e), and Trilium (TPU v6e), ICI ... connects the 4 nearest
        # neighbors" (How to Scale Your Model, Part 2 "TPUs"), which gives no PCIe figure per part
        # ("typically around 1.5e10 bytes / second per chip").
        ici_links_per_chip=4,
        host_link_note="not published for v5e: How to Scale Your Model gives only \"typically around 1.5e10 bytes / "
        "second per chip\"",
        # The same page's VM types: ct5lp-hightpu-1t 24 vCPUs and 48 GB RAM, ct5lp-hightpu-4t 112
        # vCPUs and 192 GB (48 GB a chip either way); its spec table's "DRAM per host 512 GiB,
        # chips per host 8" is the physical host, not what a TPU VM sees.
        host=HostSpec(machine="ct5lp-hightpu-4t", accelerators=4, ram_bytes=192 * GB,
                      source="https://cloud.google.com/tpu/docs/v5e (VM types)"),
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
        shapes=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    # https://cloud.google.com/tpu/docs/v5p : 95 GiB HBM2e per chip (the compiler reports 95.74 GiB
    # available), two TensorCores as one megacore device; v5p-8 (2x2x1) ... v5p-17920 (16x20x28)
    # count TensorCores.
    TpuGeneration(
        name="v5p", libtpu_name="v5p", mxu_size=128, device_kind="TPU v5", hbm_bytes_per_chip=95 * _GiB,
        cores_per_chip=2, devices_per_chip=1, slice_counts_cores=True,
        eight_bit="fp8",
        # The same page: peak 459 TFLOPs per chip in bf16 and in fp8, HBM bandwidth 2765 GBps,
        # bidirectional ICI 1200 GBps per chip, DCN 50 Gbps per chip.
        peak_bf16_flops_per_chip=459e12, peak_8bit_ops_per_chip=459e12, hbm_bandwidth_per_chip=2765e9,
        ici_bandwidth_per_chip=1200e9, dcn_bandwidth_per_chip=50e9 / 8,
        # Six neighbours, a 3-D torus (How to Scale Your Model, Part 2 "TPUs", as for v4); no PCIe
        # figure is published for v5p.
        ici_links_per_chip=6,
        host_link_note="not published for v5p: How to Scale Your Model gives only \"typically around 1.5e10 bytes / "
        "second per chip\"",
        # "The TPU v5p VPU can do roughly 7e12 FLOPs / second per core" (How to Scale Your Model,
        # Part 1 "Rooflines"; an (8, 128) vector unit with 4 ALUs a lane and sublane, Part 2's
        # appendix), two cores a chip.
        vector_ops_per_chip=2 * 7e12,
        # https://cloud.google.com/tpu/docs/v5p-training (VM, host and slice attributes): 4 chips,
        # 208 vCPUs and 448 GB RAM per VM; the TPU7x page's comparison table gives the same.
        host=HostSpec(machine="TPU v5p VM", accelerators=4, ram_bytes=448 * GB,
                      source="https://cloud.google.com/tpu/docs/v5p-training (VM, host and slice attributes)"),
        # v5p-2 is one chip (1x1x1, two TensorCores as one device), which libtpu compiles for.
        sizes=(2, 8, 16, 32, 64, 128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 2560,
               3072, 4096, 5120, 6144, 8192, 10240, 12288, 17920),
        shapes=("1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x4x12", "4x8x8", "4x4x20",
                "4x8x12", "4x4x28", "8x8x8", "4x8x20", "8x8x12", "8x8x16", "8x8x20", "8x12x16",
                "8x16x16", "8x16x20", "12x16x16", "16x16x16", "16x16x20", "16x16x24",
                "16x20x28")),
    # https://cloud.google.com/tpu/docs/v6e : 32 GiB HBM per chip, one TensorCore; v6e-1 ...
    # v6e-256 (16x16) count chips.
    TpuGeneration(
        name="v6e", libtpu_name="v6e", mxu_size=256, device_kind="TPU v6 lite", hbm_bytes_per_chip=32 * _GiB,
        cores_per_chip=1, devices_per_chip=1, slice_counts_cores=False,
        # The same page: peak 918 TFLOPs bf16 and 1836 TOPs int8 per chip, HBM bandwidth 1638
        # GBps, bidirectional ICI 800 GBps per chip.
        peak_bf16_flops_per_chip=918e12, peak_8bit_ops_per_chip=1836e12, hbm_bandwidth_per_chip=1638e9,
        ici_bandwidth_per_chip=800e9,
        # Four neighbours, a 2-D torus, and "Trillium (TPU v6e) has 32GB/s" of PCIe (How to Scale Your
        # Model, Part 2 "TPUs").
        ici_links_per_chip=4, host_link_bandwidth_per_chip=32e9,
        host_link_note="How to Scale Your Model, Part 2 \"TPUs\": \"Trillium (TPU v6e) has 32GB/s\" of PCIe",
        # https://cloud.google.com/tpu/docs/tpu7x (its table of v5p, v6e, TPU7x): the 4-chip VM
        # (ct6e-standard-4t) has 180 vCPUs and 720 GB RAM. The v6e page's "DRAM per host 1536 GiB,
        # chips per host 8" is the physical 8-chip host.
        host=HostSpec(machine="ct6e-standard-4t", accelerators=4, ram_bytes=720 * GB,
                      source="https://cloud.google.com/tpu/docs/tpu7x (RAM of the 4-chip VM)"),
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
        shapes=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    # https://cloud.google.com/tpu/docs/tpu7x : 192 GiB HBM per chip, two TensorCores that JAX sees
    # as two devices (libtpu has no megacore config for it); tpu7x-8 is 2x2x1, names count
    # TensorCores. libtpu calls it "tpu7x" and refuses "v7x".
    TpuGeneration(
        name="v7x", libtpu_name="tpu7x", device_kind="TPU7x", hbm_bytes_per_chip=192 * _GiB,
        cores_per_chip=2, devices_per_chip=2, slice_counts_cores=True, aliases=("tpu7x",),
        eight_bit="fp8",
        # The same page's table (v5p, v6e, TPU7x): "Peak compute per chip (BF16) (TFLOPs) 2307",
        # "(FP8) 4614", "HBM bandwidth per chip (GBps) 7380", "Bidirectional inter-chip interconnect
        # (ICI) bandwidth per chip (GBps) 1200", "Data center network (DCN) bandwidth per chip (Gbps)
        # 100". Int8 it has none: jax's table of the parts (jax/_src/tpu_info.py, jax 0.12.0.1,
        # TPU_7X: "int8_ops_per_second=0  # Not Available"), so the 8-bit figure is fp8's.
        # Per device: each of the chip's two devices (TensorCores) gets half of the chip's matrix
        # rates and HBM bandwidth, as jax's own table splits them ("bf16_ops_per_second=
        # int(2.31e15 // tensor_cores_per_chip)", "mem_bw_bytes_per_second=int(7.40e12 //
        # tensor_cores_per_chip)"); jaxmem.hardware.peaks.tpu_peaks divides by devices_per_chip.
        peak_bf16_flops_per_chip=2307e12, peak_8bit_ops_per_chip=4614e12, hbm_bandwidth_per_chip=7380e9,
        ici_bandwidth_per_chip=1200e9, dcn_bandwidth_per_chip=100e9 / 8,
        # The matrix unit: "mxu_column_size=256, num_mxus=2" per TensorCore in jax's table (TPU_7X),
        # as v6e's 256 x 256; Cloud's page gives no MXU size for TPU7x.
        mxu_size=256,
        # Six links a chip, a 3-D torus: Ironwood "chips form cubes via a 3D torus ICI" of 64 chips
        # joined by optical switches (Google Cloud blog "From silicon to softmax: Inside the Ironwood
        # AI stack", Nov 2025), and libtpu lays tpu7x slices out as 3-D chip grids whose full cubes
        # wrap on every axis (MaxText 0.2.5 utils/accelerator_to_spec_map.py: "tpu7x-128" is
        # "tpu7x:4x4x4" with wrap (True, True, True)). The rate of one link is not published: the
        # chip's 1200 GBps is shared by its six links (100 GB/s each way a link), and the chip's
        # two devices share them, half each (jaxmem.hardware.machine.torus); how the two devices
        # drive the chip's links, and the link between them (the die-to-die interface of the
        # dual-chiplet package), are not published.
        ici_links_per_chip=6,
        # No vector-unit rate is published: jax's table gives 8 sublanes x 128 lanes a core, no ALU
        # count or clock. No host link (PCIe) rate is published for TPU7x.
        host_link_note="not published for TPU7x (cloud.google.com/tpu/docs/tpu7x gives none)",
        # The same table: the 4-chip VM (tpu7x-standard-4t) has 224 vCPUs and 960 GB RAM, shared
        # by its 8 devices (two a chip).
        host=HostSpec(machine="tpu7x-standard-4t", accelerators=4, ram_bytes=960 * GB,
                      source="https://cloud.google.com/tpu/docs/tpu7x (RAM of the 4-chip VM)"),
        sizes=(2, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
        shapes=("1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8",
                "8x8x16", "8x16x16", "16x16x16")),
)}


def tpu_generation(generation: str) -> TpuGeneration:
  key = generation.strip().lower()
  for gen in TPU_GENERATIONS.values():
    if key == gen.name or key in gen.aliases:
      return gen
  raise JaxmemError(
      f"unknown TPU generation {generation!r}; valid: {', '.join(TPU_GENERATIONS)}")


def slice_shape(gen: TpuGeneration, size: int) -> str:
  if isinstance(size, bool) or not isinstance(size, int) or size not in gen.sizes:
    unit = "TensorCores" if gen.slice_counts_cores else "chips"
    raise JaxmemError(
        f"no {gen.name}-{size} slice; valid sizes ({unit}): "
        f"{', '.join(str(s) for s in gen.sizes)}")
  return gen.shapes[gen.sizes.index(size)]


def slice_size(gen: TpuGeneration, shape: str) -> int:
  """The accelerator-type size of the slice of chip grid ``shape``, as the recipes name slices
  ("tpu7x-4x4x4", xpk's ``--device-type``): ("v7x", "4x4x4") -> 128 (64 chips, TensorCores
  counted). A grid Cloud sells no slice of is refused, listing the grids there are."""
  if shape not in gen.shapes:
    grids = ", ".join(f"{g} ({gen.name}-{n})" for g, n in zip(gen.shapes, gen.sizes))
    raise JaxmemError(f"no {gen.name} slice of chip grid {shape}; valid grids: {grids}")
  return gen.sizes[gen.shapes.index(shape)]


def tpu_topology_name(generation: str, size: int) -> str:
  """Cloud slice name to libtpu topology: ("v5e", 8) -> "v5e:2x4", ("v5p", 8) -> "v5p:2x2x1"."""
  gen = tpu_generation(generation)
  return f"{gen.libtpu_name}:{slice_shape(gen, size)}"


def _tpu_topology_kwargs(gen: TpuGeneration, shape: str) -> dict:
  dims = [int(d) for d in shape.split("x")]
  kwargs: dict = {}
  if gen.chip_config_name:
    kwargs["chip_config_name"] = gen.chip_config_name
  if _product(shape) == 1:
    # The default host is 2x2x1 chips and libtpu refuses a topology smaller than one host.
    kwargs["chips_per_host_bounds"] = (1, 1, 1)
  # Wraparound links change collective algorithms, so the compile gets them as the real slice has them.
  wrap = slice_wrap(shape)
  kwargs["wrap"] = wrap if len(wrap) == 3 else (*wrap, False)
  return kwargs


def slice_wrap(shape: str) -> tuple[bool, ...]:
  """Which axes of a slice of chip grid ``shape`` ("4x4x8", "16x16") have wraparound links, as on
  Cloud: every axis of a 3-D slice that is whole cubes (every side a multiple of 4: the optical
  switches close the torus), the 16-chip sides of a 2-D pod; none on smaller slices ("Smaller
  topologies (e.g. 2x2x1, 2x2x2) can also be requested, albeit with no wraparounds", How to Scale
  Your Model, Part 2 "TPUs")."""
  dims = [int(d) for d in shape.split("x")]
  if len(dims) == 3:
    return (all(d % 4 == 0 for d in dims),) * 3
  return tuple(d == 16 for d in dims)



@contextlib.contextmanager
def _shared_libtpu() -> Iterator[None]:
  # libtpu takes /tmp/libtpu_lockfile when it loads, so a second process that loads it (a second
  # jaxmem run, a parallel test worker) fails "ABORTED: Internal error when accessing libtpu
  # multi-process lockfile". The lock guards the TPU chips; a process whose JAX platforms leave
  # out tpu never opens them, so it opts out of the lock (checked: both processes then compile).
  # Set only while libtpu loads (it reads the variable then), so the user's environment is left
  # as it was.
  platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
  if not platforms or "tpu" in platforms.lower() or "ALLOW_MULTIPLE_LIBTPU_LOAD" in os.environ:
    yield
    return
  os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  try:
    yield
  finally:
    del os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"]


@functools.cache
def _tpu_devices_cached(name: str, size: int, num_slices: int) -> tuple:
  gen = TPU_GENERATIONS[name]
  shape = slice_shape(gen, size)
  kwargs = _tpu_topology_kwargs(gen, shape)
  if num_slices != 1:
    kwargs["num_slices"] = num_slices
  start_jax()  # before any topology: how JAX starts decides what it initialises
  with _shared_libtpu():
    topo, e = quietly(lambda: topologies.get_topology_desc(
        platform="tpu", topology_name=f"{gen.libtpu_name}:{shape}", **kwargs))
  if e is None:
    return tuple(topo.devices)
  if not isinstance(e, RuntimeError):
    raise e
  msg = first_line(e)
  if "not installed" in msg:
    raise JaxmemError("the TPU compiler (libtpu) is not installed: pip install 'jaxmem[tpu]'") from e
  if "num_slices" in msg:
    raise JaxmemError(
        f"this libtpu cannot compile for several slices ({msg}); use num_slices=1 or upgrade jax[tpu]") from e
  raise JaxmemError(f"libtpu refused {gen.name}-{size} ({gen.libtpu_name}:{shape}): {msg}") from e


def tpu_devices(generation: str, size: int, *, num_slices: int = 1) -> list:
  """Compile-only devices for `num_slices` slices of Cloud TPU `generation`-`size`.

  One device per chip (megacore on v4/v5p), two per chip on v7x; ``device.slice_index`` tells the
  slices apart. Cached: the same key gives the same device objects.
  """
  gen = tpu_generation(generation)
  slice_shape(gen, size)
  if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
    raise JaxmemError(f"num_slices must be a positive integer, got {num_slices!r}")
  return list(_tpu_devices_cached(gen.name, size, num_slices))


@functools.cache
def tpu_compiler_available() -> CompilerAvailability:
  """Available when libtpu is installed and makes a topology; else not, with the reason."""
  try:
    _tpu_devices_cached("v5e", 4, 1)
  except JaxmemError as e:
    return CompilerAvailability(ok=False, why=str(e))
  except Exception as e:  # anything libtpu throws means the same to the caller: no TPU target
    return CompilerAvailability(ok=False, why=f"libtpu failed to start: {first_line(e)}")
  return AVAILABLE

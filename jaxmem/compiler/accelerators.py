"""Compile-only devices for TPU and GPU targets, so a laptop without either can run the real compiler.

What was established (jax/jaxlib 0.10.2, libtpu 0.0.42.1, jax-cuda12-plugin 0.10.2, 2-core x86-64,
no accelerator, ``JAX_PLATFORMS=cpu`` set before jax was imported):

Process model
  * ``jax.experimental.topologies.get_topology_desc`` works in a ``JAX_PLATFORMS=cpu`` process for
    both targets, one after the other and repeatedly. Topologies are cached per key anyway so that
    the same devices (hence equal meshes and jit cache hits) come back on every call.
  * A ``jax.sharding.Mesh`` over the returned devices, ``jax.jit(f, in_shardings, out_shardings)
    .lower(ShapeDtypeStructs carrying NamedShardings).compile().memory_analysis()`` works; argument
    bytes are per device (divided by the shard count).
  * Noise: ``import jax`` itself prints three ``cudart_stub.cc ... Could not find cuda drivers``
    lines when the CUDA plugin is installed (the caller's import, not ours). The first TPU topology
    makes libtpu print TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES warnings and an INVALID_ARGUMENT
    line to fd 2; every call here that can reach libtpu or the plugin runs under ``quiet()``.
    A successful TPU ``compile()`` prints nothing, and neither does a TPU compile that runs out of
    memory (the error is the exception). A GPU ``compile()`` prints nothing either, except that a
    program whose arguments and outputs exceed 80% of ``device_memory_size`` makes
    ``gpu_hlo_schedule.cc`` log ``The byte size of input/output arguments (N) exceeds the base
    limit (M)`` at ERROR level on fd 2 and the compile still succeeds: callers should compile under
    ``quiet()`` too (``parse_oom`` reads that line if they keep it).

Timings (2 cores): first TPU topology 0.12 s (libtpu start-up), later ones about 1 ms, the largest
(v5p-17920, 8960 chips) 0.2 s; first GPU topology 0.02 s, later ones under 1 ms. A 1024x4096 @
4096x8192 bf16 matmul sharded over v5e-4 (2x2 mesh) compiled in 0.45 s; 1024x4096 @ 4096x4096
bf16 over H100x2 in 0.18 s the first time and 0.07 s after. The usable-HBM probe below takes
0.04-0.7 s per TPU generation (2.3 s on v7x); gpu_compiler_available's probe 0.2-0.5 s per GPU.

TPU
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
    here when JAX_PLATFORMS leaves out tpu (such a process never opens a chip).
  * Every size in the tables below was accepted by libtpu 0.0.42.1 and gave the expected device
    count (tests/test_accelerators.py checks each one).

Usable HBM
  ``Device.memory_stats()`` raises on compile-only devices ("only supported for addressable PjRt
  devices") and the topology object exposes only platform, version and fingerprint. The TPU
  compiler does say what it considers available when a program does not fit, so
  :func:`usable_hbm_bytes` compiles a deliberately oversized program for one device and reads
  "exceeds available HBM (X)" from the error (units are GiB, two decimals, so +-5 MiB). Found:
  v4 30.75 of 32 GiB, v5e 15.75 of 16, v5p 95.74 (more than the 95 GiB Google publishes, so
  the chip must carry more), v6e 31.25 of 32, v7x 94.75 per device (two devices per 192 GiB chip). The GPU
  compiler never fails for size, so on GPU only the specification figure is available (JAX's
  allocator takes 75% of it by default, XLA_PYTHON_CLIENT_MEM_FRACTION; the GPU scheduler aims at
  80%).

GPU
  * ``get_topology_desc(platform="cuda", target_config=TEXT, topology="SxHxD")`` (slices x hosts x
    devices per host) gives compile-only devices; hosts show up as ``process_index``.
  * Without ``JAX_PLATFORMS=cpu``, on a machine with no CUDA runtime, the plugin fails its CUDA
    version check while jax discovers plugins and never registers, and every cuda topology in that
    process fails "topology not implemented for cuda" (libtpu is not affected), unless the plugin
    is registered again later with the check skipped, which :func:`_register_cuda_plugin_late`
    does (jax 0.10.2 and 0.12.0.1).
  * Compiling needs a CUDA toolkit on the machine even without a GPU: without ptxas/nvlink the
    compile fails "UNAVAILABLE: No PTX compilation provider is available", and without libdevice any
    transcendental fails "INTERNAL: libdevice not found". The machine this was checked on has
    ptxas 13.0 (/usr/local/cuda-13.0), and with it sm_80, sm_90 and sm_100 (B200) all compiled; an
    architecture ptxas does not know fails "ptxas too old". :func:`gpu_compiler_available` therefore
    compiles a tiny program for the requested GPU rather than trusting that the plugin imports.
  * ``feature_extension: ACCELERATED_FEATURES`` (sm_90a / sm_100a, as XLA's own specs for real
    H100/H200/B200 record) is accepted by jaxlib 0.10.2; a jaxlib whose proto lacks the field gets
    the config without it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies

from jaxmem._quiet import quiet
from jaxmem.compiler.xla import compile_timed
from jaxmem.errors import JaxmemError
from jaxmem.records import Record

_GiB = 1 << 30


# -- TPU -----------------------------------------------------------------------------------------

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
        name="v4", libtpu_name="v4", device_kind="TPU v4", hbm_bytes_per_chip=32 * _GiB,
        cores_per_chip=2, devices_per_chip=1, slice_counts_cores=True, chip_config_name="megacore",
        sizes=(8, 16, 32, 64, 128, 256, 384, 512, 1024, 1536, 2048, 4096),
        shapes=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x4x12", "4x8x8", "8x8x8",
                "8x8x12", "8x8x16", "8x16x16")),
    # https://cloud.google.com/tpu/docs/v5e : 16 GiB HBM2 per chip, one TensorCore; v5litepod-1
    # ... v5litepod-256 (16x16) count chips.
    TpuGeneration(
        name="v5e", libtpu_name="v5e", device_kind="TPU v5 lite", hbm_bytes_per_chip=16 * _GiB,
        cores_per_chip=1, devices_per_chip=1, slice_counts_cores=False, aliases=("v5litepod",),
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
        shapes=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    # https://cloud.google.com/tpu/docs/v5p : 95 GiB HBM2e per chip (the compiler reports 95.74 GiB
    # available), two TensorCores as one megacore device; v5p-8 (2x2x1) ... v5p-17920 (16x20x28)
    # count TensorCores.
    TpuGeneration(
        name="v5p", libtpu_name="v5p", device_kind="TPU v5", hbm_bytes_per_chip=95 * _GiB,
        cores_per_chip=2, devices_per_chip=1, slice_counts_cores=True,
        sizes=(8, 16, 32, 64, 128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 2560,
               3072, 4096, 5120, 6144, 8192, 10240, 12288, 17920),
        shapes=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x4x12", "4x8x8", "4x4x20",
                "4x8x12", "4x4x28", "8x8x8", "4x8x20", "8x8x12", "8x8x16", "8x8x20", "8x12x16",
                "8x16x16", "8x16x20", "12x16x16", "16x16x16", "16x16x20", "16x16x24",
                "16x20x28")),
    # https://cloud.google.com/tpu/docs/v6e : 32 GiB HBM per chip, one TensorCore; v6e-1 ...
    # v6e-256 (16x16) count chips.
    TpuGeneration(
        name="v6e", libtpu_name="v6e", device_kind="TPU v6 lite", hbm_bytes_per_chip=32 * _GiB,
        cores_per_chip=1, devices_per_chip=1, slice_counts_cores=False,
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
        shapes=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    # https://cloud.google.com/tpu/docs/tpu7x : 192 GiB HBM per chip, two TensorCores that JAX sees
    # as two devices (libtpu has no megacore config for it); tpu7x-8 is 2x2x1, names count
    # TensorCores. libtpu calls it "tpu7x" and refuses "v7x".
    TpuGeneration(
        name="v7x", libtpu_name="tpu7x", device_kind="TPU7x", hbm_bytes_per_chip=192 * _GiB,
        cores_per_chip=2, devices_per_chip=2, slice_counts_cores=True, aliases=("tpu7x",),
        sizes=(2, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
        shapes=("1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8",
                "8x8x16", "8x16x16", "16x16x16")),
)}


def _generation(generation: str) -> TpuGeneration:
  key = generation.strip().lower()
  for gen in TPU_GENERATIONS.values():
    if key == gen.name or key in gen.aliases:
      return gen
  raise JaxmemError(
      f"unknown TPU generation {generation!r}; valid: {', '.join(TPU_GENERATIONS)}")


def _shape(gen: TpuGeneration, size: int) -> str:
  if isinstance(size, bool) or not isinstance(size, int) or size not in gen.sizes:
    unit = "TensorCores" if gen.slice_counts_cores else "chips"
    raise JaxmemError(
        f"no {gen.name}-{size} slice; valid sizes ({unit}): "
        f"{', '.join(str(s) for s in gen.sizes)}")
  return gen.shapes[gen.sizes.index(size)]


def tpu_topology_name(generation: str, size: int) -> str:
  """Cloud slice name to libtpu topology: ("v5e", 8) -> "v5e:2x4", ("v5p", 8) -> "v5p:2x2x1"."""
  gen = _generation(generation)
  return f"{gen.libtpu_name}:{_shape(gen, size)}"


def _tpu_topology_kwargs(gen: TpuGeneration, shape: str) -> dict:
  dims = [int(d) for d in shape.split("x")]
  kwargs: dict = {}
  if gen.chip_config_name:
    kwargs["chip_config_name"] = gen.chip_config_name
  if _product(shape) == 1:
    # The default host is 2x2x1 chips and libtpu refuses a topology smaller than one host.
    kwargs["chips_per_host_bounds"] = (1, 1, 1)
  # Wraparound links (a torus) exist on full cubes of 3-D slices (every side a multiple of 4) and
  # along the 16-chip sides of 2-D pods, as on Cloud; they change collective algorithms, so set them
  # as the real slice has them.
  if len(dims) == 3:
    wrap = all(d % 4 == 0 for d in dims)
    kwargs["wrap"] = (wrap, wrap, wrap)
  else:
    kwargs["wrap"] = (dims[0] == 16, dims[1] == 16, False)
  return kwargs


def _allow_shared_libtpu() -> None:
  # libtpu takes /tmp/libtpu_lockfile when it starts, so a second process that loads it (a second
  # jaxmem run, a parallel test worker) fails "ABORTED: Internal error when accessing libtpu
  # multi-process lockfile". The lock guards the TPU chips; a process whose JAX_PLATFORMS leaves
  # out tpu never opens them, so it opts out of the lock (checked: both processes then compile).
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if platforms and "tpu" not in platforms.lower():
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@functools.cache
def _tpu_devices_cached(name: str, size: int, num_slices: int) -> tuple:
  gen = TPU_GENERATIONS[name]
  shape = _shape(gen, size)
  kwargs = _tpu_topology_kwargs(gen, shape)
  if num_slices != 1:
    kwargs["num_slices"] = num_slices
  _allow_shared_libtpu()
  topo, e = _quietly(lambda: topologies.get_topology_desc(
      platform="tpu", topology_name=f"{gen.libtpu_name}:{shape}", **kwargs))
  if e is not None:
    if not isinstance(e, RuntimeError):
      raise e
    msg = _first_line(e)
    if "not installed" in msg:
      raise JaxmemError(
          "the TPU compiler (libtpu) is not installed: pip install 'jaxmem[tpu]'") from e
    if "num_slices" in msg:
      raise JaxmemError(
          f"this libtpu cannot compile for several slices ({msg}); use num_slices=1 or upgrade "
          "jax[tpu]") from e
    raise JaxmemError(f"libtpu refused {gen.name}-{size} ({gen.libtpu_name}:{shape}): {msg}") from e
  return tuple(topo.devices)


def tpu_devices(generation: str, size: int, *, num_slices: int = 1) -> list:
  """Compile-only devices for `num_slices` slices of Cloud TPU `generation`-`size`.

  One device per chip (megacore on v4/v5p), two per chip on v7x; ``device.slice_index`` tells the
  slices apart. Cached: the same key gives the same device objects.
  """
  gen = _generation(generation)
  _shape(gen, size)
  if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
    raise JaxmemError(f"num_slices must be a positive integer, got {num_slices!r}")
  return list(_tpu_devices_cached(gen.name, size, num_slices))


class CompilerAvailability(NamedTuple):
  """Whether a target's compiler works here, and why not. True only when it does, so
  ``if not tpu_compiler_available():`` reads right (a plain ``(ok, why)`` tuple is always true);
  a tuple still, so ``ok, why = ...`` and ``[0]`` keep working."""

  ok: bool
  why: str = ""

  def __bool__(self) -> bool:
    return self.ok


_AVAILABLE = CompilerAvailability(ok=True)


@functools.cache
def tpu_compiler_available() -> CompilerAvailability:
  """Available when libtpu is installed and makes a topology; else not, with the reason."""
  try:
    _tpu_devices_cached("v5e", 4, 1)
  except JaxmemError as e:
    return CompilerAvailability(ok=False, why=str(e))
  except Exception as e:  # anything libtpu throws means the same to the caller: no TPU target
    return CompilerAvailability(ok=False, why=f"libtpu failed to start: {_first_line(e)}")
  return _AVAILABLE


# -- GPU -----------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class GpuSpec:
  """The figures a GpuTargetConfigProto needs, for one GPU model (SXM parts)."""
  name: str                          # user-facing: "h100"
  description: str                   # device_description_str, as the CUDA driver names the part
  hbm_bytes: int                     # device_memory_size: total memory the CUDA driver reports
  compute_capability: tuple[int, int]
  core_count: int                    # streaming multiprocessors
  fpus_per_core: int                 # FP32 lanes per SM
  shared_memory_per_core: int        # bytes of shared memory per SM
  shared_memory_per_block_optin: int # bytes a block may opt in to
  l2_cache_bytes: int
  clock_rate_ghz: float              # boost clock
  memory_bandwidth: int              # bytes per second
  accelerated_features: bool = False # sm_90a / sm_100a: arch-specific instructions (wgmma, tcgen05)


# Figures: NVIDIA datasheets for memory size, bandwidth, SM count and L2; the exact byte counts
# (what cudaGetDeviceProperties reports, a little below the marketed GB) and shared-memory limits
# are those XLA records from real devices in xla/backends/gpu/target_config/specs/*.txtpb
# (github.com/openxla/xla).
GPU_SPECS: dict[str, GpuSpec] = {s.name: s for s in (
    # A100 SXM4 40GB: nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
    # nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (40 GB HBM2, 1,555 GB/s); 108 SMs, 40 MB
    # L2, 164 KB shared memory per SM, 1410 MHz boost: NVIDIA A100 Tensor Core GPU Architecture
    # whitepaper. Bytes: XLA specs/a100_sxm_40.txtpb.
    GpuSpec(
        name="a100-40gb", description="NVIDIA A100-SXM4-40GB", hbm_bytes=42_331_013_120,
        compute_capability=(8, 0), core_count=108, fpus_per_core=64,
        shared_memory_per_core=167_936, shared_memory_per_block_optin=166_912,
        l2_cache_bytes=41_943_040, clock_rate_ghz=1.41, memory_bandwidth=1_555_200_000_000),
    # A100 SXM4 80GB: same datasheet (80 GB HBM2e, 2,039 GB/s). Bytes: XLA specs/a100_sxm_80.txtpb.
    GpuSpec(
        name="a100-80gb", description="NVIDIA A100-SXM4-80GB", hbm_bytes=85_100_068_864,
        compute_capability=(8, 0), core_count=108, fpus_per_core=64,
        shared_memory_per_core=167_936, shared_memory_per_block_optin=166_912,
        l2_cache_bytes=41_943_040, clock_rate_ghz=1.41, memory_bandwidth=2_039_040_000_000),
    # H100 SXM5 80GB: nvidia.com/en-us/data-center/h100/ (80 GB HBM3, 3.35 TB/s); 132 SMs, 50 MB
    # L2, 228 KB shared memory per SM (227 KB per block), 1.98 GHz boost: NVIDIA H100 Tensor Core
    # GPU Architecture whitepaper. Bytes: XLA specs/h100_sxm.txtpb.
    GpuSpec(
        name="h100", description="NVIDIA H100 80GB HBM3", hbm_bytes=84_942_979_072,
        compute_capability=(9, 0), core_count=132, fpus_per_core=128,
        shared_memory_per_core=233_472, shared_memory_per_block_optin=232_448,
        l2_cache_bytes=52_428_800, clock_rate_ghz=1.98, memory_bandwidth=3_352_320_000_000,
        accelerated_features=True),
    # H200 SXM 141GB: nvidia.com/en-us/data-center/h200/ (141 GB HBM3e, 4.8 TB/s); the same GH100
    # die as H100 (132 SMs, 50 MB L2). Bytes: XLA specs/h200.txtpb.
    GpuSpec(
        name="h200", description="NVIDIA H200 141GB HBM3e", hbm_bytes=151_397_597_184,
        compute_capability=(9, 0), core_count=132, fpus_per_core=128,
        shared_memory_per_core=233_472, shared_memory_per_block_optin=232_448,
        l2_cache_bytes=52_428_800, clock_rate_ghz=1.98, memory_bandwidth=4_800_000_000_000,
        accelerated_features=True),
    # B200: nvidia.com/en-us/data-center/dgx-b200/ (1,440 GB HBM3e over 8 GPUs = 180 GB each;
    # HGX B200 lists 8 TB/s per GPU). 148 SMs, 126.5 MiB L2, 7.67 TB/s and the byte count are
    # XLA's specs/b200.txtpb, recorded from a real B200.
    GpuSpec(
        name="b200", description="NVIDIA B200", hbm_bytes=191_514_411_008,
        compute_capability=(10, 0), core_count=148, fpus_per_core=128,
        shared_memory_per_core=233_472, shared_memory_per_block_optin=232_448,
        l2_cache_bytes=132_644_864, clock_rate_ghz=1.965, memory_bandwidth=7_672_320_000_000,
        accelerated_features=True),
)}


def _gpu_spec(name: str) -> GpuSpec:
  spec = GPU_SPECS.get(name.strip().lower())
  if spec is None:
    raise JaxmemError(f"unknown GPU {name!r}; valid: {', '.join(GPU_SPECS)}")
  return spec


def gpu_target_config(spec: GpuSpec, *, feature_extension: bool = True) -> str:
  """GpuTargetConfigProto text (protobuf text format) describing `spec` to XLA's GPU compiler."""
  major, minor = spec.compute_capability
  ext = ""
  if feature_extension and spec.accelerated_features:
    ext = " feature_extension: ACCELERATED_FEATURES"
  # Launch limits and register counts are the same on every NVIDIA part since Volta.
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {spec.shared_memory_per_core}
  threads_per_core_limit: 2048
  core_count: {spec.core_count}
  fpus_per_core: {spec.fpus_per_core}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {spec.memory_bandwidth}
  l2_cache_size: {spec.l2_cache_bytes}
  clock_rate_ghz: {spec.clock_rate_ghz}
  device_memory_size: {spec.hbm_bytes}
  shared_memory_per_block_optin: {spec.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {major} minor: {minor}{ext} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 patch: 0 }}
device_description_str: "{spec.description}"
"""


@functools.cache
def _gpu_devices_cached(name: str, devices_per_host: int, hosts: int) -> tuple:
  spec = GPU_SPECS[name]
  topology = f"1x{hosts}x{devices_per_host}"
  last: BaseException | None = None
  # An older jaxlib whose proto lacks feature_extension cannot parse it: retry without.
  for ext in (True, False) if spec.accelerated_features else (False,):
    config = gpu_target_config(spec, feature_extension=ext)
    topo, e = _quietly(lambda: topologies.get_topology_desc(
        platform="cuda", target_config=config, topology=topology))
    if isinstance(e, NotImplementedError) and _register_cuda_plugin_late():
      topo, e = _quietly(lambda: topologies.get_topology_desc(
          platform="cuda", target_config=config, topology=topology))
    if e is None:
      return tuple(topo.devices)
    if isinstance(e, NotImplementedError):  # "topology not implemented for cuda"
      raise JaxmemError(_no_cuda_topology()) from e
    if not isinstance(e, RuntimeError):
      raise e
    last = e
    if "parse" not in str(e):
      break
  raise JaxmemError(f"the CUDA plugin refused {name} x{devices_per_host} on {hosts} host(s): "
                    f"{_first_line(last)}") from last


_CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def _cuda_plugin_modules() -> list[str]:
  out = []
  for name in _CUDA_PLUGINS:
    try:
      if importlib.util.find_spec(name) is not None:
        out.append(name)
    except ImportError:
      pass
  return out


def _register_cuda_plugin_late() -> bool:
  """Registers an installed CUDA plugin that JAX's start-up left out; True if one registered.

  Checked on jax 0.10.2 and 0.12.0.1: with JAX_PLATFORMS unset (or naming cuda) on a machine
  without the CUDA runtime, the plugin's ``initialize()`` fails its CUDA version check ("Unable to
  load CUDA. Is it installed?") when JAX's first backend starts, and never registers, so JAX has
  no cuda topology for the rest of the process. Calling ``initialize()`` again with that check
  skipped (JAX_SKIP_CUDA_CONSTRAINTS_CHECK, the plugin's own switch) registers its topology
  factory and its custom calls; JAX's backends, already started, are left as they are, so the
  user's arrays stay where they are and only compile-only GPU devices are added.
  """
  registered = False
  saved = os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
  os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
  try:
    for name in _cuda_plugin_modules():
      try:
        with quiet():
          importlib.import_module(name).initialize()
        registered = True
      except (ImportError, OSError, RuntimeError):  # a broken install: the caller says what to do
        continue
  finally:
    if saved is None:
      del os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"]
    else:
      os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = saved
  return registered


def _no_cuda_topology() -> str:
  if not _cuda_plugin_modules():
    return "the GPU compiler (CUDA plugin) is not installed: pip install 'jaxmem[cuda]'"
  # Only after _register_cuda_plugin_late() failed too (see there).
  return ("the CUDA plugin is installed but did not load (no CUDA runtime here), and registering it "
          "after JAX started failed: import jaxmem before anything else uses JAX, or set "
          "JAX_PLATFORMS=cpu before jax is imported")


def gpu_devices(name: str, devices_per_host: int, *, hosts: int = 1) -> list:
  """Compile-only devices for `hosts` hosts of `devices_per_host` GPUs `name` each.

  ``device.process_index`` is the host. Cached: the same key gives the same device objects.
  """
  spec = _gpu_spec(name)
  for label, n in (("devices_per_host", devices_per_host), ("hosts", hosts)):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise JaxmemError(f"{label} must be a positive integer, got {n!r}")
  return list(_gpu_devices_cached(spec.name, devices_per_host, hosts))


@functools.cache
def _gpu_compiles(name: str) -> CompilerAvailability:
  try:
    devices = _gpu_devices_cached(name, 1, 1)
  except JaxmemError as e:
    return CompilerAvailability(ok=False, why=str(e))
  except Exception as e:
    return CompilerAvailability(ok=False, why=f"the CUDA plugin failed to start: {_first_line(e)}")
  _, error = _quietly(lambda: _compile_one(devices, (64, 64), _toolkit_probe))
  if error is not None:
    msg = _first_line(error)
    major, minor = GPU_SPECS[name].compute_capability
    if "too old" in msg or "does not support" in msg:
      why = f"the installed ptxas cannot compile for sm_{major}{minor} ({name})"
    elif "PTX compilation provider" in msg or "libdevice" in msg:
      why = ("no CUDA toolkit found (ptxas, nvlink, libdevice): install it or set "
             "XLA_FLAGS=--xla_gpu_cuda_data_dir=/path/to/cuda")
    else:
      why = f"compiling for {name} failed"
    return CompilerAvailability(ok=False, why=f"{why}: {msg}")
  return _AVAILABLE


def gpu_compiler_available(name: str | None = None) -> CompilerAvailability:
  """Available when a program compiles for GPU `name` (default h100); else not, with the reason.

  Compiles a tiny program, because an importable plugin is not enough: ptxas and libdevice must
  be found, and ptxas must know the GPU's architecture (sm_100 needs CUDA 12.8 or later).
  """
  return _gpu_compiles(_gpu_spec(name or "h100").name)


# -- Memory ----------------------------------------------------------------------------------------

@functools.cache
def _tpu_available_hbm(name: str) -> int | None:
  gen = TPU_GENERATIONS[name]
  devices = _tpu_devices_cached(name, gen.sizes[0], 1)[:1]
  # A 256 GiB float32 outer product that a cumsum must hold whole: larger than any TPU's HBM; the
  # compiler rejects it after buffer assignment, in 0.04-2 s.
  _, error = _quietly(lambda: _compile_one(devices, (1 << 18,), _oversized))
  oom = parse_oom(str(error)) if error is not None else None
  return oom.available_bytes if oom else None


def _toolkit_probe(a):
  # sin needs libdevice and the matmul needs ptxas: the parts of the CUDA toolkit that a compile
  # without a GPU still uses.
  return jnp.sin(a) @ a


def _oversized(v):
  return jnp.cumsum(jnp.outer(v, v), axis=0)[-1]


def _compile_one(devices, shape, fn):
  """Compiles fn for a float32 argument of `shape` replicated over `devices`."""
  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return compile_timed(jax.jit(fn).lower(jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)), quietly=False)[0]


def usable_hbm_bytes(name: str) -> int:
  """HBM per device that the compiler lets a program use, for a TPU generation or a GPU name.

  TPU: read from the compiler's out-of-memory message (v5e: 15.75 GiB of 16), to +-5 MiB; the
  specification figure per device if that fails. GPU: the specification figure
  (``device_memory_size``), because the GPU compiler enforces no limit.
  """
  key = name.strip().lower()
  if key in GPU_SPECS:
    return GPU_SPECS[key].hbm_bytes
  gen = _generation(name)
  try:
    available = _tpu_available_hbm(gen.name)
  except JaxmemError:
    available = None
  return available or gen.hbm_bytes_per_device


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = r"([\d.]+)\s*([KMGTP]?)(?:i?B)?"

# Each pattern gives (required, available); libtpu prints binary units ("128.00G" for 2**37 bytes).
_OOM_PATTERNS = (
    # TPU compile (libtpu 0.0.42): "Ran out of memory on HBM, the total memory required for HLO
    # temporaries (66.79G) exceeds available HBM (15.75G)."
    (re.compile(rf"required for [^()]*\({_SIZE}\) exceeds available \w+ \({_SIZE}\)"), (0, 1)),
    # Older TPU compile: "Ran out of memory in memory space hbm. Used 17.12G of 15.48G hbm."
    (re.compile(rf"Ran out of memory in memory space \w+\.\s*Used {_SIZE} of {_SIZE}"), (0, 1)),
    # TPU run time: "Attempting to allocate 8.00G. That was not possible. There are 5.14G free."
    (re.compile(rf"Attempting to allocate {_SIZE}\..*?There are {_SIZE} free", re.S), (0, 1)),
    # GPU compile (a log line, the compile succeeds): "The byte size of input/output arguments
    # (274878955520) exceeds the base limit (67954383257)."
    (re.compile(r"byte size of input/output arguments \((\d+)()\) exceeds the base limit "
                r"\((\d+)()\)"), (0, 1)),
    # GPU run time (BFC allocator): "Out of memory while trying to allocate 123456 bytes."
    (re.compile(rf"[Oo]ut of memory (?:while trying to allocate|allocating) {_SIZE}"), (0, None)),
)


def _bytes(number: str, unit: str) -> int:
  return int(round(float(number) * _UNITS[unit.upper()]))


@dataclass(frozen=True, kw_only=True)
class OutOfMemory(Record):
  """What an out-of-memory message says: the bytes required and available (either may be
  ``None`` where the message does not give it)."""

  required_bytes: int | None
  available_bytes: int | None


def parse_oom(message: str) -> OutOfMemory | None:
  """The required and available bytes from an out-of-memory error text.

  Knows the TPU compile-time and run-time messages and the GPU scheduler's log line and run-time
  allocator message; None when `message` is not an out-of-memory report.
  """
  for pattern, (req, avail) in _OOM_PATTERNS:
    m = pattern.search(message)
    if m:
      groups = m.groups()
      required = _bytes(groups[2 * req], groups[2 * req + 1])
      available = None if avail is None else _bytes(groups[2 * avail], groups[2 * avail + 1])
      return OutOfMemory(required_bytes=required, available_bytes=available)
  if "RESOURCE_EXHAUSTED" in message and "memory" in message.lower():
    return OutOfMemory(required_bytes=None, available_bytes=None)
  return None


def _quietly(fn):
  """(fn(), None) or (None, the exception), with fd 2 silenced throughout.

  The exception is caught inside quiet() so that libtpu's and the plugin's start-up noise is not
  replayed: callers turn these failures into one-line JaxmemErrors or unavailable answers.
  """
  with quiet():
    try:
      return fn(), None
    except Exception as e:
      return None, e


def _first_line(e: BaseException | None) -> str:
  text = str(e).strip() if e is not None else ""
  return text.splitlines()[0] if text else type(e).__name__

"""Compile-only NVIDIA GPU devices: the parts' specifications and the target description given
to XLA's CUDA compiler.

What was established (jax/jaxlib 0.10.2 and 0.12.0.1, jax-cuda12-plugin, 2-core x86-64, no GPU):

  * ``get_topology_desc(platform="cuda", target_config=TEXT, topology="SxHxD")`` (slices x hosts x
    devices per host) gives compile-only devices; hosts show up as ``process_index``. It needs the
    CUDA plugin registered, which :mod:`jaxmem.hardware.cuda_plugin` sees to.
  * Compiling needs a CUDA toolkit on the machine even without a GPU: without ptxas/nvlink the
    compile fails "UNAVAILABLE: No PTX compilation provider is available", and without libdevice any
    transcendental fails "INTERNAL: libdevice not found". The machine this was checked on has
    ptxas 13.0 (/usr/local/cuda-13.0), and with it sm_80, sm_90 and sm_100 (B200) all compiled; an
    architecture ptxas does not know fails "ptxas too old". :func:`gpu_compiler_available` therefore
    compiles a tiny program for the requested GPU rather than trusting that the plugin imports.
  * ``feature_extension: ACCELERATED_FEATURES`` (sm_90a / sm_100a, as XLA's own specs for real
    H100/H200/B200 record) is accepted by jaxlib 0.10.2; a jaxlib whose proto lacks the field gets
    the config without it.
  * A GPU ``compile()`` prints nothing, except that a program whose arguments and outputs exceed
    80% of ``device_memory_size`` makes ``gpu_hlo_schedule.cc`` log ``The byte size of
    input/output arguments (N) exceeds the base limit (M)`` at ERROR level on fd 2 and the compile
    still succeeds: callers compile under ``quiet()`` (:func:`jaxmem.hardware.oom.parse_oom` reads
    that line if they keep it).
  * Timings (2 cores): first topology 0.02 s, later ones under 1 ms; 1024x4096 @ 4096x4096 bf16
    over H100x2 compiled in 0.18 s the first time and 0.07 s after; the availability probe takes
    0.2-0.5 s per GPU.
  * The GPU compiler never fails for size, so only the specification's memory figure is known
    (JAX's allocator takes 75% of it by default, XLA_PYTHON_CLIENT_MEM_FRACTION; the GPU scheduler
    aims at 80%).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax.numpy as jnp
from jax.experimental import topologies

from jaxmem.hardware import cuda_plugin
from jaxmem.hardware.availability import AVAILABLE, CompilerAvailability, compile_probe, first_line, quietly
from jaxmem.hardware.hostmem import GB, HostSpec
from jaxmem.hardware.startup import start_jax
from jaxmem.errors import JaxmemError


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
  # NVLink bytes per second per GPU, both directions together, as NVIDIA quotes it (A100:
  # "600GB/s"). Not given to the compiler (XLA's target config has no interconnect field); it is
  # what sets a mesh's collective time on the part, and what tells an A800 from an A100. A part
  # without NVLink (``interconnect`` "PCIe": the L4, L40S, A10G) gives its PCIe link's figure here,
  # as its datasheet quotes it ("PCIe Gen4 x16: 64GB/s bidirectional").
  nvlink_bandwidth: int
  interconnect: str = "NVLink"  # what the GPUs of one host talk over: "NVLink" or "PCIe"
  accelerated_features: bool = False # sm_90a / sm_100a: arch-specific instructions (wgmma, tcgen05)
  # Dense (no structured sparsity) tensor-core peaks, FLOP/s, from the datasheets cited per part:
  # what the step-time estimate divides by (jaxmem.hardware.peaks). peak_8bit_ops: fp8 where the
  # part has it (Hopper, Blackwell), else int8 (Ampere). None: not published.
  peak_bf16_flops: float | None = None
  peak_8bit_ops: float | None = None
  # The network one GPU reaches other hosts by: its own NIC's line rate, bytes per second each way
  # (what a collective across hosts crosses: jaxmem.hardware.machine). None: not published.
  network_bandwidth: float | None = None
  # The machine that carries 8 of the part: its GPUs and RAM, with the page that publishes them
  # (jaxmem.hardware.hostmem: what offloaded bytes are held against).
  host: HostSpec | None = None


# Google Cloud's accelerator-optimized machine types, the VMs that carry 8 of each part, with
# their memory: https://cloud.google.com/compute/docs/accelerator-optimized-machines
_GCE_GPU_VMS = "https://cloud.google.com/compute/docs/accelerator-optimized-machines"

# Figures: NVIDIA datasheets for memory size, bandwidth, SM count and L2; the exact byte counts
# (what cudaGetDeviceProperties reports, a little below the marketed GB) and shared-memory limits
# are those XLA records from real devices in xla/backends/gpu/target_config/specs/*.txtpb
# (github.com/openxla/xla).
GPU_SPECS: dict[str, GpuSpec] = {s.name: s for s in (
    # A100 SXM4 40GB: nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
    # nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (40 GB HBM2, 1,555 GB/s); 108 SMs, 40 MB
    # L2, 164 KB shared memory per SM, 1410 MHz boost: NVIDIA A100 Tensor Core GPU Architecture
    # whitepaper. Bytes: XLA specs/a100_sxm_40.txtpb. NVLink 600 GB/s (12 third-generation
    # links of 50 GB/s): the same datasheet.
    GpuSpec(
        name="a100-40gb", description="NVIDIA A100-SXM4-40GB", hbm_bytes=42_331_013_120,
        compute_capability=(8, 0), core_count=108, fpus_per_core=64,
        shared_memory_per_core=167_936, shared_memory_per_block_optin=166_912,
        l2_cache_bytes=41_943_040, clock_rate_ghz=1.41, memory_bandwidth=1_555_200_000_000,
        nvlink_bandwidth=600_000_000_000,
        # The A100 datasheet: BF16 Tensor Core 312 TFLOPS, INT8 624 TOPS (dense; twice with sparsity).
        peak_bf16_flops=312e12, peak_8bit_ops=624e12,
        # DGX A100 datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/nvidia-dgx-a100-datasheet.pdf):
        # "8x Single-Port Mellanox ConnectX-6 VPI 200Gb/s HDR InfiniBand", one a GPU.
        network_bandwidth=200e9 / 8,
        # A2 Standard a2-highgpu-8g: 8 A100 40GB, 96 vCPUs, 680 GB.
        host=HostSpec(machine="a2-highgpu-8g", accelerators=8, ram_bytes=680 * GB, source=_GCE_GPU_VMS)),
    # A100 SXM4 80GB: same datasheet (80 GB HBM2e, 2,039 GB/s, NVLink 600 GB/s). Bytes: XLA
    # specs/a100_sxm_80.txtpb.
    GpuSpec(
        name="a100-80gb", description="NVIDIA A100-SXM4-80GB", hbm_bytes=85_100_068_864,
        compute_capability=(8, 0), core_count=108, fpus_per_core=64,
        shared_memory_per_core=167_936, shared_memory_per_block_optin=166_912,
        l2_cache_bytes=41_943_040, clock_rate_ghz=1.41, memory_bandwidth=2_039_040_000_000,
        nvlink_bandwidth=600_000_000_000, peak_bf16_flops=312e12, peak_8bit_ops=624e12,
        network_bandwidth=200e9 / 8,  # DGX A100 (80GB) has the same eight 200 Gb/s HDR ports
        # A2 Ultra a2-ultragpu-8g: 8 A100 80GB, 96 vCPUs, 1,360 GB.
        host=HostSpec(machine="a2-ultragpu-8g", accelerators=8, ram_bytes=1360 * GB, source=_GCE_GPU_VMS)),
    # A800 SXM4 80GB, the A100 80GB NVIDIA sells in China under the US export rules of October
    # 2022: the same GA100 part (108 SMs, 40 MB L2, 80 GB HBM2e at 2,039 GB/s, 1410 MHz, the same
    # quoted performance), its NVLink cut to 400 GB/s against the A100's 600 GB/s (8 links of
    # 50 GB/s instead of 12). Source: Reuters, November 2022, as reported by tweakers.net/nieuws/203182
    # ("Nvidia introduceert A800-gpu voor China": "De A800-serie is in grote lijnen gelijk aan de
    # bestaande A100, hoewel de bandbreedte van de NVLink-interconnect is beperkt tot 400GB/s").
    # The name is what the CUDA driver reports on the part ("NVIDIA A800-SXM4-80GB", as nvidia-smi
    # and torch.cuda.get_device_name print it). XLA records no A800 spec: the exact byte count
    # and shared-memory limits are the A100 80GB's (specs/a100_sxm_80.txtpb), the same die and
    # memory stacks.
    GpuSpec(
        name="a800", description="NVIDIA A800-SXM4-80GB", hbm_bytes=85_100_068_864,
        compute_capability=(8, 0), core_count=108, fpus_per_core=64,
        shared_memory_per_core=167_936, shared_memory_per_block_optin=166_912,
        l2_cache_bytes=41_943_040, clock_rate_ghz=1.41, memory_bandwidth=2_039_040_000_000,
        nvlink_bandwidth=400_000_000_000, peak_bf16_flops=312e12, peak_8bit_ops=624e12,
        # No cloud machine type carries A800s, and no reference server's RAM is published: the
        # part is sold in China to OEM servers whose RAM varies by order.
        host=HostSpec(machine=None, accelerators=8, ram_bytes=None, source=None,
                      why="no machine type or reference server with 8 A800s publishes its RAM (OEM servers vary)")),
    # H100 SXM5 80GB: nvidia.com/en-us/data-center/h100/ (80 GB HBM3, 3.35 TB/s); 132 SMs, 50 MB
    # L2, 228 KB shared memory per SM (227 KB per block), 1.98 GHz boost: NVIDIA H100 Tensor Core
    # GPU Architecture whitepaper. Bytes: XLA specs/h100_sxm.txtpb. NVLink 900 GB/s (18
    # fourth-generation links): the same product page.
    GpuSpec(
        name="h100", description="NVIDIA H100 80GB HBM3", hbm_bytes=84_942_979_072,
        compute_capability=(9, 0), core_count=132, fpus_per_core=128,
        shared_memory_per_core=233_472, shared_memory_per_block_optin=232_448,
        l2_cache_bytes=52_428_800, clock_rate_ghz=1.98, memory_bandwidth=3_352_320_000_000,
        nvlink_bandwidth=900_000_000_000, accelerated_features=True,
        # The same page (H100 SXM): BF16 Tensor Core 1,979 TFLOPS and FP8 3,958 TFLOPS "with
        # sparsity"; dense is half.
        peak_bf16_flops=989.5e12, peak_8bit_ops=1979e12,
        # docs.nvidia.com/dgx-basepod (Core Components): DGX H100, H200 and B200 carry eight
        # single-port ConnectX-7 VPI, "up to 400 Gb/s InfiniBand/Ethernet", one a GPU.
        network_bandwidth=400e9 / 8,
        # A3 High a3-highgpu-8g: 8 H100 80GB, 208 vCPUs, 1,872 GB.
        host=HostSpec(machine="a3-highgpu-8g", accelerators=8, ram_bytes=1872 * GB, source=_GCE_GPU_VMS)),
    # H200 SXM 141GB: nvidia.com/en-us/data-center/h200/ (141 GB HBM3e, 4.8 TB/s); the same GH100
    # die as H100 (132 SMs, 50 MB L2); NVLink 900 GB/s, the same page. Bytes: XLA specs/h200.txtpb.
    GpuSpec(
        name="h200", description="NVIDIA H200 141GB HBM3e", hbm_bytes=151_397_597_184,
        compute_capability=(9, 0), core_count=132, fpus_per_core=128,
        shared_memory_per_core=233_472, shared_memory_per_block_optin=232_448,
        l2_cache_bytes=52_428_800, clock_rate_ghz=1.98, memory_bandwidth=4_800_000_000_000,
        nvlink_bandwidth=900_000_000_000, accelerated_features=True,
        # The same page: BF16 1,979 and FP8 3,958 TFLOPS with sparsity, as H100 SXM; dense is half.
        peak_bf16_flops=989.5e12, peak_8bit_ops=1979e12,
        # docs.nvidia.com/dgx-basepod (Core Components): DGX H100, H200 and B200 carry eight
        # single-port ConnectX-7 VPI, "up to 400 Gb/s InfiniBand/Ethernet", one a GPU.
        network_bandwidth=400e9 / 8,
        # A3 Ultra a3-ultragpu-8g: 8 H200 141GB, 224 vCPUs, 2,944 GB.
        host=HostSpec(machine="a3-ultragpu-8g", accelerators=8, ram_bytes=2944 * GB, source=_GCE_GPU_VMS)),
    # B200: nvidia.com/en-us/data-center/dgx-b200/ (1,440 GB HBM3e over 8 GPUs = 180 GB each;
    # HGX B200 lists 8 TB/s per GPU). 148 SMs, 126.5 MiB L2, 7.67 TB/s and the byte count are
    # XLA's specs/b200.txtpb, recorded from a real B200. NVLink 1.8 TB/s per GPU (fifth
    # generation; DGX B200's 14.4 TB/s over 8 GPUs), the same page.
    GpuSpec(
        name="b200", description="NVIDIA B200", hbm_bytes=191_514_411_008,
        compute_capability=(10, 0), core_count=148, fpus_per_core=128,
        shared_memory_per_core=233_472, shared_memory_per_block_optin=232_448,
        l2_cache_bytes=132_644_864, clock_rate_ghz=1.965, memory_bandwidth=7_672_320_000_000,
        nvlink_bandwidth=1_800_000_000_000, accelerated_features=True,
        # nvidia.com/en-us/data-center/hgx/ (HGX B200, per GPU): FP8 9 PFLOPS and BF16 4.5 PFLOPS
        # with sparsity; dense is half.
        peak_bf16_flops=2.25e15, peak_8bit_ops=4.5e15,
        # docs.nvidia.com/dgx-basepod (Core Components): DGX H100, H200 and B200 carry eight
        # single-port ConnectX-7 VPI, "up to 400 Gb/s InfiniBand/Ethernet", one a GPU.
        network_bandwidth=400e9 / 8,
        # DGX B200: 8 B200, "System Memory 2 TB, configurable to 4 TB" (the base figure).
        host=HostSpec(machine="DGX B200", accelerators=8, ram_bytes=2000 * GB,
                      source="https://www.nvidia.com/en-us/data-center/dgx-b200/")),
    # The PCIe parts teams rent for serving (issue 42): no NVLink, GDDR6 memory, one to eight a VM.
    # XLA records no target spec for them: the byte counts are the totals nvidia-smi reports on the
    # parts (MiB x 2**20; the CUDA driver's total, which vLLM's gpu_memory_utilization multiplies),
    # as quoted in modal-labs/modal-client PR #2797 ("A10: 23028MiB", "L40S: 46068MiB",
    # "L4: 23034MiB"), and for each part in a public log of its own: vllm-project/vllm #10156 (an L4,
    # "0MiB / 23034MiB"), NVIDIA/DCGM #232 (an A10G, "8722MiB / 23028MiB"),
    # akash-network/provider-configs #99 (an L40S, "memory.total [MiB] 46068 MiB"). Shared memory:
    # the CUDA C++ Programming Guide's table of compute capabilities (8.6 and 8.9: 100 KB a
    # multiprocessor, 99 KB a block). FP32 lanes: 128 a multiprocessor on sm_86 and sm_89 (the same
    # guide). Neither XLA's compile nor its memory figures read the SM count, L2 or clock (they feed
    # its cost model, and the step-time estimate's vector rate): each is cited where it is given.
    # L4: NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4/): 24GB GDDR6, 300
    # GB/s, "BF16 Tensor Core 242 teraFLOPS*", "FP8 Tensor Core 485 teraFLOPS*" (* with sparsity;
    # dense is half), PCIe Gen4 x16 64GB/s. 58 SMs of 128 lanes (7,424 CUDA cores), 48 MB L2 and a
    # 2,040 MHz boost, as public tables of the L4's AD104 list them (the datasheet gives none).
    GpuSpec(
        name="l4", description="NVIDIA L4", hbm_bytes=23034 * 2**20,
        compute_capability=(8, 9), core_count=58, fpus_per_core=128,
        shared_memory_per_core=102_400, shared_memory_per_block_optin=101_376,
        l2_cache_bytes=48 * 2**20, clock_rate_ghz=2.04, memory_bandwidth=300_000_000_000,
        nvlink_bandwidth=64_000_000_000, interconnect="PCIe",
        peak_bf16_flops=121e12, peak_8bit_ops=242.5e12,
        # Google Cloud G2 g2-standard-96: 8 L4, 96 vCPUs, 384 GB.
        host=HostSpec(machine="g2-standard-96", accelerators=8, ram_bytes=384 * GB, source=_GCE_GPU_VMS)),
    # L40S: NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s/): 48GB GDDR6 with ECC, 864GB/s,
    # "BFLOAT16 Tensor Core TFLOPS 362.05 | 733*", "FP8 Tensor Core 733 | 1,466*" (* with sparsity),
    # 18,176 CUDA cores (142 SMs of 128), PCIe Gen4 x16 64GB/s bidirectional, no NVLink. AD102: 96 MB
    # L2, 2,520 MHz boost (public AD102 tables).
    GpuSpec(
        name="l40s", description="NVIDIA L40S", hbm_bytes=46068 * 2**20,
        compute_capability=(8, 9), core_count=142, fpus_per_core=128,
        shared_memory_per_core=102_400, shared_memory_per_block_optin=101_376,
        l2_cache_bytes=96 * 2**20, clock_rate_ghz=2.52, memory_bandwidth=864_000_000_000,
        nvlink_bandwidth=64_000_000_000, interconnect="PCIe",
        peak_bf16_flops=362.05e12, peak_8bit_ops=733e12,
        # AWS g6e.48xlarge: 8 L40S, 192 vCPUs, 1,536 GiB (aws.amazon.com/ec2/instance-types/g6e/).
        host=HostSpec(machine="g6e.48xlarge", accelerators=8, ram_bytes=1536 * 2**30,
                      source="https://aws.amazon.com/ec2/instance-types/g6e/")),
    # A10G: the A10 variant made for AWS's G5 instances. Memory and bandwidth as the A10's: 24 GB
    # GDDR6 at 600 GB/s (www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/: "The A10
    # and A10G share the same GPU memory stats: 24 gigabytes of GDDR6 VRAM with a memory bandwidth
    # of 600 gigabytes per second"); 80 SMs (AWS G5: "80 ray tracing cores", one an SM), 6 MB L2
    # (GA102), sm_86. NVIDIA publishes no datasheet for the A10G and AWS no tensor-core peak: its
    # peaks are left unset (the A10's 125 TFLOPS are another part's), so its step time has none.
    GpuSpec(
        name="a10g", description="NVIDIA A10G", hbm_bytes=23028 * 2**20,
        compute_capability=(8, 6), core_count=80, fpus_per_core=128,
        shared_memory_per_core=102_400, shared_memory_per_block_optin=101_376,
        l2_cache_bytes=6 * 2**20, clock_rate_ghz=1.71, memory_bandwidth=600_000_000_000,
        nvlink_bandwidth=64_000_000_000, interconnect="PCIe",
        # AWS g5.48xlarge: 8 A10G, 192 vCPUs, 768 GiB (aws.amazon.com/ec2/instance-types/g5/).
        host=HostSpec(machine="g5.48xlarge", accelerators=8, ram_bytes=768 * 2**30,
                      source="https://aws.amazon.com/ec2/instance-types/g5/")),
)}


# Google Cloud's GPU machine types as systems of hosts: what one GPU reaches other hosts by. A
# target names one after its part (``gpu:h100x64@a3-mega``); without one, a multi-host GPU
# target is the part's NVIDIA reference system (GpuSpec.network_bandwidth: DGX A100, DGX H100 /
# H200 / B200). Figures from https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth:
# A4 and A3 Ultra "provide eight NVIDIA ConnectX-7 (CX7) network interface cards (NICs) ... The
# eight CX7 NICs deliver a total network bandwidth of 3,200 Gbps" for GPU-to-GPU traffic, one NIC
# a GPU (400 Gb/s); for A3 Mega (GPUDirect-TCPXO) and A3 High (GPUDirect-TCPX) the page's overview
# gives only the machine's "Max total bandwidth", 1,800 and 1,000 Gbps, so a GPU's share is that
# over its 8 GPUs (the total includes the general-purpose NICs: an upper bound on what the GPUs get).
_GCE_GPU_NETWORK = "https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth"


@dataclass(frozen=True, kw_only=True)
class GpuSystem:
  """A machine type whose hosts of 8 GPUs a multi-host target may name: the parts it carries and
  the network bandwidth one GPU has to other hosts (bytes per second each way), as published."""

  name: str
  description: str
  parts: tuple[str, ...]
  network_bandwidth: float
  network: str  # what carries it, as the page names it
  source: str = _GCE_GPU_NETWORK


GPU_SYSTEMS: dict[str, GpuSystem] = {s.name: s for s in (
    GpuSystem(name="a3-high", description="Google Cloud A3 High (a3-highgpu-8g)", parts=("h100",),
              network_bandwidth=1000e9 / 8 / 8, network="GPUDirect-TCPX, 1,000 Gbps a machine"),
    GpuSystem(name="a3-mega", description="Google Cloud A3 Mega (a3-megagpu-8g)", parts=("h100",),
              network_bandwidth=1800e9 / 8 / 8, network="GPUDirect-TCPXO, 1,800 Gbps a machine"),
    GpuSystem(name="a3-ultra", description="Google Cloud A3 Ultra (a3-ultragpu-8g)", parts=("h200",),
              network_bandwidth=400e9 / 8, network="GPUDirect RDMA, one 400 Gb/s ConnectX-7 a GPU"),
    GpuSystem(name="a4", description="Google Cloud A4 (a4-highgpu-8g)", parts=("b200",),
              network_bandwidth=400e9 / 8, network="GPUDirect RDMA, one 400 Gb/s ConnectX-7 a GPU"),
)}


def gpu_spec(name: str) -> GpuSpec:
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
  start_jax()  # before any topology: how JAX starts decides what it initialises
  # An older jaxlib whose proto lacks feature_extension cannot parse it: retry without.
  for ext in (True, False) if spec.accelerated_features else (False,):
    config = gpu_target_config(spec, feature_extension=ext)
    topo, e = quietly(lambda: topologies.get_topology_desc(
        platform="cuda", target_config=config, topology=topology))
    if isinstance(e, NotImplementedError) and cuda_plugin.register_late():
      topo, e = quietly(lambda: topologies.get_topology_desc(
          platform="cuda", target_config=config, topology=topology))
    if e is None:
      return tuple(topo.devices)
    if isinstance(e, NotImplementedError):  # "topology not implemented for cuda"
      raise JaxmemError(cuda_plugin.no_topology_message()) from e
    if not isinstance(e, RuntimeError):
      raise e
    last = e
    if "parse" not in str(e):
      break
  raise JaxmemError(f"the CUDA plugin refused {name} x{devices_per_host} on {hosts} host(s): "
                    f"{first_line(last)}") from last


def gpu_devices(name: str, devices_per_host: int, *, hosts: int = 1) -> list:
  """Compile-only devices for `hosts` hosts of `devices_per_host` GPUs `name` each.

  ``device.process_index`` is the host. Cached: the same key gives the same device objects.
  """
  spec = gpu_spec(name)
  for label, n in (("devices_per_host", devices_per_host), ("hosts", hosts)):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise JaxmemError(f"{label} must be a positive integer, got {n!r}")
  return list(_gpu_devices_cached(spec.name, devices_per_host, hosts))


@functools.cache
def _gpu_compiles(name: str) -> CompilerAvailability:
  # What the probe needs (ptxas and libdevice for the architecture) is the architecture's, not
  # the part's: the parts of one compute capability share one probe (`jaxmem targets` asks of
  # every part).
  first = next(s.name for s in GPU_SPECS.values() if s.compute_capability == GPU_SPECS[name].compute_capability)
  if first != name:
    return _gpu_compiles(first)
  try:
    devices = _gpu_devices_cached(name, 1, 1)
  except JaxmemError as e:
    return CompilerAvailability(ok=False, why=str(e))
  except Exception as e:
    return CompilerAvailability(ok=False, why=f"the CUDA plugin failed to start: {first_line(e)}")
  _, error = quietly(lambda: compile_probe(devices, (64, 64), _toolkit_probe))
  if error is not None:
    msg = first_line(error)
    major, minor = GPU_SPECS[name].compute_capability
    if "too old" in msg or "does not support" in msg:
      why = f"the installed ptxas cannot compile for sm_{major}{minor} ({name})"
    elif "PTX compilation provider" in msg or "libdevice" in msg:
      why = ("no CUDA toolkit found (ptxas, nvlink, libdevice): install it or set "
             "XLA_FLAGS=--xla_gpu_cuda_data_dir=/path/to/cuda")
    else:
      why = f"compiling for {name} failed"
    return CompilerAvailability(ok=False, why=f"{why}: {msg}")
  return AVAILABLE


def gpu_compiler_available(name: str | None = None) -> CompilerAvailability:
  """Available when a program compiles for GPU `name` (default h100); else not, with the reason.

  Compiles a tiny program, because an importable plugin is not enough: ptxas and libdevice must
  be found, and ptxas must know the GPU's architecture (sm_100 needs CUDA 12.8 or later).
  """
  return _gpu_compiles(gpu_spec(name or "h100").name)


def _toolkit_probe(a):
  # sin needs libdevice and the matmul needs ptxas: the parts of the CUDA toolkit that a compile
  # without a GPU still uses.
  return jnp.sin(a) @ a

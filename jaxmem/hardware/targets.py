"""Compilation targets: which devices a program is compiled for, and how much memory each has.

Names:

- ``cpu``, ``cpu:N``: this machine's CPU, one device or N simulated ones (for trying meshes on
  a laptop; JAX must be started with ``jax_num_cpu_devices >= N``, which the CLI does). Its
  temporaries overstate an accelerator's: XLA:CPU fuses and reuses buffers less.
- ``attached``: the devices of the machine jaxmem runs on (a Cloud TPU or GPU VM; every host's
  devices in a multi-host job), with their real memory limits.
- ``tpu:GEN-SIZE``: a Cloud TPU slice by its accelerator-type name (``tpu:v5e-8``,
  ``tpu:v5p-128``, ``tpu:v6e-256``), compiled by libtpu without a TPU. v4, v5p and v7x names
  count TensorCores (v5p-8 is 4 chips, 4 JAX devices), v5e and v6e names count chips. Several
  slices (multi-slice over DCN) with ``slices=N``. The recipes' spellings name the same slices:
  the accelerator type without ``tpu:`` (``v5p-1024``; ``tpu7x-128``, MaxText's compile_topology)
  and the chip grid (``tpu7x-4x4x4``, xpk's ``--device-type``: 64 chips, ``tpu:v7x-128``).
- ``gpu:NAME`` or ``gpu:NAMExN``: N GPUs (``gpu:h100x8``), compiled by XLA's CUDA compiler
  without a GPU from a target description of the part (:mod:`jaxmem.hardware.gpu`); more than
  8 devices are laid out as hosts of 8 (``gpu:h100x16`` is two 8-GPU hosts).

Each name makes a :class:`Target` of one kind (:class:`Cpu`, :class:`Attached`, :class:`Tpu`,
:class:`Gpu`), and what differs by kind (its devices, filling its capacity, its peaks, the machine
the step time walks its ops on, its host, its runtime terms) is a method of the kind, not a test
of a name.

``capacity_bytes`` is the memory per device a program may use: TPU, what the compiler itself
says is available (read from its out-of-memory message); GPU, the device memory times the
fraction JAX's allocator takes (``mem_fraction``, else ``XLA_CLIENT_MEM_FRACTION``, else its
older name ``XLA_PYTHON_CLIENT_MEM_FRACTION``, else 0.75); attached,
``memory_stats()["bytes_limit"]``; CPU, none.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import numpy as np
from jax.experimental import mesh_utils

from jaxmem.hardware.availability import CompilerAvailability
from jaxmem.hardware.capacity import usable_hbm_bytes
from jaxmem.hardware.gpu import GPU_SPECS, GPU_SYSTEMS, gpu_compiler_available, gpu_devices
from jaxmem.hardware.hostmem import HostSpec, host_share
from jaxmem.hardware.machine import Machine, gpu_machine, tpu_machine
from jaxmem.hardware import runtime
from jaxmem.hardware.margin import RuntimeTerm, terms
from jaxmem.hardware.peaks import Peaks, device_kind_peaks, gpu_peaks, tpu_peaks
from jaxmem.hardware.tpu import TPU_GENERATIONS, slice_size, tpu_compiler_available, tpu_devices, tpu_topology_name
from jaxmem.hardware.startup import attached_accelerator_present, start_jax
from jaxmem.errors import BadValue, JaxmemError
from jaxmem.inputs import MEM_FRACTION_VARIABLES, Fraction, Size, Whole, env_fraction
from jaxmem.records import CompilerFigures, Record, RuntimeAccount
from jaxmem.units import GiB
from jaxmem.mesh import MeshSpec, format_mesh

# JAX's GPU allocator takes this fraction of device memory unless told otherwise
# (https://docs.jax.dev/en/latest/gpu_memory_allocation.html).
_DEFAULT_GPU_MEM_FRACTION = 0.75
# Representative accelerators for the default target when none is attached, most common first.
DEFAULT_ACCELERATORS = ("gpu:h100", "tpu:v6e-1", "tpu:v5p-8")


class TargetKind:
  """What kind of devices a target names, and what is known of them: how its devices are
  obtained, its capacity, its published peaks, the host that carries them and what the runtime
  holds beside a program. One subclass per kind; code that differs by kind asks the kind."""

  name: ClassVar[str]  # the kind's word, as ``Target.source`` shows it
  attached: ClassVar[bool] = False  # real devices of this machine, not compile-only ones
  slices = 1  # TPU slices over DCN (a field of Tpu)
  hosts = 1  # GPU hosts of up to 8 devices (a field of Gpu)

  def devices(self, target: Target) -> list:
    raise NotImplementedError

  def with_capacity(self, target: Target) -> Target:
    """``target`` with its capacity filled where that costs work (a probe compile); as it is elsewhere."""
    return target

  def peaks(self, target: Target) -> tuple[Peaks | None, str | None]:
    """One device's published peaks, or ``None`` and why not."""
    return None, f"target {target.name}: no published peak figures for this machine's CPU"

  def machine(self, target: Target, coords: Sequence[Sequence[int]] | None = None) -> tuple[Machine | None, str | None]:
    """One device's rates and links as the step time walks ops on them
    (:class:`jaxmem.hardware.machine.Machine`), or ``None`` and why not. ``coords``: the chip
    coordinates of the program's devices in its device assignment's order (a TPU slice's
    collectives are then timed over the links they drive)."""
    return None, self.peaks(target)[1]

  def host(self) -> HostSpec | None:
    """The machine that carries the devices, where it is recorded."""
    return None

  def nvlink_bandwidth(self) -> float | None:
    """A GPU's NVLink bytes per second, both directions; ``None`` for other kinds."""
    return None

  def runtime_terms(self, target: Target) -> tuple[RuntimeTerm, ...]:
    """What the runtime of ``target``'s platform holds on a device beside the program."""
    return terms(target.platform)

  def runtime_account(self, target: Target, figures: CompilerFigures, *, required: int | None = None,
                      communicators: int = 0, cudnn: bool = False) -> RuntimeAccount:
    """The device as this kind's runtime will hold the program of ``figures`` (its compiled
    figures), per device (:mod:`jaxmem.hardware.runtime`); none for the CPU. ``required``: the bytes
    its verdict judges (the compiler's peak); ``communicators``:
    the distinct device groups of its collectives; ``cudnn``: whether it calls cuDNN (GPU)."""
    return RuntimeAccount()


@dataclasses.dataclass(frozen=True)
class Cpu(TargetKind):
  """This machine's CPU, as one device or N simulated ones."""

  name: ClassVar[str] = "cpu"

  def devices(self, target: Target) -> list:
    return cpu_devices(target.num_devices)


@dataclasses.dataclass(frozen=True)
class Attached(TargetKind):
  """The devices of the machine jaxmem runs on, with their real memory limits."""

  name: ClassVar[str] = "attached"
  attached: ClassVar[bool] = True

  def devices(self, target: Target) -> list:
    return attached_devices()

  def peaks(self, target: Target) -> tuple[Peaks | None, str | None]:
    return device_kind_peaks(target.device_kind)

  def machine(self, target: Target, coords: Sequence[Sequence[int]] | None = None) -> tuple[Machine | None, str | None]:
    """The machine of the catalogued part of the devices' ``device_kind``, one slice or host."""
    kind = catalogued(target.device_kind)
    if kind is None:
      return None, self.peaks(target)[1]
    return kind.machine(target, coords)


@dataclasses.dataclass(frozen=True)
class Tpu(TargetKind):
  """A Cloud TPU slice (or ``slices`` of them) of one generation, compiled by libtpu without a TPU."""

  name: ClassVar[str] = "tpu"
  generation: str
  size: int  # the accelerator-type name's size: TensorCores (v4, v5p, v7x) or chips (v5e, v6e)
  slices: int = 1

  def devices(self, target: Target) -> list:
    start_jax()
    return tpu_devices(self.generation, self.size, num_slices=self.slices)

  def with_capacity(self, target: Target) -> Target:
    if target.capacity_bytes is not None:
      return target
    cap = _tpu_capacity(self.generation)
    spec = target.hbm_bytes or 0
    note = (
        "the HBM the TPU compiler reports available"
        if cap != spec
        else "the public HBM figure (the compiler's own could not be read)"
    )
    return dataclasses.replace(target, capacity_bytes=cap, capacity_note=note)

  def peaks(self, target: Target) -> tuple[Peaks | None, str | None]:
    return tpu_peaks(TPU_GENERATIONS[self.generation], slices=self.slices)

  def machine(self, target: Target, coords: Sequence[Sequence[int]] | None = None) -> tuple[Machine | None, str | None]:
    peaks, why = self.peaks(target)
    if peaks is None:
      return None, why
    return tpu_machine(TPU_GENERATIONS[self.generation], size=self.size, slices=self.slices,
                       num_devices=target.num_devices, peaks=peaks, coords=coords), None

  def host(self) -> HostSpec | None:
    return TPU_GENERATIONS[self.generation].host

  def runtime_account(self, target: Target, figures: CompilerFigures, *, required: int | None = None,
                      communicators: int = 0, cudnn: bool = False) -> RuntimeAccount:
    f = figures
    held = runtime.tpu_terms(
        generation=self.generation, argument=f.argument_size_in_bytes, output=f.output_size_in_bytes,
        alias=f.alias_size_in_bytes, temp=f.temp_size_in_bytes, code=f.generated_code_size_in_bytes,
        required=required, resident=target.resident_bytes,
    )
    alone = target.alone_capacity_bytes or target.capacity_bytes
    return runtime.tpu_account(held, alone, cap_option=TPU_HBM_CAP_OPTION)


@dataclasses.dataclass(frozen=True)
class Gpu(TargetKind):
  """NVIDIA GPUs of one part, in hosts of up to 8, compiled by XLA's CUDA compiler without a GPU."""

  name: ClassVar[str] = "gpu"
  part: str  # a key of GPU_SPECS
  per_host: int
  hosts: int = 1
  system: str | None = None  # a key of GPU_SYSTEMS: the hosts' machine type (its network); None: NVIDIA's DGX

  def devices(self, target: Target) -> list:
    start_jax()
    return gpu_devices(self.part, self.per_host, hosts=self.hosts)

  def peaks(self, target: Target) -> tuple[Peaks | None, str | None]:
    return gpu_peaks(GPU_SPECS[self.part], hosts=self.hosts)

  def machine(self, target: Target, coords: Sequence[Sequence[int]] | None = None) -> tuple[Machine | None, str | None]:
    peaks, why = self.peaks(target)
    if peaks is None:
      return None, why
    system = None if self.system is None else GPU_SYSTEMS[self.system]
    return gpu_machine(GPU_SPECS[self.part], system=system, hosts=self.hosts, num_devices=target.num_devices,
                       peaks=peaks), None

  def host(self) -> HostSpec | None:
    return GPU_SPECS[self.part].host

  def nvlink_bandwidth(self) -> float | None:
    spec = GPU_SPECS[self.part]
    return spec.nvlink_bandwidth if spec.interconnect == "NVLink" else None  # a PCIe part has none

  def runtime_account(self, target: Target, figures: CompilerFigures, *, required: int | None = None,
                      communicators: int = 0, cudnn: bool = False) -> RuntimeAccount:
    spec = GPU_SPECS[self.part]
    held = runtime.gpu_terms(compute_capability=spec.compute_capability[0], communicators=communicators, cudnn=cudnn,
                             env=os.environ)
    pool = target.alone_capacity_bytes or target.capacity_bytes
    return runtime.gpu_account(held, memory=target.hbm_bytes, pool=pool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
  """A named set of devices to compile for. ``kind`` says what they are (:class:`Cpu`,
  :class:`Attached`, :class:`Tpu`, :class:`Gpu`) and answers what differs by kind."""

  name: str
  platform: str  # "cpu", "tpu" or "gpu": the compiler used
  num_devices: int
  device_kind: str
  capacity_bytes: int | None  # usable memory per device; None where there is no such limit
  capacity_note: str | None = None  # where capacity_bytes comes from, or why it is None
  hbm_bytes: int | None = None  # memory per device by the public specification
  has_host_memory: bool = True  # a host memory space for remat offload
  # Host RAM per device (the host's RAM over the devices it carries: jaxmem.hardware.hostmem),
  # what offloaded bytes are held against; None where unknown, and the note says why.
  host_capacity_bytes: int | None = None
  host_capacity_note: str | None = None
  kind: TargetKind = Cpu()

  @property
  def source(self) -> str:
    """The kind's word: "cpu", "attached", "tpu" or "gpu" (for display; code asks ``kind``)."""
    return self.kind.name

  @property
  def slices(self) -> int:
    """TPU slices (multi-slice over DCN); 1 for every other kind."""
    return self.kind.slices

  @property
  def hosts(self) -> int:
    """GPU hosts of up to 8 devices; 1 for every other kind."""
    return self.kind.hosts
  # Bytes per device held by another program beside this one (with_resident): already out of
  # capacity_bytes; on TPU the compile is capped to match (compiler_options).
  resident_bytes: int = 0
  # The capacity before the resident bytes were taken out, where any were (for the flag to use).
  alone_capacity_bytes: int | None = None

  @property
  def capacity_checked(self) -> bool:
    """Whether the compiler itself checks each program against ``capacity_bytes`` (refusing one
    that does not fit): a TPU target's capacity as libtpu reports it, or capped to it for resident
    bytes (:attr:`compiler_options`). Not a capacity set by hand, nor the public figure where the
    compiler's could not be read, nor a GPU's or the CPU's (their compilers check none)."""
    if not isinstance(self.kind, Tpu) or self.capacity_bytes is None:
      return False
    if self.compiler_options:
      return True
    reported = _tpu_capacity(self.kind.generation)
    return self.capacity_bytes == reported != self.hbm_bytes

  @property
  def compiler_options(self) -> dict[str, Any]:
    """Options every compile for this target takes: on TPU with resident bytes, the cap on the
    HBM the compiler may plan for (:func:`hbm_cap_mib`), so its own capacity check and its
    memory-aware scheduling see the device as the program will find it."""
    if self.resident_bytes and self.platform == "tpu" and self.capacity_bytes is not None:
      return {TPU_HBM_CAP_OPTION: hbm_cap_mib(self.capacity_bytes)}
    return {}

  @property
  def devices(self) -> Devices:
    """The devices, real or compile-only, in a stable order (the same objects on every call)."""
    return Devices(self.kind.devices(self))

  def mesh(self, axes: Mapping[str, int] | Sequence[tuple[str, int]]) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` over this target's devices, for ``NamedSharding`` and
    ``jax.shard_map``: ``target("tpu:v5p-64").mesh({"data": 2, "fsdp": 16})``. Axis names are
    yours; one size may be -1, for the devices the others leave. On TPU, neighbouring mesh
    coordinates are neighbouring chips, as real jobs lay them out."""
    pairs = list(axes.items()) if isinstance(axes, Mapping) else [tuple(a) for a in axes]
    return self.make_mesh(tuple(_fill_sizes(pairs, self)))

  def make_mesh(self, axis_sizes: MeshSpec) -> jax.sharding.Mesh:
    """A mesh over this target's devices with the given ``(axis, size)`` pairs."""
    names = tuple(a for a, _ in axis_sizes)
    shape = tuple(s for _, s in axis_sizes)
    devices = self.devices
    if int(np.prod(shape)) != len(devices):
      raise JaxmemError(
          f"mesh {format_mesh(axis_sizes)} has {int(np.prod(shape))} devices but target "
          f"{self.name} has {len(devices)}; make the axis sizes multiply to {len(devices)}"
      )
    return jax.sharding.Mesh(_arrange(devices, shape), names)


class Devices(list):
  """A target's devices. Calling the list gives it back, so ``target.devices()``, the spelling
  before ``devices`` became a property, keeps working."""

  def __call__(self) -> Devices:
    return self


def _fill_sizes(pairs: list, target: Target) -> list[tuple[str, int]]:
  """``(axis, size)`` pairs with one size of -1 replaced by the devices the others leave."""
  for pair in pairs:
    if len(pair) != 2 or not isinstance(pair[0], str) or isinstance(pair[1], bool) or not isinstance(pair[1], int):
      raise JaxmemError(f"mesh axes must be name: size pairs, e.g. {{'data': 2, 'fsdp': 4}}; got {pair!r}")
  if len({a for a, _ in pairs}) != len(pairs) or not pairs:
    raise JaxmemError(f"mesh axes must be distinct and at least one; got {[a for a, _ in pairs]}")
  free = [a for a, n in pairs if n == -1]
  if len(free) > 1 or any(n < 1 and n != -1 for _, n in pairs):
    raise JaxmemError(f"mesh sizes must be positive, with at most one -1; got {dict(pairs)}")
  if free:
    rest = int(np.prod([n for _, n in pairs if n != -1]))
    if target.num_devices % rest:
      raise JaxmemError(f"mesh {dict(pairs)}: {rest} does not divide target {target.name}'s {target.num_devices} devices")
    pairs = [(a, target.num_devices // rest if n == -1 else n) for a, n in pairs]
  return pairs


def _arrange(devices: list, shape: tuple[int, ...]) -> np.ndarray:
  # Physical order on TPU keeps neighbouring mesh coordinates on neighbouring chips, as real
  # jobs lay them out; elsewhere (and where the topology has no such layout) plain order.
  if devices and devices[0].platform == "tpu" and len({getattr(d, "slice_index", 0) for d in devices}) == 1:
    try:
      return mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
      pass
  return np.array(devices, dtype=object).reshape(shape)


def cpu_devices(n: int) -> list:
  start_jax(n)
  devices = jax.devices("cpu")
  if len(devices) < n:
    raise JaxmemError(
        f"target cpu:{n} needs {n} CPU devices but JAX was started with {len(devices)}; call "
        f'jax.config.update("jax_num_cpu_devices", {n}) before JAX\'s first use (the CLI does this)'
    )
  return devices[:n]


def attached_devices() -> list:
  start_jax()
  return jax.devices()


_CPU_RE = re.compile(r"^cpu(?::(\d+))?$")
# A TPU slice: Cloud's accelerator type (v5p-128, tpu7x-128, MaxText's compile_topology) or the
# chip grid the recipes name it by (tpu7x-4x4x4, xpk's --device-type), with or without "tpu:".
_TPU_RE = re.compile(r"^(tpu:)?([a-z0-9]+)-(\d+|\d+x\d+(?:x\d+)?)$")
_GPU_RE = re.compile(r"^gpu:([a-z0-9-]+?)(?:x(\d+))?(?:@([a-z0-9-]+))?$")
TARGET_FORMS = (
    "cpu, cpu:N, attached, tpu:GEN-SIZE or GEN-SIZE (v5p-1024, tpu7x-128: the accelerator type), GEN-AxBxC (tpu7x-4x4x4: "
    "its chip grid, as recipes name slices), gpu:NAME[xN][@SYSTEM]"
)


def _tpu_slice(key: str) -> tuple[str, int] | None:
  """(generation, size) of a TPU slice name (:data:`_TPU_RE`), ``None`` where ``key`` names no
  TPU slice. With ``tpu:`` an unknown generation or grid is refused; without it a name whose
  generation is no TPU's is left to the other forms (and refused as an unknown target)."""
  m = _TPU_RE.match(key)
  if m is None:
    return None
  prefixed, gen_name, size = m.groups()
  gen = next((g for g in TPU_GENERATIONS.values() if gen_name == g.name or gen_name in g.aliases), None)
  if gen is None:
    if not prefixed:
      return None
    raise JaxmemError(f"unknown TPU generation {gen_name!r}; valid: {', '.join(TPU_GENERATIONS)}")
  return gen.name, (int(size) if size.isdigit() else slice_size(gen, size))


def get_target(name: str, *, slices: int = 1, mem_fraction: float | None = None) -> Target:
  """Looks a target up by name (:data:`TARGET_FORMS`); an unknown name is a :class:`JaxmemError`
  listing the valid forms. ``mem_fraction`` (GPU targets): the share of device memory JAX's
  allocator takes (see :func:`gpu_mem_fraction`)."""
  key = name.strip().lower()
  tpu = _tpu_slice(key)
  if slices != 1 and tpu is None:
    raise JaxmemError(f"`slices` applies to TPU targets only, not {name!r}")
  if mem_fraction is not None and not key.startswith("gpu:"):
    raise JaxmemError(f"`mem_fraction` applies to GPU targets only, not {name!r}")
  if m := _CPU_RE.match(key):
    return _cpu_target(int(m.group(1) or 1), name)
  if key == "attached":
    return _attached_target()
  if tpu is not None:
    return _tpu_target(*tpu, slices)
  if m := _GPU_RE.match(key):
    return _gpu_target(m.group(1), int(m.group(2) or 1), mem_fraction, system=m.group(3))
  raise JaxmemError(
      f"unknown target {name!r}; valid forms: {TARGET_FORMS} (GEN: {', '.join(_generation_names())}; NAME: "
      f"{', '.join(GPU_SPECS)}; SYSTEM: {', '.join(GPU_SYSTEMS)}); see `jaxmem targets`"
  )


def _generation_names() -> list[str]:
  return [n for g in TPU_GENERATIONS.values() for n in (g.name, *g.aliases)]


def _cpu_target(n: int, name: str) -> Target:
  if n < 1:
    raise JaxmemError(f"target {name!r}: the device count must be at least 1")
  return Target(
      name="cpu" if n == 1 else f"cpu:{n}",
      platform="cpu",
      num_devices=n,
      device_kind="cpu",
      capacity_bytes=None,
      capacity_note="the CPU backend has no device memory limit; its temporaries overstate an accelerator's",
      host_capacity_note="host_capacity_bytes: unknown: the CPU target's host memory is this machine's, not read",
      kind=Cpu(),
  )


def _attached_target() -> Target:
  devices = attached_devices()
  d0 = devices[0]
  stats = None
  if d0.platform != "cpu":
    try:
      stats = d0.memory_stats()
    except (RuntimeError, NotImplementedError):  # some plugins do not implement it
      stats = None
  limit = (stats or {}).get("bytes_limit")
  return Target(
      name="attached",
      platform="gpu" if d0.platform in ("gpu", "cuda", "rocm") else d0.platform,
      num_devices=len(devices),
      device_kind=d0.device_kind,
      capacity_bytes=int(limit) if limit else None,
      capacity_note=(
          "memory_stats()['bytes_limit'] of the attached device"
          if limit
          else f"the attached {d0.platform} device reports no memory limit"
      ),
      host_capacity_note="host_capacity_bytes: unknown: the attached machine's RAM is not read",
      kind=Attached(),
  )


def _tpu_capacity(gen: str) -> int:
  # Not cached here: the probe under it is (capacity._tpu_available_hbm), and a second cache
  # would keep a figure read while that probe was replaced (the test stubs do) past its restoring.
  return usable_hbm_bytes(gen)


def _tpu_target(gen_name: str, size: int, slices: int) -> Target:
  try:
    gen = next(g for g in TPU_GENERATIONS.values() if gen_name == g.name or gen_name in g.aliases)
  except StopIteration:
    raise JaxmemError(f"unknown TPU generation {gen_name!r}; valid: {', '.join(TPU_GENERATIONS)}") from None
  tpu_topology_name(gen.name, size)  # checks the size, listing valid ones
  if slices < 1:
    raise JaxmemError(f"`slices` must be at least 1 (got {slices})")
  devices = gen.chips(size) * gen.devices_per_chip * slices
  host_bytes, host_note = (None, "host_capacity_bytes: unknown: no host recorded") if gen.host is None else host_share(
      gen.host, gen.devices_per_chip)
  return Target(
      name=f"tpu:{gen.name}-{size}" + (f"x{slices}slices" if slices > 1 else ""),
      platform="tpu",
      num_devices=devices,
      device_kind=gen.device_kind,
      capacity_bytes=None,  # filled lazily by with_capacity(): it costs a probe compile
      hbm_bytes=gen.hbm_bytes_per_device,
      host_capacity_bytes=host_bytes,
      host_capacity_note=host_note,
      kind=Tpu(generation=gen.name, size=size, slices=slices),
  )


def gpu_mem_fraction(mem_fraction: float | None = None) -> tuple[float, str]:
  """(fraction of device memory JAX's GPU allocator takes, where it came from): ``mem_fraction``
  if given, else the first of :data:`MEM_FRACTION_VARIABLES` set, else JAX's default 0.75."""
  if mem_fraction is not None:
    return Fraction()(mem_fraction, "`mem_fraction`"), "mem_fraction"
  return env_fraction(MEM_FRACTION_VARIABLES) or (_DEFAULT_GPU_MEM_FRACTION, "JAX's default")


def _gpu_target(gpu: str, n: int, mem_fraction: float | None = None, *, system: str | None = None) -> Target:
  if gpu not in GPU_SPECS:
    raise JaxmemError(f"unknown GPU {gpu!r}; valid: {', '.join(GPU_SPECS)} (write gpu:h100x8 for 8)")
  if system is not None:
    if system not in GPU_SYSTEMS:
      raise JaxmemError(f"unknown GPU system {system!r} in gpu:{gpu}x{n}@{system}; valid: {', '.join(GPU_SYSTEMS)}")
    if gpu not in GPU_SYSTEMS[system].parts:
      raise JaxmemError(f"{GPU_SYSTEMS[system].description} carries {', '.join(GPU_SYSTEMS[system].parts)}, not {gpu}")
  if n < 1:
    raise JaxmemError(f"target gpu:{gpu}x{n}: the device count must be at least 1")
  per_host = n if n <= 8 else 8
  if n % per_host:
    raise JaxmemError(f"target gpu:{gpu}x{n}: more than 8 GPUs must be a multiple of 8 (hosts of 8)")
  spec = GPU_SPECS[gpu]
  fraction, source = gpu_mem_fraction(mem_fraction)
  host_bytes, host_note = (None, "host_capacity_bytes: unknown: no host recorded") if spec.host is None else host_share(spec.host)
  return Target(
      name=f"gpu:{gpu}" + (f"x{n}" if n > 1 else "") + (f"@{system}" if system else ""),
      platform="gpu",
      num_devices=n,
      device_kind=spec.description,
      capacity_bytes=int(spec.hbm_bytes * fraction),
      capacity_note=(
          f"{fraction:g} of the device's {spec.hbm_bytes / 2**30:.1f} GiB, the share JAX's allocator "
          f"takes ({source})"
      ),
      hbm_bytes=spec.hbm_bytes,
      host_capacity_bytes=host_bytes,
      host_capacity_note=host_note,
      kind=Gpu(part=gpu, per_host=per_host, hosts=n // per_host, system=system),
  )


def target(name: str, *, slices: int = 1, resident: int | str = 0, mem_fraction: float | None = None) -> Target:
  """A compilation target by name, with its capacity: ``jaxmem.target("gpu:h100x8")``.

  ``.devices`` are its devices (compile-only for TPU and GPU targets), ``.capacity_bytes`` the
  memory per device a program may use (a TPU's is read from its compiler with a quick probe
  compile, the first time), ``.mesh({"data": 2, "fsdp": 4})`` a ``jax.sharding.Mesh`` over them.
  Inputs sharded over such a mesh are what :func:`jaxmem.analyze` compiles for that target.
  ``resident``: bytes per device another program holds beside it (``"14.5GiB"``): out of the
  capacity, and on TPU the compile is capped to match (:func:`with_resident`).

  >>> t = target("cpu:4")
  >>> t.mesh({"data": 2, "fsdp": -1}).shape
  OrderedDict([('data', 2), ('fsdp', 2)])
  """
  return resolved_target(name, slices=Whole()(slices, "`slices`"), resident=Size()(resident, "`resident`"),
                         mem_fraction=mem_fraction)


def resolved_target(
    target: str | Target, *, slices: int = 1, resident: int = 0, mem_fraction: float | None = None
) -> Target:
  """The one resolution of a target, for every entry point (the CLI's workloads, ``analyze``,
  ``explain``, :mod:`jaxmem.testing`, :func:`target`), so a name gets the same capacity, verdict
  and notes wherever it is given: a name looked up (:func:`get_target`, with ``slices`` and
  ``mem_fraction``) or a :class:`Target` as given, with its capacity (:func:`with_capacity`: a
  TPU's costs a quick probe compile, once) less ``resident`` bytes per device
  (:func:`with_resident`). A :class:`Target` keeps the slices and memory fraction it was made
  with (a workload re-planned on its resolved target passes them again); ``resident`` other than
  the bytes it already holds is an error."""
  if not isinstance(target, (str, Target)):
    raise BadValue("`target`", "a target's name (tpu:v5e-8, gpu:h100x8, cpu) or a Target", target)
  tgt = get_target(target, slices=slices, mem_fraction=mem_fraction) if isinstance(target, str) else target
  if resident and tgt.resident_bytes and tgt.resident_bytes != resident:
    raise JaxmemError(f"`resident` is {resident:,} bytes but the target given already holds {tgt.resident_bytes:,}")
  return with_resident(with_capacity(tgt), 0 if tgt.resident_bytes else resident)


def with_capacity(target: Target) -> Target:
  """``target`` with its capacity, where its kind fills it lazily (a TPU's: a quick probe compile, cached)."""
  return target.kind.with_capacity(target)


def target_peaks(target: Target | None) -> tuple[Peaks | None, str | None]:
  """``target``'s per-device peaks (:mod:`jaxmem.hardware.peaks`), or ``None`` and why not."""
  if target is None:
    return None, "no target: no peak figures"
  return target.kind.peaks(target)


def target_machine(target: Target | None,
                   coords: Sequence[Sequence[int]] | None = None) -> tuple[Machine | None, str | None]:
  """``target``'s rates and links as the step time walks ops on them (its kind's ``machine``), or
  ``None`` and why not. Attached devices are timed as the catalogued part of their ``device_kind``."""
  if target is None:
    return None, "no target: no peak figures"
  return target.kind.machine(target, coords)


def catalogued(device_kind: str) -> Tpu | Gpu | None:
  """The catalogued kind of an attached device, one slice or host, by its ``device_kind``."""
  for gen in TPU_GENERATIONS.values():
    if device_kind == gen.device_kind:
      return Tpu(generation=gen.name, size=1)
  for spec in GPU_SPECS.values():
    if device_kind == spec.description:
      return Gpu(part=spec.name, per_host=1)
  return None


# libtpu's cap on the HBM a program may use, in MiB: the compiler then reports "available HBM"
# of exactly that (checked with libtpu 0.0.42.1 and 0.0.50.1: 10000 gives 9.77G; a cap above the
# device's usable HBM leaves it at the usable figure). It is taken per compile as a compiler
# option, and in LIBTPU_INIT_ARGS at start-up (the Tunix recipes' way).
TPU_HBM_CAP_OPTION = "xla_tpu_max_hbm_size_mib"


def hbm_cap_mib(capacity: int) -> int:
  """The ``--xla_tpu_max_hbm_size_mib`` value for ``capacity`` bytes (rounded down to a MiB)."""
  return capacity // (1 << 20)


def with_resident(target: Target, resident: int) -> Target:
  """``target`` with ``resident`` bytes per device held by another program: its capacity drops
  by them (a GPU's from the allocator's share), the capacity note says the setting to run with,
  and a TPU compile is capped with ``--xla_tpu_max_hbm_size_mib`` (:attr:`Target.compiler_options`).
  A target without a capacity (the CPU), or resident bytes that leave nothing, are an error."""
  if not resident:
    return target
  target = with_capacity(target)
  capacity = target.capacity_bytes
  if capacity is None:
    raise JaxmemError(f"`resident` needs a target with a device memory capacity (tpu:..., gpu:..., attached); "
                      f"{target.name} has none")
  left = capacity - resident
  if left <= 0:
    raise JaxmemError(f"`resident` of {resident:,} bytes leaves nothing of {target.name}'s capacity of {capacity:,} "
                      "bytes per device")
  if target.platform == "tpu":
    flag = hbm_cap_mib(left)
    how = (f"compiled with --{TPU_HBM_CAP_OPTION}={flag}; run the step with it (LIBTPU_INIT_ARGS, or the "
           f"compiler option {TPU_HBM_CAP_OPTION}) so the compiler plans for what the resident program leaves")
  elif target.platform == "gpu" and target.hbm_bytes:
    how = (f"run the step with XLA_PYTHON_CLIENT_MEM_FRACTION={left / target.hbm_bytes:.2f} (its allocator's share "
           f"less the resident bytes) and the resident program outside that pool")
  else:
    how = "the resident program must hold its bytes before this one allocates"
  note = (f"{capacity:,} bytes ({target.capacity_note}) less {resident:,} resident bytes held by another program "
          f"on each device; {how}")
  return dataclasses.replace(target, capacity_bytes=left, capacity_note=note, resident_bytes=resident,
                             alone_capacity_bytes=capacity)


def cpu_devices_needed(names: list[str]) -> int:
  """The number of simulated CPU devices the given target names need (for the CLI's start-up)."""
  need = 1
  for name in names:
    m = _CPU_RE.match(name.strip().lower())
    if m and m.group(1):
      need = max(need, int(m.group(1)))
  return need


def default_target_name() -> tuple[str, str]:
  """(target, why): the attached accelerator, else the first representative accelerator whose
  compiler is installed, else the CPU."""
  if attached_accelerator_present():
    return "attached", "an accelerator is attached"
  for name in DEFAULT_ACCELERATORS:
    kind, _, rest = name.partition(":")
    if gpu_compiler_available(rest) if kind == "gpu" else tpu_compiler_available():
      return name, f"no accelerator attached; {name}'s compiler is installed"
  return "cpu", "no accelerator attached and no TPU/GPU compiler installed; CPU temporaries overstate an accelerator's"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetListing(Record):
  """One line of `jaxmem targets`: a named target, its devices and memory (GiB per device),
  and whether its compiler works here (``note`` says why not). ``host``: the machine that
  carries the devices, ``host_ram_gib`` its RAM per host and ``host_gib_per_device`` that RAM
  over the devices it carries (what offloaded bytes are held against; ``None`` where unknown,
  ``host_note`` says why or where the figure is published)."""

  target: str
  platform: str
  devices: int | str  # "N" for cpu:N, "all" for attached
  device_kind: str
  hbm_gib: float | None
  capacity_gib: float | None
  nvlink_gb_s: float | None  # a GPU's NVLink GB/s, both directions (GpuSpec.nvlink_bandwidth)
  compiler: str  # "yes" or "no"
  note: str = ""
  host: str | None = None
  host_ram_gib: float | None = None
  host_gib_per_device: float | None = None
  host_note: str | None = None


def _listing(t: Target, capacity: int | None, available: CompilerAvailability) -> TargetListing:
  host = t.kind.host()
  ram = None if host is None or host.ram_bytes is None else round(host.ram_bytes / GiB, 1)
  share = None if t.host_capacity_bytes is None else round(t.host_capacity_bytes / GiB, 2)
  return TargetListing(
      host=None if host is None else host.machine,
      host_ram_gib=ram,
      host_gib_per_device=share,
      host_note=(t.host_capacity_note or "").removeprefix("host_capacity_bytes: ") or None,
      target=t.name,
      platform=t.platform,
      devices=t.num_devices,
      device_kind=t.device_kind,
      hbm_gib=round(t.hbm_bytes / GiB, 2),
      capacity_gib=None if capacity is None else round(capacity / GiB, 2),
      nvlink_gb_s=None if (nvlink := t.kind.nvlink_bandwidth()) is None else nvlink / 1e9,
      compiler="yes" if available else "no",
      note=available.why,
  )


def list_targets() -> list[TargetListing]:
  """One record per named target for `jaxmem targets`: devices, memory, compiler installed."""
  records = [
      TargetListing(target="cpu:N", platform="cpu", devices="N", device_kind="cpu", hbm_gib=None, capacity_gib=None,
                    nvlink_gb_s=None, compiler="yes", note="simulated devices")
  ]
  if attached_accelerator_present():
    records.append(TargetListing(target="attached", platform="?", devices="all", device_kind="this machine's",
                                 hbm_gib=None, capacity_gib=None, nvlink_gb_s=None, compiler="yes"))
  tpu = tpu_compiler_available()
  for gen in TPU_GENERATIONS.values():
    for size in gen.sizes:
      records.append(_listing(_tpu_target(gen.name, size, 1), _tpu_capacity(gen.name) if tpu else None, tpu))
  for gpu in GPU_SPECS:
    available = gpu_compiler_available(gpu)
    for n in (1, 8):
      t = _gpu_target(gpu, n)
      records.append(_listing(t, t.capacity_bytes, available))
  return records

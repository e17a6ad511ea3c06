"""What the compiler says about one compiled program, per device.

:class:`MemoryReport` is a small frozen record of ``Compiled.memory_analysis()`` and
``Compiled.cost_analysis()``. :func:`read_compiled` is the one place that copes with
``memory_analysis()`` returning ``None`` and with fields that differ across backends and
jax releases: a figure that cannot be had is ``None`` and ``notes`` says why.

Meaning of the fields (per device: under SPMD every device runs the same partitioned program,
and XLA reports the sizes of that one program):

- ``argument_size_in_bytes``: the inputs (parameters, optimizer state, batch) resident on the
  device while the step runs.
- ``output_size_in_bytes``: the outputs (new parameters and optimizer state, loss).
- ``alias_size_in_bytes``: output bytes that reuse a donated input buffer, so they cost nothing
  beyond the argument bytes.
- ``temp_size_in_bytes``: the compiler's temporary allocation (activations saved for the
  backward pass, gradients, workspace). On TPU it is the size of the temp allocation, which may
  be larger than the live temporaries at any one moment.
- ``generated_code_size_in_bytes``: the compiled executable itself.
- ``host_temp_size_in_bytes``: temporaries placed in host memory (remat host offload), and
  ``host_argument_size_in_bytes``, ``host_output_size_in_bytes``, ``host_alias_size_in_bytes``,
  ``host_generated_code_size_in_bytes``: the host memory space's twins of the device fields.
  ``host_total_bytes`` is their total as ``total_bytes`` is formed. Host bytes are never part of
  ``required_bytes``: they are the host's memory, not the device's.
- ``peak_memory_in_bytes``: the peak of the buffers live at once, from XLA's heap simulation.
  TPU: a true peak, and it can be below argument + temp; it also counts libtpu's other memory
  spaces (on-chip VMEM, host memory under offload), so a small program's can exceed
  ``total_bytes``. GPU: argument + temp. CPU: XLA reports the argument size here, not a peak, so
  jaxmem gives ``None`` with a note.
- ``total_bytes`` = argument + output - alias + temp: every byte the step needs on the device
  if nothing overlapped (the formula MaxText's ``train_compile`` prints). It is an upper bound on
  the device's peak.
- ``required_bytes``: what must fit in the device's memory: the peak, at most ``total_bytes``
  (:func:`device_required`; a row whose peak is above says so in a note), else ``total_bytes``.
  :meth:`MemoryReport.judge` sets it against a capacity: ``fits``, the ``verdict`` (``yes``,
  ``at risk``, ``NO``), ``margin_bytes`` and ``risk_bytes`` (:mod:`jaxmem.hardware.margin`).
- ``flops``: the step's floating-point operations per device: counted from the jaxpr that is
  lowered, with scanned layers multiplied by their count (XLA's cost analysis counts a loop body
  once), times the share of the program one device runs (see
  :func:`jaxmem.compiler.flops.per_device_flops`): 1 for a replicated step, about 1/N for one
  whose batch is split N ways; the share is taken from the optimized HLO's matrix FLOPs with loop
  trip counts (``hlo_flops``), which stay right under a ``tensor`` axis.
- ``hlo_flops``: the matrix FLOPs (``dot``, ``convolution``, cuBLAS GEMMs) one device runs per
  step, counted in the optimized HLO with loop trip counts (:mod:`jaxmem.hlo.ops`); elementwise
  work and the insides of custom calls (fused attention kernels) are not in it.
- ``compiler_flops``: ``cost_analysis()["flops"]`` as XLA gives it, per device, for reference;
  it undercounts programs with loops, such as scanned layers.

:func:`read_compiled` also gives, where it is given the arguments' names:

- ``argument_bytes``: bytes one device holds of each top-level argument (by the function's
  parameter name), and ``argument_leaf_bytes`` of each leaf (``params.layers.w``), from the
  shapes and the input shardings the compiler chose; they sum to the argument size up to layout
  padding (TPU tiles).
- ``comm_bytes`` and ``comm_<kind>_bytes``: bytes one device sends per step in collectives
  (:mod:`jaxmem.hlo.comms`), as sweep rows have them. ``comm_lower_bound``: True when they are a
  lower bound, not a total (a loop that communicates has a trip count neither the compiler
  recorded nor the reader could derive, so it was counted once; ``notes`` names it).
- ``compiled``: the ``jax.stages.Compiled`` itself, for anything else (``as_text()``,
  ``cost_analysis()``); left out of ``as_dict()`` and comparisons.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax

from jaxmem.hardware.oom import parse_oom
from jaxmem.compiler.flops import compiled_flops, jaxpr_flops, per_device_flops
from jaxmem.hardware.margin import (
    ACCEPTED, AT_RISK, JUDGED_CHECK, JUDGED_PEAK, JUDGED_REFUSAL, JUDGED_TOTAL, NO, REFUSED, Verdict, judge, risk_bytes,
)
from jaxmem.hlo.comms import communicator_groups
from jaxmem.hlo.ops import HloCosts, hlo_costs_of_module
from jaxmem.hlo.text import parse_module
from jaxmem.hlo.traffic import Traffic
from jaxmem.mesh import path_keys
from jaxmem.records import CompilerFigures, Record
from jaxmem.versions import compiler_notes, compiler_versions

# The custom-call target prefix of XLA:GPU's cuDNN calls (__cudnn$fmha..., __cudnn$conv...).
CUDNN_CALL = "__cudnn$"
# XLA's own field names, as memory_analysis() spells them.
MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
    "host_argument_size_in_bytes",
    "host_output_size_in_bytes",
    "host_alias_size_in_bytes",
    "host_temp_size_in_bytes",
    "host_generated_code_size_in_bytes",
    "peak_memory_in_bytes",
)
# What every result row carries from the compiler: XLA's fields, jaxmem's total, the FLOPs, the
# compile time and the compiler versions (the fields of CompilerFigures).
COMPILER_FIELDS = tuple(f.name for f in dataclasses.fields(CompilerFigures))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryReport(CompilerFigures):
  """The compiler's per-device memory, cost and communication figures for one program."""

  platform: str
  num_devices: int
  argument_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # per top-level argument
  argument_leaf_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # per argument leaf
  notes: tuple[str, ...] = ()
  compiled: Any = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})
  # HBM bytes per step read from the same optimized module as the communication (one parse for
  # both), for the step-time estimate (jaxmem.steptime); rows carry it as bytes_accessed.
  traffic: Traffic | None = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})
  # Each top-level op's FLOPs, bytes and communication (jaxmem.hlo.ops), for the per-op times.
  hlo_costs: HloCosts | None = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})
  # The device groups one device runs collectives in (jaxmem.hlo.comms.communicator_groups: on GPU,
  # an NCCL communicator each) and whether the program calls cuDNN, for the runtime account
  # (jaxmem.hardware.runtime).
  communicators: int = dataclasses.field(default=0, repr=False, compare=False, metadata={"as_dict": False})
  calls_cudnn: bool = dataclasses.field(default=False, repr=False, compare=False, metadata={"as_dict": False})
  # The chip coordinates of the program's devices in partition order (TPU; None elsewhere): where
  # its collectives run on the slice's links (jaxmem.steptime.timeline).
  placement: tuple[tuple[int, ...], ...] | None = dataclasses.field(default=None, repr=False, compare=False,
                                                                   metadata={"as_dict": False})
  # The verdict against the target's capacity, as compare's rows have it (set by jaxmem.analyze
  # for a target with a capacity; None otherwise): see jaxmem.records.Judgement.
  capacity_bytes: int | None = None
  fits: bool | None = None
  verdict: str | None = None
  margin_bytes: int | None = None
  risk_bytes: int | None = None
  # What the verdict judged (jaxmem.hardware.margin.Verdict): which figure required_bytes is, the
  # naive argument + output - alias + temp beside it, and the compiler's own capacity check.
  judged_figure: str | None = None
  naive_sum_bytes: int | None = None
  compiler_check: str | None = None

  @property
  def required_bytes(self) -> int | None:
    """What must fit in the device's memory: the compiler's peak where the backend gives one,
    at most ``total_bytes`` (:func:`device_required`); else ``total_bytes``."""
    return device_required(self.peak_memory_in_bytes, self.total_bytes)

  def judge(self, capacity: int | None, *, checked: bool = False) -> Verdict:
    """Whether the program fits ``capacity`` bytes per device, with its margin and the runtime's
    risk terms (:mod:`jaxmem.hardware.margin`). ``checked``: the compiler checked the program
    against this same capacity (:attr:`jaxmem.hardware.targets.Target.capacity_checked`)."""
    risk = risk_bytes(
        self.platform, capacity=capacity, argument=self.argument_size_in_bytes, output=self.output_size_in_bytes,
        alias=self.alias_size_in_bytes, generated_code=self.generated_code_size_in_bytes,
    )
    peak, total = self.peak_memory_in_bytes, self.total_bytes
    v = dataclasses.replace(
        judge(self.required_bytes, capacity, risk),
        judged_figure=None if self.required_bytes is None
        else JUDGED_PEAK if peak is not None and (total is None or peak <= total) else JUDGED_TOTAL,
        naive_sum_bytes=total,
        # A TPU program that compiled passed libtpu's own check of its HBM against what is available.
        compiler_check=ACCEPTED if self.platform == "tpu" else None,
    )
    if checked and v.compiler_check == ACCEPTED and v.fits is False and v.judged_figure == JUDGED_TOTAL and peak is not None:
      # The total is an upper bound (every buffer live at once) and the peak counts host memory
      # and VMEM too (remat offload: MaxText's 128B on v5e-256 has peak 17.46 GiB with 12 GiB of
      # host temporaries, total 15.81 of 15.75 GiB): the compiler checked the program's HBM
      # against the same capacity (a --resident cap included) and accepted it. Its margin is
      # unknown, so the verdict is at risk.
      v = dataclasses.replace(v, fits=True, verdict=AT_RISK, margin_bytes=None, judged_figure=JUDGED_CHECK)
    return v

  def figures(self) -> dict:
    """The :class:`CompilerFigures` fields (communication included), to build a row from."""
    return {f: getattr(self, f) for f in COMPILER_FIELDS}


# Why a TPU row's required bytes are below its peak (one text for every such row, so the table
# prints it once).
PEAK_OVER_TOTAL_NOTE = (
    "required_bytes: peak_memory_in_bytes is above total_bytes (argument + output - alias + temp, every buffer "
    "of the device's memory live at once), because libtpu's peak also counts its other memory spaces: on-chip "
    "VMEM, where a small program keeps its temporaries, and host memory under offload (the compiler's "
    "memory-usage report lists them apart); required_bytes is total_bytes, which the Δ columns compare"
)


def device_required(peak: int | None, total: int | None) -> int | None:
  """The bytes the device's memory must hold: ``peak`` capped at ``total``. ``total`` counts
  every buffer of the device's main memory space live at once, so its peak cannot exceed it; a
  larger peak counts other memory spaces (libtpu's includes VMEM and host memory: tiny on v5e,
  default space 3.49 MiB + vmem 84.15 MiB in the memory-usage report against a peak of 86.3 MiB)."""
  if peak is None:
    return total
  return peak if total is None else min(peak, total)


def fits(required: int | None, capacity: int | None) -> bool | None:
  """Whether ``required`` bytes fit in ``capacity``; None when either is unknown (the verdict
  with its margin: :meth:`MemoryReport.judge`)."""
  return None if (required is None or capacity is None) else required <= capacity


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refusal(Record):
  """A program with no compiled figures: the backend refused it (the error's first line, and
  for an out-of-memory refusal ``fits=False`` with the required bytes its message gives, ``None``
  where it gives none), or jaxmem did not compile it because its arguments alone exceed the
  device (see :func:`jaxmem.compiler.figures.compile_figures`).

  ``flops`` and ``program_flops`` are counted from the program as traced, so a refused
  configuration keeps them; ``notes`` say how. ``cause`` is the compiler's exception (``None``
  where nothing was compiled), for a caller that raises rather than reports; left out of
  ``as_dict()`` and comparisons. :meth:`row_fields` are what a row takes from it, as
  :meth:`jaxmem.compiler.figures.Figures.row_fields` for a compiled program.
  """

  required_bytes: int | None
  fits: bool | None
  error: str
  verdict: str | None = None  # NO for an out-of-memory refusal
  margin_bytes: int | None = None
  judged_figure: str | None = None  # what required_bytes is (jaxmem.hardware.margin)
  compiler_check: str | None = None  # "refused" for the compiler's own out-of-memory refusal
  flops: float | None = None
  program_flops: float | None = None
  versions: dict[str, str] = dataclasses.field(default_factory=dict)
  capacity_bytes: int | None = None
  notes: tuple[str, ...] = ()
  cause: Exception | None = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})

  def row_fields(self) -> dict[str, Any]:
    return self.as_dict()

  @classmethod
  def of(cls, e: jax.errors.JaxRuntimeError, **fields: Any) -> Refusal:
    """The refusal ``e`` says (``fields``: the rest of the record)."""
    message = str(e)
    oom = parse_oom(message) if "RESOURCE_EXHAUSTED" in message else None
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else message
    return cls(
        required_bytes=None if oom is None else oom.required_bytes,
        fits=False if oom is not None else None,
        error=no_triton_tiling(first) or first,
        cause=e,
        verdict=None if oom is None else NO,
        margin_bytes=None if oom is None or None in (oom.required_bytes, oom.available_bytes)
        else oom.available_bytes - oom.required_bytes,
        # Only the TPU compiler refuses a program for size (the GPU compiler never does).
        judged_figure=None if oom is None or oom.required_bytes is None else JUDGED_REFUSAL,
        compiler_check=None if oom is None else REFUSED,
        **fields,
    )


# XLA's GPU compiler, given a dot fused with its producers for the Triton GEMM emitter, turns the
# GEMM configuration it chose into tile sizes for the whole fusion; where none satisfies the
# fusion's constraints it fails "Couldn't find output tile sizes that satisfy hlo: %dot = ...".
# Seen with jaxlib 0.10.2 compiling for gpu:a100 (sm_80) without a device: in a scanned layer's
# backward pass, the bf16[8192,6144] query projection whose operand is the attention gradient
# [8, 1024, 8, 96] seen as [8192, 768] (GPT-3 22B's 96-wide heads, 8 per device under tensor=8),
# with a 128-wide contracting tile ("sizes":["128"]) that does not fit 96. H100 and jaxlib
# 0.12.0.1 compile the same program (tests/test_targets.py); so does jaxlib 0.10.2 with Triton
# GEMMs off, which leaves the matmul to cuBLAS.
_TRITON_TILING = re.compile(
    r"Couldn't find output tile sizes that satisfy hlo: %(\S+) = (\S+?)(?:\{[^}]*\})? dot\(.*?"
    r'op_name="(?:[^"]*/)?([^"/]+)/dot_general"'
)


def no_triton_tiling(error: str) -> str | None:
  """The compiler's "Couldn't find output tile sizes" refusal said as what it could not do, else
  None (another error)."""
  m = _TRITON_TILING.search(error)
  if m is None:
    return None
  name, shape, equation = m.groups()
  return (
      f"XLA's GPU compiler found no Triton tile sizes for the {shape} matmul {equation} ({name}): the "
      f"Triton GEMM configuration jax {jax.__version__} picks without a device cannot tile its fusion "
      "(jax 0.12.0.1 compiles the programs where this was seen; XLA_FLAGS=--xla_gpu_enable_triton_gemm=false "
      "leaves the matmul to cuBLAS)"
  )


def _total(a: int | None, o: int | None, al: int | None, t: int | None) -> int | None:
  if None in (a, o, al, t):
    return None
  return a + o - al + t


def read_compiled(
    compiled,
    *,
    compile_seconds: float | None = None,
    program_flops: float | None = None,
    jaxpr: Any = None,
    argument_names: Sequence[str] | None = None,
) -> MemoryReport:
  """Reads a ``jax.stages.Compiled`` into a :class:`MemoryReport`.

  ``jaxpr`` is the program's jaxpr (``traced.jaxpr.jaxpr``): its FLOPs, times the share of it one
  device runs, are the report's ``flops``, and its count the report's ``program_flops`` (unless
  ``program_flops`` gives it). Without it, ``program_flops`` (the whole program's count) is
  divided evenly over the devices. ``argument_names``: the top-level arguments' names
  (the function's parameters without the static ones), for ``argument_bytes``.
  """
  devices = _devices_of(compiled)
  platform = devices[0].platform if devices else "unknown"
  notes: list[str] = []
  stats = compiled.memory_analysis()
  values: dict[str, int | None] = {}
  if stats is None:
    notes.append(f"memory_analysis() returned None on {platform}: no memory figures")
    values = dict.fromkeys(MEMORY_FIELDS)
  else:
    for field in MEMORY_FIELDS:
      v = getattr(stats, field, None)
      values[field] = None if v is None else int(v)
      if v is None:
        notes.append(f"{field}: not reported by this jaxlib")
  if platform == "cpu" and values["peak_memory_in_bytes"] is not None:
    # Checked on jaxlib 0.10: the CPU client reports the argument size as the "peak".
    values["peak_memory_in_bytes"] = None
    notes.append("peak_memory_in_bytes: the CPU backend reports no peak (it echoes the argument size)")
  module = parse_module(compiled.as_text())
  costs = hlo_costs_of_module(module)
  comm, hbm = costs.collectives, costs.traffic
  if jaxpr is not None:
    flops, flops_note = per_device_flops(jaxpr, compiled, len(devices), hlo_flops=costs.flops)
    notes += [flops_note] if flops_note else []
    program_flops = jaxpr_flops(jaxpr) if program_flops is None else program_flops
  else:
    flops = None if program_flops is None else program_flops / max(1, len(devices))
  total = _total(*(values[f] for f in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                      "temp_size_in_bytes")))
  if values["peak_memory_in_bytes"] is not None and total is not None and values["peak_memory_in_bytes"] > total:
    notes.append(PEAK_OVER_TOTAL_NOTE)
  by_arg, by_leaf = argument_bytes(compiled, argument_names)
  return MemoryReport(
      platform=platform,
      num_devices=len(devices),
      communicators=communicator_groups(module),
      calls_cudnn=any(CUDNN_CALL in i.attrs for i in module.instructions.values() if i.opcode == "custom-call"),
      **values,
      total_bytes=total,
      host_total_bytes=_total(
          values["host_argument_size_in_bytes"],
          values["host_output_size_in_bytes"],
          values["host_alias_size_in_bytes"],
          values["host_temp_size_in_bytes"],
      ),
      flops=flops,
      program_flops=program_flops,
      compiler_flops=compiled_flops(compiled),
      placement=placement(device_assignment(compiled)),
      hlo_flops=costs.flops,
      compile_seconds=compile_seconds,
      versions=compiler_versions(platform),
      argument_bytes=by_arg,
      argument_leaf_bytes=by_leaf,
      comm_bytes=comm.total_bytes,
      **{f"comm_{k}_bytes": v for k, v in comm.bytes_by_kind.items()},
      comm_lower_bound=comm.lower_bound,
      notes=tuple(notes) + tuple(f"comm: {n}" for n in comm.notes) + tuple(f"bytes_accessed: {n}" for n in hbm.notes)
      + compiler_notes(platform),
      compiled=compiled,
      traffic=hbm,
      hlo_costs=costs,
  )


def argument_bytes(compiled, names: Sequence[str] | None = None) -> tuple[dict[str, int], dict[str, int]]:
  """Bytes one device holds of each top-level argument and of each argument leaf: each leaf's
  shard shape (from the input sharding the compiler chose) times its element size. ``names``
  name the top-level arguments (else ``args[i]``); leaves are named ``arg.key.key``."""
  args_info, _ = compiled.args_info
  shardings, _ = compiled.input_shardings
  by_arg: dict[str, int] = {}
  by_leaf: dict[str, int] = {}
  for i, (info, sharding) in enumerate(zip(args_info, shardings, strict=True)):
    name = names[i] if names is not None and i < len(names) else f"args[{i}]"
    infos = jax.tree_util.tree_leaves_with_path(info)
    leaf_shardings = jax.tree_util.tree_leaves(sharding)
    if len(leaf_shardings) != len(infos):
      # jit drops an argument the program never reads (no sharding, no buffer): it holds nothing.
      leaf_shardings = [None] * len(infos)
    for (path, leaf), s in zip(infos, leaf_shardings, strict=True):
      n = 0 if s is None else _shard_bytes(leaf.shape, leaf.dtype, s)
      by_leaf[".".join([name, *path_keys(path)])] = n
      by_arg[name] = by_arg.get(name, 0) + n
    by_arg.setdefault(name, 0)
  return by_arg, by_leaf


def _shard_bytes(shape, dtype, sharding) -> int:
  return array_bytes(shape, dtype, elements=math.prod(sharding.shard_shape(tuple(shape))))


def array_bytes(shape, dtype, *, elements: int | None = None) -> int:
  """The bytes ``elements`` (default: all) of an array of ``shape`` and ``dtype`` occupy."""
  elements = math.prod(tuple(shape)) if elements is None else elements
  if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
    # A typed PRNG key (MaxText's train step takes one) has no item size: its buffer is its key
    # data, the key's shape plus trailing unsharded words (jax.random.key_data).
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(tuple(shape), dtype))
    elements *= math.prod(data.shape[len(shape):])
    dtype = data.dtype
  return -(-elements * jax.dtypes.itemsize_bits(dtype) // 8)  # sub-byte types pack (int4: 2 a byte)


def device_assignment(compiled) -> tuple:
  """The devices of ``compiled`` in partition order (the order the HLO's device ids index): the
  mesh of its named shardings, which all share it; ``()`` where none is named."""
  for s in jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings)):
    if isinstance(s, jax.sharding.NamedSharding) and isinstance(s.mesh, jax.sharding.Mesh):
      return tuple(s.mesh.devices.flat)
  return ()


def placement(devices) -> tuple[tuple[int, ...], ...] | None:
  """The chip coordinates of ``devices`` (:func:`device_assignment`'s), or ``None`` where a
  device has none (GPUs, CPUs) or there are none."""
  out = []
  for d in devices:
    xyz = getattr(d, "coords", None)
    if xyz is None:
      return None
    out.append(tuple(int(c) for c in xyz))
  return tuple(out) or None


def _devices_of(compiled) -> list:
  # `input_shardings` is public on every backend; a program without inputs has its outputs'.
  for s in jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings)):
    if hasattr(s, "device_set"):
      return sorted(s.device_set, key=lambda d: d.id)
  return []

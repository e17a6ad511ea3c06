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
- ``host_temp_size_in_bytes``: temporaries placed in host memory (remat host offload).
- ``peak_memory_in_bytes``: the peak of the buffers live at once, from XLA's heap simulation.
  TPU: a true peak, and it can be below argument + temp. GPU: argument + temp. CPU: XLA reports
  the argument size here, not a peak, so jaxmem gives ``None`` with a note.
- ``total_bytes`` = argument + output - alias + temp: every byte the step needs on the device
  if nothing overlapped (the formula MaxText's ``train_compile`` prints). It is an upper bound on
  the peak; use ``peak_memory_in_bytes`` where the backend gives one.
- ``flops``: the step's floating-point operations per device: counted from the jaxpr that is
  lowered, with scanned layers multiplied by their count (XLA's cost analysis counts a loop body
  once), times the share of the program one device runs (see
  :func:`jaxmem.compiler.flops.per_device_flops`): 1 for a replicated step, about 1/N for one
  whose batch is split N ways.
- ``compiler_flops``: ``cost_analysis()["flops"]`` as XLA gives it, per device, for reference;
  it undercounts programs with loops, such as scanned layers.

:func:`read_compiled` also gives, where it is given the arguments' names:

- ``argument_bytes``: bytes one device holds of each top-level argument (by the function's
  parameter name), and ``argument_leaf_bytes`` of each leaf (``params.layers.w``), from the
  shapes and the input shardings the compiler chose; they sum to the argument size up to layout
  padding (TPU tiles).
- ``comm_bytes`` and ``comm_<kind>_bytes``: bytes one device sends per step in collectives
  (:mod:`jaxmem.hlo.comms`), as sweep rows have them.
- ``compiled``: the ``jax.stages.Compiled`` itself, for anything else (``as_text()``,
  ``cost_analysis()``); left out of ``as_dict()`` and comparisons.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax

from jaxmem.compiler.accelerators import parse_oom
from jaxmem.compiler.flops import compiled_flops, per_device_flops
from jaxmem.hlo.comms import collectives
from jaxmem.program.sharding import path_keys
from jaxmem.records import CompilerFigures, Record
from jaxmem.versions import compiler_versions

# XLA's own field names, as memory_analysis() spells them.
MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
    "host_temp_size_in_bytes",
    "peak_memory_in_bytes",
)
# What every result row carries from the compiler: XLA's fields, jaxmem's total, the FLOPs, the
# compile time and the compiler versions (the fields of CompilerFigures).
COMPILER_FIELDS = tuple(f.name for f in dataclasses.fields(CompilerFigures))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryReport(CompilerFigures):
  """The compiler's per-device memory and cost figures for one program."""

  platform: str
  num_devices: int
  argument_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # per top-level argument
  argument_leaf_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # per argument leaf
  comm_bytes: int | None = None
  comm_all_gather_bytes: int | None = None
  comm_reduce_scatter_bytes: int | None = None
  comm_all_reduce_bytes: int | None = None
  comm_all_to_all_bytes: int | None = None
  comm_collective_permute_bytes: int | None = None
  notes: tuple[str, ...] = ()
  compiled: Any = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})

  @property
  def required_bytes(self) -> int | None:
    """What must fit on a device: the compiler's peak where the backend gives one, else
    ``total_bytes``."""
    return self.peak_memory_in_bytes if self.peak_memory_in_bytes is not None else self.total_bytes

  def figures(self) -> dict:
    """The :class:`CompilerFigures` fields, to build a row from."""
    return {f: getattr(self, f) for f in COMPILER_FIELDS}

  def comm_figures(self) -> dict:
    """The communication fields (``comm_bytes`` and one per collective kind), as rows have them."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.startswith("comm_")}


def fits(required: int | None, capacity: int | None) -> bool | None:
  """Whether ``required`` bytes fit in ``capacity``; None when either is unknown."""
  return None if (required is None or capacity is None) else required <= capacity


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refusal(Record):
  """A compile the backend refused: the error's first line, and for an out-of-memory refusal
  ``fits=False`` with the required bytes the message gives (``None`` where it gives none)."""

  required_bytes: int | None
  fits: bool | None
  error: str

  @classmethod
  def of(cls, e: jax.errors.JaxRuntimeError) -> Refusal:
    message = str(e)
    oom = parse_oom(message) if "RESOURCE_EXHAUSTED" in message else None
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return cls(
        required_bytes=None if oom is None else oom.required_bytes,
        fits=False if oom is not None else None,
        error=lines[0] if lines else message,
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
  device runs, are the report's ``flops``. Without it, ``program_flops`` (the whole program's
  count) is divided evenly over the devices. ``argument_names``: the top-level arguments' names
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
  if jaxpr is not None:
    flops, flops_note = per_device_flops(jaxpr, compiled, len(devices))
    notes += [flops_note] if flops_note else []
  else:
    flops = None if program_flops is None else program_flops / max(1, len(devices))
  by_arg, by_leaf = argument_bytes(compiled, argument_names)
  comm = collectives(compiled)
  return MemoryReport(
      platform=platform,
      num_devices=len(devices),
      **values,
      total_bytes=_total(
          values["argument_size_in_bytes"],
          values["output_size_in_bytes"],
          values["alias_size_in_bytes"],
          values["temp_size_in_bytes"],
      ),
      flops=flops,
      compiler_flops=compiled_flops(compiled),
      compile_seconds=compile_seconds,
      versions=compiler_versions(platform),
      argument_bytes=by_arg,
      argument_leaf_bytes=by_leaf,
      comm_bytes=comm.total_bytes,
      **{f"comm_{k}_bytes": v for k, v in comm.bytes_by_kind.items()},
      notes=tuple(notes) + tuple(f"comm: {n}" for n in comm.notes),
      compiled=compiled,
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
  elements = math.prod(sharding.shard_shape(tuple(shape)))
  if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
    # A typed PRNG key (MaxText's train step takes one) has no item size: its buffer is its key
    # data, the key's shape plus trailing unsharded words (jax.random.key_data).
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(tuple(shape), dtype))
    elements *= math.prod(data.shape[len(shape):])
    dtype = data.dtype
  return -(-elements * jax.dtypes.itemsize_bits(dtype) // 8)  # sub-byte types pack (int4: 2 a byte)


def _devices_of(compiled) -> list:
  # `input_shardings` is public on every backend; a program without inputs has its outputs'.
  for s in jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings)):
    if hasattr(s, "device_set"):
      return sorted(s.device_set, key=lambda d: d.id)
  return []

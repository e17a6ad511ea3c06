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
  lowered, with scanned layers multiplied by their count, divided by the device count (see
  :mod:`jaxmem.compiler.flops` for why: XLA's cost analysis counts a loop body once).
- ``compiler_flops``: ``cost_analysis()["flops"]`` as XLA gives it, per device, for reference;
  it undercounts programs with loops, such as scanned layers.
"""

from __future__ import annotations

import dataclasses

import jax

from jaxmem.compiler.accelerators import parse_oom
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
  notes: tuple[str, ...] = ()

  @property
  def required_bytes(self) -> int | None:
    """What must fit on a device: the compiler's peak where the backend gives one, else
    ``total_bytes``."""
    return self.peak_memory_in_bytes if self.peak_memory_in_bytes is not None else self.total_bytes

  def figures(self) -> dict:
    """The :class:`CompilerFigures` fields, to build a row from."""
    return {f: getattr(self, f) for f in COMPILER_FIELDS}


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
    compiled, *, compile_seconds: float | None = None, program_flops: float | None = None
) -> MemoryReport:
  """Reads a ``jax.stages.Compiled`` into a :class:`MemoryReport`.

  ``program_flops`` is the whole program's FLOP count (from :mod:`jaxmem.compiler.flops`); it is
  divided over the devices.
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
      flops=None if program_flops is None else program_flops / max(1, len(devices)),
      compiler_flops=_flops(compiled),
      compile_seconds=compile_seconds,
      versions=compiler_versions(platform),
      notes=tuple(notes),
  )


def _devices_of(compiled) -> list:
  # `input_shardings` is public on every backend; a program with no inputs reports no devices.
  for s in jax.tree_util.tree_leaves(compiled.input_shardings):
    if hasattr(s, "device_set"):
      return sorted(s.device_set, key=lambda d: d.id)
  return []


def _flops(compiled) -> float | None:
  cost = compiled.cost_analysis()
  # Older jaxlibs return a list with one dict per program, newer ones the dict itself.
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])

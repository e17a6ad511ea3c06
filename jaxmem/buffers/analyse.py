"""What fills the memory of a compiled step: consumers, the buffers live at the peak, a timeline.

:func:`analyse` reads the optimized module's buffer assignment (which HLO value sits where in
which allocation), its schedule and live ranges (when each value is alive), and the HLO metadata
(the jax op name and the Python source of each instruction), all from XLA's dump
(:mod:`jaxmem.hlo.dump`). From these it rebuilds, for every position of the schedule, the bytes
occupied in the device's main memory (memory color 0: HBM; on TPU, VMEM and the other on-chip
spaces are left out), stacked by kind, and the set live at the peak. :mod:`jaxmem.buffers.explain`
compiles the step and calls it.

How the figures are derived (all per device):

- ``peak_bytes``: the compiler's ``peak_memory_in_bytes``. XLA:CPU gives no peak (it echoes the
  argument size), so on CPU it is the memory its buffer assignment allocates for the step,
  argument + output - alias + temp (what XLA:GPU reports as its peak), with a note. Not the
  live-range dump's ``Stack trace breakdown for peak usage``: XLA chooses that moment sizing
  loop-carried values by their tuple, and on jaxlib 0.12.0.1's XLA:CPU it lands 17% below the
  peak inside the backward loop (on 0.10.2 it happened to find it).
- ``live_bytes_at_peak``: the reconstruction: at the schedule position where the rebuilt curve
  is highest, the bytes the live values occupy, counting memory shared by aliased values
  (donated parameters, loop carries) once. Checked against ``peak_bytes`` on jax 0.10.2 and
  0.12.0.1 (tiny model; see tests/test_explain.py): within 0.1% on CPU, within 500 bytes
  (0.01%) on GPU (H100 compiled without a GPU), within 0.01% on TPU (v5e compiled without a
  TPU) once the step's temporaries are in HBM; for programs so small that libtpu keeps their
  temporaries in VMEM, libtpu's peak adds bytes that its dumped buffer assignment does not place
  in HBM, and the note gives the gap.
- ``consumers`` sum to ``footprint_bytes`` = argument + output - alias + temp + generated code
  (``memory_analysis()``). Exact: each argument group (``params``, ``opt_state.mu``, ``batch``:
  the step's argument names and the pytree paths jax gives its inputs, grouped by
  :func:`argument_group`), from the compiler's own allocation for each input; ``output`` (outputs
  not written into donated inputs); ``generated_code``. *Estimates*: the compiler's temp
  allocation is one heap whose bytes are reused over the step, so it is split in the proportions
  of the live set at the peak: ``saved residual``, ``gradient``, and ``temporary`` the remainder
  (other temporaries and layout padding).

Kinds of buffers: ``parameter`` (an input of the step), ``output`` (a new parameter or state
written into a donated input, or any other output), ``saved residual`` (made in the forward pass
and alive in the backward pass; a residual the forward layer scan stacks is one from its
allocation on, with every value that holds its buffer over the loop, as is the loop's output a
copy of which the backward pass reads, and that copy, even where the schedule makes it after the
backward pass has begun), ``gradient`` (made after the forward pass, by an op of the backward
pass or of the optimizer, with a parameter leaf's shape, of the ``params`` argument where the
step has one, in any floating dtype: a user's step with f32 master weights and bf16 compute
holds bf16 and f32 gradients and the clipped ones; or made by the backward pass and alive into the optimizer update) and ``temporary`` (everything else). Phases
come from the jax op names: ``transpose(jvp(...))`` is the backward pass, ``jvp(...)`` the forward
pass, optax's code the optimizer. A value's phase is its own op's, wherever the schedule puts it
(XLA schedules an unrolled model's weight-gradient dots among the optimizer's ops, libtpu the
optimizer's among the backward's); the regions of the timeline are the split most ops with
metadata of their own agree with (copies and async moves carry an operand's name and cast no vote).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxmem.buffers.sources import Attribution, attribute
from jaxmem.buffers.xprof import OptimizedHlo, write_logdir
from jaxmem.compiler.report import MemoryReport
from jaxmem.hardware.margin import Verdict
from jaxmem.errors import JaxmemError
from jaxmem.hlo.dump import Allocation, Dump, Value
from jaxmem.hlo.text import Module
from jaxmem.hlo.values import Origin, carried, described, origin
from jaxmem.records import Configuration, Record

KINDS = ("parameter", "output", "saved residual", "gradient", "temporary")
# Beside the argument groups, a function's consumers: its outputs, then the temp heap's split.
KIND_CONSUMERS = ("output", "saved residual", "gradient", "temporary", "generated_code")
ESTIMATED = ("saved residual", "gradient", "temporary")
AGREEMENT = 0.05  # live-at-peak and the compiler's peak agree within this fraction
# Short names a user may write for a kind (``--kind temporary,residual``).
_KIND_ALIASES = {"residual": "saved residual", "saved_residual": "saved residual", "residuals": "saved residual",
                 "gradients": "gradient", "parameters": "parameter", "params": "parameter", "outputs": "output",
                 "temporaries": "temporary"}


def parse_kinds(kinds: str | Sequence[str] | None) -> tuple[str, ...]:
  """The buffer kinds named by ``kinds`` (a comma list or a sequence of :data:`KINDS`, or their
  short names such as ``residual``), in :data:`KINDS` order; empty for None (every kind). An
  unknown name is a one-line :class:`JaxmemError`."""
  if kinds is None:
    return ()
  names = kinds.split(",") if isinstance(kinds, str) else list(kinds)
  out = set()
  for n in names:
    k = n.strip().lower()
    k = _KIND_ALIASES.get(k, k)
    if k not in KINDS:
      raise JaxmemError(f"unknown buffer kind {n.strip()!r}; valid: {', '.join(KINDS)} (or residual)")
    out.add(k)
  if not out:
    raise JaxmemError(f"kinds names no buffer kind; valid: {', '.join(KINDS)}")
  return tuple(k for k in KINDS if k in out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeakBuffer(Record):
  """One buffer live at the peak."""

  size_bytes: int
  shape: str
  dtype: str
  kind: str
  hlo: str  # the defining HLO instruction, with the tuple index for loop carries
  op_name: str  # jax's name for the op, from the HLO metadata (an input's pytree path)
  source: str | None  # file:line of the innermost user frame (see jaxmem.buffers.sources), else None
  module: str  # the model class (Attention, SwiGLU, ...) or code that made it; an input's argument group
  phase: str  # where the schedule defines it: forward, backward, optimizer
  live: tuple[int, int]  # schedule positions, inclusive
  # Set when the value came out of a loop (the scan over the layers): op_name, source and module
  # are then those of ``producer``, the instruction in the loop body that computes it, and
  # ``via_loop`` is the while instruction (``hlo`` stays the loop's output as the dump names it).
  via_loop: str | None = None
  producer: str | None = None
  # file:line of the framework's frame the source line called into (Keras's, Flax's, jax's own
  # function), None where the line called none (see jaxmem.buffers.sources).
  framework: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BufferGroup(Record):
  """Buffers live at the peak that look alike: the same kind, dtype, shape, source line, op and
  module (every layer's copy of one activation, say), with how many there are and the bytes
  they occupy together. The whole live set as such groups is what a diff of two compiled steps
  matches buffers by (:mod:`jaxmem.buffers.diff`): HLO names change between compiles, these do
  not unless the program does."""

  kind: str
  dtype: str
  shape: str
  source: str | None
  op: str  # the primitive of jax's op name, after its einsum equation where there is one (short_op)
  module: str
  count: int
  size_bytes: int


def short_op(op_name: str) -> str:
  """The primitive of jax's op name, after the einsum equation it came from where there is one
  (``.../btd,df->btf/dot_general`` -> ``btd,df->btf/dot_general``, ``.../jvp(...)/eval_jaxpr/mul``
  -> ``mul``): the op without the call path and the transformations' wrappers, which differ
  between jax versions and between remat policies (a recomputed op is ``rematted_computation/...``)."""
  parts = op_name.split("/") if op_name else []
  if len(parts) > 1 and "->" in parts[-2]:
    return "/".join(parts[-2:])
  return parts[-1] if parts else ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timeline(Record):
  """Live bytes per kind at every position of the schedule, and the phases' spans."""

  bytes_by_kind: dict[str, tuple[int, ...]]
  regions: tuple[tuple[str, int, int], ...]  # (phase, first, last position)
  peak_position: int

  @property
  def length(self) -> int:
    return len(next(iter(self.bytes_by_kind.values()), ()))

  def total(self) -> list[int]:
    return [sum(v) for v in zip(*self.bytes_by_kind.values())]


# A preset train step's configuration fields, which an Explanation reads from its configuration.
_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(Configuration) if f.name not in ("target", "mesh", "num_devices"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Explanation(Record):
  """What fills one compiled step's memory, per device. See the module docstring.

  ``target``, ``mesh`` and ``num_devices`` say where it was compiled. For a preset train step
  ``configuration`` describes the step (its fields read as the explanation's own: ``r.model``,
  ``r.remat``); for a function (``jaxmem.explain(fn, *args)``) ``function`` names it and
  ``configuration`` is ``None``, so those fields read ``None``. ``as_dict()`` is flat (the
  configuration's fields at the top, as JSON has them). ``optimized_hlo`` is the compiled module
  for XProf (:meth:`to_xprof`); it is left out of :meth:`as_dict`.
  """

  target: str
  mesh: str
  num_devices: int
  configuration: Configuration | None = None
  function: str = ""
  platform: str
  footprint_bytes: int | None  # argument + output - alias + temp + generated code
  consumers: dict[str, int | None]
  estimated: tuple[str, ...]  # consumers that are estimates
  arguments: dict[str, int]  # bytes of each argument group, largest first (exact)
  peak_bytes: int | None
  peak_source: str  # "compiler", "compiler allocation" (CPU), "xla live-range dump", "reconstructed"
  live_bytes_at_peak: int | None
  peak_position: int | None
  peak_buffers: tuple[PeakBuffer, ...]  # largest first, the top N (of ``kinds`` when given)
  # The whole live set at the peak as groups of like buffers, largest first (every kind, whatever ``top``).
  live_set: tuple[BufferGroup, ...] = ()
  live_buffer_count: int
  by_module: dict[str, int]
  by_kind: dict[str, int]
  timeline: Timeline | None
  report: MemoryReport  # its ``compiled`` is None: explain does not keep the executable
  dump_files: tuple[str, ...]
  optimized_hlo: OptimizedHlo | None = None
  notes: tuple[str, ...] = ()
  # The kinds ``peak_buffers`` is limited to (empty: every kind); by_module and by_kind are the whole live set's.
  kinds: tuple[str, ...] = ()
  # The verdict against the target's capacity, as compare's rows have it (jaxmem.records.Judgement):
  # None where the target has no capacity (the CPU) or the program gave no figure. ``judgement``
  # (jaxmem.hardware.margin.Verdict) says whether it fits, by what margin and which figure it judged.
  capacity_bytes: int | None = None
  required_bytes: int | None = None
  judgement: Verdict = dataclasses.field(default_factory=Verdict)

  fits = property(lambda self: self.judgement.fits)
  verdict = property(lambda self: self.judgement.verdict)
  margin_bytes = property(lambda self: self.judgement.margin_bytes)
  risk_bytes = property(lambda self: self.judgement.risk_bytes)
  judged_figure = property(lambda self: self.judgement.judged_figure)
  naive_sum_bytes = property(lambda self: self.judgement.naive_sum_bytes)
  compiler_check = property(lambda self: self.judgement.compiler_check)

  @property
  def versions(self) -> dict[str, str]:
    """The compiler versions that produced the figures (the report's)."""
    return self.report.versions

  def __getattr__(self, name: str) -> Any:
    # Only reached for names that are not fields: the configuration's, None for a function.
    if name in _STEP_FIELDS:
      return None if self.configuration is None else getattr(self.configuration, name)
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

  def as_dict(self) -> dict[str, Any]:
    """Every field but ``optimized_hlo``, as plain dicts and lists (nested records by their own
    ``as_dict``), the configuration's fields flat at the top."""
    out: dict[str, Any] = {name: getattr(self, name) for name in ("model", "target", "mesh", "batch", "num_devices")}
    out.update({name: getattr(self, name) for name in _STEP_FIELDS})
    skip = ("optimized_hlo", "configuration")
    out.update({f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip})
    return out

  def to_xprof(self, logdir: str, run: str | None = None) -> str:
    """Writes the compiled module as an XProf logdir (``xprof --logdir LOGDIR`` opens it in the
    Memory Viewer and the Graph Viewer) and returns the ``.xplane.pb`` path written. ``run``
    defaults to the time; an existing run is an error (see
    :func:`jaxmem.buffers.xprof.write_logdir`)."""
    if self.optimized_hlo is None:
      raise JaxmemError("this explanation holds no compiled module for XProf; make it with jaxmem.explain")
    return write_logdir(self.optimized_hlo.hlo_proto, self.optimized_hlo.module_name, logdir, run=run)


def _plain(v: Any) -> Any:
  if isinstance(v, Record):
    return v.as_dict()
  if isinstance(v, (tuple, list)):
    return [_plain(x) for x in v]
  if isinstance(v, dict):
    return {k: _plain(x) for k, x in v.items()}
  return v


# ----------------------------------------------------------------------------- analyse


def analyse(
    dump: Dump,
    report: MemoryReport,
    *,
    top: int = 10,
    function: str = "",
    optimized_hlo: OptimizedHlo | None = None,
    target: str = "",
    mesh: str = "",
    kinds: str | Sequence[str] | None = None,
    framework_packages: Sequence[str] = (),
) -> Explanation:
  """Rebuilds the live set over the schedule from ``dump`` and splits the compiler's figure.

  ``function`` names the step (code without a user frame or scope is attributed to it);
  ``target`` and ``mesh`` say where it was compiled; a preset's caller adds its
  ``configuration``; ``kinds`` (see :func:`parse_kinds`) limits the listed buffers to
  those kinds; ``framework_packages`` are packages whose frames are not the user's beside
  :data:`jaxmem.buffers.sources.FRAMEWORK_PACKAGES`."""
  wanted = parse_kinds(kinds)
  notes: list[str] = []
  names = _Names(dump.hlo, fallback=function or "(step)", packages=tuple(framework_packages))
  phases = phase_regions(dump, names)
  groups = argument_groups(dump.hlo)
  kinds = kind_classifier(dump, names, phases, groups)
  tables, missing = live_values(dump, kinds)
  if missing:
    notes.append(f"{missing} values in the buffer assignment have no live range in XLA's dump; left out")
  curves = live_curves(tables, len(dump.live.sequence))
  totals = curves.sum(axis=0)
  peak_t = int(totals.argmax()) if len(totals) else 0
  live_at_peak = int(totals[peak_t]) if len(totals) else None
  live = live_at(tables, peak_t)
  buffers, by_module, by_kind, live_set = peak_buffers(live, names, groups, phases.regions, top=top, kinds=wanted)
  peak, peak_source, pnotes = peak_figure(report, dump, live_at_peak)
  arguments = argument_bytes(dump, groups)
  cotangents, grad_dtype = cotangent_bytes(tables, kinds, len(dump.live.sequence))
  consumers, cnotes = split_consumers(report, arguments, temp_live_by_kind(tables, peak_t), cotangents=cotangents,
                                      gradient_dtype=grad_dtype, param_dtypes=param_dtypes(dump, groups))
  return Explanation(
      target=target, mesh=mesh, num_devices=report.num_devices, function=function, platform=report.platform,
      footprint_bytes=None if report.total_bytes is None else report.total_bytes + (report.generated_code_size_in_bytes or 0),
      consumers=consumers, estimated=ESTIMATED, arguments=arguments, peak_bytes=peak, peak_source=peak_source,
      live_bytes_at_peak=live_at_peak, peak_position=peak_t if len(totals) else None,
      peak_buffers=tuple(buffers), live_set=live_set, live_buffer_count=len(live), by_module=by_module, by_kind=by_kind,
      timeline=Timeline(
          bytes_by_kind={k: tuple(int(x) for x in curves[i]) for i, k in enumerate(KINDS)},
          regions=phases.regions, peak_position=peak_t,
      ),
      report=report, dump_files=dump.files, optimized_hlo=optimized_hlo,
      notes=tuple(notes + pnotes + cnotes) + report.notes, kinds=wanted,
  )


class _Names:
  """Attributions of instructions and values, each computed once (see jaxmem.buffers.sources)."""

  def __init__(self, hlo: Module, *, fallback: str, packages: tuple[str, ...] = ()):
    self.hlo, self.fallback, self.packages = hlo, fallback, packages
    self._of: dict[str, Attribution] = {}
    self._own: dict[str, Attribution | None] = {}
    self._values: dict[str, tuple[Attribution, Origin | None]] = {}
    self._chains: dict[str, tuple[str, int]] = {}

  def _attribute(self, ins: Any) -> Attribution:
    return attribute(self.hlo, ins, fallback=self.fallback, packages=self.packages)

  def hold(self, keys: set[str], loop: str, index: int) -> None:
    """``keys`` hold element ``index`` of ``loop``'s carry (a stacked residual): inside the loop
    they are named, as the loop's output is, by the op in the body that computes it."""
    for k in keys:
      self._chains.setdefault(k, (loop, index))
      self._values.pop(k, None)

  def own(self, name: str) -> Attribution | None:
    """The attribution of the instruction from its own metadata or its fused computation's root,
    None for one with neither: copies, async starts and dones, tuple plumbing and the parameters
    of called computations carry the pass of an operand, not their own (on TPU the copies
    moving forward residuals between memory spaces sit all over the backward pass)."""
    if name not in self._own:
      ins = self.hlo.instructions.get(name)
      if ins is not None and not ins.op_name:
        roots = [self.hlo.computations[c].root for c in ins.calls if c in self.hlo.computations]
        ins = next((r for n in roots if n and (r := self.hlo.instructions.get(n)) is not None and r.op_name), None)
      self._own[name] = None if ins is None or not ins.op_name else self._attribute(ins)
    return self._own[name]

  def of(self, name: str) -> Attribution:
    if name not in self._of:
      self._of[name] = self._attribute(described(self.hlo, name))
    return self._of[name]

  def value(self, v: Value) -> tuple[Attribution, Origin | None]:
    """A value's attribution, from the op in the loop body that made it when it came out of a
    loop, with that loop's :class:`~jaxmem.hlo.values.Origin`."""
    if v.key not in self._values:
      idx = v.key[len(v.name):].strip("{}")
      o = origin(self.hlo, v.name, int(idx) if idx.isdigit() else None)
      if o is None and v.key in self._chains:
        o = origin(self.hlo, *self._chains[v.key])
      nfo = self.of(v.name) if o is None else self._attribute(o.instruction)
      self._values[v.key] = (nfo, o)
    return self._values[v.key]


# ----------------------------------------------------------------------------- phase regions


@dataclasses.dataclass(frozen=True, kw_only=True)
class Phases:
  """The forward / backward / optimizer spans of the schedule."""

  regions: tuple[tuple[str, int, int], ...]
  first_bwd: int  # the first backward position; the schedule's length when there is no backward pass
  last_bwd: int
  backward: bool


def phase_regions(dump: Dump, names: _Names) -> Phases:
  """Phase spans over the schedule. A few ops are scheduled out of their pass (constants and
  broadcasts hoisted early), so each boundary is the split that the most ops agree with.
  Instructions the HLO text does not print (jaxlib 0.12's elided get-tuple-elements, listed in
  the live-range schedule only) have no metadata and cast no vote."""
  seq = dump.live.sequence
  T = len(seq)
  votes = np.array([
      -1 if (a := names.own(n)) is None else {"forward": 0, "backward": 1, "optimizer": 2}.get(a.phase, -1) for n in seq
  ], dtype=np.int64)
  is_f, is_b, is_o = (votes == 0).astype(int), (votes == 1).astype(int), (votes == 2).astype(int)
  backward = bool(is_b.any())
  if backward:
    # first_bwd = s maximising forward ops before s + backward ops from s on.
    score = np.concatenate([[0], np.cumsum(is_f)]) + np.concatenate([np.cumsum(is_b[::-1])[::-1], [0]])
    first_bwd = int(score[:T].argmax())
    # last_bwd = e maximising backward ops in [first_bwd, e] + other ops after e.
    tail_b = np.cumsum(is_b[first_bwd:])
    tail_o = np.concatenate([np.cumsum(is_o[first_bwd:][::-1])[::-1][1:], [0]])
    last_bwd = first_bwd + int((tail_b + tail_o).argmax())
  else:
    first_bwd, last_bwd = T, T - 1
  regions = [("forward", 0, first_bwd - 1)] if first_bwd > 0 else []
  if backward:
    regions.append(("backward", first_bwd, last_bwd))
  if last_bwd + 1 <= T - 1:
    regions.append(("optimizer", last_bwd + 1, T - 1))
  return Phases(regions=tuple(regions), first_bwd=first_bwd, last_bwd=last_bwd, backward=backward)


# ----------------------------------------------------------------------------- kinds


@dataclasses.dataclass(frozen=True, kw_only=True)
class KindClassifier:
  """Says each live value's kind (see the module docstring)."""

  hlo: Module
  names: _Names
  phases: Phases
  # Dims of the gradients (of the `params` argument's floating-point leaves where the step has one,
  # else of every floating-point input), in any dtype: bf16 compute of f32 leaves.
  grad_dims: frozenset[str]
  carried: frozenset[str]  # values holding a stacked residual's buffer over the forward loop
  relaid: frozenset[str]  # copies of a forward loop's stacked residual made for the backward pass

  def kind(self, alloc: Allocation, v: Value, start: int, end: int) -> str:
    if alloc.kind == "parameter":
      ins = self.hlo.instructions.get(v.name)
      return "parameter" if ins is None or ins.opcode == "parameter" else "output"
    if alloc.kind in ("output", "live-out"):
      return "output"
    p = self.phases
    # By where the schedule defines it: a remat recompute inside the backward pass is a temporary.
    if p.backward and start < p.first_bwd <= end:
      return "saved residual"
    if p.backward and start < p.first_bwd and v.key in self.carried:
      return "saved residual"
    if v.key in self.relaid:
      return "saved residual"
    if p.backward and start >= p.first_bwd and self.is_gradient(v, end):
      return "gradient"
    return "temporary"

  def is_cotangent(self, v: Value) -> bool:
    """A value the backward pass makes in a floating-point dtype with a parameter leaf's shape
    (the ``params`` argument's, where the step has one): its gradient (:func:`cotangent_bytes`)."""
    dt, dims = _dtype_dims(v.shape)
    return dt in _FLOAT_DTYPES and dims in self.grad_dims and self.names.value(v)[0].phase == "backward"

  def is_gradient(self, v: Value, end: int) -> bool:
    """A value made after the forward pass by the backward pass (its op's own name says
    ``transpose(jvp(...))``, wherever the schedule puts it: XLA schedules the weight-gradient dots
    of an unrolled model among the optimizer's ops, and libtpu the optimizer's among the
    backward's) or by the optimizer, with a parameter leaf's shape in any floating dtype (the
    gradient in the compute dtype, in the master dtype, clipped or scaled), or made by the
    backward pass and alive into the optimizer (gradients XLA concatenated, such as fused q/k/v)."""
    phase = self.names.value(v)[0].phase  # a loop's output: the op in its body that made it
    dt, dims = _dtype_dims(v.shape)
    if phase in ("backward", "optimizer") and dt in _FLOAT_DTYPES and dims in self.grad_dims:
      return True
    return phase == "backward" and end > self.phases.last_bwd


def kind_classifier(dump: Dump, names: _Names, phases: Phases, groups: dict[int, str] | None = None) -> KindClassifier:
  inputs = [a for a in dump.allocations if a.kind == "parameter" and a.color == 0]
  param_dims = frozenset(dims for a in inputs for v in a.values for dt, dims in [_dtype_dims(v.shape)] if dt in _FLOAT_DTYPES)
  # The gradients' shapes: the `params` argument's where the step has one (not the data's, whose
  # cotangents the backward pass makes too), else every floating-point input's.
  named = [a for a in inputs if (groups or {}).get(a.parameter) == "params"]
  grad_dims = frozenset(
      dims for a in named for v in a.values for dt, dims in [_dtype_dims(v.shape)] if dt in _FLOAT_DTYPES
  ) if named else param_dims
  chains, relaid = carried_residuals(dump, names, phases) if phases.backward else (set(), set())
  held: set[str] = set()
  for loop, index in chains:
    keys = carried(dump.hlo, loop, index)
    names.hold(keys, loop, index)
    held |= keys
  return KindClassifier(
      hlo=dump.hlo, names=names, phases=phases, grad_dims=grad_dims,
      carried=frozenset(held), relaid=frozenset(relaid),
  )


def carried_residuals(dump: Dump, names: _Names, phases: Phases) -> tuple[set[tuple[str, int]], set[str]]:
  """The forward loops' stacked residuals, as (while, tuple index) chains, and the copies of them
  made outside any loop body for the backward pass.

  A residual the forward pass's layer scan stacks is one buffer over the loop's life: the zeros
  the loop starts from, the body's parameter, the stacked write in the body and the loop's output
  element. Often only a copy of that output (a relayout before the backward loop) is alive when
  the backward pass starts; either way the whole chain is the saved residual, from the moment it
  is allocated, not a temporary that turns into one after the loop. (The copy alive in the
  backward pass may be in another memory space: libtpu moves residuals into VMEM.) The relayout
  may also come after the backward pass has begun: the CUDA plugin 0.12.0.1 schedules the copies
  of the stacked residuals between the loss head's backward ops and the backward loop (0.10.2
  put them before the head's backward). Such a copy of a forward loop's output, made outside any
  loop body, is the saved residual too, not a backward temporary.
  """
  hlo, live, first_bwd = dump.hlo, dump.live, phases.first_bwd
  position = {n: i for i, n in enumerate(live.sequence)}
  chains: set[tuple[str, int]] = set()
  copies: list[tuple[str, tuple[str, int]]] = []
  for a in dump.allocations:
    if a.kind in ("parameter", "thread-local"):
      continue
    for v in a.values:
      r = live.ranges.get(v.key)
      if r is None or r[1] < first_bwd:
        continue
      _, o = names.value(v)
      if o is None or o.index is None or position.get(o.loop, len(live.sequence)) >= first_bwd:
        continue
      if r[0] < first_bwd:
        chains.add((o.loop, o.index))
      elif _computation(hlo, v.name) == _computation(hlo, o.loop):
        copies.append((v.key, (o.loop, o.index)))
  return chains, {key for key, chain in copies if chain in chains}


# ----------------------------------------------------------------------------- live curves


@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveTable:
  """One allocation's values with live ranges: ``rows[i]`` is (start, end, offset, stop, kind
  index) of ``values[i]``, positions inclusive and bytes [offset, stop) in the allocation."""

  alloc: Allocation
  values: tuple[Value, ...]
  rows: np.ndarray


def live_values(dump: Dump, kinds: KindClassifier) -> tuple[list[LiveTable], int]:
  """The device-memory allocations' values with their live ranges and kinds, and how many
  values have no live range."""
  tables, missing = [], 0
  for a in dump.allocations:
    if a.color != 0 or a.kind == "thread-local":
      continue  # other memory spaces (TPU VMEM, SMEM, host) and per-thread scratch
    values, rows = [], []
    for v in a.values:
      r = dump.live.ranges.get(v.key)
      if r is None:
        missing += 1
        continue
      values.append(v)
      rows.append((r[0], r[1], v.offset, v.offset + v.size, KINDS.index(kinds.kind(a, v, *r))))
    if rows:
      tables.append(LiveTable(alloc=a, values=tuple(values), rows=np.array(rows, dtype=np.int64)))
  return tables, missing


def live_curves(tables: list[LiveTable], length: int) -> np.ndarray:
  """[kind, position] bytes live in device memory, overlapping bytes of an allocation once."""
  curves = np.zeros((len(KINDS), length), dtype=np.int64)
  for t in tables:
    arr = t.rows
    for pos in range(length):
      sel = arr[(arr[:, 0] <= pos) & (arr[:, 1] >= pos)]
      if len(sel):
        _occupy(sel, curves[:, pos])
  return curves


def cotangent_bytes(tables: list[LiveTable], kinds: KindClassifier, length: int) -> tuple[int, str | None]:
  """The most bytes the parameters' gradients occupy at once in the temp heap, and the dtype
  most of them are in: values the backward pass makes with a floating-point parameter leaf's
  shape (the cotangents of the parameter arguments; in the compute dtype where the step casts
  its parameters, the conversion to theirs then fused into the optimizer's update), overlapping
  bytes once. The peak's live set may hold none of them (a step whose peak is in the forward
  pass), so the gradient consumer is read from these, not from the peak alone."""
  picked, by_dtype = [], Counter()
  for t in tables:
    if t.alloc.kind != "temp":
      continue
    keep = [i for i, v in enumerate(t.values) if kinds.is_cotangent(v)]
    if keep:
      picked.append(LiveTable(alloc=t.alloc, values=tuple(t.values[i] for i in keep), rows=t.rows[keep]))
      for i in keep:
        by_dtype[_dtype_dims(t.values[i].shape)[0]] += t.values[i].size
  if not picked:
    return 0, None
  return int(live_curves(picked, length).sum(axis=0).max()), by_dtype.most_common(1)[0][0]


def temp_live_by_kind(tables: list[LiveTable], position: int) -> dict[str, int]:
  """The temp heap's live bytes at ``position``, by kind: the proportions temp is split in."""
  out = dict.fromkeys(KINDS, 0)
  for t in tables:
    if t.alloc.kind != "temp":
      continue
    sel = t.rows[(t.rows[:, 0] <= position) & (t.rows[:, 1] >= position)]
    if len(sel):
      acc = np.zeros(len(KINDS), dtype=np.int64)
      _occupy(sel, acc)
      for i, k in enumerate(KINDS):
        out[k] += int(acc[i])
  return out


def _occupy(sel: np.ndarray, out: np.ndarray) -> None:
  """Adds the bytes the live rows ``sel`` occupy to ``out[kind]``; overlapping bytes once,
  charged to the row that first covers them (rows by offset)."""
  sel = sel[np.lexsort((-sel[:, 3], sel[:, 2]))]
  reach = -1
  for s, e, k in zip(sel[:, 2], sel[:, 3], sel[:, 4]):
    if e <= reach:
      continue
    out[k] += e - max(s, reach)
    reach = e


# ----------------------------------------------------------------------------- the peak


@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveBuffer:
  """A value live at a position, with the bytes it alone occupies (aliases counted once)."""

  own_bytes: int
  alloc: Allocation
  value: Value
  start: int
  end: int
  kind: str


def live_at(tables: list[LiveTable], position: int) -> list[LiveBuffer]:
  """The live set at ``position``, largest first, each byte counted once (aliases share memory:
  of overlapping values the larger owns the bytes)."""
  out = []
  for t in tables:
    idx = np.nonzero((t.rows[:, 0] <= position) & (t.rows[:, 1] >= position))[0]
    covered: list[tuple[int, int]] = []
    for i in sorted(idx, key=lambda i: (-(t.rows[i, 3] - t.rows[i, 2]), t.rows[i, 2])):
      s, e = int(t.rows[i, 2]), int(t.rows[i, 3])
      own = _uncovered(s, e, covered)
      if own > 0:
        out.append(LiveBuffer(own_bytes=own, alloc=t.alloc, value=t.values[i], start=int(t.rows[i, 0]),
                              end=int(t.rows[i, 1]), kind=KINDS[int(t.rows[i, 4])]))
        covered.append((s, e))
  out.sort(key=lambda b: -b.own_bytes)
  return out


def peak_buffers(
    live: list[LiveBuffer], names: _Names, groups: dict[int, str], regions: tuple[tuple[str, int, int], ...], *, top: int,
    kinds: tuple[str, ...] = (),
) -> tuple[list[PeakBuffer], dict[str, int], dict[str, int], tuple[BufferGroup, ...]]:
  """The ``top`` largest of the live set (of ``kinds`` when given) as :class:`PeakBuffer`, the
  whole set's bytes by module and by kind, and the whole set as :class:`BufferGroup`. An
  input's module is its argument group."""
  by_module: dict[str, int] = defaultdict(int)
  by_kind: dict[str, int] = dict.fromkeys(KINDS, 0)
  alike: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
  out = []
  for b in live:
    v = b.value
    nfo, o = names.value(v)
    if b.alloc.kind == "temp":
      module = nfo.module
    elif b.kind == "parameter":
      module = groups.get(b.alloc.parameter, "inputs")
    else:
      module = "constants" if b.alloc.kind == "constant" else "outputs"
    by_module[module] += b.own_bytes
    by_kind[b.kind] += b.own_bytes
    dt, dims = _dtype_dims(v.shape)
    group = alike[(b.kind, dt or "tuple", f"[{dims}]" if dt else v.shape, nfo.source, short_op(nfo.op_name), module)]
    group[0] += 1
    group[1] += b.own_bytes
    if len(out) < top and (not kinds or b.kind in kinds):
      out.append(PeakBuffer(
          size_bytes=b.own_bytes, shape=f"[{dims}]" if dt else v.shape, dtype=dt or "tuple", kind=b.kind,
          hlo=v.key.removesuffix("{}"), op_name=nfo.op_name, source=nfo.source, module=module,
          phase=_region(regions, b.start), live=(b.start, b.end),
          via_loop=o.loop if o else None, producer=o.instruction.name if o else None, framework=nfo.framework,
      ))
  live_set = tuple(sorted(
      (BufferGroup(kind=k, dtype=dt, shape=shape, source=src, op=op, module=m, count=n, size_bytes=size)
       for (k, dt, shape, src, op, m), (n, size) in alike.items()),
      key=lambda g: (-g.size_bytes, g.kind, g.source or "", g.op),
  ))
  return out, dict(sorted(by_module.items(), key=lambda kv: -kv[1])), by_kind, live_set


def peak_figure(report: MemoryReport, dump: Dump, live_at_peak: int | None) -> tuple[int | None, str, list[str]]:
  """The compiler's peak, or on CPU the memory its buffer assignment allocates for the step;
  where it came from; and notes (also when the live set is far from it)."""
  notes: list[str] = []
  peak, source = report.peak_memory_in_bytes, "compiler"
  xla_peak = dump.live.xla_peak_bytes
  if peak is None and report.total_bytes is not None:
    # Not the live-range dump's "peak usage" line: XLA picks that moment sizing each value by its
    # defining instruction's shape (hlo_live_range.cc, ComputePeakMemoryMoment), so a stacked
    # residual carried by a loop counts as its tuple's pointer table, and the moment can miss a
    # peak inside a loop. It matched the live set on jaxlib 0.10.2's XLA:CPU; on 0.12.0.1's it
    # names a forward-pass moment 17% below the backward loop's peak. The temp heap is sized by
    # XLA's heap simulation to the most its temporaries occupy at once.
    peak, source = report.total_bytes, "compiler allocation"
    notes.append(
        "peak_bytes: XLA:CPU reports no peak; this is the device memory its buffer assignment "
        "allocates for the step (argument + output - alias + temp; the temp heap holds the most the "
        "step's temporaries occupy at once in XLA's simulation of the schedule, not a device measurement)"
    )
    if xla_peak and abs(xla_peak - peak) > AGREEMENT * peak:
      notes.append(
          f"XLA's live-range dump calls {xla_peak:,} bytes its peak usage; it chooses that "
          f"moment counting loop-carried values by their tuple's size, so it can miss a peak inside a loop"
      )
  elif peak is None and xla_peak:
    peak, source = xla_peak, "xla live-range dump"
    notes.append(
        "peak_bytes: the backend reports no peak and no memory analysis; this is the peak usage "
        "line of XLA's live-range dump (a simulation of the schedule, not a device measurement)"
    )
  elif peak is None:
    peak, source = live_at_peak, "reconstructed"
    notes.append("peak_bytes: the backend reports no peak; this is jaxmem's reconstruction")
  if peak and live_at_peak is not None and abs(live_at_peak - peak) > AGREEMENT * peak:
    notes.append(
        f"live_bytes_at_peak is {(live_at_peak - peak) / peak:+.1%} off the compiler's peak: the compiler counts "
        f"memory its dumped buffer assignment does not place in device memory (libtpu does so for programs "
        f"whose temporaries fit in on-chip VMEM); the buffer list shows the part XLA's dump explains"
    )
  return peak, source, notes


# ----------------------------------------------------------------------------- consumers


def argument_group(op_name: str, number: int) -> str:
  """The consumer an input of the step is counted under, from the pytree path jax names it by
  (the parameter's ``op_name``): the argument's name and the first attribute below it, past
  sequence indices and before any dict key: ``opt_state.mu`` for ``opt_state[0].mu['w']``,
  ``params`` for ``params['layers']['w']``, ``model.layers`` for ``model.layers[0].attn.w``.
  Containers of state (optax's named tuples) split; trees of parameters do not."""
  m = re.match(r"[A-Za-z_]\w*", op_name)
  if m is None:
    return f"argument {number}"
  for key in re.finditer(r"\[(?:'[^']*'|\"[^\"]*\"|[^\]]*)\]|\.([A-Za-z_]\w*)", op_name[m.end():]):
    if key.group(1):
      return f"{m.group(0)}.{key.group(1)}"
    if key.group(0)[1:2] in ("'", '"'):
      break
  return m.group(0)


def argument_groups(hlo: Module) -> dict[int, str]:
  """Entry parameter number -> its argument group."""
  entry = hlo.computations.get(hlo.entry or "")
  params = [i for i in entry.instructions.values() if i.opcode == "parameter"] if entry else []
  return {i.index: argument_group(i.op_name, i.index) for i in params if i.index is not None}


def argument_bytes(dump: Dump, groups: dict[int, str]) -> dict[str, int]:
  """Bytes of device memory the compiler allocates for each argument group, largest first."""
  out: dict[str, int] = defaultdict(int)
  for a in dump.allocations:
    if a.kind == "parameter" and a.color == 0 and a.parameter is not None:
      out[groups.get(a.parameter, f"argument {a.parameter}")] += a.size
  return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def param_dtypes(dump: Dump, groups: dict[int, str]) -> dict[str, int]:
  """Bytes of the ``params`` argument group's allocations by dtype (empty without one)."""
  out: dict[str, int] = Counter()
  for a in dump.allocations:
    if a.kind == "parameter" and a.color == 0 and groups.get(a.parameter) == "params":
      for v in a.values:
        out[_dtype_dims(v.shape)[0]] += v.size
  return dict(out)


def split_consumers(
    report: MemoryReport, arguments: dict[str, int], live_temp: dict[str, int], *, cotangents: int = 0,
    gradient_dtype: str | None = None, param_dtypes: dict[str, int] | None = None,
) -> tuple[dict[str, int | None], list[str]]:
  """The footprint split into the argument groups and :data:`KIND_CONSUMERS` (see the module
  docstring); sums to argument + output - alias + temp + generated code. ``gradient`` is the
  larger of the gradients' share of the peak's live set and ``cotangents`` (the parameters'
  gradients at their most, :func:`cotangent_bytes`), within what the residuals leave of temp."""
  notes: list[str] = []
  r = report
  fields = (r.argument_size_in_bytes, r.output_size_in_bytes, r.alias_size_in_bytes, r.temp_size_in_bytes)
  if None in fields:
    notes.append("consumers: the compiler did not report every memory field; no split")
    return dict.fromkeys([*arguments, *KIND_CONSUMERS]), notes
  arg, out, alias, temp = fields
  live_sum = sum(live_temp.values())
  if live_sum and temp:
    gradient = int(temp * live_temp["gradient"] / max(live_sum, temp))
    residual = int(temp * live_temp["saved residual"] / max(live_sum, temp))
  else:
    gradient = residual = 0
    if not temp:
      notes.append("consumers: the compiler reports no temp allocation in device memory (on TPU, small "
                   "programs keep their temporaries in VMEM), so saved residuals and gradients are 0 here")
  gradient = min(max(gradient, cotangents), (temp or 0) - residual)
  notes += gradient_notes(gradient, arguments.get("params"), gradient_dtype, param_dtypes or {}) if temp else []
  consumers: dict[str, int | None] = {(f"{k} (argument)" if k in KIND_CONSUMERS else k): v for k, v in arguments.items()}
  # What the parameter allocations do not cover (none was seen on CPU, GPU or TPU) stays in the total.
  unplaced = arg - sum(arguments.values())
  if unplaced:
    notes.append(f"consumers: {unplaced:,} argument bytes are in no parameter allocation of XLA's dump; counted as temporary")
  consumers.update({
      "output": out - alias, "saved residual": residual, "gradient": gradient,
      "temporary": temp - residual - gradient + unplaced, "generated_code": r.generated_code_size_in_bytes or 0,
  })
  return consumers, notes


def gradient_notes(gradient: int, params: int | None, dtype: str | None, param_dtypes: dict[str, int]) -> list[str]:
  """Why the gradient consumer is not the ``params`` group's bytes in the gradients' dtype, where
  it is more than 5% off it (nothing where the step has no ``params`` argument)."""
  if not params or not param_dtypes:
    return []
  # Elements of params, from its bytes and the share of them each dtype holds.
  elements = params * sum(b * 8 / _BITS.get(dt, 32) for dt, b in param_dtypes.items()) / sum(param_dtypes.values())
  expected = round(elements * _BITS.get(dtype or "", 32) / 8) if dtype else params
  said = [] if dtype is None or set(param_dtypes) == {dtype} else [
      f"gradient: the backward pass makes the parameters' gradients in {dtype}, the step's compute dtype "
      f"({expected:,} bytes for params), and converts them to {'/'.join(sorted(param_dtypes))} inside the "
      "optimizer's update, where XLA fuses the conversion"
  ]
  if abs(gradient - expected) > 0.05 * expected:
    said.append(
        f"gradient: {gradient:,} bytes, {gradient / expected:.0%} of params' gradients ({expected:,}): "
        + ("the compiler never holds them all at once (it frees each layer's after its update, or fuses parts "
           "into the update)" if gradient < expected else
           "more than one copy of some gradients is live at once (in another dtype, clipped or accumulated)")
    )
  return said


# ----------------------------------------------------------------------------- helpers

_BITS = {"f64": 64, "f32": 32, "bf16": 16, "f16": 16, "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3": 8, "f8e5m2fnuz": 8,
         "f8e4m3fnuz": 8}


_FLOAT_DTYPES = frozenset({"f64", "f32", "bf16", "f16", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e5m2fnuz", "f8e4m3fnuz"})


def _dtype_dims(shape: str) -> tuple[str, str]:
  m = re.match(r"^(\w+)\[([\d,]*)\]", shape)
  return (m.group(1), m.group(2)) if m else ("", "")


def _computation(hlo: Module, name: str) -> str | None:
  ins = hlo.instructions.get(name)
  return None if ins is None else ins.computation


def _region(regions: tuple[tuple[str, int, int], ...], position: int) -> str:
  for name, first, last in regions:
    if first <= position <= last:
      return name
  return "other"


def _uncovered(s: int, e: int, covered: list[tuple[int, int]]) -> int:
  own = e - s
  for cs, ce in covered:
    own -= max(0, min(e, ce) - max(s, cs))
  return max(0, own)

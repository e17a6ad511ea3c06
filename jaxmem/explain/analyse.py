"""What fills the memory of a train step: consumers, the buffers live at the peak, a timeline.

:func:`explain` compiles one configuration with XLA's dump enabled and reads the optimized
module's buffer assignment (which HLO value sits where in which allocation), its schedule and
live ranges (when each value is alive), and the HLO metadata (the jax op name and the Python
source of each instruction). From these it rebuilds, for every position of the schedule, the
bytes occupied in the device's main memory (memory color 0: HBM; on TPU, VMEM and the other
on-chip spaces are left out), stacked by kind, and the set live at the peak.

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
- ``consumers`` sum to ``compiler_bytes`` = argument + output - alias + temp + generated code
  (``memory_analysis()``): ``params`` and ``optimizer_state`` are exact (the input trees and
  their shardings), ``generated_code`` is exact (the compiler's figure). ``gradients`` and
  ``activations`` are *estimates*: the compiler's temp allocation is one heap whose bytes are
  reused over the step, so it is split in the proportions of the live set at the peak (saved
  residuals -> activations, gradients -> gradients); ``workspace`` is the remainder: other
  temporaries, the token batch, non-donated outputs and layout padding.

Kinds of buffers: ``parameter`` (an input of the step: parameters, optimizer state, tokens),
``output`` (a new parameter or state written into a donated input, or the loss),
``saved residual`` (made in the forward pass and alive in the backward pass; a residual the
forward layer scan stacks is one from its allocation on, with every value that holds its
buffer over the loop, as is the loop's output a copy of which the backward pass reads, and
that copy, even where the schedule makes it after the backward pass has begun), ``gradient``
(made in the backward pass with a parameter's shape, or alive into the optimizer update) and
``temporary`` (everything else). Phases come from the jax op names: ``transpose(jvp(...))`` is
the backward pass, ``jvp(...)`` the forward pass, what follows the backward pass the optimizer.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxmem._quiet import quiet
from jaxmem.compiler.report import MemoryReport, Refusal, read_compiled
from jaxmem.errors import JaxmemError
from jaxmem.hlo.dump import Dump, Hlo, read_dump  # noqa: F401  (Dump for analyse's callers)
from jaxmem.planning.plan import plan
from jaxmem.planning.sweep import moe_fields
from jaxmem.program import sharding as shd
from jaxmem.program.train import build_train_program
from jaxmem.records import Configuration, Record
from jaxmem.workload import Workload

KINDS = ("parameter", "output", "saved residual", "gradient", "temporary")
CONSUMERS = ("params", "gradients", "optimizer_state", "activations", "workspace", "generated_code")
ESTIMATED = ("gradients", "activations", "workspace")
AGREEMENT = 0.05  # live-at-peak and the compiler's peak agree within this fraction


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeakBuffer(Record):
  """One buffer live at the peak."""

  size_bytes: int
  shape: str
  dtype: str
  kind: str
  hlo: str  # the defining HLO instruction, with the tuple index for loop carries
  op_name: str  # jax's name for the op, from the HLO metadata
  source: str | None  # file:line of the innermost frame outside jax/flax/optax, else None
  module: str  # the model class (Attention, SwiGLU, ...) or code that made it
  phase: str  # where the schedule defines it: forward, backward, optimizer
  live: tuple[int, int]  # schedule positions, inclusive
  # Set when the value came out of a loop (the scan over the layers): op_name, source and module
  # are then those of ``producer``, the instruction in the loop body that computes it, and
  # ``via_loop`` is the while instruction (``hlo`` stays the loop's output as the dump names it).
  via_loop: str | None = None
  producer: str | None = None


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Explanation(Configuration):
  """What fills one configuration's memory, per device. See the module docstring."""

  platform: str
  compiler_bytes: int | None  # argument + output - alias + temp + generated code
  consumers: dict[str, int | None]
  estimated: tuple[str, ...]  # consumers that are estimates
  peak_bytes: int | None
  peak_source: str  # "compiler" or "xla live-range dump" (CPU)
  live_bytes_at_peak: int | None
  peak_position: int | None
  peak_buffers: tuple[PeakBuffer, ...]  # largest first, the top N
  live_buffer_count: int
  by_module: dict[str, int]
  by_kind: dict[str, int]
  timeline: Timeline | None
  report: MemoryReport
  dump_files: tuple[str, ...]
  notes: tuple[str, ...] = ()

  @property
  def versions(self) -> dict[str, str]:
    """The compiler versions that produced the figures (the report's)."""
    return self.report.versions


# ----------------------------------------------------------------------------- compile


def explain(workload: Workload | None = None, /, *, top: int = 10, **fields: Any) -> Explanation:
  """Compiles one configuration and explains its memory.

  ``workload`` (with ``fields`` replaced) names one mesh, one optimizer and one remat policy
  (``none`` unless another is named); ``top`` is how many of the buffers live at the peak to keep.
  """
  w = Workload.of(workload, {"remat": "none"}, **fields)
  if top < 1:
    raise JaxmemError(f"--top must be at least 1 (got {top})")
  for what, v in (("remat", w.remat), ("optimizer", w.optimizer), ("mesh", w.mesh), ("moe-impl", w.moe_impl),
                  ("capacity-factor", tuple(f"{f:g}" for f in w.capacity_factor))):
    if len(v) > 1:
      raise JaxmemError(f"explain takes one {what} (got {', '.join(v)}); run it once per {what}")
  p = plan(w)
  m, opt, rp = p.configs()[-1]  # the remat list starts with "none"; the last is the one named
  prog = build_train_program(p.cfg, remat=rp, optimizer=opt, batch=p.batch, seq=p.seq, target=p.target, mesh=m)
  lowered = prog.trace().lower()
  with tempfile.TemporaryDirectory(prefix="jaxmem-explain-") as d:
    try:
      with quiet():
        # The three backends honour these two options alike (checked on jaxlib 0.10.2).
        compiled = lowered.compile({"xla_dump_to": d, "xla_dump_hlo_as_text": True})
    except jax.errors.JaxRuntimeError as e:
      refusal = Refusal.of(e)
      need = "" if refusal.required_bytes is None else f" (needs {refusal.required_bytes:,} bytes)"
      raise JaxmemError(
          f"the compiler refused this configuration{need}, so there is no plan to explain: {refusal.error}"
      ) from None
    dump = read_dump(d)
  report = read_compiled(compiled)
  result = analyse(
      dump,
      report,
      param_bytes=prog.param_bytes,
      optimizer_state_bytes=prog.optimizer_state_bytes,
      top=top,
      labels=dict(
          model=p.cfg.name, target=p.target.name, mesh=shd.format_mesh(m), remat=rp.name,
          optimizer=opt.name, batch=p.batch, seq=p.seq, param_dtype=p.cfg.param_dtype, dtype=p.cfg.dtype,
          **moe_fields(p.cfg),
      ),
  )
  return dataclasses.replace(result, notes=result.notes + p.moe_notes) if p.moe_notes else result


# ----------------------------------------------------------------------------- analysis


_LIBRARY = ("site-packages", "/jax/", "/jaxlib/", "/flax/", "/optax/", "<frozen")


def _phase(op_name: str, files: Sequence[str]) -> str:
  if "transpose(jvp" in op_name:
    return "backward"
  if "jvp(" in op_name:
    return "forward"
  if any("/optax/" in f for f in files):
    return "optimizer"
  return "other"


def _dtype_dims(shape: str) -> tuple[str, str]:
  m = re.match(r"^(\w+)\[([\d,]*)\]", shape)
  return (m.group(1), m.group(2)) if m else ("", "")


@dataclasses.dataclass
class _Info:
  op_name: str
  source: str | None
  module: str
  phase: str


def _info(hlo: Hlo, name: str) -> _Info:
  return _described(hlo, hlo.described(name))


def _described(hlo: Hlo, ins) -> _Info:
  if ins is None:
    return _Info("", None, "(compiler)", "other")
  stack = hlo.stack(ins.frame)
  files = [f for f, _, _ in stack]
  source = module = None
  for f, fn, line in stack:
    if not any(s in f for s in _LIBRARY):
      if source is None:
        source = f"{_short(f)}:{line}"
      if module is None and "." in fn and not fn.startswith("<") and "<locals>" not in fn.split(".")[0]:
        module = fn.split(".")[0]
  if module is None:
    # Model code in a plain function (rope's apply_rope): XLA keeps only the innermost frames of
    # a scanned layer, so the method that called it is often not there; the function names it.
    module = next((fn for f, fn, _ in stack if "/models/" in f and not any(s in f for s in _LIBRARY) and not fn.startswith("<")), None)
  if module is None:
    opt = next((fn for f, fn, _ in stack if "/optax/" in f), None)
    module = f"optax {opt.split('.')[0]}" if opt else ("train_step" if stack else "(compiler)")
  return _Info(ins.op_name, source, module, _phase(ins.op_name, files))


def _short(path: str) -> str:
  for marker in ("/models/", "/jaxmem/"):
    if marker in path:
      return marker.strip("/") + "/" + path.split(marker, 1)[1]
  return path


def analyse(
    dump: Dump,
    report: MemoryReport,
    *,
    param_bytes: int | None,
    optimizer_state_bytes: int | None,
    top: int = 10,
    labels: dict[str, Any] | None = None,
) -> Explanation:
  """Rebuilds the live set over the schedule from ``dump`` and splits the compiler's figure."""
  notes: list[str] = []
  hlo, live = dump.hlo, dump.live
  T = len(live.sequence)
  infos: dict[str, _Info] = {}

  def info(name):
    if name not in infos:
      infos[name] = _info(hlo, name)
    return infos[name]

  def attribution(v) -> tuple[_Info, Any]:
    """A value's info, from the op in the loop body that made it when it came out of a loop."""
    idx = v.key[len(v.name):].strip("{}")
    origin = hlo.origin(v.name, int(idx) if idx.isdigit() else None)
    if origin is None:
      return info(v.name), None
    return _described(hlo, origin.instruction), origin

  # Phase spans over the schedule. A few ops are scheduled out of their pass (constants and
  # broadcasts hoisted early), so each boundary is the split that the most ops agree with.
  # Instructions the HLO text does not print (jaxlib 0.12's elided get-tuple-elements, listed in
  # the live-range schedule only) have no metadata and cast no vote (-1).
  phases = np.array([
      -1 if n not in hlo.instructions else ("forward", "backward").index(p) if p in ("forward", "backward") else 2
      for n, p in ((n, info(n).phase) for n in live.sequence)
  ])
  is_f, is_b, is_o = (phases == 0).astype(int), (phases == 1).astype(int), (phases == 2).astype(int)
  bwd = bool(is_b.any())
  if bwd:
    # first_bwd = s maximising forward ops before s + backward ops from s on.
    score = np.concatenate([[0], np.cumsum(is_f)]) + np.concatenate([np.cumsum(is_b[::-1])[::-1], [0]])
    first_bwd = int(score[: T].argmax())
    # last_bwd = e maximising backward ops in [first_bwd, e] + other ops after e.
    tail_b = np.cumsum(is_b[first_bwd:])
    tail_o = np.concatenate([np.cumsum(is_o[first_bwd:][::-1])[::-1][1:], [0]])
    last_bwd = first_bwd + int((tail_b + tail_o).argmax())
  else:
    first_bwd, last_bwd = T, T - 1
  regions = [("forward", 0, first_bwd - 1)] if first_bwd > 0 else []
  if bwd:
    regions.append(("backward", first_bwd, last_bwd))
  if last_bwd + 1 <= T - 1:
    regions.append(("optimizer", last_bwd + 1, T - 1))

  param_dims = set()
  for a in dump.allocations:
    if a.kind == "parameter" and a.color == 0:
      for v in a.values:
        param_dims.add(_dtype_dims(v.shape))

  # A residual the forward pass's layer scan stacks is one buffer over the loop's life: the zeros
  # the loop starts from, the body's parameter, the stacked write in the body and the loop's
  # output element. Often only a copy of that output (a relayout before the backward loop) is
  # alive when the backward pass starts; either way the whole chain is the saved residual, from
  # the moment it is allocated, not a temporary that turns into one after the loop. (The copy
  # alive in the backward pass may be in another memory space: libtpu moves residuals into VMEM.)
  # The relayout may also come after the backward pass has begun: the CUDA plugin 0.12.0.1
  # schedules the copies of the stacked residuals between the loss head's backward ops and the
  # backward loop (0.10.2 put them before the head's backward). Such a copy of a forward loop's
  # output, made outside any loop body, is the saved residual too, not a backward temporary.
  carried: set[str] = set()
  relaid: set[str] = set()
  if bwd:
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
        _, origin = attribution(v)
        if origin is None or origin.index is None or position.get(origin.loop, T) >= first_bwd:
          continue
        if r[0] < first_bwd:
          chains.add((origin.loop, origin.index))
        elif _computation(hlo, v.name) == _computation(hlo, origin.loop):
          copies.append((v.key, (origin.loop, origin.index)))
    for loop, index in chains:
      carried |= hlo.carried(loop, index)
    relaid = {key for key, chain in copies if chain in chains}

  def kind_of(alloc, v, start, end) -> str:
    if alloc.kind == "parameter":
      ins = hlo.instructions.get(v.name)
      return "parameter" if ins is None or ins.opcode == "parameter" else "output"
    if alloc.kind in ("output", "live-out"):
      return "output"
    # By where the schedule defines it: a remat recompute inside the backward pass is a temporary.
    if bwd and start < first_bwd <= end:
      return "saved residual"
    if bwd and start < first_bwd and v.key in carried:
      return "saved residual"
    if v.key in relaid:
      return "saved residual"
    if bwd and first_bwd <= start <= last_bwd and (_dtype_dims(v.shape) in param_dims or (bwd and end > last_bwd)):
      return "gradient"
    return "temporary"

  # Per allocation, the live values as (start, end, offset, stop, kind, value) rows.
  tables = []
  missing = 0
  for a in dump.allocations:
    if a.color != 0 or a.kind == "thread-local":
      continue  # other memory spaces (TPU VMEM, SMEM, host) and per-thread scratch
    rows = []
    for v in a.values:
      r = live.ranges.get(v.key)
      if r is None:
        missing += 1
        continue
      rows.append((r[0], r[1], v.offset, v.offset + v.size, KINDS.index(kind_of(a, v, *r)), v))
    if rows:
      tables.append((a, rows, np.array([row[:5] for row in rows], dtype=np.int64)))
  if missing:
    notes.append(f"{missing} values in the buffer assignment have no live range in XLA's dump; left out")

  curves = np.zeros((len(KINDS), T), dtype=np.int64)
  for _, _, arr in tables:
    for t in range(T):
      sel = arr[(arr[:, 0] <= t) & (arr[:, 1] >= t)]
      if len(sel):
        _occupy(sel, curves[:, t])
  totals = curves.sum(axis=0)
  peak_t = int(totals.argmax()) if T else 0
  live_at_peak = int(totals[peak_t]) if T else None

  # The live set at the peak, each byte counted once (aliases share memory).
  buffers: list[tuple[int, Any, Any, int]] = []
  for a, rows, arr in tables:
    idx = np.nonzero((arr[:, 0] <= peak_t) & (arr[:, 1] >= peak_t))[0]
    covered: list[tuple[int, int]] = []
    for i in sorted(idx, key=lambda i: (-(rows[i][3] - rows[i][2]), rows[i][2])):
      s, e = rows[i][2], rows[i][3]
      own = _uncovered(s, e, covered)
      if own > 0:
        buffers.append((own, a, rows[i], rows[i][4]))
        covered.append((s, e))
  buffers.sort(key=lambda b: -b[0])
  by_module: dict[str, int] = defaultdict(int)
  by_kind: dict[str, int] = {k: 0 for k in KINDS}
  peak_buffers = []
  for own, a, row, k in buffers:
    v = row[5]
    nfo, origin = attribution(v)
    module = nfo.module if a.kind == "temp" else ("inputs" if KINDS[k] == "parameter" else "outputs")
    by_module[module] += own
    by_kind[KINDS[k]] += own
    if len(peak_buffers) < top:
      dt, dims = _dtype_dims(v.shape)
      peak_buffers.append(
          PeakBuffer(
              size_bytes=own, shape=f"[{dims}]" if dt else v.shape, dtype=dt or "tuple", kind=KINDS[k],
              hlo=v.key.removesuffix("{}"), op_name=nfo.op_name, source=nfo.source, module=module,
              phase=_region(regions, int(row[0])), live=(int(row[0]), int(row[1])),
              via_loop=origin.loop if origin else None, producer=origin.instruction.name if origin else None,
          )
      )

  # The compiler's peak, or on CPU the memory its buffer assignment allocates for the step.
  peak, peak_source = report.peak_memory_in_bytes, "compiler"
  if peak is None and report.total_bytes is not None:
    # Not the live-range dump's "peak usage" line: XLA picks that moment sizing each value by its
    # defining instruction's shape (hlo_live_range.cc, ComputePeakMemoryMoment), so a stacked
    # residual carried by a loop counts as its tuple's pointer table, and the moment can miss a
    # peak inside a loop. It matched the live set on jaxlib 0.10.2's XLA:CPU; on 0.12.0.1's it
    # names a forward-pass moment 17% below the backward loop's peak. The temp heap is sized by
    # XLA's heap simulation to the most its temporaries occupy at once.
    peak, peak_source = report.total_bytes, "compiler allocation"
    notes.append(
        "peak_bytes: XLA:CPU reports no peak; this is the device memory its buffer assignment "
        "allocates for the step (argument + output - alias + temp; the temp heap holds the most the "
        "step's temporaries occupy at once in XLA's simulation of the schedule, not a device measurement)"
    )
    if live.xla_peak_bytes and abs(live.xla_peak_bytes - peak) > AGREEMENT * peak:
      notes.append(
          f"XLA's live-range dump calls {live.xla_peak_bytes:,} bytes its peak usage; it chooses that "
          f"moment counting loop-carried values by their tuple's size, so it can miss a peak inside a loop"
      )
  elif peak is None and live.xla_peak_bytes:
    peak, peak_source = live.xla_peak_bytes, "xla live-range dump"
    notes.append(
        "peak_bytes: the backend reports no peak and no memory analysis; this is the peak usage "
        "line of XLA's live-range dump (a simulation of the schedule, not a device measurement)"
    )
  elif peak is None:
    peak, peak_source = live_at_peak, "reconstructed"
    notes.append("peak_bytes: the backend reports no peak; this is jaxmem's reconstruction")
  if peak and live_at_peak is not None:
    gap = (live_at_peak - peak) / peak
    if abs(gap) > AGREEMENT:
      notes.append(
          f"live_bytes_at_peak is {gap:+.1%} off the compiler's peak: the compiler counts memory its "
          f"dumped buffer assignment does not place in device memory (libtpu does so for programs "
          f"whose temporaries fit in on-chip VMEM); the buffer list shows the part XLA's dump explains"
      )

  consumers, cnotes = _consumers(report, param_bytes, optimizer_state_bytes, by_kind, tables, peak_t)
  notes += cnotes
  labels = labels or {}
  return Explanation(
      model=labels.get("model", ""), target=labels.get("target", ""), mesh=labels.get("mesh", ""),
      remat=labels.get("remat", ""), optimizer=labels.get("optimizer", ""), batch=labels.get("batch", 0),
      seq=labels.get("seq", 0), param_dtype=labels.get("param_dtype", ""), dtype=labels.get("dtype", ""),
      platform=report.platform, num_devices=report.num_devices,
      compiler_bytes=None if report.total_bytes is None else report.total_bytes + (report.generated_code_size_in_bytes or 0),
      consumers=consumers, estimated=ESTIMATED, peak_bytes=peak, peak_source=peak_source,
      live_bytes_at_peak=live_at_peak, peak_position=peak_t if T else None,
      peak_buffers=tuple(peak_buffers), live_buffer_count=len(buffers),
      by_module=dict(sorted(by_module.items(), key=lambda kv: -kv[1])), by_kind=by_kind,
      timeline=Timeline(
          bytes_by_kind={k: tuple(int(x) for x in curves[i]) for i, k in enumerate(KINDS)},
          regions=tuple(regions), peak_position=peak_t,
      ),
      report=report, dump_files=dump.files, notes=tuple(notes) + report.notes,
  )


def _computation(hlo: Hlo, name: str) -> str | None:
  ins = hlo.instructions.get(name)
  return None if ins is None else ins.computation


def _region(regions, position: int) -> str:
  for name, first, last in regions:
    if first <= position <= last:
      return name
  return "other"


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


def _uncovered(s: int, e: int, covered: list[tuple[int, int]]) -> int:
  own = e - s
  for cs, ce in covered:
    own -= max(0, min(e, ce) - max(s, cs))
  return max(0, own)


def _consumers(report, param_bytes, opt_bytes, by_kind, tables, peak_t):
  notes = []
  r = report
  fields = (r.argument_size_in_bytes, r.output_size_in_bytes, r.alias_size_in_bytes, r.temp_size_in_bytes)
  if None in fields or param_bytes is None or opt_bytes is None:
    notes.append("consumers: the compiler did not report every memory field; no split")
    return dict.fromkeys(CONSUMERS), notes
  arg, out, alias, temp = fields
  code = r.generated_code_size_in_bytes or 0
  # The temp heap's live bytes at the peak, by kind: the proportions temp is split in.
  live_temp = {k: 0 for k in KINDS}
  for a, rows, arr in tables:
    if a.kind != "temp":
      continue
    sel = arr[(arr[:, 0] <= peak_t) & (arr[:, 1] >= peak_t)]
    if len(sel):
      acc = np.zeros(len(KINDS), dtype=np.int64)
      _occupy(sel, acc)
      for i, k in enumerate(KINDS):
        live_temp[k] += int(acc[i])
  live_sum = sum(live_temp.values())
  if live_sum and temp:
    grads = int(temp * live_temp["gradient"] / max(live_sum, temp))
    acts = int(temp * live_temp["saved residual"] / max(live_sum, temp))
  else:
    grads = acts = 0
    if not temp:
      notes.append("consumers: the compiler reports no temp allocation in device memory (on TPU, small "
                   "programs keep their temporaries in VMEM), so gradients and activations are 0 here")
  rest = arg - param_bytes - opt_bytes
  if rest < 0:
    notes.append("consumers: argument bytes below params + optimizer state; workspace may be negative")
  consumers = dict(
      params=param_bytes,
      gradients=grads,
      optimizer_state=opt_bytes,
      activations=acts,
      workspace=rest + (out - alias) + temp - grads - acts,
      generated_code=code,
  )
  return consumers, notes

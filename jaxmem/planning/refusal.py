"""A configuration the compiler refuses, explained from compiles that fit.

A refusal gives one figure (libtpu: "the total memory required for HLO temporaries (58.73G)
exceeds available HBM (15.75G)") and no buffers: nothing was compiled to read them from. So
the same step is compiled where it fits and each buffer is extrapolated to the configuration
asked:

- in the depth: the layers are one scan over stacked weights, so every layer adds the same
  bytes (:mod:`jaxmem.planning.depth`): two compiles at the probe depths (2 and 4 layers) give
  each buffer group's line in the depth, read at the model's depth;
- and in the batch, where the probe depths do not fit at the batch asked: the arguments do not
  grow with the per-device batch and the activations grow in proportion to it
  (:mod:`jaxmem.planning.boundary`), so each group is affine in the batch too, and bilinear in
  (depth, batch) (the saved activations are depth x batch). Four compiles: the two depths at
  the largest batch the deeper probe fits at, halving from the batch asked, and at half that.

Buffer groups (:class:`jaxmem.buffers.analyse.BufferGroup`, the live set at the peak as
``explain`` shows it) are matched across the compiles by what depth and batch leave alone:
kind, dtype, source line, op and module; a group's shape is extrapolated dimension by dimension
where every compile gives it one shape of one rank. The groups' extrapolated sum is the live
set at the peak of the configuration asked, set beside the figure the compiler's refusal states.

Then the cheapest changes that fit (:func:`changes`): one field of the workload changed, each
chosen where the extrapolation puts it within the capacity and compiled at full depth through
compare's row path, ranked by the compiled rows' tokens per second per device (the step time
jaxmem simulates from the compiled schedule, :mod:`jaxmem.steptime`).
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from jaxmem.axes import AXES
from jaxmem.buffers.analyse import BufferGroup, Explanation, parse_kinds
from jaxmem.buffers.explain import explain as explain_compiled
from jaxmem.buffers.explain import explain_workload, framework_names
from jaxmem.errors import CompilerRefused, DoesNotDivide, JaxmemError
from jaxmem.hardware.targets import Target, Tpu, get_target
from jaxmem.hardware.tpu import TPU_GENERATIONS
from jaxmem.planning.depth import at_depth, probe_depths
from jaxmem.planning.search import REMAT_LADDER
from jaxmem.planning.sweep import run_rows, with_overheads
from jaxmem.options import RunOptions
from jaxmem.records import Configuration, Record
from jaxmem.resolve import plan
from jaxmem.versions import compiler_versions
from jaxmem.workload import Workload

# Compiles the changes may take by default: about one per kind of change.
DEFAULT_CHANGES = 5
EXTRAPOLATED = "extrapolated"
COMPILED = "compiled"

Key = tuple[str, str, "str | None", str, str]  # kind, dtype, source, op, module


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeCompile(Record):
  """One compile the extrapolation made: the model's depth and the global batch, whether it fit,
  and what it needs (the compiled requirement, or the figure its refusal states)."""

  layers: int
  batch: int
  fits: bool
  required_bytes: int | None
  live_bytes_at_peak: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExtrapolatedBuffer(Record):
  """A group of like buffers live at the peak (:class:`~jaxmem.buffers.analyse.BufferGroup`'s
  fields), its bytes (and shape, and count) extrapolated to the configuration asked from the
  probe compiles; ``probe_bytes`` its bytes at each of them, in :attr:`RefusalExplanation.probes`
  order. ``shape`` is empty where the compiles gave it shapes that do not extrapolate (more
  than one, or of different ranks)."""

  kind: str
  dtype: str
  shape: str
  source: str | None
  op: str
  module: str
  count: int
  size_bytes: int
  probe_bytes: tuple[int, ...]
  how: str = EXTRAPOLATED


@dataclasses.dataclass(frozen=True, kw_only=True)
class Change(Record):
  """One change of the workload (``fields``: the fields changed, as a workload takes them;
  ``change`` in words) and what it needs: ``required_bytes`` compiled at full depth (``how``
  ``compiled``), ``fits`` and ``verdict`` against ``capacity_bytes``, ``extrapolated_bytes``
  what the probes' lines said before it was compiled (None where they say nothing of it), and
  the compiled row's estimated ``step_time_s`` and ``tokens_per_s_per_device``."""

  change: str
  fields: dict[str, Any]
  how: str
  required_bytes: int | None
  capacity_bytes: int | None
  fits: bool | None
  verdict: str | None
  extrapolated_bytes: int | None = None
  step_time_s: float | None = None
  tokens_per_s_per_device: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RefusalExplanation(Record):
  """What fills a configuration the compiler refused, per device, extrapolated from compiles that
  fit (see the module docstring): ``buffers``, every group of the live set at the peak with
  bytes extrapolated (largest first), their sum ``extrapolated_bytes`` beside the
  ``required_bytes`` the refusal states and the ``capacity_bytes`` it was refused against;
  ``probes``, the compiles it was extrapolated from; ``changes``, changes that fit first,
  ranked. ``configuration`` is the configuration asked (its fields read as the explanation's
  own, ``r.batch``); ``error`` the compiler's message."""

  target: str
  mesh: str
  num_devices: int
  configuration: Configuration | None
  required_bytes: int | None
  capacity_bytes: int | None
  extrapolated_bytes: int
  extrapolated_in: tuple[str, ...]  # "depth", and "batch" where the probe depths did not fit at the batch asked
  buffers: tuple[ExtrapolatedBuffer, ...]
  probes: tuple[ProbeCompile, ...]
  changes: tuple[Change, ...] = ()
  error: str = ""
  versions: dict[str, str] = dataclasses.field(default_factory=dict)
  notes: tuple[str, ...] = ()
  kinds: tuple[str, ...] = ()  # the kinds a table lists (empty: every kind); the sum is every buffer's
  fits = property(lambda self: False)
  verdict = property(lambda self: "NO")

  def __getattr__(self, name: str) -> Any:
    # Only reached for names that are not fields: the configuration's (model, batch, remat...).
    if name != "configuration" and self.configuration is not None and name in _CONFIGURATION_FIELDS:
      return getattr(self.configuration, name)
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

  @property
  def error_pct(self) -> float | None:
    """The extrapolated sum over the requirement the refusal states, less 1, in percent."""
    if not self.required_bytes:
      return None
    return round(100.0 * (self.extrapolated_bytes - self.required_bytes) / self.required_bytes, 2)

  def as_dict(self) -> dict[str, Any]:
    out = {name: getattr(self.configuration, name) for name in _CONFIGURATION_FIELDS} if self.configuration else {}
    out.update(super().as_dict())
    out.pop("configuration")
    out.update(fits=False, verdict="NO", error_pct=self.error_pct)
    return out


_CONFIGURATION_FIELDS = tuple(f.name for f in dataclasses.fields(Configuration))


def explain(
    fn_or_workload: Any = None, /, *args: Any, changes: int = DEFAULT_CHANGES, **kwargs: Any,
) -> Explanation | RefusalExplanation:
  """:func:`jaxmem.buffers.explain.explain` (what fills a compiled step's memory; every argument
  as there), and for a preset train step the compiler refuses for memory, what would fill it:
  a :class:`RefusalExplanation`, extrapolated from compiles that fit (see
  :mod:`jaxmem.planning.refusal`), with the cheapest changes that fit found in at most
  ``changes`` further compiles (0: none). A refused function of your own, or a step whose depth
  jaxmem cannot change, is the :class:`~jaxmem.errors.CompilerRefused` error it was.

  >>> import jaxmem
  >>> r = jaxmem.explain(model="tiny", batch=2, seq=16, target="cpu")
  >>> type(r).__name__
  'Explanation'
  """
  _check_changes(changes)
  run = RunOptions.of(kwargs.pop("run", None), kwargs)
  try:
    return explain_compiled(fn_or_workload, *args, run=run, **kwargs)
  except CompilerRefused as refused:
    if callable(fn_or_workload) or args or not refused.out_of_memory:
      raise
    keep = {k: kwargs.pop(k) for k in ("top", "kinds", "framework_packages") if k in kwargs}
    w = Workload.of(fn_or_workload, {"remat": "none"}, **kwargs)
    result = explain_refusal(w, refused, changes=changes, **keep)
    run.row(result)
    return result


def explain_refusal(
    w: Workload, refused: CompilerRefused, *, changes: int = DEFAULT_CHANGES, top: int = 10,
    kinds: str | Sequence[str] | None = None, framework_packages: str | Sequence[str] = (),
) -> RefusalExplanation:
  """The refusal ``refused`` of workload ``w`` (one configuration) explained from compiles that fit."""
  p = plan(w)
  depths = None if w.step or w.maxtext else probe_depths(p.cfg)
  if depths is None:  # a step whose depth jaxmem cannot change, or no deeper than the probes: as before
    raise refused
  framework_packages = framework_names(framework_packages)
  full = p.cfg.num_layers

  def compile_at(layers: int, batch: int) -> Explanation | CompilerRefused:
    try:
      return explain_workload(w.replace(model=at_depth(p.cfg, layers), batch=batch), top=top, kinds=kinds,
                              framework_packages=framework_packages)
    except CompilerRefused as e:
      if not e.out_of_memory:
        raise
      return e

  corners, batches, tried = probe_compiles(compile_at, depths, p.batch, valid=lambda b: _batch_divides(w, b))
  if corners is None:
    raise JaxmemError(
        f"this configuration does not fit{_needs(refused.required_bytes)}, and the step does not fit at "
        f"{depths[-1]} layers even at batch {batches[0]}: there is no smaller compile to explain it from")
  at = (full, p.batch)
  buffers = extrapolate_groups(corners, depths, batches, at)
  first = next(iter(corners.values()))
  asked = dataclasses.replace(first.configuration, batch=p.batch) if first.configuration is not None else None
  lines = Lines(corners, depths, batches, full)
  r = RefusalExplanation(
      target=p.target.name, mesh=first.mesh, num_devices=first.num_devices, configuration=asked,
      required_bytes=refused.required_bytes, capacity_bytes=refused.capacity_bytes or p.target.capacity_bytes,
      extrapolated_bytes=sum(b.size_bytes for b in buffers), extrapolated_in=("depth",) + (("batch",) * (len(batches) > 1)),
      buffers=buffers, probes=tuple(_probe(k, v) for k, v in tried), error=refused.reason,
      versions=first.versions or compiler_versions(p.target.platform), notes=_notes(buffers, corners, depths, batches),
      kinds=parse_kinds(kinds),
  )
  if changes:
    r = dataclasses.replace(r, changes=find_changes(w, p.target, r, lines, budget=changes))
  return r


def probe_compiles(
    compile_at: Callable[[int, int], Explanation | CompilerRefused], depths: tuple[int, int], batch: int, *,
    valid: Callable[[int], bool], fitting: tuple[type, ...] = (Explanation,),
) -> tuple[dict[tuple[int, int], Explanation] | None, tuple[int, ...], list[tuple[tuple[int, int], Any]]]:
  """The compiles to extrapolate from: ``depths`` at ``batch`` where both fit; else both depths at
  the largest batch the deeper fits at (halving from ``batch`` while ``valid``) and at half of
  it. Returns the fitting compiles by (layers, batch) (None where too few fit), the batches
  they are at, and every compile tried in order. ``fitting``: the types a compile that fit returns
  (anything else is a refusal)."""
  tried: list[tuple[tuple[int, int], Any]] = []

  def at(layers: int, b: int) -> Explanation | None:
    r = compile_at(layers, b)
    tried.append(((layers, b), r))
    return r if isinstance(r, fitting) else None

  a, b = depths
  shallow = at(a, batch)
  if shallow is not None and (deep := at(b, batch)) is not None:
    return {(a, batch): shallow, (b, batch): deep}, (batch,), tried
  hi, k = None, batch
  while k % 2 == 0 and valid(k // 2):
    k //= 2
    if (deep := at(b, k)) is not None:
      hi = k
      break
  if hi is None or hi % 2 or not valid(hi // 2):
    return None, (k,), tried
  lo = hi // 2
  corners = {(b, hi): deep}
  for key in ((a, hi), (a, lo), (b, lo)):
    e = at(*key)
    if e is None:  # a shallower or smaller step refused where a deeper or larger fit: nothing to draw a line through
      return None, (lo,), tried
    corners[key] = e
  return corners, (lo, hi), tried


class Lines:
  """The requirement (and each kind's bytes) at full depth as lines in the batch, from the probe
  compiles: what the changes are chosen by."""

  def __init__(self, corners: dict[tuple[int, int], Explanation], depths: tuple[int, int], batches: tuple[int, ...], full: int):
    self.corners, self.depths, self.batches, self.full = corners, depths, batches, full

  def at(self, batch: int, figure: Callable[[Explanation], int | None] = lambda e: e.live_bytes_at_peak) -> int | None:
    values = {k: figure(e) for k, e in self.corners.items()}
    if any(v is None for v in values.values()):
      return None
    return round(bilinear(values, self.depths, self.batches, (self.full, batch)))

  def kind(self, kind: str, batch: int) -> int:
    return self.at(batch, lambda e: e.by_kind.get(kind, 0)) or 0

  def largest_batch(self, capacity: int, valid: Callable[[int], bool], below: int) -> int | None:
    """The largest valid batch under ``below`` the line puts within ``capacity``."""
    if len(self.batches) < 2:
      return None
    lo, hi = self.batches
    r_lo, r_hi = self.at(lo), self.at(hi)
    if r_lo is None or r_hi is None or r_hi <= r_lo:
      return None
    b = min(below - 1, lo + int((capacity - r_lo) * (hi - lo) // (r_hi - r_lo)))
    while b >= 1 and not valid(b):
      b -= 1
    return b if b >= 1 else None


def bilinear(values: dict[tuple[int, int], float], depths: tuple[int, int], batches: tuple[int, ...],
             at: tuple[int, int]) -> float:
  """``values`` at (layers, batch) ``at``: each batch's line in the depth, then the line through
  those in the batch (one batch: the depth's line alone)."""
  a, b = depths
  in_depth = [values.get((a, n), 0) + (at[0] - a) * (values.get((b, n), 0) - values.get((a, n), 0)) / (b - a)
              for n in batches]
  if len(batches) == 1:
    return in_depth[0]
  (n1, n2), (v1, v2) = batches, in_depth
  return v1 + (at[1] - n1) * (v2 - v1) / (n2 - n1)


def _key(g: BufferGroup) -> Key:
  return (g.kind, g.dtype, g.source, g.op, g.module)


def extrapolate_groups(
    corners: dict[tuple[int, int], Explanation], depths: tuple[int, int], batches: tuple[int, ...], at: tuple[int, int],
) -> tuple[ExtrapolatedBuffer, ...]:
  """Every group of the compiles' live sets at the peak, extrapolated to ``at`` (largest first);
  a group whose extrapolation is not positive (present at some compiles only, where the peak
  moved) is left out, and a note counts it."""
  grouped: dict[Key, dict[tuple[int, int], list[BufferGroup]]] = defaultdict(lambda: defaultdict(list))
  for corner, e in corners.items():
    for g in e.live_set:
      grouped[_key(g)][corner].append(g)
  order = list(corners)
  out = []
  for key, by_corner in grouped.items():
    size = bilinear({c: sum(g.size_bytes for g in gs) for c, gs in by_corner.items()}, depths, batches, at)
    if size <= 0:
      continue
    count = bilinear({c: sum(g.count for g in gs) for c, gs in by_corner.items()}, depths, batches, at)
    kind, dtype, source, op, module = key
    out.append(ExtrapolatedBuffer(
        kind=kind, dtype=dtype, shape=_shape(by_corner, order, depths, batches, at), source=source, op=op,
        module=module, count=max(1, round(count)), size_bytes=round(size),
        probe_bytes=tuple(sum(g.size_bytes for g in by_corner.get(c, [])) for c in order),
    ))
  return tuple(sorted(out, key=lambda b: -b.size_bytes))


_DIMS = re.compile(r"^\[([\d,]*)\]$")


def _shape(by_corner: dict[tuple[int, int], list[BufferGroup]], order: list[tuple[int, int]], depths: tuple[int, int],
           batches: tuple[int, ...], at: tuple[int, int]) -> str:
  """The group's shape at ``at``, each dimension on its own line, where every compile has the
  group once, in shapes of one rank."""
  dims: dict[tuple[int, int], list[int]] = {}
  for c in order:
    gs = by_corner.get(c, [])
    m = _DIMS.match(gs[0].shape) if len(gs) == 1 else None
    if m is None:
      return ""
    dims[c] = [int(d) for d in m.group(1).split(",") if d]
  if len({len(d) for d in dims.values()}) != 1:
    return ""
  rank = len(next(iter(dims.values())))
  out = [round(bilinear({c: d[i] for c, d in dims.items()}, depths, batches, at)) for i in range(rank)]
  return "[" + ",".join(map(str, out)) + "]"


def _probe(key: tuple[int, int], r: Explanation | CompilerRefused) -> ProbeCompile:
  layers, batch = key
  if isinstance(r, Explanation):
    return ProbeCompile(layers=layers, batch=batch, fits=r.fits is not False, required_bytes=r.required_bytes,
                        live_bytes_at_peak=r.live_bytes_at_peak)
  return ProbeCompile(layers=layers, batch=batch, fits=False, required_bytes=r.required_bytes)


def _notes(buffers: tuple[ExtrapolatedBuffer, ...], corners: dict[tuple[int, int], Explanation],
           depths: tuple[int, int], batches: tuple[int, ...]) -> tuple[str, ...]:
  groups = {_key(g) for e in corners.values() for g in e.live_set}
  dropped = len(groups) - len(buffers)
  where = f"{depths[0]} and {depths[1]} layers" + (
      f" at batch {batches[0]}" if len(batches) == 1 else f", each at batch {batches[0]} and {batches[1]}")
  notes = [f"every buffer is extrapolated: the live set at the peak of compiles at {where}, matched by kind, dtype, "
           "source, op and module, each group's bytes read off its line at the configuration asked"]
  if dropped:
    notes.append(f"{dropped} groups extrapolate to no bytes (the compiles' peaks differ in what is live) and are left out")
  return tuple(notes)


def _needs(required: int | None) -> str:
  return "" if required is None else f" (needs {required:,} bytes)"


def _batch_divides(w: Workload, batch: int) -> bool:
  try:
    plan(w.replace(batch=batch)).tasks()
  except DoesNotDivide:
    return False
  return True


def _check_changes(changes: int) -> None:
  if not isinstance(changes, int) or isinstance(changes, bool) or changes < 0:
    raise JaxmemError(f"`changes` must be a whole number of compiles, 0 or more (got {changes!r})")


# ----------------------------------------------------------------------------- changes


def find_changes(w: Workload, target: Target, r: RefusalExplanation, lines: Lines, *, budget: int) -> tuple[Change, ...]:
  """The changes to try, each where the lines put it within the capacity, compiled at full depth
  until ``budget`` compiles: those that fit first, most tokens per second per device first."""
  capacity = r.capacity_bytes
  found: list[Change] = []
  for candidate in candidates(w, target, r, lines):
    if len(found) >= budget:
      break
    if candidate is not None:
      found.append(compile_change(w, *candidate, capacity=capacity))
  return tuple(sorted(found, key=lambda c: (not c.fits, -(c.tokens_per_s_per_device or 0.0))))


def candidates(w: Workload, target: Target, r: RefusalExplanation, lines: Lines):
  """(change in words, fields, extrapolated bytes) for each kind of change, cheapest kind first:
  the least recomputing remat policy the lines put within the capacity, the fewest microbatches,
  the largest smaller batch, twice the devices of the same TPU generation, and each option's
  declared relief (:attr:`jaxmem.axes.Axis.relief`: vocab tiles)."""
  capacity, batch = r.capacity_bytes, r.configuration.batch if r.configuration else w.batch
  total = lines.at(batch)
  saved = lines.kind("saved residual", batch)
  asked = next((g for g in REMAT_LADDER if g.name == w.remat[-1]), None)
  if total is not None and asked is not None and asked.keep > 0:
    # A rung keeps its share of the no-remat activations (search.Rung): the saved residuals scale by it.
    for rung in (g for g in REMAT_LADDER if g.keep < asked.keep):
      need = round(total - saved * (1 - rung.keep / asked.keep))
      if need <= capacity or rung.name == REMAT_LADDER[-1].name:
        yield f"remat {rung.name}", {"remat": rung.name}, need
        break
  for m in (2**i for i in range(1, batch.bit_length())):
    need = lines.at(batch // m)  # a microbatch's activations; the gradients' accumulator is in the compile
    if need is not None and need <= capacity and _microbatches_valid(w, m):
      yield f"microbatches {m}", {"microbatches": m}, need
      break
  smaller = lines.largest_batch(capacity, lambda b: _batch_divides(w, b), below=batch)
  if smaller is not None:
    yield f"batch {smaller}", {"batch": smaller}, lines.at(smaller)
  bigger = _bigger_target(target)
  if bigger is not None:
    yield f"target {bigger}", {"target": bigger, "mesh": ()}, None
  for axis in AXES.values():  # the options whose declaration names a value that frees memory
    if axis.relief is not None and batch and getattr(w, axis.name) == axis.unset:
      yield f"{axis.word or axis.column_header} {axis.relief}", {axis.name: axis.relief}, None


def compile_change(w: Workload, change: str, fields: dict[str, Any], extrapolated: int | None, *,
                   capacity: int | None) -> Change:
  """``w`` with ``fields`` replaced, compiled at full depth as compare compiles a row."""
  p = plan(w.replace(**fields))
  (row,) = with_overheads(run_rows(p, [p.tasks()[-1]]))
  return Change(change=change, fields=fields, how=COMPILED, required_bytes=row.required_bytes,
                capacity_bytes=row.capacity_bytes if row.capacity_bytes is not None else capacity, fits=row.fits,
                verdict=row.verdict, extrapolated_bytes=extrapolated, step_time_s=row.step_time_s,
                tokens_per_s_per_device=row.tokens_per_s_per_device)


def _microbatches_valid(w: Workload, m: int) -> bool:
  try:
    plan(w.replace(microbatches=m)).tasks()
  except JaxmemError:
    return False
  return True


def _bigger_target(t: Target) -> str | None:
  """The one-slice TPU target of the same generation with twice the devices, if there is one."""
  if not isinstance(t.kind, Tpu) or t.kind.slices != 1 or t.kind.generation not in TPU_GENERATIONS:
    return None
  gen = t.kind.generation
  for size in TPU_GENERATIONS[gen].sizes:
    if get_target(f"tpu:{gen}-{size}").num_devices == 2 * t.num_devices:
      return f"tpu:{gen}-{size}"
  return None

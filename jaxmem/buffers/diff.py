"""What changed between two saved results: ``jaxmem diff A.json B.json``.

Two documents as jaxmem writes them (``--format json``), from two jax versions, two commits or
two configurations of one step, compared figure by figure, largest change first:

- ``explain`` documents: the configuration and compiler versions that differ, the headline
  figures (``peak_bytes``, the compiler's total, the live set at the peak), the consumers, the
  buffers live at the peak matched by what they are (kind, dtype, shape, source line, op and
  module: :class:`jaxmem.buffers.analyse.BufferGroup`; HLO names change between compiles, these
  do not unless the program does), the same bytes by source line and by op, and the saved
  activations (``saved residual``) that disappear or appear, by source line (what a remat
  policy stops or starts saving). A document without ``live_set`` (written before it existed)
  is compared on the top buffers it lists, and the diff says so.
- ``compare`` (or ``fit``, ``scale``: any document with ``rows``) documents: rows matched by
  their configuration (every :class:`jaxmem.records.Configuration` field both rows carry); rows
  left unmatched are paired by the fewest configuration fields that differ, the rest listed as
  in one document only; for each pair, the memory figures and the verdict that changed.

Two results are compared only when they hold one kind of record made by one command: each says
what made it (its ``made_by``: command, kind, version; :class:`jaxmem.inputs.MadeBy`), and a
result written before results said is read by its shape, or refused with a line saying how to
write it again (:func:`read_result`). A document that is not a jaxmem result, or whose fields the
diff reads have the wrong JSON type (rows that are not objects, say), is refused in one line
(:class:`~jaxmem.errors.NotAResult`), as are two results that cannot be compared
(:class:`~jaxmem.errors.NotComparable`).

Everything here reads plain dicts (the JSON as loaded) and never compiles.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from jaxmem.buffers.analyse import short_op
from jaxmem.errors import NotAResult, NotComparable
from jaxmem.inputs import DIFF, EXPLANATION, INFERENCE, REFUSAL, RESIDUALS, MadeBy, Whole
from jaxmem.inputs import ROWS as ROW_RECORDS
from jaxmem.records import Configuration, Record

EXPLAIN, ROWS = "explain", "rows"
SAVED = "saved residual"
# The figures of an explain document compared first, and of a row, in the order shown.
EXPLAIN_FIGURES = ("peak_bytes", "compiler_bytes", "live_bytes_at_peak")
ROW_FIGURES = (
    "required_bytes", "peak_memory_in_bytes", "naive_sum_bytes", "total_bytes", "argument_size_in_bytes",
    "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes", "generated_code_size_in_bytes",
    "host_total_bytes", "host_temp_size_in_bytes", "capacity_bytes", "margin_bytes",
)
ROW_OUTCOMES = ("fits", "verdict", "compiler_check", "judged_figure", "error")
CONFIGURATION_FIELDS = tuple(f.name for f in dataclasses.fields(Configuration))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Change(Record):
  """One figure in both documents: ``before`` (A's) and ``after`` (B's), ``None`` where a
  document lacks it (a consumer, source line or op one step does not have), and ``delta_bytes``
  (after - before, a missing figure counting 0)."""

  name: str
  before: int | None
  after: int | None
  delta_bytes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class BufferChange(Record):
  """Buffers live at the peak that look alike (:class:`jaxmem.buffers.analyse.BufferGroup`),
  whose count or bytes differ between the two documents."""

  kind: str
  dtype: str
  shape: str
  source: str | None
  op: str
  module: str
  before_count: int
  after_count: int
  before_bytes: int
  after_bytes: int
  delta_bytes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowChange(Record):
  """Two rows of the same (or the nearest) configuration: ``configuration`` is A's row's,
  ``configuration_changes`` the fields that differ (empty where matched exactly), ``figures``
  the memory figures that changed, largest first, ``outcomes`` the verdict's fields that changed
  (name -> [A's, B's]). ``status``: ``matched``, ``paired`` (nearest configuration), ``only in A``
  or ``only in B`` (then the figures are empty)."""

  status: str
  configuration: dict[str, Any]
  configuration_changes: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
  figures: tuple[Change, ...] = ()
  outcomes: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResultDiff(Record):
  """What changed from document A to document B (see the module docstring). Lists hold only
  what changed, largest change first; an empty list means nothing did."""

  kind: str  # "explain" or "rows"
  a: str
  b: str
  versions: dict[str, list[str | None]]  # compiler -> [A's, B's], where they differ
  configuration_changes: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
  figures: tuple[Change, ...] = ()
  consumers: tuple[Change, ...] = ()
  kinds: tuple[Change, ...] = ()
  buffers: tuple[BufferChange, ...] = ()
  sources: tuple[Change, ...] = ()  # bytes live at the peak by source line (every kind)
  ops: tuple[Change, ...] = ()  # bytes live at the peak by the op that made them
  saved_disappeared: tuple[Change, ...] = ()  # saved residual bytes by source line: in A, none in B
  saved_appeared: tuple[Change, ...] = ()  # ...: none in A, in B
  rows: tuple[RowChange, ...] = ()
  notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Saved:
  """A saved result as diff reads it: what made it (its ``made_by``, or for a file written
  before results said, what its shape says) and the document, its fields checked."""

  made_by: MadeBy
  doc: Mapping[str, Any]

  @property
  def kind(self) -> str:
    """``explain`` or ``rows``: how the diff compares it."""
    return EXPLAIN if self.made_by.kind == EXPLANATION else ROWS


def read_result(doc: Any, name: str) -> Saved:
  """``doc`` (a loaded JSON document) as a saved result jaxmem wrote: a
  :class:`~jaxmem.errors.NotAResult` in one line where it is not one, or where a field the diff
  reads has the wrong JSON type."""
  if not isinstance(doc, Mapping):
    raise NotAResult(f"{name} is not a jaxmem JSON document (a JSON object); save one with `format` json")
  made = MadeBy.read(doc["made_by"], name) if doc.get("made_by") is not None else _made_by_shape(doc, name)
  if made.kind == DIFF:
    raise NotAResult(f"{name} is a diff (jaxmem diff's output), not a result; diff the two results it compared")
  if made.kind == REFUSAL:
    # Its buffers are extrapolated, not compiled: diff compares what two compiles hold.
    raise NotComparable(f"{name} explains a configuration the compiler refused (extrapolated buffers, no compile); "
                        "diff compares compiled results: diff the probes' explanations, or two configurations that fit")
  _object_or_none(doc.get("versions"), f"{name}'s versions")
  if made.kind == EXPLANATION:
    _check_explanation(doc, name)
  else:
    _check_rows(doc, name)
  return Saved(made, doc)


def comparable(a: Saved, b: Saved, a_name: str, b_name: str) -> None:
  """Two results diff can compare: records of one kind, made by one command (where both say).
  Otherwise a :class:`~jaxmem.errors.NotComparable` naming what each is."""
  ma, mb = a.made_by, b.made_by
  if ma.kind != mb.kind or (ma.command is not None and mb.command is not None and ma.command != mb.command):
    raise NotComparable(f"{a_name} is {_what(ma)} but {b_name} is {_what(mb)}; diff compares two of a kind "
                        "(two results of one command)")


def _what(m: MadeBy) -> str:
  return f"{m.command}'s {m.kind}" if m.command else m.kind


# How to make a result that says what made it, for a file an older jaxmem wrote.
_REGENERATE = "run the command that wrote it again with --format json (a result now says what made it: made_by)"


def _made_by_shape(doc: Mapping[str, Any], name: str) -> MadeBy:
  """What made a document written before results said (no ``made_by``), where its shape tells:
  explain's (consumers and a peak), scale's (growth), fit's ranked configurations
  (recommended), compare's residuals (policies), infer's rows (a phase and weights each), a
  sweep's train-step rows (a remat policy each: compare's, or fit's or scale's so far)."""
  if "consumers" in doc and "peak_bytes" in doc:
    return MadeBy(command="explain", kind=EXPLANATION)
  rows = doc.get("rows")
  if not isinstance(rows, list):
    raise NotAResult(f"{name} is neither explain's nor a sweep's JSON (no consumers, no rows); save one with `format` json")
  _check_rows(doc, name)
  for key, command, kind in (("growth", "scale", ROW_RECORDS), ("recommended", "fit", ROW_RECORDS),
                             ("policies", "compare", RESIDUALS)):
    if key in doc:
      return MadeBy(command=command, kind=kind)
  if rows and all("phase" in r and "weights" in r for r in rows):
    return MadeBy(command="infer", kind=INFERENCE)
  if all("remat" in r for r in rows):
    return MadeBy(command=None, kind=ROW_RECORDS)
  raise NotAResult(f"{name} has no made_by (an older jaxmem wrote it) and its rows are not a sweep's; {_REGENERATE}")


def _check_rows(doc: Mapping[str, Any], name: str) -> None:
  rows = doc.get("rows")
  if not isinstance(rows, list):
    raise NotAResult(f"{name} holds no rows (a JSON list under rows); save a result with `format` json")
  for i, r in enumerate(rows):
    if not isinstance(r, Mapping):
      raise NotAResult(f"{name}: rows[{i}] is {_json_type(r)} where a row (a JSON object) belongs; {_REGENERATE}")


def _check_explanation(doc: Mapping[str, Any], name: str) -> None:
  """The fields of explain's document the diff reads: the consumers and kinds (objects of
  figures), the configuration, and the buffers live at the peak (lists of objects whose
  fields are names and whole numbers)."""
  if not isinstance(doc.get("consumers"), Mapping):
    raise NotAResult(f"{name}'s consumers must be a JSON object of figures, got {_json_type(doc.get('consumers'))}")
  for key in ("by_kind", "configuration"):
    _object_or_none(doc.get(key), f"{name}'s {key}")
  for key in ("live_set", "peak_buffer_details", "peak_buffers"):
    listed = doc.get(key)
    if listed is None:
      continue
    if not isinstance(listed, list):
      raise NotAResult(f"{name}'s {key} must be a JSON list of buffers, got {_json_type(listed)}")
    for i, buf in enumerate(listed):
      _check_buffer(buf, f"{name}'s {key}[{i}]")


def _check_buffer(buf: Any, where: str) -> None:
  if not isinstance(buf, Mapping):
    raise NotAResult(f"{where} must be a JSON object (a buffer), got {_json_type(buf)}")
  for k in (*_GROUP_KEY, "op_name"):
    if buf.get(k) is not None and not isinstance(buf[k], str):
      raise NotAResult(f"{where}.{k} must be a string, got {_json_type(buf[k])}")
  for k in ("count", "size_bytes"):
    if buf.get(k) is not None:
      Whole(least=0, json=True)(buf[k], f"{where}.{k}")


def _object_or_none(value: Any, what: str) -> None:
  if value is not None and not isinstance(value, Mapping):
    raise NotAResult(f"{what} must be a JSON object, got {_json_type(value)}")


def _json_type(v: Any) -> str:
  """What a JSON value is, in words (``a list``, ``a number``)."""
  for t, words in ((bool, "true or false"), (Mapping, "an object"), (list, "a list"), (str, "a string"),
                   ((int, float), "a number")):
    if isinstance(v, t):
      return words
  return "null" if v is None else type(v).__name__


def diff_documents(a: Any, b: Any, *, a_name: str = "A", b_name: str = "B") -> ResultDiff:
  """The diff of two loaded documents of the same kind (explain's, or a sweep's ``rows``), each
  read as a saved result (:func:`read_result`) and checked comparable (:func:`comparable`)."""
  ra, rb = read_result(a, a_name), read_result(b, b_name)
  comparable(ra, rb, a_name, b_name)
  a, b = ra.doc, rb.doc
  versions = _changed(a.get("versions") or {}, b.get("versions") or {})
  base = dict(kind=ra.kind, a=a_name, b=b_name, versions=versions)
  if ra.kind == ROWS:
    return ResultDiff(**base, rows=tuple(diff_rows(a["rows"], b["rows"])))
  return diff_explanations(a, b, base)


def diff_explanations(a: Mapping[str, Any], b: Mapping[str, Any], base: dict[str, Any]) -> ResultDiff:
  notes: list[str] = []
  groups_a, groups_b = (_buffer_groups(d, name, notes) for d, name in ((a, base["a"]), (b, base["b"])))
  return ResultDiff(
      **base,
      configuration_changes=_changed(a.get("configuration") or {}, b.get("configuration") or {}),
      figures=_changes({k: a.get(k) for k in EXPLAIN_FIGURES}, {k: b.get(k) for k in EXPLAIN_FIGURES}, keep_order=True),
      consumers=_changes(a.get("consumers") or {}, b.get("consumers") or {}),
      kinds=_changes(a.get("by_kind") or {}, b.get("by_kind") or {}),
      buffers=tuple(_buffer_changes(groups_a, groups_b)),
      sources=_changes(_sum_by(groups_a, "source"), _sum_by(groups_b, "source")),
      ops=_changes(_sum_by(groups_a, "op"), _sum_by(groups_b, "op")),
      saved_disappeared=_saved(groups_a, groups_b, gone=True),
      saved_appeared=_saved(groups_a, groups_b, gone=False),
      notes=tuple(notes),
  )


def _buffer_groups(doc: Mapping[str, Any], name: str, notes: list[str]) -> list[dict[str, Any]]:
  """The document's live set as groups of like buffers: its ``live_set``, or (an older document)
  its listed top buffers grouped the same way, with a note."""
  if doc.get("live_set") is not None:
    return list(doc["live_set"])
  listed = doc.get("peak_buffer_details") or doc.get("peak_buffers") or []
  notes.append(f"{name} has no live_set (an older jaxmem wrote it): only its {len(listed)} listed buffers at the peak "
               "are compared, so a change below them is not seen")
  out: dict[tuple, dict[str, Any]] = {}
  for buf in listed:
    group = dict(kind=buf.get("kind"), dtype=buf.get("dtype"), shape=buf.get("shape"), source=buf.get("source"),
                 op=short_op(buf.get("op_name") or ""), module=buf.get("module", ""))
    g = out.setdefault(_key(group), {**group, "count": 0, "size_bytes": 0})
    g["count"] += 1
    g["size_bytes"] += buf.get("size_bytes") or 0
  return list(out.values())


_GROUP_KEY = ("kind", "dtype", "shape", "source", "op", "module")


def _key(group: Mapping[str, Any]) -> tuple:
  return tuple(group.get(k) for k in _GROUP_KEY)


def _buffer_changes(groups_a: list[dict[str, Any]], groups_b: list[dict[str, Any]]) -> list[BufferChange]:
  by_a, by_b = {_key(g): g for g in groups_a}, {_key(g): g for g in groups_b}
  out = []
  for k in dict.fromkeys([*by_a, *by_b]):
    ga, gb = by_a.get(k, {}), by_b.get(k, {})
    before, after = ga.get("size_bytes", 0), gb.get("size_bytes", 0)
    if before == after and ga.get("count", 0) == gb.get("count", 0):
      continue
    out.append(BufferChange(
        **dict(zip(_GROUP_KEY, k, strict=True)), before_count=ga.get("count", 0), after_count=gb.get("count", 0),
        before_bytes=before, after_bytes=after, delta_bytes=after - before,
    ))
  out.sort(key=lambda c: (-abs(c.delta_bytes), c.source or "", c.op))
  return out


def _sum_by(groups: Iterable[Mapping[str, Any]], field: str, kind: str | None = None) -> dict[str, int]:
  out: dict[str, int] = defaultdict(int)
  for g in groups:
    if kind is None or g.get("kind") == kind:
      out[g.get(field) or "-"] += g.get("size_bytes") or 0
  return dict(out)


def _saved(groups_a: list[dict[str, Any]], groups_b: list[dict[str, Any]], *, gone: bool) -> tuple[Change, ...]:
  """Source lines whose saved residuals are live at A's peak and not at B's (``gone``), or the reverse."""
  before, after = _sum_by(groups_a, "source", SAVED), _sum_by(groups_b, "source", SAVED)
  if gone:
    only = {k: v for k, v in before.items() if v and not after.get(k)}
    return _changes(only, {})
  only = {k: v for k, v in after.items() if v and not before.get(k)}
  return _changes({}, only)


def _changes(before: Mapping[str, Any], after: Mapping[str, Any], *, keep_order: bool = False) -> tuple[Change, ...]:
  """The figures that differ, largest change first (``keep_order``: in the given order)."""
  out = []
  for k in dict.fromkeys([*before, *after]):
    x, y = before.get(k), after.get(k)
    if x == y or not all(v is None or _figure(v) for v in (x, y)) or not math.isfinite((y or 0) - (x or 0)):
      continue
    out.append(Change(name=str(k), before=x, after=y, delta_bytes=int((y or 0) - (x or 0))))
  return tuple(out if keep_order else sorted(out, key=lambda c: (-abs(c.delta_bytes), c.name)))


def _figure(v: Any) -> bool:
  """A figure two documents can be compared on: a finite number (a document in hand may hold a NaN)."""
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, list[Any]]:
  return {k: [a.get(k), b.get(k)] for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)}


# ----------------------------------------------------------------------------- rows


def diff_rows(rows_a: list[Mapping[str, Any]], rows_b: list[Mapping[str, Any]]) -> list[RowChange]:
  """Rows matched by configuration, the rest paired by the nearest configuration (fewest fields
  differing) or listed as in one document only; pairs whose figures changed most come first."""
  left_b = list(range(len(rows_b)))
  pairs: list[tuple[int | None, int | None]] = []
  unmatched_a = []
  for i, ra in enumerate(rows_a):
    j = next((j for j in left_b if not _configuration_changes(ra, rows_b[j])), None)
    if j is None:
      unmatched_a.append(i)
    else:
      left_b.remove(j)
      pairs.append((i, j))
  for i in unmatched_a:
    if not left_b:
      pairs.append((i, None))
      continue
    j = min(left_b, key=lambda j: len(_configuration_changes(rows_a[i], rows_b[j])))
    left_b.remove(j)
    pairs.append((i, j))
  pairs += [(None, j) for j in left_b]
  out = [_row_change(None if i is None else rows_a[i], None if j is None else rows_b[j]) for i, j in pairs]
  out.sort(key=lambda r: -max((abs(c.delta_bytes) for c in r.figures), default=0))
  return out


def _configuration(row: Mapping[str, Any]) -> dict[str, Any]:
  return {k: row[k] for k in CONFIGURATION_FIELDS if k in row}


def _configuration_changes(ra: Mapping[str, Any], rb: Mapping[str, Any]) -> dict[str, list[Any]]:
  shared = [k for k in CONFIGURATION_FIELDS if k in ra and k in rb]
  return {k: [ra[k], rb[k]] for k in shared if ra[k] != rb[k]}


def _row_change(ra: Mapping[str, Any] | None, rb: Mapping[str, Any] | None) -> RowChange:
  if ra is None or rb is None:
    return RowChange(status="only in B" if ra is None else "only in A", configuration=_configuration(rb if ra is None else ra))
  config = _configuration_changes(ra, rb)
  return RowChange(
      status="paired" if config else "matched", configuration=_configuration(ra), configuration_changes=config,
      figures=_changes({k: ra.get(k) for k in ROW_FIGURES}, {k: rb.get(k) for k in ROW_FIGURES}),
      outcomes={k: [ra.get(k), rb.get(k)] for k in ROW_OUTCOMES if ra.get(k) != rb.get(k)},
  )

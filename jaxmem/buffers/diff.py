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

Everything here reads plain dicts (the JSON as loaded) and never compiles.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from jaxmem.buffers.analyse import short_op
from jaxmem.errors import JaxmemError
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


def document_kind(doc: Mapping[str, Any], name: str) -> str:
  """``explain`` or ``rows``; anything else is a one-line error naming the document."""
  if not isinstance(doc, Mapping):
    raise JaxmemError(f"{name} is not a jaxmem JSON document (a JSON object); save one with `format` json")
  if "consumers" in doc and "peak_bytes" in doc:
    return EXPLAIN
  if isinstance(doc.get("rows"), list):
    return ROWS
  raise JaxmemError(
      f"{name} is neither explain's nor a sweep's JSON (no consumers, no rows); save one with `format` json"
  )


def diff_documents(a: Mapping[str, Any], b: Mapping[str, Any], *, a_name: str = "A", b_name: str = "B") -> ResultDiff:
  """The diff of two loaded documents of the same kind (explain's, or a sweep's ``rows``)."""
  kind_a, kind_b = document_kind(a, a_name), document_kind(b, b_name)
  if kind_a != kind_b:
    raise JaxmemError(f"{a_name} is {kind_a}'s JSON but {b_name} is {kind_b}'s; diff compares two of a kind")
  versions = _changed(a.get("versions") or {}, b.get("versions") or {})
  base = dict(kind=kind_a, a=a_name, b=b_name, versions=versions)
  if kind_a == ROWS:
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
    if x == y or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in (x, y)):
      continue
    out.append(Change(name=str(k), before=x, after=y, delta_bytes=int((y or 0) - (x or 0))))
  return tuple(out if keep_order else sorted(out, key=lambda c: (-abs(c.delta_bytes), c.name)))


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
    return RowChange(status="only in B" if ra is None else "only in A", configuration=_configuration(ra or rb))
  config = _configuration_changes(ra, rb)
  return RowChange(
      status="paired" if config else "matched", configuration=_configuration(ra), configuration_changes=config,
      figures=_changes({k: ra.get(k) for k in ROW_FIGURES}, {k: rb.get(k) for k in ROW_FIGURES}),
      outcomes={k: [ra.get(k), rb.get(k)] for k in ROW_OUTCOMES if ra.get(k) != rb.get(k)},
  )

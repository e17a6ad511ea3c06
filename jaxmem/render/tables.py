"""Rendering rows as text: ``table`` (plain), ``markdown``, ``json``, ``csv``.

The library returns frozen dataclasses and never prints. This module renders the sweep's rows
(``compare``, ``fit``, ``scale``) and any list of records, and holds the JSON envelope every
command's JSON shares; ``render.explain`` and ``render.inference`` render those commands' own
results with it. Tables show sizes per device in one unit (``render.units``), with deltas
against the ``none`` (no remat) row of the same mesh and optimizer, and a heading that names
the compiler versions behind the figures. Which columns a table has, and how each cell reads,
is declared in :mod:`jaxmem.render.columns`.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
from tabulate import tabulate

from jaxmem.axes import AXES, Apart
from jaxmem.hardware.margin import AT_RISK
from jaxmem.errors import JaxmemError
from jaxmem.inputs import FIT, ROWS, MadeBy
from jaxmem.planning.sweep import baseline_key
from jaxmem.render import columns as cols
from jaxmem.render.columns import LOWER_BOUND_MARK, host_verdict_cell, step_time_cells, verdict_cell  # noqa: F401  (re-exported)
from jaxmem.render.units import unit_for
from jaxmem.versions import __version__, compiler_versions, describe, merged

FORMATS = ("table", "markdown", "json", "csv")
# A file whose extension names a format holds that format (--output result.json: --format json).
FORMAT_EXTENSIONS = {".json": "json", ".csv": "csv", ".md": "markdown", ".markdown": "markdown"}


def check_format(fmt: str) -> str:
  if fmt not in FORMATS:
    raise JaxmemError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
  return fmt


def envelope(rows: Sequence[Any], *, made_by: MadeBy, versions: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
  """The JSON document every command writes: what made it (``made_by``: the command, the kind of
  record it holds, jaxmem's version; what ``jaxmem diff`` checks before comparing two), jaxmem's
  version, the compiler versions of the whole run (``versions``; else those the rows carry; else
  every compiler installed here), any ``extra`` sections, then the rows."""
  dicts = [_as_dict(r) for r in rows]
  versions = versions or run_versions(dicts) or compiler_versions()
  return {"made_by": made_by.as_dict(), "jaxmem_version": __version__, "jax_version": jax.__version__,
          "versions": versions, **extra, "rows": dicts}


def made_by(command: str, kind: str) -> MadeBy:
  """What made a result this jaxmem writes: ``command`` (``compare``), the ``kind`` of record it
  holds (:data:`jaxmem.inputs.ROWS`...), this version."""
  return MadeBy(command=command, kind=kind, version=__version__)


def run_versions(rows: Sequence[Any]) -> dict[str, str]:
  """The compiler versions behind a set of rows (records or dicts carrying ``versions``)."""
  return merged([_as_dict(r).get("versions") or {} for r in rows])


def _as_dict(r: Any) -> dict[str, Any]:
  return r.as_dict() if hasattr(r, "as_dict") else dict(r)


def markup(fmt: str) -> str:
  """tabulate's style for a text format."""
  return "github" if fmt == "markdown" else "simple"


def grid(body: Sequence[Sequence[Any]], headers: Sequence[str], fmt: str) -> str:
  """Cells under their headers in a text format: markdown as GitHub's, a plain table as
  tabulate's ``simple`` (a rule under the headers, columns two spaces apart) but as narrow as
  its widest cell or header, without the two spaces ``simple`` adds after each header."""
  if fmt == "markdown" or not headers:
    return tabulate(body, headers=headers, tablefmt=markup(fmt), disable_numparse=True)
  rows = [["" if c is None else str(c) for c in r] for r in body]
  head = [str(h) for h in headers]
  rule = ["-" * max(len(x) for x in column) for column in zip(head, *rows, strict=False)]
  return tabulate([head, rule, *rows], tablefmt="plain", disable_numparse=True)


def heading_versions(rows: Sequence[Any]) -> str:
  """`` · jax 0.12.0.1, libtpu 0.0.50.1`` for a heading line, or nothing when rows carry none."""
  v = run_versions(rows)
  return f" · {describe(v)}" if v else ""


def render_json(rows: Sequence[Any], *, made_by: MadeBy, **extra: Any) -> str:
  return json.dumps(envelope(rows, made_by=made_by, **extra), indent=2)


def render_csv(rows: Sequence[Any], columns: Sequence[cols.Column] = (), baseline: Callable[[Any], Any] | None = None) -> str:
  """The rows' own fields, one line each, then any of ``columns`` marked ``written`` (``baseline``:
  the row each is compared with, for a column derived from it)."""
  dicts = [_as_dict(r) for r in rows]
  if not dicts:
    return ""
  for key, values in cols.written(columns, cols.Table(rows, unit_for([]), baseline=baseline)).items():
    for d, v in zip(dicts, values, strict=True):
      d.setdefault(key, v)
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=list(dicts[0]), lineterminator="\n")
  writer.writeheader()
  for d in dicts:
    writer.writerow({k: _csv_cell(v) for k, v in d.items()})
  return buf.getvalue()


def _csv_cell(v: Any) -> Any:
  # Lists (notes) and dicts (versions) in one cell, readably: "a; b", "jax 0.10.2; jaxlib 0.10.2".
  if isinstance(v, list):
    return "; ".join(map(str, v))
  if isinstance(v, dict):
    return "; ".join(f"{k} {x}" for k, x in v.items())
  return "" if v is None else v


def render_records(rows: Sequence[Any], fmt: str, headers: Sequence[str] | None = None, *,
                   made_by: MadeBy | None = None) -> str:
  """Generic listing (models, targets): records or plain dicts, in any format; JSON says what
  made it (``made_by``, required for JSON)."""
  check_format(fmt)
  if fmt == "json":
    if made_by is None:
      raise ValueError("render_records writes JSON with the made_by of its command")
    return json.dumps(envelope(rows, made_by=made_by), indent=2)
  if fmt == "csv":
    return render_csv(rows)
  dicts = [_as_dict(r) for r in rows]
  keys = list(headers or (dicts[0].keys() if dicts else []))
  body = [[_cell(r.get(k)) for k in keys] for r in dicts]
  return grid(body, keys, fmt)


def _cell(v: Any) -> str:
  return cols.plain(v, None)


def _size(v: int | None, unit: float) -> str:
  return cols._size(v, unit)


# Whole-mesh figures for --totals: a per-device field times the device count.
TOTALS = {
    "all_devices_param_bytes": "param_bytes",
    "all_devices_optimizer_state_bytes": "optimizer_state_bytes",
    "all_devices_argument_bytes": "argument_size_in_bytes",
    "all_devices_temp_bytes": "temp_size_in_bytes",
    "all_devices_total_bytes": "total_bytes",
}


def with_totals(r: Any) -> dict[str, Any]:
  d = _as_dict(r)
  for key, field in TOTALS.items():
    v = d.get(field)
    d[key] = None if v is None else v * d["num_devices"]
  return d


# The step-time estimate's headers, as compare's columns name them.
STEP_TIME_HEADERS = ("step (est)", "roofline", "exposed comm", "bound", "MFU (est)")


def varying_dtypes(rows: Sequence[Any]) -> tuple[str, ...]:
  """The swept fields (:data:`jaxmem.records.SWEPT_FIELDS`: the dtypes, the layout's options)
  whose value differs between ``rows``: a column each (one every row shares stays in the
  heading)."""
  return tuple(k for k in cols.swept_columns() if len({getattr(r, k, None) for r in rows}) > 1)


def _dtypes(r: Any, skip: Sequence[str] = ()) -> str:
  """The heading's words for the swept fields every row shares (each axis's declared
  ``heading``): the dtypes in one list, the others apart. A user's step has no compute dtype of
  jaxmem's choosing (``None``), and parameters only if named."""
  listed: list[str] = []
  apart: list[str] = []
  for a in AXES.values():
    v = getattr(r, a.name, None)
    if a.heading is None or a.name in skip or v in (None, False) or (a.same_as and v == getattr(r, a.same_as, None)):
      continue
    (apart if isinstance(a.heading, Apart) else listed).append(a.heading.format(v))
  return (f" · {', '.join(listed)}" if listed else "") + "".join(f" · {w}" for w in apart)


def _compare_heading(rows: Sequence[Any], table: cols.Table, shown: Sequence[str]) -> str:
  """compare's heading: what every row shares (model, target, batch, seq, dtypes), the unit, the
  compiler versions and what the total and comm columns mean."""
  r0 = rows[0]
  parts = [f"{k} {getattr(r0, k)}" for k in cols.HEADING_FIELDS if k not in shown]
  devices = f"{r0.num_devices} devices" if r0.num_devices > 1 else "1 device"
  heading = " · ".join(parts) + f" ({devices}){_dtypes(r0, skip=shown)} · {table.unit.name} per device"
  heading += heading_versions(rows)
  if "totals" in table.options:
    heading += f"; Σ = summed over all {r0.num_devices} devices"
  if "comm_bytes" in shown:
    heading += "; comm = bytes each device sends per step in collectives"
    if any(r.comm_lower_bound for r in rows):
      heading += f"; comm marked {LOWER_BOUND_MARK} is a lower bound (a loop without a known trip count counted once: see notes)"
  return heading


def render_compare(rows: Sequence[Any], fmt: str, *, totals: bool = False, command: str = "compare",
                   columns: frozenset[str] = cols.DEFAULT_CHOICE) -> str:
  """Renders compare rows; table and markdown get a one-line heading and notes below.

  With ``totals``, whole-mesh figures are added (per-device bytes times the device count), next
  to ``param_bytes_global``, the model's own size: under data parallelism the sum over devices
  is N copies of the model, under FSDP it is one. Sharding moves ownership, not total bytes.
  ``command``: the command whose rows these are (scale's, so far, where Ctrl-C stopped it), as
  its JSON says. ``columns``: the table's columns (:func:`jaxmem.render.columns.choose`; JSON and
  CSV carry every field).
  """
  check_format(fmt)
  if totals:
    rows = [_Dict(with_totals(r)) for r in rows]
  if fmt == "json":
    return render_json(rows, made_by=made_by(command, ROWS))
  base = {baseline_key(r): r for r in rows if r.remat == "none"}

  def baseline(r: Any) -> Any:
    return base.get(baseline_key(r))

  if fmt == "csv":
    return render_csv(rows, cols.COMPARE, baseline)
  if not rows:
    return "no rows"
  table = cols.Table(rows, cols.unit_of(rows, cols.COMPARE_UNIT_FIELDS), frozenset({"totals"} if totals else ()),
                     baseline=baseline, chosen=columns)
  headers, body = cols.lay_out(cols.COMPARE, table)
  text = grid(body, headers, fmt)
  notes = _notes(rows)
  shown = [c.field for c in cols.shown(cols.COMPARE, table)]
  out = [*release_disagreements(rows), _compare_heading(rows, table, shown), "", text]
  if notes:
    out += [""] + [f"{'- ' if fmt == 'markdown' else ''}{n}" for n in notes]
  return "\n".join(out)


def release_disagreements(rows: Sequence[Any]) -> list[str]:
  """One line for each configuration whose verdict differs between the compiler releases it was
  compiled under (the ``compiler`` axis), first in compare's table: the verdict depends on the
  release a team runs, more than on any margin."""
  groups: dict[tuple, list[Any]] = {}
  for r in rows:
    if getattr(r, "compiler", None) is not None:
      groups.setdefault(tuple(getattr(r, f, None) for f in cols.label_fields() if f != "compiler"), []).append(r)
  keys = [k for k in _labels(rows)[0] if k != "compiler"]
  out = []
  for group in groups.values():
    said = {r.compiler: _said(r) for r in group}
    if len(set(said.values())) > 1:
      where = " ".join(f"{k} {_label(getattr(group[0], k, None))}" for k in keys)
      out.append(f"the compiler releases disagree{f' on {where}' if where else ''}: "
                 + "; ".join(f"{v} under {c}" for c, v in said.items()))
  return out


def _said(r: Any) -> str:
  if getattr(r, "verdict", None) == "at risk":
    return "at risk"
  if r.fits is None:
    # An error that is not the compiler's memory refusal (that one is fits False) is no verdict on
    # memory: a release that cannot compile the program (a Pallas kernel written for a later libtpu).
    return "no verdict" if r.error is None else "did not compile"
  return "fits" if r.fits else "does not fit"


# An HLO instruction named at the head of a note ("comm: while.12: while loop ..."): the same
# note about another instruction, or the same instruction renamed in another row's program, is
# one note.
_SUBJECT = re.compile(r"^((?:[a-z_]+: )?)([A-Za-z_][\w-]*\.\d+): ")
def _labels(rows: Sequence[Any]) -> tuple[tuple[str, ...], list[str]]:
  """The fields that tell rows apart (:func:`jaxmem.render.columns.label_fields`) and each row's
  values of them (``remat full``)."""
  keys = tuple(k for k in cols.label_fields() if len({_label(getattr(r, k, None)) for r in rows}) > 1)
  return keys, [" ".join(_label(getattr(r, k, None)) for k in keys) for r in rows]


def _label(v: Any) -> str:
  return "-" if v is None else str(v)


def _scope(keys: tuple[str, ...], labels: list[str], total: int) -> str:
  if len(labels) == total or not keys:
    return ""  # every row: no list
  if len(keys) == 1:
    return f" ({keys[0]} {', '.join(labels)})"
  return f" ({'; '.join(labels)})"


def _notes(rows: Sequence[Any]) -> list[str]:
  """One line per distinct note with the rows it applies to (none listed when it applies to
  all), then the errors and the at-risk explanation."""
  keys, labels = _labels(rows)
  groups: dict[str, tuple[list[str], list[str]]] = {}
  for r, label in zip(rows, labels, strict=True):
    for n in dict.fromkeys(r.notes):
      m = _SUBJECT.match(n)
      text, subject = (m.group(1) + n[m.end():], m.group(2)) if m else (n, None)
      applies, subjects = groups.setdefault(text, ([], []))
      if label not in applies:
        applies.append(label)
      if subject is not None and subject not in subjects:
        subjects.append(subject)
  out = []
  for text, (applies, subjects) in groups.items():
    named = ""
    if subjects:
      shown = ", ".join(subjects[:4]) + (f" and {len(subjects) - 4} more" if len(subjects) > 4 else "")
      named = f" ({shown})"
    out.append(f"note{_scope(keys, applies, len(rows))}: {text}{named}")
  at_risk = [label for r, label in zip(rows, labels, strict=True) if r.verdict == AT_RISK]
  if at_risk:
    out.append(f"note{_scope(keys, at_risk, len(rows))}: {AT_RISK_NOTE}")
  for r in rows:
    if r.error:
      moe = f" {r.moe_impl}" if r.moe_impl else ""
      attention = f" {r.attention}" if r.attention else ""
      line = f"error [{r.mesh} {r.optimizer}{attention} {r.remat}{moe}]: {r.error}"
      if line not in out:
        out.append(line)
  return out


AT_RISK_NOTE = (
    "at risk: it fits, but its margin (capacity - required) is below what the runtime may hold beside the "
    "program (risk_bytes: on TPU the loaded executable, on GPU the 5% XLA's scheduler leaves for allocations it "
    "does not model); docs/backends.md lists what each runtime holds and its source"
)


class _Dict(dict):
  """A row as a dict whose keys also read as attributes (for the table code)."""

  def __getattr__(self, name: str) -> Any:
    try:
      return self[name]
    except KeyError:
      raise AttributeError(name) from None

  def as_dict(self) -> dict[str, Any]:
    return dict(self)


def render_ranked(rows: Sequence[Any], fmt: str, *, columns: frozenset[str] = cols.DEFAULT_CHOICE) -> str:
  """Configurations for one workload, ranked (fitting, cheapest recompute first), with the
  recommendation said first."""
  check_format(fmt)
  best = next((r for r in rows if r.fits), None)
  if best is None:
    advice = "recommendation: none of these configurations fits; try a smaller batch, remat full, or more devices"
  else:
    pct = "-" if best.recompute_overhead_pct is None else f"{best.recompute_overhead_pct:+.1f}% recompute"
    u = unit_for([best.required_bytes, best.capacity_bytes])
    mb = best.microbatches or 1
    risk = ""
    if best.verdict == AT_RISK:
      risk = (f", at risk: {_size(best.margin_bytes, u.size)} {u.name} left, under the "
              f"{_size(best.risk_bytes, u.size)} the runtime may hold beside it")
    advice = (
        f"recommendation: mesh {best.mesh}, {best.optimizer}, "
        + (f"attention {best.attention}, " if best.attention else "")
        + (f"{mb} microbatches, " if mb > 1 else "")
        + "".join(f"{k.replace('_', ' ')} {_label(getattr(best, k))}, " for k in varying_dtypes(rows))
        + f"remat {best.remat} "
        f"({_size(best.required_bytes, u.size)} of {_size(best.capacity_bytes, u.size)} {u.name} per device, {pct}{risk})"
    )
  if fmt == "json":
    return json.dumps(envelope(rows, made_by=made_by("fit", ROWS), recommended=None if best is None else _as_dict(best)),
                      indent=2)
  if fmt == "csv":
    return render_csv(rows)
  return advice + "\n\n" + render_compare(rows, fmt, columns=columns)


def render_fit(results: Sequence[Any], fmt: str, *, columns: frozenset[str] = cols.DEFAULT_CHOICE) -> str:
  """The largest fitting workload per configuration (``columns``: the table's, as
  :func:`render_compare`'s)."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope(results, made_by=made_by("fit", FIT)), indent=2)
  if fmt == "csv":
    return render_csv(results, cols.FIT)
  over = results[0].over if results else "batch"
  rows = [r.row for r in results if r.row is not None]
  table = cols.Table(results, cols.unit_of(rows, cols.FIT_UNIT_FIELDS), words={"over": over}, chosen=columns)
  r0 = next((r.row for r in results if r.row is not None), None)
  fixed = "" if r0 is None else (f" · seq {r0.seq}" if over == "batch" else f" · batch {r0.batch}")
  versions = heading_versions(rows)
  head = "" if r0 is None else f"model {r0.model} · target {r0.target}{fixed} · largest {over} that fits, per device figures at it{versions}\n\n"
  notes = _notes(rows) if rows else []  # the compared rows' notes (the cuDNN workspace's, say), as compare prints them
  if "note" not in [c.field for c in cols.shown(cols.FIT, table)]:
    notes = _answer_notes(results) + notes
  tail = "".join(f"\n{'- ' if fmt == 'markdown' else ''}{n}" for n in notes)
  return head + tabulated(cols.FIT, table, fmt) + ("\n" + tail if tail else "")


def _answer_notes(results: Sequence[Any]) -> list[str]:
  """The answers' own notes (where the search stopped, what the depth probe did), where the
  table has no note column: one line per note, with the answers it applies to (none listed when
  it applies to all)."""
  keys, labels = _labels(results)
  groups: dict[str, list[str]] = {}
  for r, label in zip(results, labels, strict=True):
    if r.note:
      groups.setdefault(r.note, []).append(label)
  return [f"note{_scope(keys, applies, len(results))}: {text}" for text, applies in groups.items()]


def tabulated(columns: Sequence[cols.Column], table: cols.Table, fmt: str) -> str:
  """``table`` laid out under ``columns`` (those it shows) in a text format."""
  headers, body = cols.lay_out(columns, table)
  return grid(body, headers, fmt)


def render_listing(records: Sequence[Any], fmt: str, columns: Sequence[cols.Column],
                   chosen: frozenset[str] = cols.DEFAULT_CHOICE, *, made_by: MadeBy) -> str:
  """A listing (``targets``, ``models``): JSON and CSV every field of ``records`` (records or
  dicts; JSON says what made it, ``made_by``), a table the ``columns`` chosen
  (:func:`jaxmem.render.columns.choose`)."""
  check_format(fmt)
  if fmt in ("json", "csv"):
    return render_records(records, fmt, made_by=made_by)
  rows = [_Dict(_as_dict(r)) for r in records]
  return tabulated(columns, cols.Table(rows, unit_for([]), chosen=chosen), fmt)


def render_scale(rows: Sequence[Any], growth: Sequence[Any], fmt: str, *, totals: bool = False,
                 columns: frozenset[str] = cols.DEFAULT_CHOICE) -> str:
  """Per-point figures, then the fitted growth exponent of each component (``columns``: both
  tables', as :func:`render_compare`'s)."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope(rows, made_by=made_by("scale", ROWS), growth=[g.as_dict() for g in growth]), indent=2)
  if fmt == "csv":
    return render_compare(rows, "csv")
  table = render_compare(rows, fmt, totals=totals, columns=columns)
  exps = tabulated(cols.GROWTH, cols.Table(growth, cols.unit_of(rows, cols.COMPARE_UNIT_FIELDS), chosen=columns), fmt)
  return f"{table}\n\ngrowth exponents (bytes ~ batch^a x seq^b; 0 constant, 1 linear, 2 quadratic):\n\n{exps}"

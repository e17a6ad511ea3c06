"""Rendering rows as text: ``table`` (plain), ``markdown``, ``json``, ``csv``.

The library returns frozen dataclasses and never prints. This module renders the sweep's rows
(``compare``, ``fit``, ``scale``) and any list of records, and holds the JSON envelope every
command's JSON shares; ``render.explain`` and ``render.inference`` render those commands' own
results with it. Tables show sizes per device in one unit (``render.units``), with deltas
against the ``none`` (no remat) row of the same mesh and optimizer, and a heading that names
the compiler versions behind the figures.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Sequence
from typing import Any

import jax
from tabulate import tabulate

from jaxmem.axes import AXES, baseline_fields, key
from jaxmem.hardware.margin import AT_RISK
from jaxmem.errors import JaxmemError
from jaxmem.render.units import Unit, percent, seconds, unit_for
from jaxmem.versions import __version__, compiler_versions, describe, merged

FORMATS = ("table", "markdown", "json", "csv")


def check_format(fmt: str) -> str:
  if fmt not in FORMATS:
    raise JaxmemError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
  return fmt


def envelope(rows: Sequence[Any], *, versions: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
  """The JSON document every command writes: jaxmem's version, the compiler versions of the
  whole run (``versions``; else those the rows carry; else every compiler installed here), any
  ``extra`` sections, then the rows."""
  dicts = [_as_dict(r) for r in rows]
  versions = versions or run_versions(dicts) or compiler_versions()
  return {"jaxmem_version": __version__, "jax_version": jax.__version__, "versions": versions, **extra, "rows": dicts}


def run_versions(rows: Sequence[Any]) -> dict[str, str]:
  """The compiler versions behind a set of rows (records or dicts carrying ``versions``)."""
  return merged([_as_dict(r).get("versions") or {} for r in rows])


def _as_dict(r: Any) -> dict[str, Any]:
  return r.as_dict() if hasattr(r, "as_dict") else dict(r)


def markup(fmt: str) -> str:
  """tabulate's style for a text format."""
  return "github" if fmt == "markdown" else "simple"


def heading_versions(rows: Sequence[Any]) -> str:
  """`` · jax 0.12.0.1, libtpu 0.0.50.1`` for a heading line, or nothing when rows carry none."""
  v = run_versions(rows)
  return f" · {describe(v)}" if v else ""


def render_json(rows: Sequence[Any], **extra: Any) -> str:
  return json.dumps(envelope(rows, **extra), indent=2)


def render_csv(rows: Sequence[Any]) -> str:
  dicts = [_as_dict(r) for r in rows]
  if not dicts:
    return ""
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


def render_records(rows: Sequence[Any], fmt: str, headers: Sequence[str] | None = None) -> str:
  """Generic listing (models, targets): records or plain dicts, in any format."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope(rows), indent=2)
  if fmt == "csv":
    return render_csv(rows)
  dicts = [_as_dict(r) for r in rows]
  keys = list(headers or (dicts[0].keys() if dicts else []))
  body = [[_cell(r.get(k)) for k in keys] for r in dicts]
  return tabulate(body, headers=keys, tablefmt=markup(fmt), disable_numparse=True)


def _cell(v: Any) -> str:
  if v is None:
    return "-"
  if isinstance(v, float):
    return f"{v:.4g}"
  if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
    return f"{v:,}"
  return str(v)


def _size(v: int | None, unit: int) -> str:
  return "-" if v is None else f"{v / unit:.2f}"


def _delta(v: int | None, base: int | None, unit: int) -> str:
  if v is None or base is None:
    return "-"
  d = (v - base) / unit
  return f"{d:+.2f}" if abs(d) >= 0.005 else "0"


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


_SWEEP_HEADERS = ["remat", "params", "opt state", "argument", "temp", "Δtemp", "peak", "total", "Δtotal", "GFLOP", "recompute", "compile s"]
_TOTALS_HEADERS = ["model params", "Σ params", "Σ opt state", "Σ argument", "Σ total"]
_TOTALS_FIELDS = ("param_bytes_global", "all_devices_param_bytes", "all_devices_optimizer_state_bytes",
                  "all_devices_argument_bytes", "all_devices_total_bytes")


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Which of compare's columns a set of rows shows, and in which unit."""

  varying: tuple[str, ...]  # of model, target, batch, seq: those that differ between rows
  mesh: bool
  optimizer: bool
  step: tuple[str, ...]  # the step's columns shown: attention always, microbatches/vocab_tiles when > 1
  moe: bool  # a mixture-of-experts model: how its experts run, and the capacity factor
  factor: bool
  comm: bool
  host: bool
  host_total: bool  # host memory beyond host temp (host arguments or outputs)
  host_fit: bool  # some row keeps bytes on the host: the host's capacity per device and its verdict
  fit: bool
  steptime: bool  # the step-time estimate's columns: some row has one
  totals: bool
  unit: Unit
  pipeline: bool = False  # some row pipelined over a stage axis: stages, pipeline microbatches, bubble
  repeats: bool = False  # some row with a circular schedule

  @classmethod
  def of(cls, rows: Sequence[Any], totals: bool) -> _Layout:
    return cls(
        varying=tuple(k for k in ("model", "target", "batch", "seq") if len({getattr(r, k) for r in rows}) > 1),
        mesh=len({r.mesh for r in rows}) > 1 or rows[0].num_devices > 1,
        optimizer=len({r.optimizer for r in rows}) > 1,
        # Rows from a user's step (or an older cache) record no attention: no column for it then.
        step=("attention",) * any(_get(r, "attention", None) for r in rows)
        + ("context_strategy",) * any(_get(r, "context_strategy", None) for r in rows)
        + tuple(k for k in ("microbatches", "vocab_tiles") if any(_get(r, k, 1) > 1 for r in rows))
        + varying_dtypes(rows),
        moe=any(_get(r, "moe_impl", None) for r in rows),
        factor=any(_get(r, "capacity_factor", None) is not None for r in rows),
        comm=any((r.num_devices or 1) > 1 for r in rows),
        host=any(r.host_temp_size_in_bytes for r in rows),
        host_total=any(_get(r, "host_total_bytes", 0) != (r.host_temp_size_in_bytes or 0) for r in rows),
        host_fit=any(_get(r, "host_total_bytes", None) for r in rows),
        fit=any(r.capacity_bytes is not None for r in rows),
        steptime=any(_get(r, "step_time_s", None) is not None for r in rows),
        totals=totals,
        unit=unit_for([getattr(r, f) for r in rows for f in ("total_bytes", "argument_size_in_bytes", "param_bytes")]),
        pipeline=any(_get(r, "stages", 1) > 1 for r in rows),
        repeats=any(_get(r, "pipeline_repeats", 1) > 1 for r in rows),
    )

  def headers(self) -> list[str]:
    h = [*self.varying] + ["mesh"] * self.mesh + ["optimizer"] * self.optimizer
    h += [_header(k) for k in self.step] + ["moe"] * self.moe + ["capacity factor"] * self.factor
    h += ["stages", "pipeline mb"] * self.pipeline + ["repeats"] * self.repeats + ["bubble"] * self.pipeline
    h += _SWEEP_HEADERS
    h += ["comm"] * self.comm + ["host temp"] * self.host + ["host total"] * self.host_total
    h += list(STEP_TIME_HEADERS) if self.steptime else []
    h += ["capacity", "required", "fits"] if self.fit else []
    h += ["host capacity", "host fits"] * self.host_fit
    h += ["stage act", "1F1B required (est.)"] * self.pipeline
    return h + (_TOTALS_HEADERS if self.totals else [])

  def cells(self, r: Any, b: Any) -> list[str]:
    """One row's cells; ``b`` is the no-remat row it is compared with (or None)."""
    u = self.unit.size
    line = [str(getattr(r, k)) for k in self.varying] + [r.mesh] * self.mesh + [r.optimizer] * self.optimizer
    line += [str(_get(r, k, "-")) for k in self.step]
    factor = _get(r, "capacity_factor", None)
    line += [_get(r, "moe_impl", "-")] * self.moe + ["-" if factor is None else f"{factor:g}"] * self.factor
    if self.pipeline:
      bubble = _get(r, "bubble_fraction", None)
      line += [str(_get(r, "stages", 1)), str(_get(r, "pipeline_microbatches", "-"))]
      line += [str(_get(r, "pipeline_repeats", "-"))] * self.repeats + ["-" if bubble is None else f"{bubble:.1%}"]
    flops = "-" if r.flops is None else f"{r.flops / 1e9:,.1f}"
    recompute = "-" if r.recompute_overhead_pct is None else f"{r.recompute_overhead_pct:+.1f}%"
    if r.error:
      line += [r.remat, _size(r.param_bytes, u), _size(r.optimizer_state_bytes, u)]
      line += ["error (see below)"] + ["-"] * 5 + [flops, recompute, "-"]
      line += ["-"] * (self.comm + self.host + self.host_total)
    else:
      line += [r.remat] + [_size(getattr(r, f), u) for f in ("param_bytes", "optimizer_state_bytes", "argument_size_in_bytes", "temp_size_in_bytes")]
      line += [_delta(r.temp_size_in_bytes, b and b.temp_size_in_bytes, u), _size(r.peak_memory_in_bytes, u)]
      line += [_size(r.total_bytes, u), _delta(r.total_bytes, b and b.total_bytes, u), flops, recompute]
      line += ["cached" if _get(r, "cached", False) else "-" if r.compile_seconds is None else f"{r.compile_seconds:.1f}"]
      line += [_comm(r, u)] * self.comm + [_size(r.host_temp_size_in_bytes, u)] * self.host
      line += [_size(_get(r, "host_total_bytes", None), u)] * self.host_total
    if self.steptime:
      line += step_time_cells(r)
    if self.fit:
      line += [_size(r.capacity_bytes, u), _size(r.required_bytes, u), verdict_cell(r, self.unit)]
    if self.host_fit:
      line += [_size(_get(r, "host_capacity_bytes", None), u), host_verdict_cell(r)]
    if self.pipeline:
      line += [_size(_get(r, "stage_activation_bytes", None), u), _size(_get(r, "required_1f1b_bytes", None), u)]
    if self.totals:
      line += [_size(getattr(r, k), u) for k in _TOTALS_FIELDS]
    return line

  def heading(self, rows: Sequence[Any]) -> str:
    r0 = rows[0]
    parts = [f"{k} {getattr(r0, k)}" for k in ("model", "target", "batch", "seq") if k not in self.varying]
    devices = f"{r0.num_devices} devices" if r0.num_devices > 1 else "1 device"
    heading = " · ".join(parts) + f" ({devices}){_dtypes(r0, skip=self.step)} · {self.unit.name} per device"
    heading += heading_versions(rows)
    if self.totals:
      heading += f"; Σ = summed over all {r0.num_devices} devices"
    if self.comm:
      heading += "; comm = bytes each device sends per step in collectives"
      if any(_get(r, "comm_lower_bound", False) for r in rows):
        heading += f"; comm marked {LOWER_BOUND_MARK} is a lower bound (a loop without a known trip count counted once: see notes)"
    return heading


# The step-time estimate's columns (jaxmem.records.StepTime), labelled as estimates: the compiled
# schedule simulated, its roofline lower bound, the communication it leaves exposed, the term that
# bounds most of it, and MFU.
STEP_TIME_HEADERS = ("step (est)", "roofline", "exposed comm", "bound", "MFU (est)")


def step_time_cells(r: Any) -> list[str]:
  """A row's step-time cells (``-`` where it has none: refused, or no peak figures)."""
  return [seconds(_get(r, "step_time_s", None)), seconds(_get(r, "roofline_step_time_s", None)),
          seconds(_get(r, "exposed_comm_time_s", None)), _get(r, "bound", "-"), percent(_get(r, "mfu", None))]


# Marks a comm figure that is a lower bound, not a total (Row.comm_lower_bound).
LOWER_BOUND_MARK = ">="


def _comm(r: Any, unit: int) -> str:
  cell = _size(r.comm_bytes, unit)
  return f"{LOWER_BOUND_MARK}{cell}" if _get(r, "comm_lower_bound", False) and r.comm_bytes is not None else cell


# The swept fields with a column of their own where they vary (jaxmem.axes: the dtypes, dropout,
# sequence parallelism; the step's, the pipeline's and the MoE columns are laid out apart).
_SWEPT_COLUMNS = tuple(a.name for a in AXES.values() if a.column and a.record is not None)


def _header(k: str) -> str:
  return AXES[k].column_header if k in AXES else k.replace("_", " ")


def varying_dtypes(rows: Sequence[Any]) -> tuple[str, ...]:
  """The swept fields with a column of their own whose value differs between ``rows``: a
  column each (one every row shares stays in the heading)."""
  return tuple(k for k in _SWEPT_COLUMNS if len({_get(r, k, None) for r in rows}) > 1)


def _dtypes(r: Any, skip: Sequence[str] = ()) -> str:
  """The heading's words for the swept fields every row shares (each axis's declared
  ``heading``): the dtypes in one list, the others apart. A user's step has no compute dtype of
  jaxmem's choosing (``-``), and parameters only if named."""
  listed: list[str] = []
  apart: list[str] = []
  for a in AXES.values():
    v = _get(r, a.name, None)
    if a.heading is None or a.name in skip or v in (None, False, "-") or (a.same_as and v == _get(r, a.same_as, None)):
      continue
    (apart if a.heading_apart else listed).append(a.heading.format(v))
  return (f" · {', '.join(listed)}" if listed else "") + "".join(f" · {w}" for w in apart)


def _get(r: Any, key: str, default: Any) -> Any:
  """A row's field (rows from an older cache or JSON may lack the step's fields)."""
  v = r.get(key) if isinstance(r, dict) else getattr(r, key, None)
  return default if v is None else v


def _base_key(r: Any) -> tuple:
  """What a row shares with the no-remat row it is compared with (see sweep.baseline_key)."""
  return key(r, baseline_fields())


def render_compare(rows: Sequence[Any], fmt: str, *, totals: bool = False) -> str:
  """Renders compare rows; table and markdown get a one-line heading and notes below.

  With ``totals``, whole-mesh figures are added (per-device bytes times the device count), next
  to ``param_bytes_global``, the model's own size: under data parallelism the sum over devices
  is N copies of the model, under FSDP it is one. Sharding moves ownership, not total bytes.
  """
  check_format(fmt)
  if totals:
    rows = [_Dict(with_totals(r)) for r in rows]
  if fmt == "json":
    return render_json(rows)
  if fmt == "csv":
    return render_csv(rows)
  if not rows:
    return "no rows"
  layout = _Layout.of(rows, totals)
  base = {_base_key(r): r for r in rows if r.remat == "none"}
  body = [layout.cells(r, base.get(_base_key(r))) for r in rows]
  table = tabulate(body, headers=layout.headers(), tablefmt=markup(fmt), disable_numparse=True)
  notes = _notes(rows)
  out = [layout.heading(rows), "", table]
  if notes:
    out += [""] + [f"{'- ' if fmt == 'markdown' else ''}{n}" for n in notes]
  return "\n".join(out)


def verdict_cell(r: Any, unit: Unit) -> str:
  """The fits column: ``yes``, ``NO``, or ``at risk`` with the margin left (rows from an older
  cache or JSON without a verdict show their ``fits``)."""
  verdict = _get(r, "verdict", None)
  if verdict is None:
    return "-" if r.fits is None else ("yes" if r.fits else "NO")
  margin = _get(r, "margin_bytes", None)
  return f"{verdict} ({_size(margin, unit.size)} left)" if verdict == AT_RISK and margin is not None else verdict


def host_verdict_cell(r: Any) -> str:
  """The host fits column: ``yes`` or ``NO`` for a row with host bytes against a known host
  capacity, ``?`` where the host's capacity is unknown (a note says why), ``-`` without host bytes."""
  if not _get(r, "host_total_bytes", None):
    return "-"
  verdict = _get(r, "host_verdict", None)
  return "?" if verdict is None else verdict


# An HLO instruction named at the head of a note ("comm: while.12: while loop ..."): the same
# note about another instruction, or the same instruction renamed in another row's program, is
# one note.
_SUBJECT = re.compile(r"^((?:[a-z_]+: )?)([A-Za-z_][\w-]*\.\d+): ")
_LABEL_FIELDS = ("model", "target", "batch", "seq", "mesh", "optimizer", "attention", "context_strategy",
                 "microbatches", "vocab_tiles", "pipeline_microbatches", "pipeline_repeats", "moe_impl", "capacity_factor",
                 *_SWEPT_COLUMNS, "remat")


def _labels(rows: Sequence[Any]) -> tuple[tuple[str, ...], list[str]]:
  """The fields that tell rows apart and each row's values of them (``remat full``)."""
  keys = tuple(k for k in _LABEL_FIELDS if len({str(_get(r, k, "-")) for r in rows}) > 1)
  return keys, [" ".join(str(_get(r, k, "-")) for k in keys) for r in rows]


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
  at_risk = [label for r, label in zip(rows, labels, strict=True) if _get(r, "verdict", None) == AT_RISK]
  if at_risk:
    out.append(f"note{_scope(keys, at_risk, len(rows))}: {AT_RISK_NOTE}")
  for r in rows:
    if r.error:
      moe = f" {r.moe_impl}" if _get(r, "moe_impl", None) else ""
      attention = f" {r.attention}" if _get(r, "attention", None) else ""
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

  __getattr__ = dict.__getitem__

  def as_dict(self) -> dict[str, Any]:
    return dict(self)


def render_ranked(rows: Sequence[Any], fmt: str) -> str:
  """Configurations for one workload, ranked (fitting, cheapest recompute first), with the
  recommendation said first."""
  check_format(fmt)
  best = next((r for r in rows if r.fits), None)
  if best is None:
    advice = "recommendation: none of these configurations fits; try a smaller batch, remat full, or more devices"
  else:
    pct = "-" if best.recompute_overhead_pct is None else f"{best.recompute_overhead_pct:+.1f}% recompute"
    u = unit_for([best.required_bytes, best.capacity_bytes])
    mb = _get(best, "microbatches", 1)
    risk = ""
    if _get(best, "verdict", None) == AT_RISK:
      risk = (f", at risk: {_size(_get(best, 'margin_bytes', None), u.size)} {u.name} left, under the "
              f"{_size(_get(best, 'risk_bytes', None), u.size)} the runtime may hold beside it")
    advice = (
        f"recommendation: mesh {best.mesh}, {best.optimizer}, "
        + (f"attention {best.attention}, " if _get(best, "attention", None) else "")
        + (f"{mb} microbatches, " if mb > 1 else "")
        + "".join(f"{k.replace('_', ' ')} {_get(best, k, '-')}, " for k in varying_dtypes(rows))
        + f"remat {best.remat} "
        f"({_size(best.required_bytes, u.size)} of {_size(best.capacity_bytes, u.size)} {u.name} per device, {pct}{risk})"
    )
  if fmt == "json":
    return json.dumps(envelope(rows, recommended=None if best is None else _as_dict(best)), indent=2)
  if fmt == "csv":
    return render_csv(rows)
  return advice + "\n\n" + render_compare(rows, fmt)


def render_fit(results: Sequence[Any], fmt: str) -> str:
  """The largest fitting workload per configuration."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope(results), indent=2)
  if fmt == "csv":
    return render_csv([r.as_dict() for r in results])
  over = results[0].over if results else "batch"
  rows = [r.row for r in results if r.row is not None]
  micro = any(_get(r, "microbatches", 1) > 1 for r in results)
  strategy = any(_get(r, "context_strategy", None) for r in results)
  host = any(_get(row, "host_total_bytes", None) for row in rows)
  dtypes = varying_dtypes(results)
  u = unit_for([getattr(row, f) for row in rows for f in ("required_bytes", "capacity_bytes", "temp_size_in_bytes")])
  records = []
  for r in results:
    row = r.row
    moe = {"moe": r.moe} if any(getattr(x, "moe", None) for x in results) else {}
    records.append(
        {
            "mesh": r.mesh,
            "optimizer": r.optimizer,
            "attention": _get(r, "attention", "-"),
            **({"context strategy": _get(r, "context_strategy", "-")} if strategy else {}),
            **({"microbatches": _get(r, "microbatches", 1)} if micro else {}),
            **{k.replace("_", " "): _get(r, k, "-") for k in dtypes},
            **moe,
            "remat": r.remat,
            f"max {over}": r.max_batch if over == "batch" else r.max_seq,
            f"required {u.name}": None if row is None else _size(row.required_bytes, u.size),
            f"capacity {u.name}": None if row is None else _size(row.capacity_bytes, u.size),
            f"temp {u.name}": None if row is None else _size(row.temp_size_in_bytes, u.size),
            "fits": None if row is None else verdict_cell(row, u),
            **({f"host {u.name}": None if row is None else _size(_get(row, "host_total_bytes", None), u.size),
                f"host capacity {u.name}": None if row is None else _size(_get(row, "host_capacity_bytes", None), u.size),
                "host fits": None if row is None else host_verdict_cell(row)} if host else {}),
            "recompute": None if row is None or row.recompute_overhead_pct is None else f"{row.recompute_overhead_pct:+.1f}%",
            **dict(zip(STEP_TIME_HEADERS, ["-"] * len(STEP_TIME_HEADERS) if row is None else step_time_cells(row), strict=True)),
            "compiles": r.compiles,
            "note": r.note,
        }
    )
  r0 = next((r.row for r in results if r.row is not None), None)
  fixed = "" if r0 is None else (f" · seq {r0.seq}" if over == "batch" else f" · batch {r0.batch}")
  versions = heading_versions(rows)
  head = "" if r0 is None else f"model {r0.model} · target {r0.target}{fixed} · largest {over} that fits, per device figures at it{versions}\n\n"
  notes = _notes(rows) if rows else []  # the compared rows' notes (the cuDNN workspace's, say), as compare prints them
  tail = "".join(f"\n{'- ' if fmt == 'markdown' else ''}{n}" for n in notes)
  return head + render_records(records, fmt) + ("\n" + tail if tail else "")


def render_scale(rows: Sequence[Any], growth: Sequence[Any], fmt: str, *, totals: bool = False) -> str:
  """Per-point figures, then the fitted growth exponent of each component."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope(rows, growth=[g.as_dict() for g in growth]), indent=2)
  if fmt == "csv":
    return render_csv(rows)
  moe = any(g.moe for g in growth)
  strategy = any(_get(g, "context_strategy", None) for g in growth)
  dtypes = varying_dtypes(growth)
  records = [
      {
          "mesh": g.mesh,
          "optimizer": g.optimizer,
          "attention": _get(g, "attention", "-"),
          **({"context strategy": _get(g, "context_strategy", "-")} if strategy else {}),
          **({"moe": g.moe} if moe else {}),
          **{k.replace("_", " "): _get(g, k, "-") for k in dtypes},
          "remat": g.remat,
          "component": g.component.replace("_size_in_bytes", "").replace("_bytes", "").replace("_in", ""),
          "batch exponent": _exponent(g.batch_exponent),
          "seq exponent": _exponent(g.seq_exponent),
      }
      for g in growth
  ]
  table = render_compare(rows, fmt, totals=totals)
  exps = render_records(records, fmt)
  return f"{table}\n\ngrowth exponents (bytes ~ batch^a x seq^b; 0 constant, 1 linear, 2 quadratic):\n\n{exps}"


def _exponent(x: float | None) -> str | None:
  return None if x is None else f"{x + 0.0:.2f}".replace("-0.00", "0.00")

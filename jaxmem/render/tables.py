"""Rendering rows as text: ``table`` (plain), ``markdown``, ``json``, ``csv``.

The library returns frozen dataclasses and never prints; this module is the only place that
turns them into text. Tables show sizes per device in GiB (MiB for small models), with deltas
against the ``none`` (no remat) row of the same mesh and optimizer.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

import jax
from tabulate import tabulate

from jaxmem.errors import JaxmemError

FORMATS = ("table", "markdown", "json", "csv")
GiB = 1024**3
MiB = 1024**2


def check_format(fmt: str) -> str:
  if fmt not in FORMATS:
    raise JaxmemError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
  return fmt


def envelope(rows: Sequence[Any], **extra: Any) -> dict[str, Any]:
  from jaxmem import __version__

  return {"jaxmem_version": __version__, "jax_version": jax.__version__, **extra, "rows": [_as_dict(r) for r in rows]}


def _as_dict(r: Any) -> dict[str, Any]:
  return r.as_dict() if hasattr(r, "as_dict") else dict(r)


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
    writer.writerow({k: "; ".join(v) if isinstance(v, list) else ("" if v is None else v) for k, v in d.items()})
  return buf.getvalue()


def render_records(rows: Sequence[dict[str, Any]], fmt: str, headers: Sequence[str] | None = None) -> str:
  """Generic listing (models, targets): rows of plain dicts in any format."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope(rows), indent=2)
  if fmt == "csv":
    return render_csv(rows)
  keys = list(headers or (rows[0].keys() if rows else []))
  body = [[_cell(r.get(k)) for k in keys] for r in rows]
  return tabulate(body, headers=keys, tablefmt="github" if fmt == "markdown" else "simple", disable_numparse=True)


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
  biggest = max((getattr(r, f) or 0) for r in rows for f in ("total_bytes", "argument_size_in_bytes", "param_bytes"))
  unit, uname = (GiB, "GiB") if biggest >= GiB // 10 else (MiB, "MiB")
  base = {(r.target, r.mesh, r.optimizer, r.batch, r.seq): r for r in rows if r.remat == "none"}
  varying = [k for k in ("model", "target", "batch", "seq") if len({getattr(r, k) for r in rows}) > 1]
  show_mesh = len({r.mesh for r in rows}) > 1 or rows[0].num_devices > 1
  show_opt = len({r.optimizer for r in rows}) > 1
  show_fit = any(r.capacity_bytes is not None for r in rows)
  headers = [*varying]
  headers += ["mesh"] if show_mesh else []
  headers += ["optimizer"] if show_opt else []
  headers += ["remat", "params", "opt state", "argument", "temp", "Δtemp", "peak", "total", "Δtotal", "GFLOP", "recompute", "compile s"]
  show_comm = any((r.num_devices or 1) > 1 for r in rows)
  headers += ["comm"] if show_comm else []
  show_host = any(r.host_temp_size_in_bytes for r in rows)
  headers += ["host temp"] if show_host else []
  headers += ["capacity", "required", "fits"] if show_fit else []
  headers += ["model params", "Σ params", "Σ opt state", "Σ argument", "Σ total"] if totals else []
  body = []
  for r in rows:
    b = base.get((r.target, r.mesh, r.optimizer, r.batch, r.seq))
    line = [str(getattr(r, k)) for k in varying]
    line += [r.mesh] if show_mesh else []
    line += [r.optimizer] if show_opt else []
    if r.error:
      line += [r.remat, _size(r.param_bytes, unit), _size(r.optimizer_state_bytes, unit)]
      line += ["error (see below)"] + ["-"] * 5
      line += ["-" if r.flops is None else f"{r.flops / 1e9:,.1f}"]
      line += ["-" if r.recompute_overhead_pct is None else f"{r.recompute_overhead_pct:+.1f}%", "-"]
      line += ["-"] if show_comm else []
      line += ["-"] if show_host else []
    else:
      line += [
          r.remat,
          _size(r.param_bytes, unit),
          _size(r.optimizer_state_bytes, unit),
          _size(r.argument_size_in_bytes, unit),
          _size(r.temp_size_in_bytes, unit),
          _delta(r.temp_size_in_bytes, b and b.temp_size_in_bytes, unit),
          _size(r.peak_memory_in_bytes, unit),
          _size(r.total_bytes, unit),
          _delta(r.total_bytes, b and b.total_bytes, unit),
          "-" if r.flops is None else f"{r.flops / 1e9:,.1f}",
          "-" if r.recompute_overhead_pct is None else f"{r.recompute_overhead_pct:+.1f}%",
          "-" if r.compile_seconds is None else f"{r.compile_seconds:.1f}",
      ]
      line += [_size(r.comm_bytes, unit)] if show_comm else []
      line += [_size(r.host_temp_size_in_bytes, unit)] if show_host else []
    if show_fit:
      line += [
          _size(r.capacity_bytes, unit),
          _size(r.required_bytes, unit),
          "-" if r.fits is None else ("yes" if r.fits else "NO"),
      ]
    if totals:
      line += [_size(r.param_bytes_global, unit)] + [
          _size(getattr(r, k), unit)
          for k in ("all_devices_param_bytes", "all_devices_optimizer_state_bytes", "all_devices_argument_bytes", "all_devices_total_bytes")
      ]
    body.append(line)
  r0 = rows[0]
  heading_parts = [f"{k} {getattr(r0, k)}" for k in ("model", "target", "batch", "seq") if k not in varying]
  devices = f"{r0.num_devices} devices" if r0.num_devices > 1 else "1 device"
  heading = " · ".join(heading_parts) + f" ({devices}) · {r0.param_dtype} params, {r0.dtype} compute · {uname} per device"
  if totals:
    heading += f"; Σ = summed over all {r0.num_devices} devices"
  if show_comm:
    heading += "; comm = bytes each device sends per step in collectives"
  table = tabulate(body, headers=headers, tablefmt="github" if fmt == "markdown" else "simple", disable_numparse=True)
  notes = _notes(rows)
  out = [heading, "", table]
  if notes:
    out += [""] + [f"{'- ' if fmt == 'markdown' else ''}{n}" for n in notes]
  return "\n".join(out)


def _notes(rows: Sequence[Any]) -> list[str]:
  seen: dict[str, None] = {}
  for r in rows:
    for n in r.notes:
      seen.setdefault(f"note: {n}")
    if r.error:
      seen.setdefault(f"error [{r.mesh} {r.optimizer} {r.remat}]: {r.error}")
  return list(seen)


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
    advice = (
        f"recommendation: mesh {best.mesh}, {best.optimizer}, remat {best.remat} "
        f"({_size(best.required_bytes, GiB)} of {_size(best.capacity_bytes, GiB)} GiB per device, {pct})"
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
  records = []
  for r in results:
    row = r.row
    records.append(
        {
            "mesh": r.mesh,
            "optimizer": r.optimizer,
            "remat": r.remat,
            f"max {over}": r.max_batch if over == "batch" else r.max_seq,
            "required GiB": None if row is None else _size(row.required_bytes, GiB),
            "capacity GiB": None if row is None else _size(row.capacity_bytes, GiB),
            "temp GiB": None if row is None else _size(row.temp_size_in_bytes, GiB),
            "recompute": None if row is None or row.recompute_overhead_pct is None else f"{row.recompute_overhead_pct:+.1f}%",
            "compiles": r.compiles,
            "note": r.note,
        }
    )
  r0 = next((r.row for r in results if r.row is not None), None)
  fixed = "" if r0 is None else (f" · seq {r0.seq}" if over == "batch" else f" · batch {r0.batch}")
  head = "" if r0 is None else f"model {r0.model} · target {r0.target}{fixed} · largest {over} that fits, per device figures at it\n\n"
  return head + render_records(records, fmt)


def render_scale(rows: Sequence[Any], growth: Sequence[Any], fmt: str, *, totals: bool = False) -> str:
  """Per-point figures, then the fitted growth exponent of each component."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope(rows, growth=[g.as_dict() for g in growth]), indent=2)
  if fmt == "csv":
    return render_csv(rows)
  records = [
      {
          "mesh": g.mesh,
          "optimizer": g.optimizer,
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

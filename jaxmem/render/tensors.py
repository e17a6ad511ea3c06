"""``fit --remat search``'s output: the chosen per-tensor assignment, what each name costs, and
every compile the search made with its prediction beside it."""

from __future__ import annotations

import json
from typing import Any

from jaxmem.inputs import TENSOR_SEARCH
from jaxmem.render.tables import _size, check_format, envelope, grid, heading_versions, made_by, render_csv, verdict_cell
from jaxmem.render.units import unit_for


def _tflop(v: float | None) -> str:
  return "-" if v is None else f"{v / 1e12:.2f}"


def render_tensor_search(r: Any, fmt: str) -> str:
  """A :class:`jaxmem.planning.tensors.TensorSearchResult` as text, markdown, JSON or CSV (one
  record: the chosen row and the search's fields)."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(envelope([r], made_by=made_by("fit", TENSOR_SEARCH), versions=None), indent=2)
  if fmt == "csv":
    return render_csv([r.as_dict()])
  rows = [row for row in (r.row, *r.end_points) if row is not None]
  u = unit_for([x for row in rows for x in (row.required_bytes, row.capacity_bytes)])
  r0 = rows[0]
  head = (f"model {r0.model} · target {r0.target} · batch {r0.batch} · seq {r0.seq} · mesh {r.mesh} · per-tensor remat "
          f"search{heading_versions(rows)}")
  if r.row is None:
    advice = "recommendation: no per-tensor assignment fits; try a smaller batch or more devices"
  else:
    pct = "-" if r.row.recompute_overhead_pct is None else f"{r.row.recompute_overhead_pct:+.1f}%"
    advice = (f"recommendation: remat {r.remat}\n  {_size(r.row.required_bytes, u.size)} of {_size(r.row.capacity_bytes, u.size)} "
              f"{u.name} per device (predicted {_size(r.predicted_required_bytes, u.size)}, {r.prediction_error_pct:+.2f}%), "
              f"recompute {_tflop(r.recompute_flops)} TFLOP ({pct}), host {_size(r.host_bytes, u.size)} {u.name} "
              f"(transfer {_size(r.host_transfer_bytes, u.size)} {u.name} per step), {r.compiles} compiles")
  choice = dict(r.assignment)
  names = grid(
      [[n.name, _size(n.device_bytes, u.size), _tflop(n.recompute_flops), choice.get(n.name, "-")] for n in r.names],
      ["name", f"device {u.name} (all layers)", "recompute TFLOP", "chosen"], fmt,
  )
  compiled = {row.remat: row for row in rows}
  tried = [[t.remat, _size(t.predicted_required_bytes, u.size), _size(t.required_bytes, u.size),
            "-" if t.prediction_error_pct is None else f"{t.prediction_error_pct:+.2f}%",
            verdict_cell(compiled[t.remat], u) if t.remat in compiled else {True: "yes", False: "NO"}.get(t.fits, "-"), _tflop(t.recompute_flops)]
           for t in r.tried]
  tried = [[row.remat, "end point", _size(row.required_bytes, u.size), "-", verdict_cell(row, u), "-"] for row in r.end_points] + tried
  table = grid(tried, ["remat", f"predicted {u.name}", f"compiled {u.name}", "error", "fits", "recompute TFLOP"], fmt)
  notes = "\n".join(f"note: {n}" for n in r.notes)
  return "\n\n".join(filter(None, [head, advice, names, table, notes]))

"""``explain``'s output in every format, and the residuals table behind ``compare --residuals``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from jaxmem.buffers.analyse import Explanation
from jaxmem.buffers.residuals import PolicyResiduals
from jaxmem.planning.refusal import RefusalExplanation
from jaxmem.render.timeline import timeline_text, title
from jaxmem.steptime import OpTimes
from jaxmem.render.ops import op_times_json, render_op_times
from jaxmem.inputs import EXPLANATION, REFUSAL, RESIDUALS
from jaxmem.render import columns as cols
from jaxmem.render.tables import check_format, envelope, made_by, render_csv, render_records, tabulated
from jaxmem.render.units import unit_for
from jaxmem.records import Configuration
from jaxmem.versions import describe

# via_loop: the while the value came out of when op_name/source are those of the op in its body.
JSON_BUFFER_KEYS = ("size_bytes", "shape", "dtype", "kind", "hlo", "op_name", "source", "via_loop")
# The verdict against the target's capacity (None on a target without one), as compare's rows have it.
VERDICT_KEYS = ("capacity_bytes", "required_bytes", "fits", "verdict", "margin_bytes", "risk_bytes", "judged_figure",
                "naive_sum_bytes", "compiler_check")
# The configuration as explain's JSON names it: the explained function (empty for a preset), the
# platform, and a preset's configuration (jaxmem.records.Configuration: every sweep axis it records).
_CONFIGURATION = ("function", "platform", *(f.name for f in dataclasses.fields(Configuration)))


# What the three figures printed side by side are, and why they differ.
PEAKS_LINE = (
    "three figures: 'sum = footprint' is every allocation of the step counted at once (total, i.e. arguments + "
    "outputs not aliased + the temp heap, plus generated code), which the consumers split; peak_bytes is the most the compiler says is "
    "live at one time (XLA:CPU gives none: there, its allocation without the code), less than the total where "
    "buffers never coexist or the heap's layout leaves gaps, more on TPU where it counts on-chip memory; "
    "live_bytes_at_peak is the whole live set (its largest buffers listed below) at the highest point of jaxmem's"
    " rebuild of device memory over the compiler's schedule from XLA's dump, without the code"
)


def explain_json(result: Explanation) -> dict[str, Any]:
  """The JSON document: the envelope with the four required keys, then the rest."""
  d = result.as_dict()
  doc = envelope(
      [],
      made_by=made_by("explain", EXPLANATION),
      versions=result.versions,
      consumers=d["consumers"],
      peak_bytes=d["peak_bytes"],
      live_bytes_at_peak=d["live_bytes_at_peak"],
      peak_buffers=[{k: b[k] for k in JSON_BUFFER_KEYS} for b in d["peak_buffers"]],
      peak_buffer_kinds=d["kinds"],  # the kinds peak_buffers is limited to; empty: every kind
      estimated=d["estimated"],
      footprint_bytes=d["footprint_bytes"],
      **{k: getattr(result, k) for k in VERDICT_KEYS},
      peak_source=d["peak_source"],
      configuration={k: d[k] for k in _CONFIGURATION},
      arguments=d["arguments"],
      by_module=d["by_module"],
      by_kind=d["by_kind"],
      peak_buffer_details=d["peak_buffers"],
      live_set=d["live_set"],  # the whole live set at the peak, like buffers grouped (what `jaxmem diff` matches)
      timeline=d["timeline"],
      notes=d["notes"],
  )
  doc.pop("rows", None)
  return doc


def render_explain(result: Explanation, fmt_name: str, *, op_times: OpTimes | None = None, framework: bool = False,
                   columns: frozenset[str] = cols.DEFAULT_CHOICE) -> str:
  """Consumers, the peak, the buffers live at it, by module and kind, the timeline, notes; and
  with ``op_times`` (``explain --top-ops``) the slowest ops by their time in the simulated step, last.
  ``framework``: the buffers' table adds the framework line each source line called; ``columns``:
  the buffers' table's (:data:`jaxmem.render.columns.EXPLAIN_BUFFERS`; JSON and CSV carry every
  field)."""
  check_format(fmt_name)
  if fmt_name == "json":
    doc = explain_json(result)
    if op_times is not None:
      doc["op_times"] = op_times_json(op_times)
    return json.dumps(doc, indent=2)
  if fmt_name == "csv":
    return render_csv([{**{k: b.as_dict()[k] for k in JSON_BUFFER_KEYS}, "module": b.module, "phase": b.phase} for b in result.peak_buffers])
  size = unit_for([result.peak_bytes, result.footprint_bytes], smallest="KiB")
  uname = size.name
  r = result
  head = f"{title(r)} · {uname} per device" + (f" · {describe(r.versions)}" if r.versions else "")
  consumers = [
      {"consumer": k, uname: size(v), "how": "estimate" if k in r.estimated else "exact"}
      for k, v in r.consumers.items()
  ]
  consumers.append({"consumer": "sum = footprint", uname: size(r.footprint_bytes), "how": "total (argument+output-alias+temp)+code"})
  peak_lines = [
      f"peak_bytes {size(r.peak_bytes)} {uname} ({r.peak_source}); live_bytes_at_peak {size(r.live_bytes_at_peak)} {uname} "
      f"at schedule position {r.peak_position}, {r.live_buffer_count} buffers",
      PEAKS_LINE,
  ]
  if r.capacity_bytes is not None and r.required_bytes is not None:
    peak_lines.insert(1, f"required {size(r.required_bytes)} of capacity {size(r.capacity_bytes)} {uname}: fits {r.verdict}")
  if r.kinds:
    peak_lines.append(f"buffers listed: the largest of kind {', '.join(r.kinds)} only (the tables below them count every kind)")
  buffers = cols.Table(r.peak_buffers, size, frozenset({"framework"} if framework else ()), chosen=columns)
  shown = [c.field for c in cols.shown(cols.EXPLAIN_BUFFERS, buffers)]
  groups = [{"module": m, uname: size(v)} for m, v in r.by_module.items()]
  kinds = [{"kind": k, uname: size(v)} for k, v in r.by_kind.items() if v]
  out = [head, "", render_records(consumers, fmt_name), "", *peak_lines, "", tabulated(cols.EXPLAIN_BUFFERS, buffers, fmt_name),
         "", render_records(groups, fmt_name), "", render_records(kinds, fmt_name)]
  if fmt_name == "table":
    out += ["", timeline_text(r)]
  notes = list(r.notes)
  if "hlo" in shown and any(b.via_loop for b in r.peak_buffers):
    notes.append(
        "hlo 'X <- W body P': X came out of the loop W (the scan over the layers); module, source "
        "and op_name are those of P, the instruction in W's body that computes it"
    )
  out += [""] + [f"{'- ' if fmt_name == 'markdown' else ''}note: {n}" for n in notes]
  if op_times is not None:
    out += ["", f"the {len(op_times.ops)} slowest ops in the simulated schedule (estimates, per device per step):",
            render_op_times(op_times, fmt_name)]
  return "\n".join(out).rstrip()


def residuals_table(rows: Sequence[PolicyResiduals], fmt_name: str) -> str:
  """``compare --residuals``: ``rows`` from :func:`jaxmem.buffers.residuals.saved_residuals_by_policy`,
  one line per saved residual, with each policy's per-layer and total bytes."""
  check_format(fmt_name)
  flat = [rec for p in rows for rec in p.rows()]
  if fmt_name == "json":
    return json.dumps(envelope([], made_by=made_by("compare", RESIDUALS), policies=[p.as_dict() for p in rows]) | {"rows": flat},
                      indent=2)
  if fmt_name == "csv":
    return render_csv([{**r, "shape": "x".join(map(str, r["shape"]))} for r in flat])
  u = unit_for([p.total_bytes for p in rows], smallest="KiB")
  unit, uname = u.size, u.name
  summary = [
      {"attention": p.attention or "dot", "remat": p.remat, "residuals": len(p.residuals), f"per layer {uname}": f"{p.per_layer_bytes / unit:,.2f}",
       f"all {p.num_layers} layers {uname}": f"{p.total_bytes / unit:,.2f}"}
      for p in rows
  ]
  detail = [
      {"attention": r["attention"] or "dot", "remat": r["remat"], "residual": r["residual"], "shape": "[" + ",".join(map(str, r["shape"])) + "]",
       "dtype": r["dtype"], uname: f"{r['bytes'] / unit:,.3f}"}
      for r in flat
  ]
  head = ""
  if rows:
    p0 = rows[0]
    head = f"saved for the backward pass · model {p0.model} · batch {p0.batch} x seq {p0.seq}, one device, unsharded · {uname}\n\n"
  return head + render_records(summary, fmt_name) + "\n\n" + render_records(detail, fmt_name)


def refusal_json(r: RefusalExplanation) -> dict[str, Any]:
  """A refused configuration explained, as JSON: the envelope, then the explanation's fields
  (the configuration's flat at the top, as explain's JSON has them)."""
  d = r.as_dict()
  doc = envelope([], made_by=made_by("explain", REFUSAL), versions=d.pop("versions"), **d)
  doc.pop("rows", None)
  return doc


def render_refusal(r: RefusalExplanation, fmt_name: str, *, top: int = 10) -> str:
  """``explain`` of a configuration the compiler refused: the requirement the refusal states, the
  buffers that fill it (extrapolated, largest first: every group in JSON and CSV, the ``top``
  largest in a table, of ``r.kinds`` where given, and the rest as one line), their sum beside the
  requirement, the compiles they were extrapolated from, and the changes compiled, those that fit first."""
  check_format(fmt_name)
  if fmt_name == "json":
    return json.dumps(refusal_json(r), indent=2)
  if fmt_name == "csv":
    return render_csv([{k: v for k, v in b.as_dict().items() if k != "probe_bytes"} for b in r.buffers])
  size = unit_for([r.required_bytes, r.extrapolated_bytes], smallest="KiB")
  uname = size.name
  head = f"{title(r)} · refused by the compiler · {uname} per device" + (f" · {describe(r.versions)}" if r.versions else "")
  shown = [b for b in r.buffers if not r.kinds or b.kind in r.kinds][:top]
  bufs = [{uname: size(b.size_bytes), "how": b.how, "kind": b.kind, "dtype": b.dtype, "shape": b.shape or "-",
           "module": b.module, "source": b.source or "-", "op": b.op or "-"} for b in shown]
  rest = [b for b in r.buffers if b not in shown]
  if rest:
    bufs.append({uname: size(sum(b.size_bytes for b in rest)), "how": rest[0].how, "kind": f"{len(rest)} more groups"})
  bufs.append({uname: size(r.extrapolated_bytes), "how": "sum", "kind": "the buffers above"})
  if r.required_bytes is not None:
    bufs.append({uname: size(r.required_bytes), "how": "compiler", "kind": "the requirement the refusal states"})
  gap = "" if r.error_pct is None else f" ({r.error_pct:+.1f}% of the requirement the compiler states)"
  lines = [
      f"the compiler refused it: {r.error}",
      f"required {size(r.required_bytes) if r.required_bytes is not None else '?'} of capacity "
      f"{size(r.capacity_bytes) if r.capacity_bytes is not None else '?'} {uname}: fits NO",
      f"what fills it, extrapolated in the {' and '.join(r.extrapolated_in)} from the compiles below: "
      f"{size(r.extrapolated_bytes)} {uname}{gap}",
  ]
  probes = [{"layers": p.layers, "batch": p.batch, "fits": "yes" if p.fits else "NO",
             f"required {uname}": size(p.required_bytes) if p.required_bytes is not None else "-",
             f"live at peak {uname}": size(p.live_bytes_at_peak) if p.live_bytes_at_peak is not None else "-"}
            for p in r.probes]
  out = [head, "", *lines, "", render_records(bufs, fmt_name), "", "compiled to extrapolate from:",
         render_records(probes, fmt_name)]
  if r.changes:
    changes = [{"change": c.change, f"required {uname}": size(c.required_bytes) if c.required_bytes is not None else "-",
                "fits": c.verdict or ("yes" if c.fits else "NO"), "how": c.how,
                f"extrapolated {uname}": size(c.extrapolated_bytes) if c.extrapolated_bytes is not None else "-",
                "step s": f"{c.step_time_s:.3f}" if c.step_time_s is not None else "-",
                "tokens/s/device": f"{c.tokens_per_s_per_device:,.0f}" if c.tokens_per_s_per_device else "-"}
               for c in r.changes]
    out += ["", "changes, compiled at full depth (those that fit first, the most tokens per second per device first):",
            render_records(changes, fmt_name)]
  out += [""] + [f"{'- ' if fmt_name == 'markdown' else ''}note: {n}" for n in r.notes]
  return "\n".join(out).rstrip()

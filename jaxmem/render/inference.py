"""``infer`` and ``estimate`` output, the sections ``compare --with-inference/--with-estimate`` add, and
a serving engine's answer (``--engine``: :func:`render_engine`).

Rendering goes through :mod:`jaxmem.render.tables`' generic record renderer. Tables show one
binary unit chosen for the figures (:mod:`jaxmem.render.units`), ``estimate`` decimal GB as its
sources quote them; JSON and CSV give bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jaxmem.hardware.margin import AT_RISK, NO, YES
from jaxmem.planning.estimate import Estimate
from jaxmem.inference.engines import EngineCapacity
from jaxmem.inference.infer import InferRow
from jaxmem.launch import Launch
from jaxmem.render import columns as cols
from jaxmem.render.columns import verdict_cell
from jaxmem.inputs import ESTIMATES, INFERENCE, KV_CACHE, SERVING
from jaxmem.render.tables import (
    AT_RISK_NOTE, check_format, envelope, grid, heading_versions, made_by, render_csv, render_records,
    run_versions,
)
from jaxmem.render.units import Unit, unit, unit_for

KV_COLUMNS = ("batch", "context", "kv_heads", "kv_cache_bytes")
ESTIMATE_COLUMNS = (
    "model", "params", "bytes_per_param", "model_state_bytes", "h100_80gb_equivalents", "activation_bytes_per_layer",
    "activation_bytes", "kv_cache_bytes", "weight_bytes_bf16", "weight_bytes_fp8", "weight_bytes_int4",
)
# Shown when a model is a mixture of experts (dispatch buffers: every MoE layer, whole model).
MOE_ESTIMATE_COLUMNS = (
    "model", "params", "active_params", "expert_state_bytes", "non_expert_state_bytes", "dispatch_bytes_dropless",
    "dispatch_bytes_capacity", "capacity_factor",
)
SIDE_COLUMNS = (
    "mesh", "workload", "detail", "batch", "argument_size_in_bytes", "temp_size_in_bytes", "required_bytes",
    "all_devices_required_bytes", "capacity_bytes", "fits", "verdict",
)
COMPARISON_COLUMNS = ("mesh", "optimizer", "remat", "component", "estimate_bytes", "compiler_bytes", "ratio")


def _is_bytes(k: str) -> bool:
  return "bytes" in k and k != "bytes_per_param"


def _unit_for(dicts: Sequence[dict[str, Any]], keys: Sequence[str]) -> Unit:
  return unit_for([d.get(k) for d in dicts for k in keys if _is_bytes(k) and isinstance(d.get(k), (int, float))])


def _table_records(dicts: Sequence[dict[str, Any]], keys: Sequence[str], u: Unit | None = None) -> list[dict[str, Any]]:
  u = u or _unit_for(dicts, keys)
  out = []
  for d in dicts:
    r = {}
    for k in keys:
      v = d.get(k)
      if _is_bytes(k):
        label = k.replace("_size_in_bytes", "").replace("_in_bytes", "").replace("_bytes", "")
        r[f"{label} {u.name}"] = u(v)
      elif k == "fits":
        # infer's rows carry the verdict (yes, at risk, NO: jaxmem.hardware.margin); others only fits.
        verdict = d.get("verdict") if d.get("verdict") in (YES, AT_RISK, NO) else None
        r[k] = verdict or ("-" if v is None else ("yes" if v else "NO"))
      elif isinstance(v, float):
        r[k] = f"{v:.3g}"
      else:
        r[k] = v
    out.append(r)
  return out


def render(dicts: Sequence[dict[str, Any]], fmt_name: str, keys: Sequence[str]) -> str:
  """Records as JSON or CSV (bytes), or a table of ``keys`` in one unit (infer's KV cache table)."""
  if fmt_name in ("json", "csv"):
    return render_records(list(dicts), fmt_name, made_by=made_by("infer", KV_CACHE))
  return render_records(_table_records(dicts, keys), fmt_name)


def render_infer(rows: Sequence[InferRow], fmt_name: str, *, kv_rows: Sequence[dict[str, Any]] = (),
                 columns: frozenset[str] = cols.DEFAULT_CHOICE) -> str:
  """``infer``'s rows; in table and markdown, a heading (with the compiler versions), the notes
  and errors; the KV cache table from the formula after it when ``kv_rows`` are given. Tables
  show :data:`jaxmem.render.columns.INFER`: the KV cache per token (whole model, one sequence) in
  KiB, with the attention kind, and for a mixture-of-experts model how its experts run; with
  several devices, the bytes each sends per step in collectives (``comm``); ``columns``: the
  ones chosen (:func:`jaxmem.render.columns.choose`; JSON and CSV carry every field)."""
  if fmt_name in ("json", "csv"):
    text = (render_records(list(rows), fmt_name, made_by=made_by("infer", INFERENCE)) if fmt_name == "json"
            else render_csv(rows, cols.INFER))
  else:
    u = cols.unit_of(rows, cols.byte_fields(cols.INFER))
    headers, body = cols.lay_out(cols.INFER, cols.Table(rows, u, chosen=columns))
    text = grid(body, headers, fmt_name)
    r0 = rows[0]
    text = (f"model {r0.model} · target {r0.target} · {u.name} per device (weight and kv_cache: whole model)"
            f"{heading_versions(rows)}\n\n" + text)
    notes = dict.fromkeys(n for r in rows for n in r.notes)
    errors = [f"error [{r.mesh} {r.phase} {r.weights} {r.context}]: {r.error}" for r in rows if r.error]
    if notes or errors:
      text += "\n\n" + "\n".join([f"note: {n}" for n in notes] + errors)
  if kv_rows:
    text += "\n\n" + render(kv_rows, fmt_name, KV_COLUMNS)
  return text


def render_estimates(rows: Sequence[Estimate], fmt_name: str) -> str:
  """``estimate``'s closed forms: JSON/CSV in bytes, tables in decimal GB with their sources."""
  dicts = [r.as_dict() for r in rows]
  if fmt_name in ("json", "csv"):
    return render_records(dicts, fmt_name, made_by=made_by("estimate", ESTIMATES))
  # Decimal GB, as the sources (ZeRO, Hugging Face, NVIDIA's 80 GB) quote their figures.
  recs = _table_records(dicts, ESTIMATE_COLUMNS, unit("GB"))
  for rec, d in zip(recs, dicts, strict=True):
    rec["params"] = f"{d['params'] / 1e9:.3f}B"
    rec["h100_80gb_equivalents"] = f"{d['h100_80gb_equivalents']:.1f}"
    # Per token: kilobytes, where GB would round to zero (MLA's point is this figure).
    rec["kv per token KB"] = f"{d['kv_cache_bytes_per_token'] / 1e3:,.1f}"
  e = rows[0]
  head = (f"{e.optimizer}, {_layout(e)}, batch {e.batch} x seq {e.seq}, tensor {e.tensor}, "
          f"recompute {e.recompute}; whole model, GB = 1e9 bytes (h100 = model state / 80 GB)")
  text = head + "\n\n" + render_records(recs, fmt_name)
  if e.data > 1:
    text += "\n\n" + "\n".join(
        f"{d['model']}: Megatron's distributed optimizer over data = {e.data}: {d['distributed_bytes_per_param']:g} bytes "
        f"per parameter, {d['distributed_model_state_bytes'] / 1e9:.3f} GB model state per rank" for d in dicts
    )
  moe = [d for d in dicts if d["expert_params"]]
  if moe:
    recs = _table_records(moe, MOE_ESTIMATE_COLUMNS, unit("GB"))
    for rec, d in zip(recs, moe, strict=True):
      rec["params"], rec["active_params"] = (f"{d[k] / 1e9:.3f}B" for k in ("params", "active_params"))
    text += ("\n\nmixture of experts: state of the routed experts (what an expert axis divides) and of the rest; "
             "dispatch buffers of every MoE layer, GB:\n\n" + render_records(recs, fmt_name))
  return text + "\n\n" + "\n".join(f"source: {s}" for s in e.sources)


def _layout(e: Estimate) -> str:
  """The precision an estimate is for: its preset, and the dtypes of its parameters, gradients,
  master copy and moments."""
  dtypes = e.layout.words()
  return f"{e.precision} precision ({dtypes})" if e.precision != "dtypes" else dtypes


def render_compare_extras(extras: dict[str, list[dict[str, Any]]], fmt_name: str) -> str:
  """Text for table/markdown (sections after compare's table); empty for json/csv, where
  ``extras`` go into the JSON envelope instead."""
  if fmt_name in ("json", "csv") or not extras:
    return ""
  parts = []
  if extras.get("inference"):
    parts.append("training vs inference, per device (all_devices = summed over the devices):\n\n"
                 + render(extras["inference"], fmt_name, SIDE_COLUMNS))
  if extras.get("estimate"):
    recs = extras["estimate"]
    table = render(recs, fmt_name, COMPARISON_COLUMNS)
    notes = dict.fromkeys(f"{r['component']} ({r['remat']}): {r['note']}" for r in recs if r["note"])
    sources = dict.fromkeys(f"{r['component']}: {r['source']}" for r in recs if r.get("source"))
    parts.append("estimate vs compiler, per device (ratio = compiler / estimate):\n\n" + table
                 + ("\n\n" + "\n".join(f"note: {n}" for n in notes) if notes else "")
                 + ("\n" + "\n".join(f"source: {s}" for s in sources) if sources else ""))
  return "\n\n" + "\n\n".join(parts)


def render_serving(results: Sequence[Any], fmt_name: str) -> str:
  """``fit --phase``'s answers (:class:`jaxmem.inference.serving.ServingFit`): JSON as the
  envelope of their dicts (bytes), CSV one line each, tables in one unit with the size one step
  up and why it does not fit, then the answers' notes."""
  check_format(fmt_name)
  if fmt_name == "json":
    return json.dumps(envelope(results, made_by=made_by("fit", SERVING)), indent=2)
  dicts = [r.as_dict() for r in results]
  if fmt_name == "csv":
    keys = list(dict.fromkeys(k for d in dicts for k in d))  # an answer without a row has fewer fields
    return render_csv([{k: d.get(k) for k in keys} for d in dicts])
  rows = [r.row for r in results if r.row is not None]
  u = _unit_for(dicts, SERVING_COLUMNS)
  recs = []
  for r, d in zip(results, dicts, strict=True):
    rec = {"mesh": r.mesh, "weights": r.weights, "phase": r.phase}
    rec.update({"max batch": r.max_batch, "context": r.max_context} if r.over == "batch"
               else {"batch": r.max_batch, "max context": r.max_context})
    rec.update({f"{label} {u.name}": u(d.get(k)) for k, label in SERVING_COLUMNS.items()})
    rec["fits"] = None if r.row is None else verdict_cell(r.row, u)
    rec["next up"] = _next_cell(r, u)
    rec["argument limit"] = r.argument_limit  # the smallest size its arguments alone exclude: never compiled
    rec["compiles"] = r.compiles
    rec["note"] = r.note
    recs.append(rec)
  text = render_records(recs, fmt_name)
  r0 = results[0] if results else None
  if r0 is not None:
    what = "concurrent sequences" if r0.over == "batch" else "context"
    fixed = {(x.context if r0.over == "batch" else x.batch) for r in results for x in (r.row, r.next) if x is not None}
    name = "context" if r0.over == "batch" else "batch"
    at = f"at {name} {fixed.pop()}" if len(fixed) == 1 else f"at each {name}"
    head = (f"model {(rows[0].model if rows else '-')} · target {(rows[0].target if rows else '-')} · {r0.phase} {at} · "
            f"the most {what} that fit, {u.name} per device (compiled){heading_versions(rows)}")
    text = head + "\n\n" + text
  notes = list(dict.fromkeys(n for row in rows for n in row.notes))
  notes.append("argument limit: the smallest size whose arguments (weights, KV cache, tokens) alone exceed the "
               "capacity, from their shapes and shardings; no size from it up is compiled")
  if any(row.verdict == AT_RISK for row in rows):
    notes.append(AT_RISK_NOTE)
  return text + "\n\n" + "\n".join(f"note: {n}" for n in notes)


# The answer's figures per device, each with its column's label.
SERVING_COLUMNS = {
    "weight_bytes_per_device": "weights", "kv_cache_bytes_per_device": "kv cache", "argument_size_in_bytes": "argument",
    "temp_size_in_bytes": "temp", "required_bytes": "required", "capacity_bytes": "capacity",
}


def _next_cell(r: Any, u: Unit) -> str:
  """The size one step above the answer and why it does not fit: compiled (its required bytes)
  or refused by its argument bytes alone."""
  n = r.next
  if n is None:
    return "-"
  size = n.batch if r.over == "batch" else n.context
  if n.error is not None and n.error.startswith("not compiled"):
    return f"{size}: arguments alone {u(n.required_bytes)} {u.name}, not compiled"
  if n.required_bytes is None:
    return f"{size}: refused ({(n.error or '').splitlines()[0][:60]})"
  return f"{size}: {n.verdict or ('NO' if n.fits is False else '-')}, {u(n.required_bytes)} {u.name}"


def render_engine(results: Sequence[EngineCapacity], fmt_name: str, *, launches: Sequence[Launch] = ()) -> str:
  """An engine's answers (:class:`jaxmem.inference.engines.EngineCapacity`): JSON as the envelope
  of their dicts (bytes; ``launches`` beside the rows), CSV one line each (the terms and pairs
  left to JSON); tables one line a (mesh, weights, context) in the engine's units, then each
  distinct set of terms per device (what the compiler, the engine and the target each give, and
  the rule's source), the pairs that fit, the notes and the launch lines."""
  check_format(fmt_name)
  if fmt_name == "json":
    rows = [r.row for r in results if r.row is not None]
    return json.dumps(envelope(results, versions=run_versions(rows) or None, launches=[x.as_dict() for x in launches]),
                      indent=2)
  if fmt_name == "csv":
    flat = [{k: v for k, v in r.as_dict().items() if k not in ("terms", "pairs", "row", "settings", "notes")}
            | {f"setting_{k}": v for k, v in r.settings.items()} for r in results]
    return render_csv(flat)
  u = unit_for([r.kv_bytes for r in results if r.kv_bytes] + [t.bytes for r in results for t in r.terms if t.bytes])
  text = _laid_out(cols.ENGINE, results, u, fmt_name)
  if results:
    r0 = results[0]
    rows = [r.row for r in results if r.row is not None]
    text = (f"engine {r0.engine} · model {r0.model} · target {r0.target} · KV {r0.kv_cache_dtype}, {u.name} over "
            f"all {r0.num_devices} devices{heading_versions(rows)}\n\n" + text)
  seen: list[tuple[Any, ...]] = []
  for r in results:
    key = tuple((t.name, t.bytes) for t in r.terms)
    if key not in seen:
      seen.append(key)
      text += f"\n\nterms a device ({r.mesh} {r.weights} {r.context}):\n\n" + _laid_out(cols.ENGINE_TERMS, r.terms, u,
                                                                                        fmt_name)
  pairs = dict.fromkeys(f"{r.mesh} {r.weights}: " + ", ".join(f"{c:,} x {n:,}" for c, n in r.pairs)
                        for r in results if r.pairs)
  if pairs:
    text += "\n\ncontext x the most concurrent sequences of it that fit:\n" + "\n".join(pairs)
  notes = dict.fromkeys([*(n for r in results for n in r.notes), *(n for x in launches for n in x.notes)])
  lines = [f"note: {n}" for n in notes] + [f"{x.tool}: {x.text()}" for x in launches]
  return text + ("\n\n" + "\n".join(lines) if lines else "")


def _laid_out(columns: Sequence[cols.Column], rows: Sequence[Any], u: Unit, fmt_name: str) -> str:
  """``rows`` as a table (or markdown) of ``columns`` (every one it shows: an engine's table is
  asked for by name, --engine, and has no wider set to choose from), byte cells in ``u``."""
  headers, body = cols.lay_out(columns, cols.Table(rows, u, chosen=frozenset({cols.ALL})))
  return grid(body, headers, fmt_name)

"""CLI for ``infer`` and ``estimate``, and the ``compare --with-inference/--with-estimate`` sections.

Registered by :mod:`jaxmem.cli` through :func:`add_infer_parsers`; rendering goes through
:mod:`jaxmem.format`'s generic record renderer. Tables show GiB; JSON and CSV give bytes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from jaxmem.errors import JaxmemError

GiB = 1024**3
_INFER_COLUMNS = (
    "mesh", "phase", "weights", "context", "batch", "weight_bytes_per_device", "kv_cache_bytes_per_device",
    "argument_size_in_bytes", "temp_size_in_bytes", "peak_memory_in_bytes", "total_bytes", "capacity_bytes",
    "fits", "weight_bytes", "kv_cache_bytes", "compile_seconds",
)


UNITS = {"GiB": GiB, "MiB": 1024**2, "GB": 1e9}


def _unit_for(dicts: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
  biggest = max((d.get(k) or 0 for d in dicts for k in keys if "bytes" in k and isinstance(d.get(k), (int, float))), default=0)
  return "GiB" if biggest >= GiB // 10 else "MiB"


def _table_records(dicts: Sequence[dict[str, Any]], keys: Sequence[str], unit: str | None = None) -> list[dict[str, Any]]:
  unit = unit or _unit_for(dicts, keys)
  out = []
  for d in dicts:
    r = {}
    for k in keys:
      v = d.get(k)
      if "bytes" in k and k != "bytes_per_param":
        label = k.replace("_size_in_bytes", "").replace("_in_bytes", "").replace("_bytes", "")
        r[f"{label} {unit}"] = "-" if v is None else f"{v / UNITS[unit]:,.2f}"
      elif k == "fits":
        r[k] = "-" if v is None else ("yes" if v else "NO")
      elif isinstance(v, float):
        r[k] = f"{v:.3g}"
      else:
        r[k] = v
    out.append(r)
  return out


def render(dicts: Sequence[dict[str, Any]], fmt_name: str, keys: Sequence[str]) -> str:
  from jaxmem.render import tables as fmt

  if fmt_name in ("json", "csv"):
    return fmt.render_records(list(dicts), fmt_name)
  return fmt.render_records(_table_records(dicts, keys), fmt_name)


def add_infer_parsers(subparsers: Any, add_workload: Callable[[argparse.ArgumentParser], None]) -> None:
  """Registers ``infer`` and ``estimate`` on the CLI's subparsers."""
  i = subparsers.add_parser("infer", help="prefill and decode memory with a KV cache, per weight format")
  add_workload(i)
  i.set_defaults(batch=1)
  i.add_argument("--prompt", type=int, default=1024, help="prefill prompt length in tokens; default 1024")
  i.add_argument("--context", default="2048", help="decode KV cache lengths, comma separated; default 2048")
  i.add_argument("--weights", default="bf16", help="bf16, fp16, fp8, int8, int4, comma separated, or all; default bf16")
  i.add_argument("--phase", default="prefill,decode", help="prefill, decode or both; default both")
  i.add_argument("--kv-table", action="store_true", help="also list the KV cache (formula) against context and batch")
  i.add_argument("--plot", default=None, metavar="FILE", help="write a figure of memory against context (png, pdf, svg)")
  i.set_defaults(func=cmd_infer)
  e = subparsers.add_parser("estimate", help="closed-form memory figures with their sources (ZeRO, Korthikanti et al.)")
  e.add_argument("--model", default="gpt2-small", help="model presets, comma separated; default gpt2-small")
  e.add_argument("--optimizer", default="adamw", help="optimizer; default adamw")
  e.add_argument("--precision", default="mixed", help="mixed (ZeRO's 16 B/param for Adam), fp32 or bf16; default mixed")
  e.add_argument("--batch", type=int, default=8, help="micro-batch per model replica; default 8")
  e.add_argument("--seq", type=int, default=1024, help="sequence length; default 1024")
  e.add_argument("--tensor", type=int, default=1, help="tensor-parallel size t; default 1")
  e.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with --tensor)")
  e.add_argument("--recompute", default="none", help="none, selective or full; default none")
  e.add_argument("--context", type=int, default=None, help="KV cache context; default --seq")
  e.add_argument("--format", default="table", help="table, markdown, json or csv; default table")
  e.add_argument("--output", default=None, help="also write the result to this file")
  e.set_defaults(func=cmd_estimate)


def cmd_infer(args: argparse.Namespace) -> int:
  import sys

  from jaxmem.render import tables as fmt
  from jaxmem.inference import infer
  from jaxmem.cli import _emit, _resolve_target

  fmt.check_format(args.format)
  args.target, chosen = _resolve_target(args)
  plan = infer.plan_infer(
      model=args.model, weights=args.weights, phase=args.phase, prompt=args.prompt, context=args.context,
      batch=args.batch, target=args.target, mesh=args.mesh, dtype=args.dtype, slices=args.slices,
  )
  if chosen:
    print(chosen, file=sys.stderr)
  rows = [infer.run_infer_config(plan, *c) for c in plan.configs()]
  dicts = [r.as_dict() for r in rows]
  text = render(dicts, args.format, _INFER_COLUMNS)
  if args.format in ("table", "markdown"):
    r0 = rows[0]
    unit = _unit_for(dicts, _INFER_COLUMNS)
    text = f"model {r0.model} · target {r0.target} · {unit} per device (weight and kv_cache: whole model)\n\n" + text
    notes = dict.fromkeys(n for r in rows for n in r.notes)
    errors = [f"error [{r.mesh} {r.phase} {r.weights} {r.context}]: {r.error}" for r in rows if r.error]
    if notes or errors:
      text += "\n\n" + "\n".join([f"note: {n}" for n in notes] + errors)
  if args.kv_table:
    kv = infer.kv_cache_table(plan.cfg, contexts=sorted({1024, 8192, 32768, 131072, *plan.contexts}), batches=sorted({1, 8, 32, plan.batch}))
    text += "\n\n" + render(kv, args.format, ("batch", "context", "kv_heads", "kv_cache_bytes"))
  if args.plot:
    kv = infer.kv_cache_table(plan.cfg, contexts=[2**k for k in range(10, 18)], batches=sorted({1, 8, 32, plan.batch}))
    infer.plot(rows, args.plot, kv_rows=kv)
  _emit(text, args.output)
  return 0


def cmd_estimate(args: argparse.Namespace) -> int:
  from jaxmem.inference import estimate as est
  from jaxmem.render import tables as fmt
  from jaxmem.cli import _emit

  fmt.check_format(args.format)
  models = [m.strip() for m in args.model.split(",") if m.strip()]
  if not models:
    raise JaxmemError("--model is empty")
  rows = est.estimates(
      models, optimizer=args.optimizer, precision=args.precision, batch=args.batch, seq=args.seq,
      tensor=args.tensor, sequence_parallel=args.sequence_parallel, recompute=args.recompute, context=args.context,
  )
  dicts = [r.as_dict() for r in rows]
  if args.format in ("json", "csv"):
    _emit(fmt.render_records(dicts, args.format), args.output)
    return 0
  keys = ("model", "params", "bytes_per_param", "model_state_bytes", "h100_80gb_equivalents", "activation_bytes_per_layer",
          "activation_bytes", "kv_cache_bytes", "weight_bytes_bf16", "weight_bytes_fp8", "weight_bytes_int4")
  # Decimal GB, as the sources (ZeRO, Hugging Face, NVIDIA's 80 GB) quote their figures.
  recs = _table_records(dicts, keys, unit="GB")
  for rec, d in zip(recs, dicts, strict=True):
    rec["params"] = f"{d['params'] / 1e9:.3f}B"
    rec["h100_80gb_equivalents"] = f"{d['h100_80gb_equivalents']:.1f}"
  head = (f"{args.optimizer}, {args.precision} precision, batch {args.batch} x seq {args.seq}, tensor {args.tensor}, "
          f"recompute {args.recompute}; whole model, GB = 1e9 bytes (h100 = model state / 80 GB)")
  text = head + "\n\n" + fmt.render_records(recs, args.format) + "\n\n" + "\n".join(f"source: {s}" for s in rows[0].sources)
  _emit(text, args.output)
  return 0


# --- compare --with-inference / --with-estimate -------------------------------------------------


def add_compare_flags(p: argparse.ArgumentParser) -> None:
  p.add_argument("--with-inference", action="store_true", help="add the decode step of the same model, target and mesh")
  p.add_argument("--with-estimate", action="store_true", help="add the closed-form estimate against the compiler, per component")
  p.add_argument("--weights", default="bf16", help="weights for --with-inference; default bf16")


def compare_extras(args: argparse.Namespace, rows: Sequence[Any]) -> dict[str, list[dict[str, Any]]]:
  """Records for the sections ``compare`` adds: ``inference`` (training vs decode, one pair per
  mesh, for the last remat policy of that mesh) and ``estimate`` (per component, per row)."""
  from jaxmem.inference import estimate as est
  from jaxmem.inference import infer

  out: dict[str, list[dict[str, Any]]] = {}
  if getattr(args, "with_inference", False):
    pairs = []
    for mesh in dict.fromkeys(r.mesh for r in rows):
      r = [x for x in rows if x.mesh == mesh][-1]
      for w in infer.training_vs_inference(target=args.target, weights=getattr(args, "weights", "bf16"), train_row=r):
        pairs.append(w.as_dict())
    out["inference"] = pairs
  if getattr(args, "with_estimate", False):
    recs = []
    for r in rows:
      if r.error:
        continue
      for c in est.estimate_vs_compiler(r):
        recs.append(dict(mesh=r.mesh, optimizer=r.optimizer, remat=r.remat, **c.as_dict()))
    out["estimate"] = recs
  return out


def render_compare_extras(extras: dict[str, list[dict[str, Any]]], fmt_name: str) -> str:
  """Text for table/markdown (sections after compare's table); empty for json/csv, where the
  lead puts ``extras`` into the JSON envelope instead."""
  if fmt_name in ("json", "csv") or not extras:
    return ""
  parts = []
  if extras.get("inference"):
    parts.append("training vs inference, per device (all_devices = summed over the devices):\n\n" + render(
        extras["inference"], fmt_name,
        ("mesh", "workload", "detail", "batch", "argument_size_in_bytes", "temp_size_in_bytes", "required_bytes",
         "all_devices_required_bytes", "capacity_bytes", "fits", "verdict")))
  if extras.get("estimate"):
    recs = extras["estimate"]
    table = render(recs, fmt_name, ("mesh", "optimizer", "remat", "component", "estimate_bytes", "compiler_bytes", "ratio"))
    notes = dict.fromkeys(f"{r['component']} ({r['remat']}): {r['note']}" for r in recs if r["note"])
    parts.append("estimate vs compiler, per device (ratio = compiler / estimate):\n\n" + table
                 + ("\n\n" + "\n".join(f"note: {n}" for n in notes) if notes else ""))
  return "\n\n" + "\n\n".join(parts)

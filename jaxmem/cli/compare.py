"""``jaxmem compare``: remat policies, optimizers and meshes side by side, one row each; with
``--residuals`` what each policy saves per layer, and the ``--with-inference`` and
``--with-estimate`` sections."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import columns as cols
from jaxmem.render import tables
from jaxmem.render.explain import residuals_table
from jaxmem.render.inference import render_compare_extras


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("compare", help="compare remat policies and optimizers for a model's train step")
  c.add_workload(p, own=True)
  c.add_run_options(p)
  c.add_step(p)
  c.add_train_step(p)
  c.add_sweep_axes(
      p, remat_help=f"policies, comma separated, or all; none is always the baseline (default {c.DEFAULT_REMAT}); "
      "names:save=A+B:offload=C places checkpoint names, custom:NAME=PLACE:... is MaxText's custom map"
  )
  p.add_argument("--residuals", action="store_true", help="list what each remat policy saves for the backward pass, per layer")
  p.add_argument("--with-inference", action="store_true", help="add the decode step of the same model, target and mesh")
  p.add_argument("--with-estimate", action="store_true", help="add the closed-form estimate against the compiler, per component")
  p.add_argument("--weights", default=None, help="weights for --with-inference; default bf16")
  c.add_columns(p, cols.COMPARE)
  p.set_defaults(func=run)


# What --residuals does not take: it lists what each policy saves, compiling nothing, so it has
# no sweep to run, no whole-mesh figures and no sections (the listing's own fields it refuses itself).
_NOT_RESIDUALS = ("--totals", "--jobs", "--scheduler", "--no-cache", "--with-inference", "--with-estimate", "--weights")


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  c.no_step(args, "--residuals", "--with-inference", "--with-estimate")
  if args.residuals:
    c.refuse_given(args, _NOT_RESIDUALS, "with --residuals, which lists what each remat policy saves and compiles nothing")
  if args.weights is not None and not args.with_inference:
    raise jaxmem.JaxmemError("--weights is the decode step's of --with-inference; add --with-inference or drop it")
  if args.residuals:
    c.columns(args, why="--residuals' listing")
    c.starting(args, "compare", ": the residuals each remat policy saves")
    chosen = c.resolve_target(args)
    records = jaxmem.saved_residuals_by_policy(c.workload(args))
    c.say(chosen)
    c.emit(residuals_table(records, args.format), args.output)
    return 0
  columns = c.columns(args, cols.COMPARE)
  c.starting(args, "compare")
  chosen = c.resolve_target(args)
  w = c.workload(args)
  sweep = c.Sweep(args, chosen, lambda rows: tables.render_compare(jaxmem.with_overheads(rows), args.format,
                                                                   totals=args.totals, columns=columns))
  rows = sweep.run(lambda run: jaxmem.compare(w, run=run))
  extras = compare_extras(args, rows, sweep.started.model)
  if args.format == "json":
    out = [tables.with_totals(r) for r in rows] if args.totals else rows
    c.emit(json.dumps(tables.envelope(out, made_by=tables.made_by("compare", jaxmem.inputs.ROWS), **extras), indent=2),
           args.output)
  else:
    text = tables.render_compare(rows, args.format, totals=args.totals, columns=columns)
    c.emit(text + render_compare_extras(extras, args.format), args.output)
  return 0


def compare_extras(
    args: argparse.Namespace, rows: Sequence[jaxmem.Row], cfg: jaxmem.ModelConfig
) -> dict[str, list[dict[str, Any]]]:
  """Records for the sections ``compare`` adds: ``inference`` (training vs decode, one pair per
  mesh, for the last remat policy of that mesh) and ``estimate`` (per component, per row), for
  the plan's model ``cfg`` (not looked up again by name: a config.json model has no preset)."""
  out: dict[str, list[dict[str, Any]]] = {}
  if args.with_inference:
    pairs = []
    for mesh in dict.fromkeys(r.mesh for r in rows):
      r = [x for x in rows if x.mesh == mesh][-1]
      sides = jaxmem.training_vs_inference(
          model=cfg, target=args.target, slices=args.slices, resident=args.resident, weights=args.weights or "bf16",
          train_row=r,
      )
      pairs += [s.as_dict() for s in sides]
    out["inference"] = pairs
  if args.with_estimate:
    recs = []
    for r in rows:
      if r.error:
        continue
      for comp in jaxmem.estimate_vs_compiler(r, cfg=cfg):
        recs.append(dict(mesh=r.mesh, optimizer=r.optimizer, remat=r.remat, **comp.as_dict()))
    out["estimate"] = recs
  return out

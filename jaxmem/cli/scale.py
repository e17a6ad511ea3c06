"""``jaxmem scale``: each memory component against batch and sequence length, with fitted
growth exponents and an optional plot."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("scale", help="each memory component against batch and sequence length, with growth exponents")
  c.add_workload(p, own=True)
  c.add_run_options(p)
  c.add_step(p)
  c.add_train_step(p)
  p.add_argument("--over", action="append", default=None,
                 help="seq=1024,2048,4096 or batch=8,16,32 (repeatable); default the sequence at a quarter, a half "
                 "and whole (with --seq given, the batch at once, twice and four times)")
  p.add_argument("--remat", default="none", help="policies, comma separated (default none)")
  p.add_argument("--optimizer", default="adamw", help="optimizers, comma separated; default adamw")
  p.add_argument("--plot", default=None, metavar="FILE", help="write the curves (png, svg, pdf) with the capacity as a line")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  chosen = c.resolve_target(args)
  sweep = c.Sweep(args, chosen, lambda rows: tables.render_compare(jaxmem.with_overheads(rows), args.format, totals=args.totals,
                                                                 command="scale"))
  result = sweep.run(lambda run: jaxmem.scale(c.workload(args), over=args.over, run=run))
  rows = list(result.rows)
  if args.plot:
    jaxmem.plot_scaling(rows, result.over, args.plot)
  c.emit(tables.render_scale(rows, list(result.growth), args.format, totals=args.totals), args.output)
  return 0

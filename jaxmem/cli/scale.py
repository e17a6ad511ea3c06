"""``jaxmem scale``: each memory component against batch and sequence length, with fitted
growth exponents and an optional plot."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import columns as cols
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
  c.add_columns(p, cols.COMPARE, cols.GROWTH)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  columns = c.columns(args, cols.COMPARE, cols.GROWTH)
  c.starting(args, "scale", f" over {' and '.join(args.over or [])}" if args.over else "")
  chosen = c.resolve_target(args)
  sweep = c.Sweep(args, chosen, lambda rows: tables.render_compare(jaxmem.with_overheads(rows), args.format,
                                                                   totals=args.totals, columns=columns, command="scale"))
  result = sweep.run(lambda run: jaxmem.scale(c.workload(args), over=args.over, run=run))
  rows = list(result.rows)
  plot = [c.Artifact("--plot", args.plot, lambda: jaxmem.plot_scaling(rows, result.over, args.plot))] if args.plot else []
  c.emit(tables.render_scale(rows, list(result.growth), args.format, totals=args.totals, columns=columns), args.output,
         *plot)
  return 0

"""``jaxmem fit``: the largest batch (or sequence) that fits, per remat policy, optimizer and
mesh; with the workload fixed, the configurations ranked and the best recommended."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("fit", help="the largest batch (or sequence) that fits, per remat policy, optimizer and mesh")
  c.add_workload(p, batch=None, seq=None)
  c.add_step(p)
  c.add_train_step(p)
  p.add_argument("--over", default="batch", help="search the batch (default) or seq")
  p.add_argument(
      "--depth-probe", action="store_true",
      help="predict each probe from compiles at 2 and 4 layers (memory is affine in a scanned stack's depth) "
      "and compile only the answer at full depth",
  )
  c.add_sweep_axes(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  chosen = c.resolve_target(args)
  # Searched: the dimension --over names when it is not given (an --over fit refuses is searched, so refused).
  searching = {"batch": args.batch, "seq": args.seq}.get(args.over) is None
  w = c.workload(args, seq=args.seq or 1024)
  if not searching:  # the workload fixed: every configuration compiled once, ranked
    sweep = c.Sweep(args, chosen, lambda rows: tables.render_ranked(rows, args.format))
    rows = sweep.run(lambda **callbacks: jaxmem.rank_configurations(
        w, jobs=args.jobs, scheduler=args.scheduler, on_plan=sweep.progress.planned, **callbacks))
    if rows is None:
      return 130
    c.emit(tables.render_ranked(rows, args.format), args.output)
    return 0
  # The number of compiles is known only at the end: the progress counts them, with no total.
  cache = c.cache(args)
  progress = c.Progress(args, chosen, cache)
  try:
    results = jaxmem.fit(
        w, over=args.over, batch=args.batch, jobs=args.jobs, scheduler=args.scheduler, cache=cache,
        on_plan=lambda p: progress.start(None), on_row=progress.row, on_round=progress.round,
        depth_probe=args.depth_probe,
    )
  except KeyboardInterrupt:
    c.say("jaxmem: interrupted; run the same command again to resume (compiles so far are cached)")
    return 130
  finally:
    progress.close()
  c.emit(tables.render_fit(results, args.format), args.output)
  c.say(compiles_line(results))
  return 0


def compiles_line(results: list[jaxmem.FitResult]) -> str:
  """The search's cost on stderr: compiles in all and per configuration."""
  total = sum(r.compiles for r in results)
  return f"jaxmem: {total} compiles for {len(results)} configurations ({total / max(1, len(results)):.1f} each)"

"""``jaxmem fit``: the largest batch (or sequence) that fits, per remat policy, optimizer and
mesh; with the workload fixed, the configurations ranked and the best recommended."""

from __future__ import annotations

import argparse

from jaxmem.cli import _common as c
from jaxmem.planning import fit
from jaxmem.planning.cache import RowCache
from jaxmem.planning.plan import plan
from jaxmem.planning.sweep import baseline_flops
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("fit", help="the largest batch (or sequence) that fits, per remat policy, optimizer and mesh")
  c.add_workload(p, batch=None, seq=None)
  c.add_step(p)
  c.add_train_step(p)
  p.add_argument("--over", default="batch", help="search the batch (default) or seq")
  c.add_sweep_axes(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  fit.check_over(args.over)
  chosen = c.resolve_target(args)
  searching = args.batch is None if args.over == "batch" else args.seq is None
  w = c.workload(args, seq=args.seq or 1024)
  if args.seq is None and args.over == "seq":
    w = fit.template(w, "seq")  # a sequence the vocabulary tiles divide (replaced per probe)
  if args.batch is None:
    # A template workload every mesh accepts (the searched dimension is replaced per probe).
    w = fit.template(w, "batch")
  p = plan(w)
  fit.require_capacity(p)
  c.say(chosen)
  if not searching:
    rows = c.run_sweep(p.tasks(), args)
    if rows is None:
      return 130
    c.emit(tables.render_ranked(fit.rank(rows), args.format), args.output)
    return 0
  # The number of compiles is known only at the end: the bar counts them, with no total.
  bar = c.progress(len(p.tasks()), args.format, unknown_total=True)
  on_round = None if bar is None else (lambda r, n: (bar.set_postfix_str(f"round {r}"), bar.update(n)))
  cache = RowCache(enabled=not args.no_cache)
  try:
    results = fit.search(p, over=args.over, jobs=args.jobs, scheduler=args.scheduler, cache=cache, on_round=on_round)
  except KeyboardInterrupt:
    c.say("jaxmem: interrupted; run the same command again to resume (compiles so far are cached)")
    return 130
  finally:
    if bar is not None:
      bar.close()
  results = fit.with_recompute(results, p, lambda row: baseline_flops(p, row))
  c.emit(tables.render_fit(results, args.format), args.output)
  return 0

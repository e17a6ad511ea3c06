"""``jaxmem fit``: the largest batch (or sequence) that fits, per remat policy, optimizer and
mesh; with the workload fixed, the configurations ranked and the best recommended."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.cli import _engine
from jaxmem.render import columns as cols
from jaxmem.render import tables
from jaxmem.render.inference import render_serving
from jaxmem.render.tensors import render_tensor_search


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("fit", help="the largest batch (or sequence) that fits, per remat policy, optimizer and mesh")
  c.add_workload(p, batch="searched (--over batch)", seq=f"{c.TRAIN_SEQ}; searched with --over seq")
  c.add_run_options(p, totals=False)  # its tables have no whole-mesh figures
  c.add_step(p)
  c.add_train_step(p)
  p.add_argument("--over", default=None, help="search the batch (default) or seq; with --phase, batch or context")
  p.add_argument(
      "--depth-probe", action="store_true",
      help="predict each probe from compiles at 2 and 4 layers (memory is affine in a scanned stack's depth) "
      "and compile only the answer and its neighbour at full depth",
  )
  c.add_sweep_axes(p)
  add_serving(p)
  c.add_columns(p, cols.FIT, cols.COMPARE)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  if args.phase is None and (args.context is not None or args.weights is not None or args.kv_cache_dtype is not None
                             or args.engine is not None):
    given = next(f for f in ("context", "weights", "kv_cache_dtype", "engine") if getattr(args, f) is not None)
    raise jaxmem.JaxmemError(f"`{given}` is a serving fit's: give `phase` decode or prefill")
  _engine.check_engine(args)
  if args.phase is not None:
    c.columns(args, why="a serving fit's table (`phase`)")
    c.starting(args, "fit", f": the most {args.over or 'batch'} that fit in {args.phase}")
    return run_serving(args, c.resolve_target(args))
  over = args.over or "batch"
  # Searched: the dimension --over names when it is not given (an --over fit refuses is searched, so refused).
  searching = {"batch": args.batch, "seq": args.seq}.get(over) is None
  if jaxmem.remat.SEARCH in [n.strip() for n in str(args.remat).split(",")]:
    c.columns(args, why="the per-tensor search's tables (remat search)")
    c.starting(args, "fit", ": the per-tensor remat that fits")
    chosen = c.resolve_target(args)
    return run_tensor_search(args, chosen, c.workload(args), searching)
  columns = c.columns(args, cols.FIT if searching else cols.COMPARE)
  c.starting(args, "fit", f": the largest {over} that fits" if searching else ": the configurations ranked")
  chosen = c.resolve_target(args)
  w = c.workload(args)  # no --seq: the plan's default (a MaxText step's: its config's)
  if not searching:  # the workload fixed: every configuration compiled once, ranked
    c.refuse_given(args, ("--over", "--depth-probe"), f"with --batch and --seq given: fit ranks the configurations "
                   f"at that workload and searches nothing (leave out the --{over} to search it)")
    sweep = c.Sweep(args, chosen, lambda rows: tables.render_ranked(rows, args.format, columns=columns))
    rows = sweep.run(lambda run: jaxmem.rank_configurations(w, run=run))
    c.emit(tables.render_ranked(rows, args.format, columns=columns), args.output)
    return 0
  # The number of compiles is known only at the end: the progress counts them, with no total.
  sweep = c.Sweep(args, chosen)
  results = sweep.run(lambda run: jaxmem.fit(w, over=over, batch=args.batch, run=run, depth_probe=args.depth_probe))
  c.emit(tables.render_fit(results, args.format, columns=columns), args.output)
  c.say(compiles_line(results))
  return 0


def run_tensor_search(args: argparse.Namespace, chosen: str | None, w: jaxmem.Workload, searching: bool) -> int:
  """``fit --remat search``: the per-tensor assignment with the least recompute that fits, at
  the given batch and sequence (jaxmem.planning.tensors)."""
  if searching or args.seq is None:
    raise jaxmem.JaxmemError("`remat search` searches the assignment at one workload: give --batch and --seq")
  if [n.strip() for n in str(args.remat).split(",") if n.strip()] != [jaxmem.remat.SEARCH]:
    raise jaxmem.JaxmemError("`remat search` runs alone (it compiles `full` itself); compare policies with fit --remat a,b")
  if args.depth_probe:
    raise jaxmem.JaxmemError("`depth_probe` is the batch search's; `remat search` compiles at full depth")
  c.refuse_given(args, ("--over",), "to `remat search`, which searches the assignment at the --batch and --seq given")
  result = c.Sweep(args, chosen).run(lambda run: jaxmem.remat_search(w, run=run))
  c.emit(render_tensor_search(result, args.format), args.output)
  c.say(f"jaxmem: {result.compiles} compiles for the per-tensor search")
  return 0


def compiles_line(results: list[jaxmem.FitResult]) -> str:
  """The search's cost on stderr: compiles in all and per configuration."""
  total = sum(r.compiles for r in results)
  return f"jaxmem: {total} compiles for {len(results)} configurations ({total / max(1, len(results)):.1f} each)"


# A train step's flags, refused with --phase when set (their defaults, to tell): the train step's
# axes (jaxmem.TRAINING_ONLY) and fit's own.
_TRAINING_FLAGS = (*jaxmem.TRAINING_ONLY, "depth_probe")


def add_serving(p: argparse.ArgumentParser) -> None:
  """``--phase``: serving capacity (jaxmem.fit_serving) instead of a train step's search."""
  p.add_argument(
      "--phase", default=None,
      help="serving capacity instead of a train step: decode or prefill; the most concurrent sequences at "
      "--context (or with --over context the longest context at --batch) that fit, with the KV cache and --weights",
  )
  p.add_argument("--context", default=None,
                 help="with --phase: the KV cache length (prefill: the prompt), comma separated; default 2048")
  p.add_argument("--weights", default=None, help="with --phase: bf16, fp16, fp8, int8, int4, comma separated, or all; default bf16")
  _engine.add_engine(p)  # with --phase decode: a serving engine's capacity instead of jaxmem's decode step


def run_serving(args: argparse.Namespace, chosen: str | None) -> int:
  """``fit --phase``: every answer compiled (jaxmem.fit_serving); a train step's flags refused."""
  if args.jobs != 1 or args.scheduler:
    given = "--jobs" if args.jobs != 1 else "--scheduler"
    raise jaxmem.JaxmemError(f"{given} does not apply to a serving fit (`phase` {args.phase}): it compiles one probe at a time here")
  training = {k: getattr(args, k) for k in _TRAINING_FLAGS if k in args.flag_defaults and getattr(args, k) != args.flag_defaults[k]}
  if args.engine is not None:
    return run_engine(args, chosen, training)
  w = c.workload(args, jaxmem.InferWorkload)  # --batch and --context go to fit_serving, which checks them
  sweep = c.Sweep(args, chosen)
  results = sweep.run(lambda run: jaxmem.fit_serving(
      w, phase=args.phase, over=args.over or "batch", batch=args.batch, context=args.context,
      run=run, **training,
  ))
  c.emit(render_serving(results, args.format), args.output)
  return 0


def run_engine(args: argparse.Namespace, chosen: str | None, training: dict[str, object]) -> int:
  """``fit --phase decode --engine``: the most concurrent sequences at each --context, by the
  engine's rule (cli/_engine.py); what it does not search is refused in one line."""
  if args.phase != "decode":
    raise jaxmem.JaxmemError(f"`engine` {args.engine} sizes a server for decode: give `phase` decode (not {args.phase})")
  if args.over != "batch":
    raise jaxmem.JaxmemError(f"`engine` {args.engine} answers the most sequences at each `context` (`over` batch); "
                             "its pairs give every context's")
  if args.batch is not None:
    raise jaxmem.JaxmemError("`batch` is what `over` batch searches; leave it out (infer --engine checks a given batch)")
  return _engine.run_engine(args, chosen, batch=None, refused={**training})

"""``jaxmem explain``: what fills the memory of one configuration."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem import JaxmemError
from jaxmem.render import columns as cols
from jaxmem.render import tables
from jaxmem.render.explain import render_explain, render_refusal
from jaxmem.render.timeline import FORMATS as TIMELINE_FORMATS


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("explain", help="what fills the memory: consumers, buffers live at the peak, timeline")
  c.add_workload(p, own=True)
  c.add_step(p)
  c.add_train_step(p)
  p.add_argument("--remat", default="none", help="one remat policy (default none)")
  p.add_argument("--optimizer", default="adamw", help="one optimizer (default adamw)")
  p.add_argument("--top", type=c.COUNT, default=10, help="how many of the buffers live at the peak to list (default 10)")
  p.add_argument("--kind", default=None, metavar="KINDS",
                 help="list only buffers of these kinds, a comma list of parameter, output, saved residual (or "
                      "residual), gradient, temporary (default every kind)")
  p.add_argument("--top-ops", type=jaxmem.inputs.Whole(least=0), default=0, metavar="N",
                 help="also list the N slowest ops of the step by their time in its simulated schedule (estimates: "
                      "each op's compute, memory and communication terms at the target's rates, its bound, and the "
                      "step's sum over ops)")
  p.add_argument("--plot", default=None,
                 help=f"write the memory timeline to this {' or '.join('.' + f for f in TIMELINE_FORMATS)} file")
  p.add_argument("--framework-packages", default="", metavar="PACKAGES",
                 help="packages whose lines are library code, not yours, beside jax, flax, optax, keras, haiku and "
                      "equinox (comma separated): a buffer's source is the first line outside them")
  p.add_argument("--framework-frames", action="store_true",
                 help="add a column with the framework's line each buffer's source line called (JSON always has it)")
  p.add_argument("--xprof", default=None, metavar="DIR",
                 help="write the compiled step as an XProf logdir, to open with `xprof --logdir DIR` (Memory Viewer)")
  c.add_columns(p, cols.EXPLAIN_BUFFERS)
  p.add_argument("--changes", type=jaxmem.inputs.Whole(least=0), default=None, metavar="N",
                 help="where the compiler refuses the configuration: compile at most N changes that the extrapolation "
                      "puts within the capacity (remat, microbatches, batch, devices, vocab tiles; default: "
                      "jaxmem.explain's, 0: none)")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  if args.mesh and len(args.mesh) > 1:
    raise JaxmemError("explain takes one --mesh; run it once per mesh")
  if args.top_ops < 0 or (args.top_ops and args.format == "csv"):
    raise JaxmemError("--top-ops takes a positive count, and --format table, markdown or json (csv holds one table)"
                      if args.top_ops else f"--top-ops takes a positive count (got {args.top_ops})")
  c.check_outputs(args, formats=TIMELINE_FORMATS)
  columns = c.columns(args, cols.EXPLAIN_BUFFERS)
  c.starting(args, "explain")
  chosen = c.resolve_target(args)
  # One compile, shown as compare shows each of its own (the chosen target, the compile, its row).
  sweep = c.Sweep(args, chosen, cached=False)
  result = sweep.run(lambda run: jaxmem.explain(c.workload(args), top=args.top, kinds=args.kind,
                                                framework_packages=args.framework_packages, run=run,
                                                **({} if args.changes is None else {"changes": args.changes})))
  if isinstance(result, jaxmem.RefusalExplanation):
    unwritten = [f for f, v in (("--plot", args.plot), ("--xprof", args.xprof), ("--top-ops", args.top_ops)) if v]
    if unwritten:
      c.say(f"jaxmem: the compiler refused this configuration, so nothing compiled for {', '.join(unwritten)}")
    c.emit(render_refusal(result, args.format, top=args.top), args.output)
    return 0
  ops = jaxmem.op_times(result, top=args.top_ops) if args.top_ops else None
  text = render_explain(result, args.format, op_times=ops, framework=args.framework_frames, columns=columns)
  c.emit(text, args.output, *artifacts(args, result))
  return 0


def artifacts(args: argparse.Namespace, result: jaxmem.Explanation) -> list[c.Artifact]:
  """The timeline plot and the XProf logdir asked for, written after the result is printed."""
  out = []
  if args.plot:
    out.append(c.Artifact("--plot", args.plot, lambda: jaxmem.plot_timeline(result, args.plot) and None))
  if args.xprof:
    def xprof() -> str:
      return f"jaxmem: wrote {result.to_xprof(args.xprof)}; open it with: xprof --logdir {args.xprof}"
    out.append(c.Artifact("--xprof", args.xprof, xprof))
  return out

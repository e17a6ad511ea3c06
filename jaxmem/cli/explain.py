"""``jaxmem explain``: what fills the memory of one configuration."""

from __future__ import annotations

import argparse

from jaxmem.cli import _common as c
from jaxmem.errors import JaxmemError
from jaxmem.buffers.analyse import Explanation
from jaxmem.buffers.explain import explain_function, explain_workload
from jaxmem.buffers.timeline import plot_timeline
from jaxmem.planning.plan import plan
from jaxmem.program.step import call_step
from jaxmem.render import tables
from jaxmem.render.explain import render_explain


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("explain", help="what fills the memory: consumers, buffers live at the peak, timeline")
  c.add_workload(p)
  c.add_step(p)
  c.add_train_step(p)
  p.add_argument("--remat", default="none", help="one remat policy (default none)")
  p.add_argument("--optimizer", default="adamw", help="one optimizer (default adamw)")
  p.add_argument("--top", type=int, default=10, help="how many of the buffers live at the peak to list (default 10)")
  p.add_argument("--kind", default=None, metavar="KINDS",
                 help="list only buffers of these kinds, a comma list of parameter, output, saved residual (or "
                      "residual), gradient, temporary (default every kind)")
  p.add_argument("--plot", default=None, help="write the memory timeline to this .png or .svg file")
  p.add_argument("--xprof", default=None, metavar="DIR",
                 help="write the compiled step as an XProf logdir, to open with `xprof --logdir DIR` (Memory Viewer)")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  if args.mesh and len(args.mesh) > 1:
    raise JaxmemError("explain takes one --mesh; run it once per mesh")
  if args.plot and not args.plot.lower().endswith((".png", ".svg")):
    raise JaxmemError(f"--plot writes .png or .svg files (got {args.plot!r})")
  c.say(c.resolve_target(args))
  result = explain_step(args) if args.step else explain_workload(c.workload(args), top=args.top, kinds=args.kind)
  if args.plot:
    plot_timeline(result, args.plot)
  if args.xprof:
    path = result.to_xprof(args.xprof)
    c.say(f"jaxmem: wrote {path}; open it with: xprof --logdir {args.xprof}")
  c.emit(render_explain(result, args.format), args.output)
  return 0


def explain_step(args: argparse.Namespace) -> Explanation:
  """``explain --step``: the factory's step at the workload and remat policy given, explained by
  ``jaxmem.explain(fn, *args, target=..., **jit_kwargs)`` (issue 10 item 1)."""
  w = c.workload(args)
  if len(w.remat) > 1:
    raise JaxmemError(f"explain takes one remat (got {', '.join(w.remat)}); run it once per remat")
  p = plan(w)
  mesh, _, rp = p.configs()[-1]  # the remat list starts with "none"; the last is the one named
  fn, fargs, jit_kwargs = call_step(
      p.workload.step, batch=p.batch, seq=p.seq, remat=rp.policy, mesh=p.target.make_mesh(mesh), target=p.target
  )
  return explain_function(fn, *fargs, target=p.target, top=args.top, kinds=args.kind, **jit_kwargs)

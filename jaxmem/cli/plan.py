"""``jaxmem plan``: the fastest configuration that fits (mesh, remat policy, microbatches,
attention kernel), searched in a compile budget and ranked by the estimated step time."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import plan as render
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("plan", help="the fastest mesh, remat policy, microbatches and kernel that fit, in a compile budget")
  p.add_argument("--model", default="gpt2-small", help="a preset (see `jaxmem models`) or a Hugging Face config.json")
  p.add_argument("--target", default=None, help="tpu:v5p-16, gpu:h100x8... (see `jaxmem targets`)")
  p.add_argument("--batch", type=int, default=8, help="global batch size; default 8")
  p.add_argument("--seq", type=int, default=1024, help="sequence length; default 1024")
  p.add_argument("--optimizer", default="adamw", help="the optimizer; default adamw")
  budget = jaxmem.plan.__kwdefaults__["budget"]
  p.add_argument("--budget", type=int, default=budget, help=f"compile at most this many candidates; default {budget}")
  p.add_argument("--plot", default=None, metavar="FILE", help="write the Pareto plot (memory against estimated step time)")
  c.add_output(p)
  c.add_run_options(p, totals=False)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  chosen = c.resolve_target(args)
  result = c.Sweep(args, chosen).run(lambda run: jaxmem.plan(
      model=args.model, target=args.target, batch=args.batch, seq=args.seq, optimizer=args.optimizer,
      budget=args.budget, run=run,
  ))
  if args.plot:
    render.plot_plan(result, args.plot)
  c.emit(render.render_plan(result, args.format), args.output)
  return 0

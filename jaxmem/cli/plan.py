"""``jaxmem plan``: the fastest configuration that fits (mesh, remat policy, microbatches,
attention kernel; on a mixture-of-experts model the MoE kernel and ``fsdp_shard_on_exp`` too),
searched in a compile budget and ranked by the estimated step time."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import columns as cols
from jaxmem.render import plan as render
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("plan", help="the fastest mesh, remat policy, microbatches and kernel that fit, in a compile budget")
  p.add_argument("--model", default="gpt2-small", help="a preset (see `jaxmem models`) or a Hugging Face config.json")
  p.add_argument("--target", default=None, help="tpu:v5p-16, gpu:h100x8... (see `jaxmem targets`)")
  p.add_argument(
      "--maxtext", default=None, nargs="+", metavar=("CONFIG", "KEY=VALUE"),
      help="search MaxText's own train step instead of --model: a MaxText config (base.yml, or a path) and its "
      "overrides (the maxtext extra); the mesh, remat_policy, gradient_accumulation_steps and attention are searched",
  )
  p.add_argument("--batch", type=c.COUNT, default=None, help="global batch size; default 8 (with --maxtext, its config's)")
  p.add_argument("--seq", type=c.COUNT, default=None, help="sequence length; default 1024 (with --maxtext, its config's)")
  p.add_argument("--optimizer", default="adamw", help="the optimizer; default adamw")
  budget = jaxmem.plan.__kwdefaults__["budget"]
  p.add_argument("--budget", type=c.COUNT, default=budget, help=f"compile at most this many candidates; default {budget}")
  p.add_argument("--plot", default=None, metavar="FILE", help="write the Pareto plot (memory against estimated step time)")
  p.add_argument("--emit", default=None, choices=jaxmem.taking(jaxmem.EMITTERS, jaxmem.PlanResult),
                 help="also write the recommendation as a launch: maxtext prints MaxText's key=value overrides after "
                 "the table (`maxtext` in JSON); a choice MaxText cannot spell is named in a note")
  c.add_output(p)
  c.add_run_options(p, totals=False)
  c.add_columns(p, cols.PLAN)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  if args.emit and args.format == "csv":
    raise jaxmem.JaxmemError("--emit writes after the table or into JSON; use --format table, markdown or json with it")
  c.check_outputs(args)
  columns = c.columns(args, cols.PLAN)
  c.starting(args, "plan", f": up to {args.budget} compiles")
  chosen = c.resolve_target(args)
  result = c.Sweep(args, chosen).run(lambda run: jaxmem.plan(
      model=args.model, target=args.target, batch=args.batch, seq=args.seq, optimizer=args.optimizer,
      maxtext=args.maxtext, budget=args.budget, run=run,
  ))
  plot = [c.Artifact("--plot", args.plot, lambda: render.plot_plan(result, args.plot))] if args.plot else []
  c.emit(render.render_plan(result, args.format, _launch(args, result), columns=columns), args.output, *plot)
  return 0


def _launch(args: argparse.Namespace, result: jaxmem.PlanResult) -> jaxmem.MaxTextLaunch | str | None:
  """The recommendation as ``--emit``'s launch, or the line that says why there is none (the
  table is printed either way: nothing compiled is lost)."""
  if not args.emit:
    return None
  if result.recommended is None:
    return f"no compiled configuration fits, so there is no {args.emit} launch to write"
  return jaxmem.EMITTERS.get(args.emit)(result)

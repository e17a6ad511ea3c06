"""``jaxmem estimate``: the closed-form figures (ZeRO, Korthikanti et al.), each with its source."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem import JaxmemError
from jaxmem.cli import _common as c
from jaxmem.render import tables
from jaxmem.render.inference import render_estimates


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("estimate", help="closed-form memory figures with their sources (ZeRO, Korthikanti et al.)")
  p.add_argument("--model", default="gpt2-small", help="model presets, comma separated; default gpt2-small")
  p.add_argument("--optimizer", default="adamw", help="optimizer; default adamw")
  p.add_argument(
      "--precision", default=None,
      help="mixed (ZeRO's 16 B/param for Adam), fp32 or bf16; default mixed, or the layout the dtype flags give",
  )
  p.add_argument("--param-dtype", default=None, help="the train step's parameter dtype (instead of --precision); default float32")
  c.add_precision(p, sweep=False)
  p.add_argument(
      "--data", type=c.COUNT, default=1,
      help="data-parallel ranks d for Megatron's distributed optimizer (p + g + o/d bytes per parameter); default 1",
  )
  p.add_argument("--batch", type=c.COUNT, default=8, help="micro-batch per model replica; default 8")
  p.add_argument("--seq", type=c.COUNT, default=1024, help="sequence length; default 1024")
  p.add_argument("--tensor", type=c.COUNT, default=1, help="tensor-parallel size t; default 1")
  p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with --tensor)")
  p.add_argument("--recompute", default="none", help="none, selective or full; default none")
  p.add_argument("--context", type=c.COUNT, default=None, help="KV cache context; default --seq")
  p.add_argument(
      "--capacity-factor", type=jaxmem.inputs.Number(above=0.0), default=None, help="mixture of experts: the capacity path's factor; default the model's (1.25)"
  )
  c.add_output(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  models = [m.strip() for m in args.model.split(",") if m.strip()]
  if not models:
    raise JaxmemError("--model is empty")
  rows = jaxmem.estimates(
      models, optimizer=args.optimizer, precision=args.precision, batch=args.batch, seq=args.seq,
      tensor=args.tensor, sequence_parallel=args.sequence_parallel, recompute=args.recompute, context=args.context,
      capacity_factor=args.capacity_factor, param_dtype=args.param_dtype, data=args.data,
      **{a.name: getattr(args, a.name) for a in jaxmem.AXES.values() if a.group == "precision"},  # c.add_precision's
  )
  c.emit(render_estimates(rows, args.format), args.output)
  return 0

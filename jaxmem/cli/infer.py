"""``jaxmem infer``: prefill and decode memory with a KV cache, per weight format; with ``--engine``,
a serving engine's capacity at the workload (cli/_engine.py)."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.cli import _engine
from jaxmem.render import columns as cols
from jaxmem.render import tables
from jaxmem.render.inference import render_infer


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("infer", help="prefill and decode memory with a KV cache, per weight format")
  # --prompt and --context instead of --seq; no train step's options (its parameters are stored bf16: --weights)
  c.add_workload(p, batch="1 (or the smallest the mesh's data axes divide)", seq=None, training=False)
  p.add_argument("--prompt", type=c.COUNT, default=None,
                 help="prefill prompt length in tokens; default 1024 (or the model's learned positions, where fewer)")
  p.add_argument("--context", default=None,
                 help="decode KV cache lengths, comma separated; default 2048 (or the model's learned positions, where "
                 "fewer; with --engine vllm: max_model_len, default the model's positions; jetstream: max_target_length)")
  p.add_argument("--weights", default="bf16", help="bf16, fp16, fp8, int8, int4, comma separated, or all; default bf16")
  p.add_argument("--phase", default=None, help="prefill, decode or both; default both")
  p.add_argument("--kv-table", action="store_true", help="also list the KV cache (formula) against context and batch")
  p.add_argument("--plot", default=None, metavar="FILE", help="write a figure of memory against context (png, pdf, svg)")
  c.add_columns(p, cols.INFER)
  _engine.add_engine(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  _engine.check_engine(args)
  columns = c.columns(args, cols.INFER)
  c.starting(args, "infer", f": {args.phase or 'prefill,decode'}")
  chosen = c.resolve_target(args)
  if args.engine is not None:  # --batch is the concurrent sequences the engine is asked to hold
    return _engine.run_engine(args, chosen, batch=args.batch, refused={
        "prompt": args.prompt, "phase": args.phase, "kv_table": args.kv_table, "plot": args.plot})
  w = c.workload(args, jaxmem.InferWorkload)
  sweep = c.Sweep(args, chosen, lambda rows: render_infer(rows, args.format, columns=columns), cached=False)
  rows = sweep.run(lambda run: jaxmem.infer(w, run=run))
  cfg = sweep.started.model
  batches = sorted({1, 8, 32, *(r.batch for r in rows)})  # the batch asked, or the one infer chose
  kv = []
  if args.kv_table:
    contexts = {r.context for r in rows if r.phase == "decode"}
    kv = jaxmem.kv_cache_table(cfg, contexts=sorted({1024, 8192, 32768, 131072, *contexts}), batches=batches)
  plot = []
  if args.plot:
    kv_rows = jaxmem.kv_cache_table(cfg, contexts=[2**k for k in range(10, 18)], batches=batches)
    plot.append(c.Artifact("--plot", args.plot, lambda: jaxmem.plot_inference(rows, args.plot, kv_rows=kv_rows) and None))
  c.emit(render_infer(rows, args.format, kv_rows=kv, columns=columns), args.output, *plot)
  return 0

"""``jaxmem infer``: prefill and decode memory with a KV cache, per weight format; with ``--engine``,
a serving engine's capacity at the workload (cli/_engine.py)."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.cli import _engine
from jaxmem.render import tables
from jaxmem.render.inference import render_infer


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("infer", help="prefill and decode memory with a KV cache, per weight format")
  c.add_workload(p, batch=1)
  # None: the library's defaults (InferWorkload: batch 1, prompt 1024, context 2048, both phases),
  # so a flag given can be told from one left out (--engine refuses infer's own).
  p.set_defaults(batch=None)
  p.add_argument("--prompt", type=int, default=None, help="prefill prompt length in tokens; default 1024")
  p.add_argument("--context", default=None,
                 help="decode KV cache lengths, comma separated; default 2048 (with --engine vllm: max_model_len, "
                 "default the model's positions; jetstream: max_target_length)")
  p.add_argument("--weights", default="bf16", help="bf16, fp16, fp8, int8, int4, comma separated, or all; default bf16")
  p.add_argument("--phase", default=None, help="prefill, decode or both; default both")
  p.add_argument("--kv-table", action="store_true", help="also list the KV cache (formula) against context and batch")
  p.add_argument("--plot", default=None, metavar="FILE", help="write a figure of memory against context (png, pdf, svg)")
  _engine.add_engine(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  _engine.check_engine(args)
  chosen = c.resolve_target(args)
  if args.engine is not None:  # --batch is the concurrent sequences the engine is asked to hold
    return _engine.run_engine(args, chosen, batch=args.batch, refused={
        "prompt": args.prompt, "phase": args.phase, "kv_table": args.kv_table, "plot": args.plot})
  w = c.workload(args, jaxmem.InferWorkload)
  sweep = c.Sweep(args, chosen, lambda rows: render_infer(rows, args.format), cached=False)
  rows = sweep.run(lambda run: jaxmem.infer(w, run=run))
  cfg = sweep.started.model
  batches = sorted({1, 8, 32, w.batch})
  kv = []
  if args.kv_table:
    contexts = {int(n) for n in w.context}  # checked by infer
    kv = jaxmem.kv_cache_table(cfg, contexts=sorted({1024, 8192, 32768, 131072, *contexts}), batches=batches)
  if args.plot:
    kv_rows = jaxmem.kv_cache_table(cfg, contexts=[2**k for k in range(10, 18)], batches=batches)
    jaxmem.plot_inference(rows, args.plot, kv_rows=kv_rows)
  c.emit(render_infer(rows, args.format, kv_rows=kv), args.output)
  return 0

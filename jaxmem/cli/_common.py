"""Command line: a thin layer over the library. ``main(argv) -> int`` so tests call it directly.

Bad input is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from jaxmem.errors import JaxmemError

DEFAULT_REMAT = "none,dots_saveable,full"


class _Parser(argparse.ArgumentParser):
  """argparse, but a usage error is a JaxmemError (one line) instead of usage + exit."""

  def error(self, message: str):  # noqa: D102
    raise JaxmemError(f"{message} (see {self.prog} --help)")


def _add_workload(p: argparse.ArgumentParser, *, batch: int | None = 8, seq: int | None = 1024) -> None:
  p.add_argument("--model", default="gpt2-small", help="model preset (see `jaxmem models`); default gpt2-small")
  p.add_argument("--batch", type=int, default=batch, help=f"global batch size; default {batch or 'searched'}")
  p.add_argument("--seq", type=int, default=seq, help=f"sequence length; default {seq or 'searched'}")
  p.add_argument(
      "--target",
      default=None,
      help="where to compile: attached, tpu:v5e-8, gpu:h100x8, cpu, cpu:N (see `jaxmem targets`); "
      "default: the attached accelerator, else a representative one whose compiler is installed",
  )
  p.add_argument("--slices", type=int, default=1, help="TPU slices (multi-slice over DCN); default 1")
  p.add_argument(
      "--mesh",
      action="append",
      default=None,
      help="mesh axes, e.g. data=4 or fsdp=2,tensor=2; repeat for one row group per mesh (default: fsdp over all devices)",
  )
  p.add_argument("--param-dtype", default=None, help="parameter dtype (default float32)")
  p.add_argument("--dtype", default=None, help="compute dtype (default bfloat16)")
  p.add_argument("--format", default="table", help="table, markdown, json or csv; default table")
  p.add_argument("--output", default=None, help="also write the result to this file")
  p.add_argument("--totals", action="store_true", help="add whole-mesh figures (per device x devices)")
  p.add_argument("--jobs", type=int, default=1, help="compile in this many processes; default 1")
  p.add_argument("--scheduler", default=None, help="compile on the Dask cluster at this address (tcp://host:8786)")
  p.add_argument("--no-cache", action="store_true", help="recompile everything instead of reusing cached rows")
  p.add_argument(
      "--distributed",
      action="store_true",
      help="multi-host TPU/GPU VMs: call jax.distributed.initialize() first and run the same command on every host",
  )


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog="jaxmem", description="Will it fit? XLA's own per-device memory figures for JAX train steps.")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
  sub.required = True
  c = sub.add_parser("compare", help="compare remat policies and optimizers for a model's train step")
  _add_workload(c)
  c.add_argument("--remat", default=DEFAULT_REMAT, help=f"policies, comma separated, or all; none is always the baseline (default {DEFAULT_REMAT})")
  c.add_argument("--optimizer", default="adamw", help="optimizers, comma separated, or all; default adamw")
  c.add_argument("--residuals", action="store_true", help="list what each remat policy saves for the backward pass, per layer")
  c.set_defaults(func=cmd_compare)
  from jaxmem.render import inference as infer_cli
  from jaxmem.render.explain import add_explain_parser

  infer_cli.add_compare_flags(c)
  infer_cli.add_infer_parsers(sub, _add_workload)
  add_explain_parser(sub, _add_workload)
  f = sub.add_parser("fit", help="the largest batch (or sequence) that fits, per remat policy, optimizer and mesh")
  _add_workload(f, batch=None, seq=None)
  f.add_argument("--over", default="batch", help="search the batch (default) or seq")
  f.add_argument("--remat", default=DEFAULT_REMAT, help=f"policies, comma separated, or all (default {DEFAULT_REMAT})")
  f.add_argument("--optimizer", default="adamw", help="optimizers, comma separated, or all; default adamw")
  f.set_defaults(func=cmd_fit)
  sc = sub.add_parser("scale", help="each memory component against batch and sequence length, with growth exponents")
  _add_workload(sc)
  sc.add_argument("--over", action="append", default=None, help="seq=1024,2048,4096 or batch=8,16,32 (repeatable)")
  sc.add_argument("--remat", default="none", help="policies, comma separated (default none)")
  sc.add_argument("--optimizer", default="adamw", help="optimizers, comma separated; default adamw")
  sc.add_argument("--plot", default=None, metavar="FILE", help="write the curves (png, svg, pdf) with the capacity as a line")
  sc.set_defaults(func=cmd_scale)
  v = sub.add_parser("validate", help="run real steps on the attached accelerator: measured peak vs predicted")
  _add_workload(v)
  v.add_argument("--remat", default=DEFAULT_REMAT, help=f"policies, comma separated, or all (default {DEFAULT_REMAT})")
  v.add_argument("--optimizer", default="adamw", help="optimizers, comma separated; default adamw")
  v.add_argument("--steps", type=int, default=3, help="train steps to run per configuration; default 3")
  v.set_defaults(func=cmd_validate)
  w = sub.add_parser("_measure")  # one configuration in a fresh process, for validate
  _add_workload(w)
  w.add_argument("--remat", required=True)
  w.add_argument("--optimizer", required=True)
  w.add_argument("--steps", type=int, default=3)
  w.set_defaults(func=cmd_measure)
  t = sub.add_parser("targets", help="list compilation targets: devices, memory, compiler installed")
  t.add_argument("--format", default="table", help="table, markdown, json or csv")
  t.set_defaults(func=cmd_targets)
  m = sub.add_parser("models", help="list model presets")
  m.add_argument("--format", default="table", help="table, markdown, json or csv")
  m.set_defaults(func=cmd_models)
  return parser


def _start_jax(target: str | None, *, distributed: bool = False) -> None:
  """Starts JAX for the CLI before anything else touches it (see targets.start_jax)."""
  from jaxmem.compiler import targets

  if distributed:
    import jax

    try:
      # Finds the coordinator from the Cloud TPU / SLURM / Kubernetes environment.
      jax.distributed.initialize()
    except (ValueError, RuntimeError) as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise JaxmemError(f"--distributed: jax.distributed.initialize() failed: {first}") from None
  targets.start_jax(targets.cpu_devices_needed([target or ""]))


def _emit(text: str, output: str | None) -> None:
  import jax

  if jax.process_index() != 0:  # multi-host: every host computes, the first one reports
    return
  print(text)
  if output:
    _write(output, text)


def _write(path: str, text: str) -> None:
  try:
    with open(path, "w") as f:
      f.write(text if text.endswith("\n") else text + "\n")
  except OSError as e:
    raise JaxmemError(f"cannot write --output {path}: {e.strerror}") from None


def _resolve_target(args: argparse.Namespace) -> tuple[str, str | None]:
  """(target, why): the --target given, or the default and the reason it was chosen."""
  from jaxmem.compiler import targets

  _start_jax(args.target, distributed=getattr(args, "distributed", False))
  if args.target:
    return args.target, None
  name, why = targets.default_target_name()
  return name, f"jaxmem: target {name} ({why}; choose with --target)"


def _plan(args: argparse.Namespace, **override):
  """sweep.plan from the shared workload flags; ``override`` replaces any of them."""
  from jaxmem.planning import sweep as cmp

  kwargs = dict(
      model=args.model,
      remat=args.remat,
      optimizer=args.optimizer,
      batch=args.batch,
      seq=args.seq,
      target=args.target,
      mesh=args.mesh,
      param_dtype=args.param_dtype,
      dtype=args.dtype,
      slices=args.slices,
  )
  return cmp.plan(**{**kwargs, **override})


def cmd_compare(args: argparse.Namespace) -> int:
  from jaxmem.planning import sweep as cmp
  from jaxmem.render import tables as fmt

  fmt.check_format(args.format)
  args.target, chosen = _resolve_target(args)
  plan = _plan(args)
  if chosen:  # said once the input is known to be good, so an error stays one line
    print(chosen, file=sys.stderr)
  if args.residuals:
    return _residuals(args)
  tasks = plan.tasks()
  rows = _run_sweep(tasks, args)
  if rows is None:
    return 130
  from jaxmem.render import inference as infer_cli

  rows = cmp.with_overheads(rows)
  extras = infer_cli.compare_extras(args, rows)
  if args.format == "json":
    import json

    out = [fmt.with_totals(r) for r in rows] if args.totals else rows
    _emit(json.dumps(fmt.envelope(out, **extras), indent=2), args.output)
  else:
    text = fmt.render_compare(rows, args.format, totals=args.totals)
    _emit(text + infer_cli.render_compare_extras(extras, args.format), args.output)
  return 0


def _residuals(args: argparse.Namespace) -> int:
  """compare --residuals: what each policy saves per layer, from JAX's own residual listing."""
  from jaxmem.render.explain import residuals_table
  from jaxmem.explain.residuals import saved_residuals_by_policy

  rows = saved_residuals_by_policy(
      model=args.model, remat=args.remat, batch=args.batch, seq=args.seq, param_dtype=args.param_dtype, dtype=args.dtype
  )
  _emit(residuals_table(rows, args.format), args.output)
  return 0


def _run_sweep(tasks, args: argparse.Namespace):
  """Runs tasks with progress, cache and partial output; None if interrupted (what finished
  has been printed and is in the cache)."""
  from jaxmem.render import tables as fmt
  from jaxmem.planning import sweep as cmp
  from jaxmem.planning.cache import RowCache
  from jaxmem.planning.runner import run_tasks

  cache = RowCache(enabled=not args.no_cache)
  bar = _progress(len(tasks), args.format)
  done: dict[int, cmp.Row] = {}

  def on_row(i: int, d: dict, cached: bool) -> None:
    done[i] = cmp.row_from_dict(d)
    if args.output:  # keep what is done on disk, so an interrupted sweep loses nothing
      partial = cmp.with_overheads([done[k] for k in sorted(done)])
      _write(args.output, fmt.render_compare(partial, args.format, totals=args.totals))
    if bar is not None:
      bar.set_postfix_str(f"{done[i].optimizer} {done[i].remat}" + (" (cached)" if cached else ""), refresh=False)
      bar.update(1)

  try:
    dicts = run_tasks(tasks, jobs=args.jobs, scheduler=args.scheduler, cache=cache, on_row=on_row)
  except KeyboardInterrupt:
    if bar is not None:
      bar.close()
    if done:
      partial = cmp.with_overheads([done[k] for k in sorted(done)])
      _emit(fmt.render_compare(partial, args.format, totals=args.totals), args.output)
    print(
        f"jaxmem: interrupted after {len(done)} of {len(tasks)} configurations; "
        "run the same command again to resume (finished ones are cached)",
        file=sys.stderr,
    )
    return None
  if bar is not None:
    bar.close()
  if cache.hits:
    print(f"jaxmem: {cache.hits} of {len(tasks)} configurations from the cache ({cache.directory}; --no-cache to recompile)", file=sys.stderr)
  return [cmp.row_from_dict(d) for d in dicts]


def cmd_fit(args: argparse.Namespace) -> int:
  import math

  from jaxmem.planning import fit
  from jaxmem.render import tables as fmt
  from jaxmem.program import sharding as shd
  from jaxmem.planning import sweep as cmp
  from jaxmem.compiler import targets
  from jaxmem.planning.cache import RowCache

  fmt.check_format(args.format)
  if args.over not in ("batch", "seq"):
    raise JaxmemError(f"--over must be batch or seq (got {args.over!r})")
  args.target, chosen = _resolve_target(args)
  searching = args.batch is None if args.over == "batch" else args.seq is None
  # A template workload every mesh accepts (the searched dimension is replaced per probe): the
  # smallest batch the data axes divide.
  meshes = [shd.parse_mesh(m) for m in args.mesh or []] or [
      shd.default_mesh(targets.get_target(args.target, slices=args.slices).num_devices)
  ]
  batch = args.batch if args.batch is not None else math.lcm(*[shd.data_parallel_size(m) for m in meshes])
  seq = args.seq if args.seq is not None else (1024 if args.over == "batch" else fit.SEQ_QUANTUM)
  plan = _plan(args, batch=batch, seq=seq)
  fit.require_capacity(plan)
  if chosen:
    print(chosen, file=sys.stderr)
  cache = RowCache(enabled=not args.no_cache)
  if not searching:
    rows = _run_sweep(plan.tasks(), args)
    if rows is None:
      return 130
    ranked = fit.rank(rows)
    _emit(fmt.render_ranked(ranked, args.format), args.output)
    return 0
  # The number of compiles is known only at the end: the bar counts them, with no total.
  bar = _progress(len(plan.tasks()), args.format, unknown_total=True)
  on_round = None if bar is None else (lambda r, n: (bar.set_postfix_str(f"round {r}"), bar.update(n)))
  try:
    results = fit.search(plan, over=args.over, jobs=args.jobs, scheduler=args.scheduler, cache=cache, on_round=on_round)
  except KeyboardInterrupt:
    print("jaxmem: interrupted; run the same command again to resume (compiles so far are cached)", file=sys.stderr)
    return 130
  finally:
    if bar is not None:
      bar.close()
  results = fit.with_recompute(results, plan, lambda row: cmp.baseline_flops(plan, row))
  _emit(fmt.render_fit(results, args.format), args.output)
  return 0


def cmd_scale(args: argparse.Namespace) -> int:
  from jaxmem.render import tables as fmt
  from jaxmem.planning import scale
  from jaxmem.planning import sweep as cmp

  fmt.check_format(args.format)
  over = scale.parse_over(args.over or [])
  args.target, chosen = _resolve_target(args)
  tasks = []
  for batch, seq in scale.grid(over, args.batch, args.seq):
    plan = _plan(args, batch=batch, seq=seq)
    # scale measures what the user named: the no-remat baseline only if asked for.
    names = {n.strip() for n in args.remat.split(",")}
    tasks += [t for t in plan.tasks() if t.remat in names or args.remat == "all"]
  if chosen:
    print(chosen, file=sys.stderr)
  rows = _run_sweep(tasks, args)
  if rows is None:
    return 130
  rows = cmp.with_overheads(rows)
  growth = scale.growth_exponents(rows, over)
  if args.plot:
    scale.plot(rows, over, args.plot)
  _emit(fmt.render_scale(rows, growth, args.format, totals=args.totals), args.output)
  return 0


def _progress(total: int, fmt_name: str, *, unknown_total: bool = False):
  """A progress bar with ETA on stderr for sweeps of several configurations, only on a terminal."""
  if total < 3 or fmt_name == "json" or not sys.stderr.isatty() or os.environ.get("JAXMEM_NO_PROGRESS"):
    return None
  from tqdm import tqdm

  return tqdm(
      total=None if unknown_total else total,
      unit="compile" if unknown_total else "config",
      file=sys.stderr,
      dynamic_ncols=True,
      leave=False,
  )


def _validation_plan(args: argparse.Namespace):
  from jaxmem.compiler import targets
  from jaxmem.planning import validate as val

  if args.target not in (None, "attached"):
    raise JaxmemError(f"validate runs on the attached devices; drop --target {args.target}")
  _start_jax("attached", distributed=args.distributed)
  val.require_accelerator(targets.get_target("attached").platform)
  return _plan(args, target="attached", slices=1)


def cmd_validate(args: argparse.Namespace) -> int:
  from jaxmem.render import tables as fmt
  from jaxmem.program import sharding as shd
  from jaxmem.planning import validate as val

  fmt.check_format(args.format)
  if args.steps < 1:
    raise JaxmemError(f"--steps must be at least 1 (got {args.steps})")
  plan = _validation_plan(args)
  records = []
  for mesh, opt, rp in plan.configs():
    argv = ["--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq), "--mesh", shd.format_mesh(mesh)]
    argv += ["--remat", rp.name, "--optimizer", opt.name, "--steps", str(args.steps)]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in (("param_dtype", args.param_dtype), ("dtype", args.dtype)) if v]
    m = val.measure_in_subprocess(argv)
    m.update(mesh=m.get("mesh", shd.format_mesh(mesh)), remat=rp.name, optimizer=opt.name)
    records.append(m)
    if args.output:
      _write(args.output, fmt.render_records(records, args.format))
  keys = ["mesh", "optimizer", "remat", "predicted_bytes", "measured_bytes", "ratio", "loss", "error"]
  text = fmt.render_records(records, args.format, headers=None if args.format in ("json", "csv") else keys)
  _emit(text, args.output)
  return 0


def cmd_measure(args: argparse.Namespace) -> int:
  import json

  from jaxmem.planning import validate as val

  plan = _validation_plan(args)
  ((mesh, opt, rp),) = [c for c in plan.configs() if c[2].name == args.remat]
  print(json.dumps(val.measure(plan, mesh, opt, rp, steps=args.steps).as_dict()))
  return 0


def cmd_targets(args: argparse.Namespace) -> int:
  from jaxmem.render import tables as fmt
  from jaxmem.compiler import targets

  fmt.check_format(args.format)
  _start_jax(None)
  print(fmt.render_records(targets.list_targets(), args.format))
  return 0


def cmd_models(args: argparse.Namespace) -> int:
  from jaxmem.render import tables as fmt
  from jaxmem.models import PRESETS, count_params

  fmt.check_format(args.format)
  records = []
  for name, make in PRESETS.items():
    c = make()
    records.append(
        dict(
            model=name,
            style=c.style,
            params=count_params(c),
            layers=c.num_layers,
            d_model=c.d_model,
            heads=c.num_heads,
            kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            d_ff=c.d_ff,
            vocab=c.vocab_size,
            tied=c.tie_embeddings,
        )
    )
  print(fmt.render_records(records, args.format))
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  try:
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.func(args)
  except JaxmemError as e:
    print(f"jaxmem: error: {e}", file=sys.stderr)
    return 2
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0


if __name__ == "__main__":
  sys.exit(main())

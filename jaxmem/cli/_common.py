"""What every command shares: the parser class, the workload flags and the Workload they make,
target resolution, output (emit/write), the progress bar and the sweep driver.

Bad input is a :class:`JaxmemError`: the CLI prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

import jax
from tqdm import tqdm

from jaxmem.compiler import targets
from jaxmem.compiler.startup import start_distributed, start_jax, started
from jaxmem.errors import JaxmemError
from jaxmem.planning import sweep
from jaxmem.planning.cache import RowCache
from jaxmem.planning.plan import Task
from jaxmem.planning.runner import run_tasks
from jaxmem.render import tables
from jaxmem.workload import Workload

DEFAULT_REMAT = ",".join(Workload().remat)


class Parser(argparse.ArgumentParser):
  """argparse, but a usage error is a JaxmemError (one line) instead of usage + exit."""

  def error(self, message: str):  # noqa: D102
    raise JaxmemError(f"{message} (see {self.prog} --help)")


def add_workload(p: argparse.ArgumentParser, *, batch: int | None = 8, seq: int | None = 1024) -> None:
  """The flags every compiling command shares. Each flag named after a :class:`Workload`
  field sets that field (:func:`workload`); a new field needs only its flag here."""
  p.add_argument(
      "--model", default="gpt2-small",
      help="a preset (see `jaxmem models`) or a path to a Hugging Face config.json; default gpt2-small",
  )
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
  p.add_argument(
      "--moe-impl",
      default=None,
      help="mixture-of-experts models: how routed experts run, dropless (tokens sorted by expert, grouped matmuls) "
      "and/or capacity (GShard dispatch; copies past capacity dropped), comma separated; default dropless, "
      "capacity on GPU targets",
  )
  p.add_argument(
      "--capacity-factor",
      default=None,
      help="capacity path: slots per expert over its fair share, comma separated (implies --moe-impl capacity); default 1.25",
  )
  p.add_argument("--param-dtype", default=None, help="parameter dtype (default float32)")
  p.add_argument("--dtype", default=None, help="compute dtype (default bfloat16)")
  p.add_argument(
      "--attention",
      default="auto",
      help="attention implementations, comma separated: auto (the target's production kernel: splash on TPU, "
      "cudnn on GPU, chunked on CPU), dot, chunked, splash, cudnn, triton; default auto",
  )
  add_output(p)
  p.add_argument("--totals", action="store_true", help="add whole-mesh figures (per device x devices)")
  p.add_argument("--jobs", type=int, default=1, help="compile in this many processes; default 1")
  p.add_argument("--scheduler", default=None, help="compile on the Dask cluster at this address (tcp://host:8786)")
  p.add_argument("--no-cache", action="store_true", help="recompile everything instead of reusing cached rows")
  p.add_argument(
      "--distributed",
      action="store_true",
      help="multi-host TPU/GPU VMs: call jax.distributed.initialize() first and run the same command on every host",
  )


def add_step(p: argparse.ArgumentParser) -> None:
  """``--step``: the user's own step factory instead of ``--model`` (compare, explain, fit, scale)."""
  p.add_argument(
      "--step", default=None, metavar="MODULE:FACTORY",
      help="your own step instead of --model: package.module:make_step or path/to/file.py:make_step, a "
      "function make_step(*, batch, seq, remat[, mesh]) returning (fn, args, jit_kwargs)",
  )


def no_step(args: argparse.Namespace, *flags: str) -> None:
  """A one-line error for flags that need a model of jaxmem's own, given with ``--step``."""
  given = [f for f in flags if getattr(args, f.lstrip("-").replace("-", "_"), None)]
  if getattr(args, "step", None) and given:
    raise JaxmemError(f"{given[0]} needs a model of jaxmem's own (--model), not --step")


def add_output(p: argparse.ArgumentParser) -> None:
  p.add_argument("--format", default="table", help="table, markdown, json or csv; default table")
  p.add_argument("--output", default=None, help="also write the result to this file")


def add_train_step(p: argparse.ArgumentParser) -> None:
  """How the train step is computed: gradient accumulation, vocabulary tiling, score dtype."""
  p.add_argument(
      "--microbatches", default="1",
      help="gradient accumulation: split the global batch into N microbatches run in sequence "
      "(comma separated to sweep); default 1",
  )
  p.add_argument(
      "--vocab-tiles", type=int, default=1,
      help="compute the output projection and loss in N tiles of the tokens (MaxText's num_vocab_tiling); default 1",
  )
  p.add_argument(
      "--qk-dtype", default="bfloat16",
      help="dot attention's scores: bfloat16 (MaxText's default: the compute dtype) or float32; default bfloat16",
  )


def add_sweep_axes(p: argparse.ArgumentParser, *, remat: str = DEFAULT_REMAT, remat_help: str | None = None) -> None:
  """``--remat`` and ``--optimizer``: comma-separated lists (or all)."""
  p.add_argument("--remat", default=remat, help=remat_help or f"policies, comma separated, or all (default {remat})")
  p.add_argument("--optimizer", default="adamw", help="optimizers, comma separated, or all; default adamw")


def flag_message(e: JaxmemError, parser: argparse.ArgumentParser) -> str:
  """``e``'s message for CLI users: each field it names (``microbatches``, see
  :mod:`jaxmem.errors`) as the flag that sets it (``--microbatches``), read from ``parser`` and
  its subcommands, so a new flag needs no entry here."""
  return e.worded(flags_by_field(parser))


def flags_by_field(parser: argparse.ArgumentParser) -> dict[str, str]:
  """Each option's destination (the field it sets) -> its long flag, over every subcommand."""
  out: dict[str, str] = {}
  for action in parser._actions:  # argparse keeps them here; there is no public accessor
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        out.update({k: v for k, v in flags_by_field(sub).items() if k not in out})
    elif action.option_strings:
      out.setdefault(action.dest, max(action.option_strings, key=len))
  return out


def workload(args: argparse.Namespace, cls: type[Workload] = Workload, **overrides: Any) -> Workload:
  """The :class:`Workload` (or subclass ``cls``) the flags describe: each field from the flag
  of its name where one was given, else the field's default; ``overrides`` win."""
  fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
  return cls.of(None, **{**fields, **overrides})


def start(target: str | None, *, distributed: bool = False) -> None:
  """Starts JAX for the CLI before anything else touches it (simulated CPU devices for a
  ``cpu:N`` target; see :func:`jaxmem.compiler.startup.start_jax`)."""
  if distributed:
    start_distributed()
  start_jax(targets.cpu_devices_needed([target or ""]))


def resolve_target(args: argparse.Namespace) -> str | None:
  """Starts JAX and sets ``args.target`` to the --target given or the default; returns the line
  that says which default was chosen and why (to print once the input is known to be good)."""
  start(args.target, distributed=getattr(args, "distributed", False))
  if args.target:
    return None
  args.target, why = targets.default_target_name()
  return f"jaxmem: target {args.target} ({why}; choose with --target)"


def say(line: str | None) -> None:
  """A status line on stderr (the chosen target, cache hits), never on stdout."""
  if line:
    print(line, file=sys.stderr)


def emit(text: str, output: str | None) -> None:
  """The result on stdout, and in ``output`` when given; multi-host: the first host reports.
  (A command that never started JAX, such as estimate, has one host and starts no backend.)"""
  if started() and jax.process_index() != 0:
    return
  print(text)
  if output:
    write(output, text)


def write(path: str, text: str) -> None:
  try:
    with open(path, "w") as f:
      f.write(text if text.endswith("\n") else text + "\n")
  except OSError as e:
    raise JaxmemError(f"cannot write --output {path}: {e.strerror}") from None


def progress(total: int, fmt_name: str, *, unknown_total: bool = False) -> tqdm | None:
  """A progress bar with ETA on stderr for sweeps of several configurations, only on a terminal."""
  if total < 3 or fmt_name == "json" or not sys.stderr.isatty() or os.environ.get("JAXMEM_NO_PROGRESS"):
    return None
  return tqdm(
      total=None if unknown_total else total,
      unit="compile" if unknown_total else "config",
      file=sys.stderr,
      dynamic_ncols=True,
      leave=False,
  )


def run_sweep(tasks: list[Task], args: argparse.Namespace) -> list[sweep.Row] | None:
  """Runs tasks with progress, cache and partial output; None if interrupted (what finished
  has been printed and is in the cache)."""
  cache = RowCache(enabled=not args.no_cache)
  bar = progress(len(tasks), args.format)
  done: dict[int, sweep.Row] = {}

  def partial() -> str:
    return tables.render_compare(sweep.with_overheads([done[k] for k in sorted(done)]), args.format, totals=args.totals)

  def on_row(i: int, d: dict, cached: bool) -> None:
    done[i] = sweep.row_from_dict(d)
    if args.output:  # keep what is done on disk, so an interrupted sweep loses nothing
      write(args.output, partial())
    if bar is not None:
      bar.set_postfix_str(f"{done[i].optimizer} {done[i].remat}" + (" (cached)" if cached else ""), refresh=False)
      bar.update(1)

  try:
    dicts = run_tasks(tasks, sweep.run_task, jobs=args.jobs, scheduler=args.scheduler, cache=cache, on_row=on_row)
  except KeyboardInterrupt:
    if bar is not None:
      bar.close()
    if done:
      emit(partial(), args.output)
    say(
        f"jaxmem: interrupted after {len(done)} of {len(tasks)} configurations; "
        "run the same command again to resume (finished ones are cached)"
    )
    return None
  if bar is not None:
    bar.close()
  if cache.hits:
    say(f"jaxmem: {cache.hits} of {len(tasks)} configurations from the cache ({cache.directory}; --no-cache to recompile)")
  return [sweep.row_from_dict(d) for d in dicts]

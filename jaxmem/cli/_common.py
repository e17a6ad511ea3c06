"""What every command shares: the parser class, the workload flags and the Workload they make,
target resolution, output paths (checked before compiling) and output (emit/write), and the
progress a sweep shows (:class:`Progress`).

Commands call the public library (``jaxmem.compare``, ``fit``, ``scale``, ``infer``,
``explain``) and pass their progress and interrupt handling in as callbacks; this package
imports only ``jaxmem``'s public names and ``jaxmem.render`` (tests/test_cli_imports.py).
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

import jaxmem
from jaxmem import JaxmemError, Workload
from jaxmem.models import attention_help
from jaxmem.render.units import unit_for

DEFAULT_REMAT = ",".join(Workload().remat)


class Parser(argparse.ArgumentParser):
  """argparse, but a usage error is a JaxmemError (one line) instead of usage + exit."""

  def error(self, message: str):  # noqa: D102
    raise JaxmemError(f"{message} (see {self.prog} --help)")


def add_axis(
    p: argparse.ArgumentParser, flag: str, *, default: str | None, help: str, shown: str | None = None, sweep: bool = True
) -> None:
  """An option that shapes the compiled program, given as a comma list the same way everywhere:
  each value is a sweep axis's entry (a row, or a row group, each), as ``--microbatches 1,4``.
  The string goes to the :class:`Workload` field of the flag's name, which splits it and checks
  every item (a bad one is named with the valid ones, in one line). ``shown``: the default as
  the help says it, where ``default`` is None (the library's choice). ``sweep`` False: one value
  (a closed form, ``estimate``, compiles nothing to sweep)."""
  said = shown if shown is not None else default
  p.add_argument(flag, default=default, help=help + "; comma separated to sweep" * sweep + (f"; default {said}" if said else ""))


def add_workload(p: argparse.ArgumentParser, *, batch: int | None = 8, seq: int | None = 1024) -> None:
  """The flags every compiling command shares. Each flag named after a :class:`Workload`
  field sets that field (:func:`workload`); a new field needs only its flag here."""
  p.add_argument(
      "--model", default="gpt2-small",
      help="a preset (see `jaxmem models`), a path to a Hugging Face config.json, or a Hub id ORG/NAME[@REVISION] "
      "(only its config.json is fetched; HF_TOKEN, the Hub cache and HF_HUB_OFFLINE apply); default gpt2-small",
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
      "--mem-fraction", type=float, default=None,
      help="GPU targets: the share of device memory JAX's allocator takes (capacity = fraction x memory); "
      "default XLA_CLIENT_MEM_FRACTION (or XLA_PYTHON_CLIENT_MEM_FRACTION), else 0.75",
  )
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
  add_axis(p, "--param-dtype", default=None, shown="float32", help="parameter dtype")
  add_axis(p, "--dtype", default=None, shown="bfloat16", help="compute dtype (infer: one)")
  p.add_argument(
      "--attention",
      default="auto",
      help=attention_help(),
  )
  add_axis(
      p, "--qk-dtype", default="bfloat16",
      help="dot attention's scores (prefill's, in infer): bfloat16 (MaxText's default: the compute dtype) or float32",
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
  add_axis(
      p, "--microbatches", default="1",
      help="gradient accumulation: split the global batch into N microbatches run in sequence",
  )
  add_axis(
      p, "--vocab-tiles", default="1",
      help="compute the output projection and loss in N tiles of the tokens (MaxText's num_vocab_tiling)",
  )
  add_axis(
      p, "--context-strategy", default="all_gather",
      help="how attention crosses a sequence split over a context mesh axis: all_gather (MaxText's default: "
      "keys and values gathered, causal load balanced) or ring (ppermute of key/value blocks, online softmax)",
  )
  add_axis(
      p, "--pipeline-microbatches", default=None, shown="the stage count",
      help="meshes with a stage axis: cut each batch (or --microbatches microbatch) into N pipeline "
      "microbatches (MaxText's num_pipeline_microbatches; at least the stages; none for the stage count)",
  )
  p.add_argument(  # an int default, as fit --phase tells a given flag by it
      "--pipeline-repeats", default=1,
      help="meshes with a stage axis: MaxText's circular schedule, R non-adjacent layer groups per stage; "
      "comma separated to sweep; default 1",
  )
  add_precision(p)
  add_parallelism(p)


def add_parallelism(p: argparse.ArgumentParser) -> None:
  """Korthikanti et al. 2022's options: Megatron sequence parallelism and the models' dropout."""
  p.add_argument(
      "--sequence-parallel", nargs="?", const="on", default=None, metavar="off,on",
      help="Megatron sequence parallelism: split the residual stream, norms and dropouts along the sequence over "
      "the tensor axis (all-gather before, reduce-scatter after the tensor-parallel matmuls); needs --mesh tensor=N; "
      "the flag alone is on, off,on compiles both",
  )
  add_axis(
      p, "--dropout", default=None, shown="0",
      help="the models' dropout probability (embeddings, attention probabilities under --attention dot, both "
      "sub-blocks' outputs; masks are one byte each)",
  )


def add_precision(p: argparse.ArgumentParser, *, sweep: bool = True) -> None:
  """The optimizer's and the gradients' dtypes beside --param-dtype (jaxmem.program.precision);
  ``sweep`` False for estimate's closed form (one value each)."""
  default = "; `none` or `default` in a list for the default" if sweep else ""
  add_axis(
      p, "--master-dtype", default=None, shown="none", sweep=sweep,
      help="keep a master copy of the parameters in this dtype in the optimizer state (float32 with "
      "--param-dtype bfloat16: ZeRO's 2 + 2 + 12 bytes per parameter)" + default,
  )
  add_axis(
      p, "--moments-dtype", default=None, shown="the dtype the optimizer updates in (the master copy's, else the parameters')",
      help="store the optimizer's moments in this dtype (adam, adamw, momentum, nesterov, lion)" + default, sweep=sweep,
  )
  add_axis(
      p, "--grad-reduce-dtype", default=None, shown="the parameters' dtype", sweep=sweep,
      help="form and reduce the gradients over the data axes in this dtype" + default,
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
    jaxmem.start_distributed()
  jaxmem.start_jax(jaxmem.cpu_devices_needed([target or ""]))


def resolve_target(args: argparse.Namespace) -> str | None:
  """Starts JAX and sets ``args.target`` to the --target given or the default; returns the line
  that says which default was chosen and why (to print once the input is known to be good)."""
  start(args.target, distributed=getattr(args, "distributed", False))
  if args.target:
    return None
  args.target, why = jaxmem.default_target_name()
  return f"jaxmem: target {args.target} ({why}; choose with --target)"


def say(line: str | None) -> None:
  """A status line on stderr (the chosen target, cache hits), never on stdout."""
  if line:
    print(line, file=sys.stderr)


def emit(text: str, output: str | None) -> None:
  """The result on stdout, and in ``output`` when given; multi-host: the first host reports.
  (A command that never started JAX, such as estimate, has one host and starts no backend.)"""
  if jaxmem.started() and jax.process_index() != 0:
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


# The flags that name a path a command writes, and whether each is a directory.
OUTPUT_FLAGS = (("output", False), ("plot", False), ("xprof", True))


def check_outputs(args: argparse.Namespace) -> None:
  """Every output path given (``--output``, ``--plot``, ``--xprof``) can be written, checked
  before anything compiles, so a bad path costs no compile and loses no table. Nothing is
  created: the nearest existing folder above the path must be a writable folder, and the path,
  if it exists, a file (a folder for ``--xprof``)."""
  for name, is_dir in OUTPUT_FLAGS:
    path = getattr(args, name, None)
    if path:
      _check_output(f"--{name}", path, is_dir=is_dir)


def _check_output(flag: str, path: str, *, is_dir: bool) -> None:
  full = os.path.abspath(path)
  if os.path.exists(full):
    if os.path.isdir(full) != is_dir:
      raise JaxmemError(f"cannot write {flag} {path}: {'not a folder' if is_dir else 'it is a folder'}")
    if not os.access(full, os.W_OK):
      raise JaxmemError(f"cannot write {flag} {path}: permission denied")
    return
  parent = os.path.dirname(full)
  while not os.path.exists(parent):
    if not is_dir:  # a file's folder must exist: open() does not create it
      raise JaxmemError(f"cannot write {flag} {path}: no folder {os.path.dirname(path) or '.'}")
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise JaxmemError(f"cannot write {flag} {path}: {parent} is not a folder")
  if not os.access(parent, os.W_OK):
    raise JaxmemError(f"cannot write {flag} {path}: {parent} is not writable")


class Progress:
  """What a sweep shows on stderr while it runs: on a terminal, a bar with its ETA; otherwise
  (a log, a pipe, CI) one line per configuration, so a long sweep is never silent. Nothing with
  ``JAXMEM_NO_PROGRESS`` set. Also says the chosen target once the sweep is planned (the input
  is then known to be good, so an error stays one line) and counts the rows the cache answered.
  ``total`` is None for a search, whose number of compiles is known only at its end."""

  def __init__(self, args: argparse.Namespace, chosen: str | None, cache: Any = None):
    self.chosen, self.cache, self.fmt = chosen, cache, args.format
    self.total: int | None = None
    self.done = 0
    self.hits = 0
    self.bar: tqdm | None = None
    self.quiet = bool(os.environ.get("JAXMEM_NO_PROGRESS"))
    self.lines = not self.quiet and not sys.stderr.isatty()

  def planned(self, p: Any) -> None:
    """The ``on_plan`` callback of compare and fit: the sweep's configurations are ``p.tasks()``."""
    self.start(len(p.tasks()))

  def start(self, total: int | None) -> None:
    say(self.chosen)
    self.chosen = None
    self.total = total
    if self.quiet or self.lines or self.fmt == "json" or (total is not None and total < 3):
      return
    self.bar = tqdm(total=total, unit="config" if total else "compile", file=sys.stderr, dynamic_ncols=True, leave=False)

  def row(self, r: Any) -> None:
    """The ``on_row`` callback: one configuration finished (compiled, refused or from the cache)."""
    if self.chosen is not None:
      self.start(None)
    self.done += 1
    hits = getattr(self.cache, "hits", 0)
    cached, self.hits = hits > self.hits, hits  # the runner counts a hit just before its callback
    label = _label(r) + (" (cached)" if cached else "")
    if self.bar is not None:
      self.bar.set_postfix_str(label, refresh=False)
      self.bar.update(1)
    elif self.lines:
      of = f"/{self.total}" if self.total else ""
      say(f"jaxmem: [{self.done}{of}] {label}: {_verdict(r)}")

  def round(self, n: int, probes: int) -> None:
    """fit's ``on_round`` callback."""
    if self.bar is not None:
      self.bar.set_postfix_str(f"round {n}")

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None


def _label(r: Any) -> str:
  """A row's configuration in a few words: train rows' mesh, optimizer, remat and workload; infer
  rows' weights, phase and context."""
  words = [str(v) for k in ("mesh", "optimizer", "remat", "attention", "weights", "phase") if (v := getattr(r, k, None))]
  words += [f"{k.replace('_', ' ')} {v}" for k in ("batch", "seq", "context", "microbatches", "vocab_tiles")
            if (v := getattr(r, k, None)) is not None and not (k in ("microbatches", "vocab_tiles") and v == 1)]
  # The dtypes and options a sweep may vary, where not their defaults (so two rows' lines differ).
  words += [f"{what} {v}" for k, what, default in _SWEPT_WORDS if (v := getattr(r, k, None)) not in (None, default, False)]
  if getattr(r, "moments_dtype", None) not in (None, getattr(r, "param_dtype", None)):
    words.append(f"moments {r.moments_dtype}")
  return " ".join(words)


# (field, word, default) of the swept fields a progress line names when not at their default.
_SWEPT_WORDS = (("param_dtype", "params", "float32"), ("dtype", "compute", "bfloat16"), ("qk_dtype", "qk", "bfloat16"),
                ("master_dtype", "master", None), ("grad_reduce_dtype", "grad reduce", None), ("dropout", "dropout", 0.0),
                ("sequence_parallel", "sequence parallel", False))


def _verdict(r: Any) -> str:
  if getattr(r, "error", None):
    return "refused: " + r.error.splitlines()[0][:120]
  if getattr(r, "required_bytes", None) is None:
    return "compiled"
  u = unit_for(r.required_bytes)
  fits = {True: ", fits", False: ", does not fit"}.get(r.fits, "")
  return f"required {u(r.required_bytes)} {u.name}{fits}"


def cache(args: argparse.Namespace) -> jaxmem.RowCache:
  return jaxmem.RowCache(enabled=not args.no_cache)


def say_cache(c: jaxmem.RowCache, total: int) -> None:
  if c.hits:
    say(f"jaxmem: {c.hits} of {total} configurations from the cache ({c.directory}; --no-cache to recompile)")


class Sweep:
  """A sweep's callbacks for ``jaxmem.compare`` / ``scale`` / ``rank_configurations``: progress,
  the rows so far written to ``--output`` as each finishes (an interrupted sweep loses nothing),
  and on an interrupt the finished rows printed. ``render(rows)`` is the command's table."""

  def __init__(self, args: argparse.Namespace, chosen: str | None, render):
    self.args, self.render = args, render
    self.cache = cache(args)
    self.progress = Progress(args, chosen, self.cache)
    self.rows: list[Any] = []

  def on_row(self, r: Any) -> None:
    self.rows.append(r)
    if self.args.output:
      write(self.args.output, self.render(jaxmem.with_overheads(self.rows)))
    self.progress.row(r)

  def run(self, call) -> Any:
    """``call(**callbacks)`` (the library function), or None if interrupted (what finished has
    been printed and is in the cache)."""
    try:
      out = call(cache=self.cache, on_row=self.on_row)
    except KeyboardInterrupt:
      self.progress.close()
      if self.rows:
        emit(self.render(jaxmem.with_overheads(self.rows)), self.args.output)
      total = "" if self.progress.total is None else f" of {self.progress.total}"
      say(
          f"jaxmem: interrupted after {len(self.rows)}{total} configurations; "
          "run the same command again to resume (finished ones are cached)"
      )
      return None
    self.progress.close()
    say_cache(self.cache, len(self.rows))
    return out

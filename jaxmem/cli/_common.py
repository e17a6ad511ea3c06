"""What every command shares: the parser class, the workload flags and the Workload they make,
target resolution, the files a command writes (checked before compiling: :func:`check_outputs`;
written after the result is printed: :func:`emit`), the columns a table shows (``--columns``),
the first line a command says (:func:`starting`) and the progress a sweep shows
(:class:`Progress`).

Commands call the public library (``jaxmem.compare``, ``fit``, ``scale``, ``infer``,
``explain``) and pass their progress and interrupt handling in as callbacks; this package
imports only ``jaxmem``'s public names and ``jaxmem.render`` (tests/test_cli_imports.py).
Bad input is a :class:`JaxmemError`: the CLI prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
from tqdm import tqdm

import jaxmem
from jaxmem import BadValue, JaxmemError, Workload, inputs
from jaxmem.render import columns as cols
from jaxmem.render.figures import plot_formats
from jaxmem.render.tables import FORMAT_EXTENSIONS, FORMATS
from jaxmem.render.units import unit_for

DEFAULT_REMAT = ",".join(Workload().remat)


class Parser(argparse.ArgumentParser):
  """argparse, but a usage error is a JaxmemError (one line) instead of usage + exit, and a
  flag's value is parsed by its ``type=`` (a parser of :mod:`jaxmem.inputs`) when the command
  line is read: a bad one is that parser's refusal, naming the flag."""

  def __init__(self, *args: Any, **kwargs: Any):
    kwargs.setdefault("exit_on_error", False)  # argparse's errors reach parse_known_args below
    super().__init__(*args, **kwargs)

  def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # noqa: D102
    try:
      return super().parse_known_args(args, namespace)
    except argparse.ArgumentError as e:
      refused = e.__context__  # what the flag's type= raised, where it refused the value
      if isinstance(refused, BadValue):
        raise refused.named(e.argument_name or inputs.VALUE) from None
      if isinstance(refused, JaxmemError):
        raise refused from None
      self.error(str(e))

  def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # noqa: D102
    try:
      return super().parse_args(args, namespace)
    except argparse.ArgumentError as e:  # Python 3.12+: arguments left over, without exit_on_error
      self.error(str(e))

  def error(self, message: str):  # noqa: D102
    raise JaxmemError(f"{message} (see {self.prog} --help)")


# The flags' parsers (a flag's type=): each refuses a bad value when the command line is read.
COUNT = inputs.Whole()  # a whole number of at least 1: --batch, --seq, --slices, --jobs...


def add_axes(
    p: argparse.ArgumentParser, group: str, *, sweep: bool = True, helps: dict[str, str] | None = None,
    training: bool = True,
) -> None:
  """The flags of the sweep axes declared in ``group`` (``jaxmem.AXES``), in their order; an
  axis without help has a flag its commands declare themselves, or its help in ``helps``. Each
  flag sets the :class:`Workload` field of its name, which splits a comma list and checks every
  item (a bad one is named with the valid ones, in one line). ``sweep`` False: one value each
  (a closed form, ``estimate``, compiles nothing to sweep). ``training`` False: the command
  compiles no train step, so a train step's axes (``Axis.training``) have no flag."""
  for axis in jaxmem.AXES.values():
    text = (helps or {}).get(axis.name, axis.help)
    if axis.group == group and text is not None and (training or not axis.training):
      p.add_argument(axis.flag, default=axis.flag_default, help=axis_help(axis, text, sweep=sweep), type=axis.flag_type,
                     **axis.flag_options)


def axis_help(axis: jaxmem.Axis, text: str, *, sweep: bool = True) -> str:
  """An axis's flag help: ``text``, and for a comma list that it sweeps and its default (as
  ``shown`` says it where the library chooses)."""
  if not axis.listed:
    return text
  said = axis.shown if axis.shown is not None else axis.flag_default
  return text + (axis.list_note + "; comma separated to sweep") * sweep + (f"; default {said}" if said else "")


# What the library chooses where --batch and --seq are not given (jaxmem.resolve.fitted_batch and
# default_seq: the defaults, or the nearest that fit the model and the mesh, said in a line).
TRAIN_BATCH = "8 (or the next multiple the mesh's data axes x microbatches divide)"
TRAIN_SEQ = "1024 (or the model's learned positions, where fewer)"


def add_workload(
    p: argparse.ArgumentParser, *, batch: str = TRAIN_BATCH, seq: str | None = TRAIN_SEQ, own: bool = False,
    output: bool = True, training: bool = True,
) -> None:
  """The flags every compiling command shares. Each flag named after a :class:`Workload`
  field sets that field (:func:`workload`); a new field needs only its flag here. --batch and
  --seq are None unless given: the library chooses them from the model and the mesh (``batch``
  and ``seq`` say its default in the help; ``seq`` None: the command takes no --seq). ``own``:
  the command takes --maxtext, whose step has its own batch and sequence. ``output``: the
  command writes its result (--format, --output). ``training`` False: the command compiles no
  train step (infer), so the train step's axes of the group have no flag."""
  p.add_argument(
      "--model", default="gpt2-small",
      help="a preset (see `jaxmem models`), a path to a Hugging Face config.json, or a Hub id ORG/NAME[@REVISION] "
      "(only its config.json is fetched; HF_TOKEN, the Hub cache and HF_HUB_OFFLINE apply); default gpt2-small",
  )
  mx = "; with --maxtext, its config's" if own else ""
  p.add_argument("--batch", type=COUNT, default=None, help=f"global batch size; default {batch}{mx}")
  if seq is not None:
    p.add_argument("--seq", type=COUNT, default=None, help=f"sequence length; default {seq}{mx}")
  p.add_argument(
      "--target",
      default=None,
      help="where to compile: attached, tpu:v5e-8, gpu:h100x8, cpu, cpu:N (see `jaxmem targets`); "
      "default: the attached accelerator, else a representative one whose compiler is installed",
  )
  p.add_argument("--slices", type=COUNT, default=1, help="TPU slices (multi-slice over DCN); default 1")
  p.add_argument(
      "--resident", default=None, metavar="BYTES", type=inputs.Size(),
      help="bytes per device another program holds beside the step (14.5GiB, 512MiB, or bytes): out of the "
      "capacity; a TPU compile is capped to match with --xla_tpu_max_hbm_size_mib (the row's note gives the flag)",
  )
  p.add_argument(
      "--mem-fraction", type=inputs.Fraction(), default=None,
      help="GPU targets: the share of device memory JAX's allocator takes (capacity = fraction x memory); "
      "default XLA_CLIENT_MEM_FRACTION (or XLA_PYTHON_CLIENT_MEM_FRACTION), else 0.75",
  )
  p.add_argument(
      "--always-compile", action="store_true",
      help="compile even where the arguments' shapes alone exceed the device (answered from the shapes otherwise): "
      "the compiler's own verdict and figures, at the cost of the compile",
  )
  add_axes(p, "workload", helps={"attention": jaxmem.attention_help()}, training=training)  # the models' kernels
  if output:
    add_output(p)
  p.add_argument(
      "--distributed",
      action="store_true",
      help="multi-host TPU/GPU VMs: call jax.distributed.initialize() first and run the same command on every host",
  )


def add_run_options(p: argparse.ArgumentParser, *, totals: bool = True) -> None:
  """How a sweep runs (:class:`jaxmem.RunOptions`), for the commands that honour it: compare,
  fit, scale and plan (``totals``: whether the command's table has whole-mesh figures)."""
  if totals:
    p.add_argument("--totals", action="store_true", help="add whole-mesh figures (per device x devices)")
  p.add_argument("--jobs", type=COUNT, default=1, help="compile in this many processes; default 1")
  p.add_argument("--scheduler", default=None, type=inputs.ADDRESS,
                 help="compile on the Dask cluster at this address (tcp://host:8786)")
  p.add_argument("--no-cache", action="store_true", help="recompile everything instead of reusing cached rows")


def add_step(p: argparse.ArgumentParser) -> None:
  """``--step``: the user's own step factory instead of ``--model`` (compare, explain, fit, scale)."""
  p.add_argument(
      "--step", default=None, metavar="MODULE:FACTORY", type=inputs.STEP,
      help="your own step instead of --model: package.module:make_step or path/to/file.py:make_step, a "
      "function make_step(*, batch, seq, remat[, mesh]) returning (fn, args, jit_kwargs)",
  )
  p.add_argument(
      "--maxtext", default=None, nargs="+", metavar=("CONFIG", "KEY=VALUE"),
      help="MaxText's own train step instead of --model: a MaxText config (base.yml, or a path) and its overrides, "
      "as train_compile takes them (the maxtext extra); --batch, --seq, --remat, --attention, --mesh and the "
      "other options map onto MaxText's, and one with no mapping is refused",
  )


def no_step(args: argparse.Namespace, *flags: str) -> None:
  """A one-line error for flags that need a model of jaxmem's own, given with ``--step``."""
  given = [f for f in flags if getattr(args, f.lstrip("-").replace("-", "_"), None)]
  step = "--step" if getattr(args, "step", None) else "--maxtext" if getattr(args, "maxtext", None) else None
  if step and given:
    raise JaxmemError(f"{given[0]} needs a model of jaxmem's own (--model), not {step}")


def refuse_given(args: argparse.Namespace, flags: tuple[str, ...], where: str) -> None:
  """A one-line error for the first of ``flags`` given (set away from its parser default, which
  is what an absent flag reads), which does not apply ``where``."""
  for flag in flags:
    dest = flag.lstrip("-").replace("-", "_")
    if getattr(args, dest) != args.flag_defaults.get(dest):
      raise JaxmemError(f"{flag} does not apply {where}")


def add_output(p: argparse.ArgumentParser) -> None:
  p.add_argument("--format", default="table", type=inputs.Choice(FORMATS), help="table, markdown, json or csv; default table")
  p.add_argument("--output", default=None,
                 help="also write the result to this file (checked before anything compiles; a .json, .csv or .md "
                 "file must be of that --format)")


def add_columns(p: argparse.ArgumentParser, *tables: list[cols.Column]) -> None:
  """``--columns``: which of the command's table columns are shown (its ``tables``' columns
  and sets are named in the help, and in the line refusing a name they lack)."""
  sets = [s for s in (cols.ALL, *cols.SETS) if s in (cols.ALL, cols.DEFAULT) or any(s in c.sets for t in tables for c in t)]
  p.add_argument(
      "--columns", default=None, metavar="NAMES",
      help=f"the table's columns: sets ({', '.join(sets)}) or column names (as JSON names them), comma separated; "
      "default: the figures that decide a launch; json and csv carry every field",
  )


def columns(args: argparse.Namespace, *tables: list[cols.Column], why: str | None = None) -> frozenset[str]:
  """``--columns`` read against the ``tables`` this path of a command prints (each name a set
  or one of their columns, else one line naming the valid ones). It chooses a table's columns:
  with ``--format json`` or ``csv`` (every field) it is refused, and on a path whose output has
  no table it chooses for (``why`` says which) too."""
  given = getattr(args, "columns", None)
  if given is None:
    return cols.DEFAULT_CHOICE
  if args.format in ("json", "csv"):
    raise JaxmemError(f"`columns` chooses a table's columns; --format {args.format} writes every field")
  if not tables:
    raise JaxmemError(f"`columns` chooses the columns of a result table; {why} has none to choose")
  return cols.choose(given, *tables)


def add_train_step(p: argparse.ArgumentParser) -> None:
  """How the train step is computed (gradient accumulation, vocabulary tiling, the pipeline...),
  its precision and its parallelism: every train step's axis with a flag."""
  add_axes(p, "step")
  add_precision(p)
  add_parallelism(p)


def add_parallelism(p: argparse.ArgumentParser) -> None:
  """Korthikanti et al. 2022's options (the axes declared in the group ``parallelism``)."""
  add_axes(p, "parallelism")


def add_precision(p: argparse.ArgumentParser, *, sweep: bool = True) -> None:
  """The optimizer's and the gradients' dtypes beside --param-dtype (jaxmem.program.precision);
  ``sweep`` False for estimate's closed form (one value each)."""
  add_axes(p, "precision", sweep=sweep)


def add_sweep_axes(p: argparse.ArgumentParser, *, remat: str = DEFAULT_REMAT, remat_help: str | None = None) -> None:
  """``--remat`` and ``--optimizer``: comma-separated lists (or all)."""
  p.add_argument("--remat", default=remat, help=remat_help or f"policies, comma separated, or all (default {remat}); "
                 "names:save=A+B:offload=C places checkpoint names, custom:NAME=PLACE:... is MaxText's custom map")
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
  ``cpu:N`` target; see :func:`jaxmem.hardware.startup.start_jax`)."""
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
    print(line, file=sys.stderr, flush=True)


def tell(line: str) -> None:
  """A progress line on stderr: what the command is doing (``JAXMEM_NO_PROGRESS`` silences it)."""
  if not os.environ.get("JAXMEM_NO_PROGRESS"):
    say(line)


def starting(args: argparse.Namespace, command: str, doing: str = "", *, target: str | None = None) -> None:
  """A command's first line on stderr, once its own flags are checked and before JAX, the
  target or a compiler starts (which can take many seconds on a fresh machine): what it is
  about to do, ``jaxmem: compare gpt2-small on gpu:h100; starting JAX and the compiler``
  (``target``: the words for where, when not the ``--target`` given or the default one).
  Progress (:func:`tell`); input found bad only once JAX has started is the next line."""
  where = target or getattr(args, "target", None) or "the default target"
  tell(f"jaxmem: {command} {subject(args)} on {where}{doing}; starting JAX and the compiler")


def subject(args: argparse.Namespace) -> str:
  """What a command compiles, in words: the user's step, MaxText's, or the model."""
  if getattr(args, "step", None):
    return f"the step {args.step}"
  if getattr(args, "maxtext", None):
    return f"MaxText's step ({args.maxtext[0]})"
  return str(args.model)


@dataclasses.dataclass(frozen=True)
class Artifact:
  """A file (or folder) a command writes beside its printed result: the flag that named it, its
  path, and how to write it (``write()``, which returns a line to say, or None)."""

  flag: str
  path: str
  write: Callable[[], str | None]


def emit(text: str, output: str | None, *artifacts: Artifact) -> None:
  """The result on stdout, then the files asked for: ``output`` (the result again) and
  ``artifacts`` (a plot, an XProf logdir). Multi-host: the first host reports. (A command that
  never started JAX, such as estimate, has one host and starts no backend.)

  The result is printed first, so a file that cannot be written after the compile loses
  nothing: each file is tried, and those that failed are one :class:`JaxmemError` naming them
  (the CLI's one line on stderr, exit status 2), after the result on stdout."""
  if jaxmem.started() and jax.process_index() != 0:
    return
  print(text)
  sys.stdout.flush()  # the result is out before any file is tried
  wanted = ([Artifact("--output", output, lambda: write(output, text))] if output else []) + list(artifacts)
  failed = []
  for a in wanted:
    try:
      say(a.write())
    except JaxmemError as e:
      failed.append(str(e))
    except OSError as e:  # a writer that raised the system's error as it is (a folder made read-only since)
      failed.append(f"cannot write {a.flag} {a.path}: {e.strerror or e}")
  if failed:
    raise JaxmemError("; ".join(failed) + " (the result is printed in full on stdout)")


def write(path: str, text: str) -> None:
  try:
    with open(path, "w") as f:
      f.write(text if text.endswith("\n") else text + "\n")
  except OSError as e:
    raise JaxmemError(f"cannot write --output {path}: {e.strerror}") from None


# The flags that name a path a command writes, and whether each is a directory.
OUTPUT_FLAGS = (("output", False), ("plot", False), ("xprof", True))


def check_outputs(args: argparse.Namespace, *, formats: tuple[str, ...] | None = None) -> None:
  """Every output path given (``--output``, ``--plot``, ``--xprof``) can be written, checked
  before anything compiles, so a bad path costs no compile and loses no table. Nothing is
  left behind: the nearest existing folder above the path must be a folder a file can be made in
  (tried with a temporary file, removed at once), and the path, if it exists, a file (a folder
  for ``--xprof``). The format is known from the extension: ``--plot``'s must be one of
  ``plot_formats`` (the command's plot's; default every format matplotlib writes), and an
  ``--output`` named ``.json``, ``.csv`` or ``.md`` must be what ``--format`` writes."""
  for name, is_dir in OUTPUT_FLAGS:
    path = getattr(args, name, None)
    if path:
      _check_output(f"--{name}", path, is_dir=is_dir)
  if getattr(args, "plot", None):
    _check_extension("--plot", args.plot, formats or plot_formats())
  output, fmt = getattr(args, "output", None), getattr(args, "format", None)
  named = FORMAT_EXTENSIONS.get(os.path.splitext(output or "")[1].lower())
  if named is not None and fmt is not None and named != fmt:
    raise JaxmemError(f"cannot write --output {output}: a {os.path.splitext(output)[1]} file holds --format {named}, "
                      f"not {fmt}; give --format {named}, or another file name")


def _check_extension(flag: str, path: str, formats: tuple[str, ...]) -> None:
  ext = os.path.splitext(path)[1].lower().lstrip(".")
  if ext not in formats:
    got = f".{ext} is not a format it writes" if ext else "no extension to name its format"
    raise JaxmemError(f"cannot write {flag} {path}: {got}; use {', '.join(formats)}")


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
  try:  # os.access trusts the mode bits, which root passes and /proc or a read-only mount refuse
    with tempfile.TemporaryFile(dir=parent):
      pass
  except OSError as e:
    raise JaxmemError(f"cannot write {flag} {path}: {parent} is not writable ({e.strerror})") from None


class Progress:
  """What a sweep shows on stderr while it runs: on a terminal, a bar with its ETA; otherwise
  (a log, a pipe, CI) one line per configuration, so a long sweep is never silent. Nothing with
  ``JAXMEM_NO_PROGRESS`` set. Also says the chosen target once the sweep is planned (the input
  is then known to be good, so an error stays one line) and counts the rows the cache answered.
  ``total`` is None for a search, whose number of compiles is known only at its end."""

  def __init__(self, args: argparse.Namespace, chosen: str | None, cache: Any = None, *, quiet: bool = False):
    global _PROGRESS
    self.chosen, self.cache, self.fmt = chosen, cache, args.format
    self.total: int | None = None
    self.done = 0
    self.hits = 0
    self.compiles = 0  # compiles started
    self.first: float | None = None  # when the first compile started (time.monotonic)
    self.bar: tqdm | None = None
    self.quiet = quiet or inputs.env_switch("JAXMEM_NO_PROGRESS")
    self.lines = not self.quiet and not sys.stderr.isatty()
    _PROGRESS = self  # the sweep's compiles (jaxmem.events.Compiling) are shown by this one

  def compiling(self, e: Any) -> None:
    """A compile is about to start (a :class:`jaxmem.events.Compiling`): a line saying which,
    with, from the second on, an estimate of the time left (the mean so far times the rest)."""
    if self.chosen is not None:
      self.start(None)
    input_good()
    now = time.monotonic()
    self.compiles += 1
    self.first = now if self.first is None else self.first
    total = self.total or e.total
    index = self.done + 1 if self.total else e.index
    line = f"compiling {index} of {total}: {e.label}" if total else f"compiling {index}: {e.label}"
    if self.compiles > 1 and total:
      line += f" (about {_duration((now - self.first) / (self.compiles - 1) * (total - index + 1))} left)"
    if self.bar is not None:
      self.bar.set_postfix_str(line, refresh=True)
    elif self.lines:
      say(f"jaxmem: {line}")

  def start(self, total: int | None) -> None:
    say(self.chosen)
    self.chosen = None
    input_good()
    self.total = total
    if self.quiet or self.lines or self.fmt == "json" or (total is not None and total < 3):
      # No bar (a pipe, a log, JSON, a short run): a line per compile and per row instead, so a
      # terminal is not left silent through a compile that takes minutes.
      self.lines = not self.quiet
      return
    self.bar = tqdm(total=total, unit="config" if total else "compile", file=sys.stderr, dynamic_ncols=True, leave=False)

  def row(self, r: Any) -> None:
    """The ``on_row`` callback: one configuration finished (compiled, refused or from the cache)."""
    if self.chosen is not None:
      self.start(None)
    self.done += 1
    hits = getattr(self.cache, "hits", 0)
    cached, self.hits = hits > self.hits, hits  # the runner counts a hit just before its callback
    cached = getattr(r, "cached", cached)  # a row that says whether it came from the cache
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


_PROGRESS: Progress | None = None  # the command's progress, which shows the compiles
_SAID: set[str] = set()  # the notices this command has printed (or kept to print)
# Notices heard while the input may still be refused (the defaults a plan chose, say): printed once
# it is known good, so a refusal stays one line (input_good).
_PENDING: list[str] = []


@contextlib.contextmanager
def listening() -> Iterator[None]:
  """A command's run, with the library's events shown on stderr (:func:`on_event`)."""
  global _PROGRESS
  _PROGRESS = None
  _SAID.clear()
  _PENDING.clear()
  try:
    with jaxmem.listen(on_event):
      yield
  except JaxmemError:
    _PENDING.clear()  # the input was refused: its one line is all that is said
    raise
  finally:
    input_good()
    _PROGRESS = None


def input_good() -> None:
  """The input is known good (a sweep or a compile starts, or the command ends): the notices
  kept until then are printed."""
  for text in _PENDING:
    say(f"jaxmem: {text}")
  _PENDING.clear()


def on_event(e: Any) -> None:
  """The CLI's listener (:func:`jaxmem.listen`): notices as lines on stderr, compiles shown by
  the command's progress (or as a line where it has none)."""
  if isinstance(e, jaxmem.Notice):
    # Each line once: a sweep plans each point, and each plan says the defaults it chose. A
    # progress notice is said at once (a search says it as it starts); others once the input is good.
    if not (e.progress and inputs.env_switch("JAXMEM_NO_PROGRESS")) and e.text not in _SAID:
      _SAID.add(e.text)
      _PENDING.append(e.text)
      if e.progress:
        input_good()
  elif isinstance(e, jaxmem.Compiling):
    if _PROGRESS is not None:
      _PROGRESS.compiling(e)
    else:
      input_good()
      if not inputs.env_switch("JAXMEM_NO_PROGRESS"):
        say(f"jaxmem: compiling {e.label}")


def _duration(seconds: float) -> str:
  """``45 s``, ``12 min``, ``2.5 h``."""
  if seconds < 90:
    return f"{seconds:.0f} s"
  return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _label(r: Any) -> str:
  """A row's configuration in a few words: train rows' mesh, optimizer, remat and workload, then
  each sweep axis not at its default (``jaxmem.AXES``' words, so two rows' lines differ); infer
  rows' weights, phase and context."""
  words = [str(v) for k in ("mesh", "optimizer", "remat", "attention", "weights", "phase") if (v := getattr(r, k, None))]
  words += [f"{k} {v}" for k in ("batch", "seq", "context") if (v := getattr(r, k, None)) is not None]
  words += [w for a in jaxmem.AXES.values() if (w := a.label(r)) is not None]
  return " ".join(words)


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
  """A command's run (:class:`jaxmem.RunOptions`) and what Ctrl-C shows of it: progress, the
  rows so far written to ``--output`` as each finishes (an interrupted run loses nothing), and,
  if interrupted, the finished rows printed by :func:`interrupted`. ``render(rows)`` is the
  command's table of the rows so far (None for a search, whose probes are not its result);
  ``cached``: the command honours ``--jobs``, ``--scheduler`` and ``--no-cache``; ``progress``:
  whether it shows progress on stderr."""

  def __init__(self, args: argparse.Namespace, chosen: str | None, render: Callable[[list[Any]], str] | None = None,
               *, cached: bool = True, progress: bool = True):
    self.args, self.render, self.cached = args, render, cached
    self.cache = cache(args) if cached else None
    self.progress = Progress(args, chosen, self.cache, quiet=not progress)
    self.rows: list[Any] = []
    self.started: jaxmem.Started | None = None
    self.unwritable = False  # --output could not be written with the rows so far
    on_interrupt(args, self.interrupted)

  def options(self) -> jaxmem.RunOptions:
    """The run options the command's flags give, with this sweep's callbacks."""
    run = jaxmem.RunOptions(on_start=self.on_start, on_row=self.on_row, on_round=self.progress.round)
    if not self.cached:
      return run
    return dataclasses.replace(run, jobs=self.args.jobs, scheduler=self.args.scheduler, cache=self.cache)

  def on_start(self, s: jaxmem.Started) -> None:
    self.started = s
    self.progress.start(s.total)

  def on_row(self, r: Any) -> None:
    self.rows.append(r)
    if self.args.output and self.render is not None and not self.unwritable:
      try:
        write(self.args.output, self.render(self.rows))
      except JaxmemError:  # the file became unwritable mid-run: the sweep goes on, emit says so at its end
        self.unwritable = True
    self.progress.row(r)

  def run(self, call: Callable[[jaxmem.RunOptions], Any]) -> Any:
    """``call(run_options)`` (the library function); a Ctrl-C goes on to ``main``, which shows
    :meth:`interrupted`."""
    try:
      out = call(self.options())
    finally:
      self.progress.close()
    if self.cache is not None:
      say_cache(self.cache, len(self.rows))
    return out

  def interrupted(self) -> None:
    """What Ctrl-C shows: the finished rows' table on stdout (and in ``--output``), and on stderr
    how far it got and how to resume."""
    self.progress.close()
    if self.render is not None and self.rows:
      try:
        emit(self.render(self.rows), self.args.output)
      except JaxmemError as e:  # the rows are printed; the file is not, which is said on stderr
        say(f"jaxmem: {e}")
    if self.render is None:
      done = f" after {len(self.rows)} compiles" if self.rows else ""
    else:
      total = "" if self.progress.total is None else f" of {self.progress.total}"
      done = f" after {len(self.rows)}{total} configurations"
    cached = self.cache is not None and self.cache.enabled
    resume = "; run the same command again to resume (finished compiles are cached)" if cached else ""
    say(f"jaxmem: interrupted{done}{resume}")


def on_interrupt(args: argparse.Namespace, report: Callable[[], None]) -> None:
  """What ``main`` shows if Ctrl-C stops this command: ``report()`` prints what was computed so
  far (the last one registered is used)."""
  args.interrupted = report


def interrupted(args: argparse.Namespace | None) -> None:
  """``main``'s Ctrl-C: the command's partial output where it registered one
  (:func:`on_interrupt`), else one line; never a traceback."""
  report = getattr(args, "interrupted", None)
  if report is not None:
    report()
  else:
    say("jaxmem: interrupted")

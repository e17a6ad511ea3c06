"""The command line run without compiling anything, and what it did observed.

:func:`run` calls ``jaxmem.cli.main(argv)`` with the compiler stubbed out (:func:`no_compiles`):
a :class:`Compiled` sentinel is raised where a compile would start (the library's ``Compiling``
event, before the program is traced; ``jax.stages.Lowered.compile`` behind it), the capacity
probes answer without compiling (the TPU generation's specified HBM, a GPU compiler that works),
and ``validate`` finds an accelerator and measures in no subprocess. The command goes on past the
sentinel: the library call that reached it returns a :class:`Result`, an object that stands for any
result, so what the command does with its result (the table, ``--output``, ``--plot``,
``--emit``...) is observed too.

What it did (:class:`Outcome`) is every call it made into the library and its renderers (each
function of the ``jaxmem`` package, and of the ``jaxmem.render`` modules a command calls), with
its arguments written as plain values, what it printed and the files it wrote. Two runs did the
same when their outcomes are equal.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import io
import os
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

import jax
import pytest

import jaxmem
from jaxmem.cli import _common, main
from jaxmem.inference.run import run_infer_config


class Compiled(BaseException):
  """Where a compile would start. A BaseException, so no ``except Exception`` in the library
  takes it for a failed compile."""


class Result(str):
  """Any result of a library call made after the sentinel (rows, an explanation, a plan): every
  attribute, call and item is another; it iterates as empty, counts 0 and prints (and writes as
  JSON) as ``<result>``."""

  def __new__(cls) -> Result:
    return super().__new__(cls, "<result>")

  def __getattr__(self, name: str) -> Result:
    if name.startswith("__"):
      raise AttributeError(name)
    return Result()

  def __call__(self, *a: Any, **k: Any) -> Result:
    return Result()

  def __getitem__(self, key: Any) -> Result:
    return Result()

  def __iter__(self) -> Iterator[Any]:
    return iter(())

  def __len__(self) -> int:
    return 0

  def __bool__(self) -> bool:
    return True

  def __contains__(self, item: Any) -> bool:
    return False

  def __format__(self, spec: str) -> str:
    return "<result>"

  def __add__(self, other: Any) -> Result:
    return Result()

  __radd__ = __add__


# The library's functions never called, even before the sentinel: they reach beyond this process.
NEVER_CALLED = ("start_distributed",)


@dataclasses.dataclass
class Outcome:
  """What one run did: its exit status (None where an exception left ``main`` after the
  sentinel, ``raised`` naming it), whether it reached a compile, the library and renderer calls
  it made (name, arguments as plain values), stdout, stderr's lines and the files it wrote."""

  rc: int | None
  compiled: bool
  calls: tuple
  out: str
  err: tuple[str, ...]
  files: tuple
  raised: str | None = None

  @property
  def refused(self) -> bool:
    """Bad input's answer, before any compile: exit 2 and one line on stderr."""
    return not self.compiled and self.rc == 2 and len(self.err) == 1 and self.err[0].startswith("jaxmem: error: ")

  @property
  def line(self) -> str:
    return self.err[-1] if self.err else ""

  def same(self, other: Outcome) -> bool:
    """Whether two runs did the same: where both ran to their end without a compile (a closed
    form, a listing), what they printed and wrote; otherwise also what they asked of the library
    and the renderers (what a compile would have answered is not known)."""
    seen = (self.rc, self.compiled, self.out, self.err, self.files, self.raised)
    if self.compiled or other.compiled:
      return seen + (self.calls,) == (other.rc, other.compiled, other.out, other.err, other.files, other.raised,
                                      other.calls)
    return seen == (other.rc, other.compiled, other.out, other.err, other.files, other.raised)


class _State:
  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.stopped = False
    self.calls: list[tuple] = []


_STATE = _State()


def stop(*args: Any, **kwargs: Any) -> None:
  """Where a compile would start: the sentinel."""
  raise Compiled()


def _wrap(name: str, fn: Any) -> Any:
  @functools.wraps(fn)
  def call(*args: Any, **kwargs: Any) -> Any:
    _STATE.calls.append((name, plain(args), plain(kwargs)))
    if _STATE.stopped or name in NEVER_CALLED:
      return Result()
    try:
      return fn(*args, **kwargs)
    except Compiled:
      _STATE.stopped = True
      return Result()
  call.__kwdefaults__ = fn.__kwdefaults__  # read by the CLI (plan's --budget default)
  return call


def _on_event(real: Any) -> Any:
  def on_event(e: Any) -> None:
    if isinstance(e, jaxmem.Compiling):
      raise Compiled()
    real(e)
  return on_event


def _library_functions() -> Iterator[tuple[Any, str, Any]]:
  """(owner, name, function) for each function a command calls outside the CLI: the ``jaxmem``
  package's, and those of the ``jaxmem.render`` modules the command modules hold or import from."""
  for name, fn in vars(jaxmem).items():
    if inspect.isfunction(fn):
      yield jaxmem, name, fn
  modules = [m for n, m in sys.modules.items() if n.startswith("jaxmem.cli.") and m is not None]
  for mod in modules:
    for name, v in vars(mod).items():
      if isinstance(v, types.ModuleType) and v.__name__.startswith("jaxmem.render"):
        for fname, fn in vars(v).items():
          if inspect.isfunction(fn) and fn.__module__ == v.__name__:
            yield v, fname, fn
      elif inspect.isfunction(v) and v.__module__.startswith("jaxmem.render"):
        yield mod, name, v
      elif isinstance(v, dict):  # a registry of the library's functions (plan's --emit writers)
        for key, fn in v.items():
          if inspect.isfunction(fn) and not fn.__module__.startswith("jaxmem.cli"):
            yield v, key, fn


@contextlib.contextmanager
def no_compiles(cache_dir: str) -> Iterator[None]:
  """The stubs :func:`run` needs, in place for the block; rows cached in ``cache_dir`` (empty)."""
  from jaxmem import launch
  from jaxmem.hardware import capacity, gpu
  from jaxmem.hardware.availability import AVAILABLE
  from jaxmem.planning import validate

  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("JAXMEM_CACHE_DIR", cache_dir)
    mp.setenv("JAXMEM_NO_PROGRESS", "1")
    mp.setattr(jax.stages.Lowered, "compile", stop)
    mp.setattr(capacity, "_tpu_available_hbm", lambda name: None)
    mp.setattr(gpu, "_gpu_compiles", lambda name: AVAILABLE)
    mp.setattr(validate, "require_accelerator", lambda platform: None)
    mp.setattr(validate, "measure", stop)
    mp.setattr(validate, "measure_in_subprocess", stop)
    mp.setattr(_common, "on_event", _on_event(_common.on_event))
    # --emit's writers (jaxmem.EMITTERS) check the kind of result they are given: a stub result
    # stands for any kind, so it is written as one more stub.
    emit = launch.Emitter.__call__
    mp.setattr(launch.Emitter, "__call__", lambda self, result: Result() if isinstance(result, Result) else emit(self, result))
    # infer's and a serving fit's one configuration: compiled with no Compiling event before its trace.
    _everywhere(mp, run_infer_config, stop)
    seen: set[tuple[int, str]] = set()
    for owner, name, fn in list(_library_functions()):
      if (id(owner), name) not in seen:
        seen.add((id(owner), name))
        call = _wrap(f"{getattr(owner, '__name__', fn.__module__)}.{name}", fn)
        if isinstance(owner, dict):
          mp.setitem(owner, name, call)
        else:
          mp.setattr(owner, name, call)
    yield


def _everywhere(mp: pytest.MonkeyPatch, fn: Any, replacement: Any) -> None:
  """``fn`` replaced in every module of jaxmem that holds it (each that imported it by name)."""
  for name, mod in list(sys.modules.items()):
    if name.startswith("jaxmem") and mod is not None:
      for attr, v in list(vars(mod).items()):
        if v is fn:
          mp.setattr(mod, attr, replacement)


def run(argv: list[str], where: str | os.PathLike) -> Outcome:
  """``main(argv)`` under :func:`no_compiles` (which the caller holds), run in the folder
  ``where``: what it did."""
  _STATE.reset()
  out, err = io.StringIO(), io.StringIO()
  rc, raised = None, None
  before = _files(where)
  cwd = os.getcwd()
  os.chdir(where)
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      rc = main(argv)
  except Compiled:
    _STATE.stopped = True
  except Exception as e:  # only where a Result reached code that cannot take it (after the sentinel)
    if not _STATE.stopped:
      raise
    raised = type(e).__name__
  finally:
    os.chdir(cwd)
  written = tuple(sorted((p, c) for p, c in _files(where).items() if before.get(p) != c))
  return Outcome(rc=rc, compiled=_STATE.stopped, calls=tuple(_STATE.calls), out=out.getvalue(),
                 err=tuple(ln for ln in err.getvalue().splitlines() if ln.strip()), files=written, raised=raised)


def _files(where: str | os.PathLike) -> dict[str, str]:
  out = {}
  for root, _, names in os.walk(where):
    for n in names:
      p = os.path.join(root, n)
      try:
        with open(p, "rb") as f:
          out[os.path.relpath(p, where)] = f.read().decode("utf-8", "replace")
      except OSError:
        pass
  return out


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def plain(v: Any) -> Any:
  """``v`` as plain values that compare equal when two calls asked the same: records by their
  fields, callbacks as ``<callable>``, a :class:`Result` as ``<result>``."""
  if v is None or isinstance(v, (bool, int, float, str, bytes)):
    return v
  if isinstance(v, Result):
    return "<result>"
  if isinstance(v, argparse.Namespace):
    return "<args>"
  if isinstance(v, (list, tuple)):
    return tuple(plain(x) for x in v)
  if isinstance(v, dict):
    return tuple((plain(k), plain(x)) for k, x in v.items())
  if isinstance(v, (set, frozenset)):
    return tuple(sorted(map(repr, v)))
  if dataclasses.is_dataclass(v) and not isinstance(v, type):
    return (type(v).__name__, tuple((f.name, plain(getattr(v, f.name))) for f in dataclasses.fields(v)))
  if isinstance(v, jaxmem.RowCache):
    return ("RowCache", v.enabled)
  if callable(v) and not isinstance(v, type):
    return "<callable>"
  return _ADDRESS.sub("", repr(v))

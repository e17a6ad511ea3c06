"""Your own train step in jaxmem's sweeps: a step factory, found by import path.

A factory builds the step at one workload::

    def make_step(*, batch, seq, remat, mesh=None):
      ...
      return train_step, (params, opt_state, batch_tokens), {"donate_argnums": (0, 1)}

It is called with the global ``batch``, the sequence length ``seq`` and ``remat``, the
``jax.checkpoint`` policy the sweep is at (``None`` for no remat, the baseline), and, where its
signature takes them, ``mesh`` (a ``jax.sharding.Mesh`` over the target's devices, with the
sweep's axes: ``fsdp`` over every device unless ``--mesh`` says otherwise) and ``target`` (the
:class:`~jaxmem.hardware.targets.Target`). It returns ``(fn, args, jit_kwargs)``: what
:func:`jaxmem.analyze` compiles. ``args`` are usually ``jax.ShapeDtypeStruct``\\ s, sharded with
``NamedSharding`` over ``mesh`` (:func:`jaxmem.fsdp_shardings` shards any tree FSDP-style).

Factories are named by import path, so worker processes (``--jobs``) import them and the row
cache keys on them: ``package.module:make_step`` (the current directory is searched too, as
Python does for a script) or ``path/to/file.py:make_step``. A callable passed to the library is
turned into its import path; one that has none (a lambda, a closure, a function in a notebook)
runs in this process only and is never cached. The cache key adds a hash of the source of the
factory's module and of every module loaded from the same package or directory, so editing the
model invalidates its rows.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import jax

from jaxmem.errors import JaxmemError
from jaxmem.program.remat import RematPolicy, checkpoint_names_in, names_note

# The row fields a step does not have: its optimizer and dtypes are its own.
OWN = "-"
LOCAL = "<local>:"  # spec prefix of a callable that only this process can run
_LOCAL: dict[str, Callable] = {}
_HOW = "write package.module:make_step or path/to/file.py:make_step"


def step_spec(step: str | Callable) -> str:
  """The import path of a factory: ``"pkg.mod:make_step"``, ``"/abs/file.py:make_step"``, or
  for a callable without one, a name this process alone can look up."""
  if callable(step):
    return _callable_spec(step)
  if not isinstance(step, str):
    raise JaxmemError(f"`step` must be a factory function or its import path ({_HOW}); got {type(step).__name__}")
  module, sep, attr = step.strip().rpartition(":")
  if step.startswith(LOCAL):
    return step
  if not sep or not module or not attr:
    raise JaxmemError(f"`step` {step!r}: {_HOW}")
  if module.endswith(".py"):
    return f"{os.path.abspath(module)}:{attr}"
  return f"{module}:{attr}"


def _callable_spec(fn: Callable) -> str:
  module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
  if module and "<" not in qualname:
    if module == "__main__":
      path = getattr(sys.modules.get("__main__"), "__file__", None)
      spec = f"{os.path.abspath(path)}:{qualname}" if path else None
    else:
      spec = f"{module}:{qualname}"
    if spec is not None and _resolves(module, qualname, fn):
      return spec
  spec = f"{LOCAL}{qualname or type(fn).__name__}@{id(fn):x}"
  _LOCAL[spec] = fn
  return spec


def _resolves(module: str, qualname: str, fn: Callable) -> bool:
  obj: Any = sys.modules.get(module)
  for part in qualname.split("."):
    obj = getattr(obj, part, None)
  return obj is fn


def is_local(spec: str | None) -> bool:
  """Whether ``spec`` names a factory only this process can run."""
  return bool(spec) and spec.startswith(LOCAL)


def step_label(spec: str) -> str:
  """The model name a step's rows carry: ``step:module:make_step`` (a file by its stem)."""
  if is_local(spec):
    return "step:" + spec[len(LOCAL):].split("@")[0]
  module, _, attr = spec.rpartition(":")
  if module.endswith(".py"):
    module = os.path.splitext(os.path.basename(module))[0]
  return f"step:{module}:{attr}"


def load_step(spec: str) -> Callable:
  """The factory ``spec`` names, imported (a ``.py`` file is loaded by path); an import that
  fails, a missing name or a factory without ``batch``, ``seq`` and ``remat`` keywords is a
  one-line :class:`JaxmemError`."""
  if is_local(spec):
    if spec not in _LOCAL:
      raise JaxmemError(
          f"step {step_label(spec)} was defined in another process (a notebook, a lambda, a closure); "
          "define make_step in a module and pass it as 'module:make_step'"
      )
    return _checked(_LOCAL[spec], spec)
  module_name, _, attr = spec.rpartition(":")
  module = _load_file(module_name) if module_name.endswith(".py") else _import(module_name)
  obj: Any = module
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise JaxmemError(f"step {spec}: {module_name} has no {attr!r}; {_HOW}")
    obj = getattr(obj, part)
  return _checked(obj, spec)


def _checked(factory: Any, spec: str) -> Callable:
  if not callable(factory):
    raise JaxmemError(f"step {step_label(spec)} is a {type(factory).__name__}, not a function")
  params = _parameters(factory)
  if params is not None and not _takes_all(params, ("batch", "seq", "remat")):
    raise JaxmemError(
        f"step {step_label(spec)} must take the keywords batch, seq and remat "
        f"(make_step(*, batch, seq, remat, mesh=None)); it takes ({', '.join(params)})"
    )
  return factory


def _parameters(fn: Callable) -> dict[str, inspect.Parameter] | None:
  try:
    return dict(inspect.signature(fn).parameters)
  except (TypeError, ValueError):  # a builtin or C callable: take it on trust
    return None


def _takes_all(params: dict[str, inspect.Parameter], names: tuple[str, ...]) -> bool:
  if any(p.kind is p.VAR_KEYWORD for p in params.values()):
    return True
  return all(n in params and params[n].kind is not inspect.Parameter.POSITIONAL_ONLY for n in names)


def _import(name: str):
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    # As `python script.py` would: a module beside the user, in the current directory.
    if e.name != name.split(".")[0] or os.getcwd() in sys.path:
      raise JaxmemError(f"cannot import step module {name!r}: {e}") from None
    sys.path.append(os.getcwd())
    return _import(name)
  except Exception as e:  # the user's module failed at import: say so in one line
    raise JaxmemError(f"cannot import step module {name!r}: {type(e).__name__}: {_first_line(e)}") from e


@functools.cache
def _load_file(path: str):
  """A ``.py`` file as a module, once per process, with its directory on ``sys.path`` (as
  Python runs a script) so it can import the modules beside it."""
  if not os.path.isfile(path):
    raise JaxmemError(f"step file {path} does not exist; {_HOW}")
  name = f"_jaxmem_step_{os.path.splitext(os.path.basename(path))[0]}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"
  directory = os.path.dirname(path)
  if directory not in sys.path:
    sys.path.insert(0, directory)
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # so what it defines pickles and its dataclasses resolve
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # the user's file failed at import: one line
    del sys.modules[name]
    raise JaxmemError(f"cannot load step file {path}: {type(e).__name__}: {_first_line(e)}") from e
  return module


def step_fingerprint(spec: str) -> str | None:
  """A hash of the source behind a factory: its module's file and every loaded module's file
  under the same package (or directory, for a file or a top-level module), outside installed
  packages unless the factory is one. ``None`` for a factory with no source to hash (then its
  rows are not cached)."""
  if is_local(spec):
    return None
  factory = load_step(spec)
  module = sys.modules.get(getattr(factory, "__module__", ""), None)
  path = getattr(module, "__file__", None)
  if not path:
    return None
  root = _root(module, path)
  installed = ("site-packages" in path) or ("dist-packages" in path)
  files = {os.path.abspath(path)}
  for m in list(sys.modules.values()):
    f = getattr(m, "__file__", None)
    if not f or not os.path.abspath(f).startswith(root + os.sep):
      continue
    if not installed and ("site-packages" in f or "dist-packages" in f):
      continue
    files.add(os.path.abspath(f))
  digest = hashlib.sha256()
  for f in sorted(files):
    try:
      with open(f, "rb") as fh:
        digest.update(f.encode() + b"\0" + fh.read() + b"\0")
    except OSError:
      continue
  return digest.hexdigest()[:32]


def _root(module, path: str) -> str:
  top = (module.__name__ or "").split(".")[0]
  package = sys.modules.get(top)
  package_file = getattr(package, "__file__", None) or ""
  if top != module.__name__ and os.path.basename(package_file) == "__init__.py":
    return os.path.dirname(os.path.abspath(package_file))  # the top-level package's directory
  return os.path.dirname(os.path.abspath(path))


def call_step(
    spec: str, *, batch: int, seq: int, remat: Callable | None, mesh: Any, target: Any, workload: Any = None,
) -> tuple[Callable, tuple, dict]:
  """``(fn, args, jit_kwargs)`` from the factory at one workload; a factory that raises or
  returns anything else is a one-line :class:`JaxmemError`. A factory that takes ``workload``
  gets the task's :class:`~jaxmem.workload.Workload` (one value of each axis: MaxText's step
  reads its config and the names of the policy and attention there)."""
  factory = load_step(spec)
  params = _parameters(factory)
  kwargs: dict[str, Any] = dict(batch=batch, seq=seq, remat=remat)
  for name, value in (("mesh", mesh), ("target", target), ("workload", workload)):
    if params is None or name in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
      kwargs[name] = value
  label = step_label(spec)
  try:
    out = factory(**kwargs)
  except JaxmemError:
    raise
  except Exception as e:  # the user's factory: one line that names it and the workload
    raise JaxmemError(
        f"step {label} raised at batch {batch}, seq {seq}: {type(e).__name__}: {_first_line(e)}"
    ) from e
  if not isinstance(out, (tuple, list)) or len(out) != 3:
    got = f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
    raise JaxmemError(f"step {label} must return (fn, args, jit_kwargs); it returned {got}")
  fn, args, jit_kwargs = out
  if not callable(fn):
    raise JaxmemError(f"step {label} must return (fn, args, jit_kwargs) with fn callable; fn is a {type(fn).__name__}")
  if not isinstance(args, (tuple, list)):
    raise JaxmemError(f"step {label} must return args as a tuple (fn's positional arguments); got a {type(args).__name__}")
  if jit_kwargs is not None and not isinstance(jit_kwargs, dict):
    raise JaxmemError(f"step {label} must return jit_kwargs as a dict (or None); got a {type(jit_kwargs).__name__}")
  return fn, tuple(args), dict(jit_kwargs or {})


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def step_notes(traced: jax.stages.Traced, rp: RematPolicy) -> list[str]:
  """What a step's row (or explanation) should say about its traced program beside what every
  program gets (:meth:`jaxmem.compiler.analysis.Lowering.figures`: attention materialised for an
  accelerator): a name-based remat policy whose names it never uses."""
  return [n for n in (names_note(rp, checkpoint_names_in(traced.jaxpr.jaxpr)),) if n]

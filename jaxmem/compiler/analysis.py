"""``analyze``: the compiler's memory figures for any jittable function of your own.

:func:`lower_for_target` is its first half, shared with ``explain(fn, ...)``, a user's step
(``--step``) and :mod:`jaxmem.testing`: it resolves the target as the CLI does
(:func:`jaxmem.hardware.targets.resolved_target`: a name gets its capacity), places the
arguments on the target's devices (replicating those that carry no sharding of their own),
refuses, in one line, arguments sharded on other devices, and traces and lowers the function.
:meth:`Lowering.figures` is the second: the arguments checked against the capacity, the
compile, and the notes every such program gets (a framework trap:
:func:`jaxmem.compiler.traps.kernel_note`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from jaxmem.compiler.figures import Figures, compile_figures
from jaxmem.steptime import Work
from jaxmem.compiler.report import MemoryReport, Refusal
from jaxmem.hardware.startup import start_jax
from jaxmem.compiler.traps import kernel_note
from jaxmem.hardware.targets import Target, cpu_devices_needed, resolved_target
from jaxmem.errors import JaxmemError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lowering:
  """A function traced and lowered for a target, ready to compile.

  ``traced`` gives the jaxpr (FLOPs), ``lowered`` compiles (with compiler options, for a dump);
  ``target`` is ``None`` where the program goes where ``jax.jit`` would put it;
  ``argument_names`` name the top-level arguments that are not static (the function's
  parameter names where it has them, else ``args[i]``), in the order of ``compiled.args_info``;
  ``args`` are the arguments as traced (placed on the target's devices), for the check of their
  bytes against its capacity.
  """

  traced: jax.stages.Traced
  lowered: jax.stages.Lowered
  target: Target | None
  argument_names: tuple[str, ...]
  args: tuple[Any, ...] = ()

  def figures(
      self, *, notes: Sequence[str] = (), compiler_options: Mapping[str, Any] | None = None, work: Work | None = None,
      always_compile: bool = False, kernel_named: bool = False,
  ) -> Figures | Refusal:
    """Compiled and read, or refused (:func:`jaxmem.compiler.figures.compile_figures`, which
    checks the arguments against the target's capacity first, unless ``always_compile``;
    ``work`` as there). ``notes`` come first, then the note on attention the program computes
    in plain ops for an accelerator (:func:`jaxmem.compiler.traps.kernel_note`), unless
    ``kernel_named``: its attention is an implementation chosen by name (jaxmem's own models,
    MaxText's step), which the row names."""
    note = None if kernel_named else kernel_note(self.traced.jaxpr.jaxpr, self.platform)
    return compile_figures(
        self.traced, self.target, args=None if always_compile else self.args, argument_names=self.argument_names,
        notes=(*notes, *([note] if note else [])), compiler_options=compiler_options, lowered=self.lowered, work=work,
    )

  @property
  def platform(self) -> str:
    """The platform the program compiles for: the target's, else where ``jax.jit`` puts it."""
    return self.target.platform if self.target is not None else jax.default_backend()


def lower_for_target(fn: Callable, *args: Any, target: str | Target | None = None, **jit_kwargs: Any) -> Lowering:
  """Traces and lowers ``jax.jit(fn, **jit_kwargs)`` for ``args`` on ``target``.

  With a target, arguments that carry no sharding of their own (``ShapeDtypeStruct`` without
  one, arrays JAX placed by default) are replicated over its devices, and the outputs too when
  no argument is an array. Arguments (and ``in_shardings``/``out_shardings``) sharded on other
  devices, such as a mesh over ``jax.devices()`` of another platform or over some of the
  target's devices only, are a :class:`JaxmemError` naming both device sets: build the mesh with
  ``jaxmem.target(name).mesh(...)``. Without a target, arguments on different device sets are
  the same one-line error rather than JAX's.
  """
  start_jax(cpu_devices_needed([target]) if isinstance(target, str) else 1)
  tgt = None if target is None else resolved_target(target)
  _check_devices(args, jit_kwargs, tgt)
  if tgt is not None:
    replicated = NamedSharding(tgt.make_mesh((("devices", tgt.num_devices),)), PartitionSpec())
    if not any(_is_array(leaf) for leaf in jax.tree_util.tree_leaves(args)) and "out_shardings" not in jit_kwargs:
      jit_kwargs = {**jit_kwargs, "out_shardings": replicated}  # else it compiles for the default device
    args = jax.tree_util.tree_map(lambda a: _on(a, replicated), args)
  # A function already wrapped in jax.jit is traced as it is when no jit_kwargs are given, so its
  # own shardings and donated arguments hold (jitting it again would drop the donation: only the
  # outermost jit donates).
  jitted = fn if not jit_kwargs and hasattr(fn, "trace") and hasattr(fn, "lower") else jax.jit(fn, **jit_kwargs)
  with _kernels_cross_compile(tgt):
    traced = jitted.trace(*args)
  return Lowering(
      traced=traced, lowered=traced.lower(), target=tgt, argument_names=_names(fn, len(args), jit_kwargs), args=args
  )


def analyze(fn: Callable, *args: Any, target: str | Target | None = None, **jit_kwargs) -> MemoryReport:
  """Compiles ``fn`` for ``args`` and reports the compiler's per-device memory and cost.

  ``args`` may be concrete arrays or ``jax.ShapeDtypeStruct`` (nothing is allocated). With
  ``target=None`` the program is compiled where ``jax.jit`` would put it, so the report equals
  ``jax.jit(fn, **jit_kwargs).lower(*args).compile().memory_analysis()``. With a target
  (``"cpu:4"``, ``"gpu:h100x8"``, or a :func:`jaxmem.target`), inputs that carry no sharding of
  their own are replicated over the target's devices; shard them with ``NamedSharding`` over
  ``jaxmem.target(name).mesh(...)`` (or :func:`jaxmem.fsdp_shardings`). Inputs sharded on other
  devices are an error, never a silent fallback (see :func:`lower_for_target`).

  The report has, besides ``memory_analysis()``'s fields, the bytes per argument and per
  argument leaf, the communication by collective kind, the FLOPs per device and the
  ``Compiled`` itself (``report.compiled``). A target by name is resolved as the CLI resolves
  ``--target`` (a TPU's capacity read from its compiler). For a target with a capacity it is
  judged as compare's rows are: ``capacity_bytes``, ``required_bytes``, ``fits``, ``verdict``,
  ``margin_bytes`` and ``risk_bytes``, with a note where it does not fit; arguments whose bytes
  alone exceed the capacity are a :class:`JaxmemError` without a compile. Its ``notes`` are
  those ``explain`` gives the same program for the capacity, the compiler's figures and the
  verdict, and a note where the program materialises attention scores that the target's fused
  kernel would not (:mod:`jaxmem.compiler.traps`).

  >>> import jax, jax.numpy as jnp
  >>> x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
  >>> analyze(lambda a: a @ a, x).output_size_in_bytes
  524288
  """
  outcome = lower_for_target(fn, *args, target=target, **jit_kwargs).figures()
  if isinstance(outcome, Refusal):  # the compiler's own error, as jax.jit would raise it
    raise outcome.cause if outcome.cause is not None else JaxmemError(outcome.error)
  return outcome.judged_report()


@contextlib.contextmanager
def _kernels_cross_compile(target: Target | None) -> Iterator[None]:
  """Kernel libraries told that the program is lowered on one platform and compiled for
  another. tokamax's ops (MaxText's grouped matmul and splash among them) refuse at trace time a
  device they do not support, unless ``tokamax.config.cross_compile`` is set ("the machine where
  kernels are lowered and compiled is not the same as the machine where they are run", its
  flag's help): a TPU target traced on this host's CPU devices is that case. Only a tokamax the
  program has already imported is told; jaxmem does not import it."""
  tokamax = sys.modules.get("tokamax")
  cross = getattr(getattr(tokamax, "config", None), "cross_compile", None)
  if target is None or target.platform == jax.default_backend() or cross is None:
    yield
    return
  with cross(True):
    yield


# -------------------------------------------------------------------- where the inputs live


def _is_array(leaf: Any) -> bool:
  return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


def _own_sharding(leaf: Any) -> Sharding | None:
  """The sharding a leaf carries by the user's choice: a ``ShapeDtypeStruct``'s, or a committed
  array's (an array JAX put on its default device by itself carries none)."""
  if isinstance(leaf, jax.ShapeDtypeStruct):
    return leaf.sharding if isinstance(leaf.sharding, Sharding) else None
  if isinstance(leaf, jax.Array):
    return leaf.sharding if getattr(leaf, "committed", True) else None
  return None


def _placements(args: tuple, jit_kwargs: dict[str, Any]) -> Iterator[tuple[str, frozenset]]:
  """(where, device set) of every sharding the program is given."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(args):
    s = _own_sharding(leaf)
    if s is not None:
      yield f"args{jax.tree_util.keystr(path)}", frozenset(s.device_set)
  for key in ("in_shardings", "out_shardings"):
    shardings = jit_kwargs.get(key)
    for path, s in jax.tree_util.tree_leaves_with_path(shardings, is_leaf=lambda x: isinstance(x, Sharding)):
      if isinstance(s, Sharding):
        yield f"{key}{jax.tree_util.keystr(path)}", frozenset(s.device_set)


def _describe(devices: frozenset | set) -> str:
  d = min(devices, key=lambda d: d.id)
  kind = getattr(d, "device_kind", d.platform)
  return f"{len(devices)} {d.platform} device{'s' if len(devices) != 1 else ''} ({kind})"


def _check_devices(args: tuple, jit_kwargs: dict[str, Any], tgt: Target | None) -> None:
  placed = list(_placements(args, jit_kwargs))
  if tgt is not None:
    devices = frozenset(tgt.devices)
    for where, ds in placed:
      if ds != devices:
        how = "some of" if ds < devices else "not on"
        raise JaxmemError(
            f"{where} is sharded on {_describe(ds)}, {how} target {tgt.name}'s {_describe(devices)}; "
            f"shard it over jaxmem.target({tgt.name!r}).mesh(...) (every device of the target)"
        )
  first = placed[0] if placed else None
  for where, ds in placed[1:]:
    if ds != first[1]:
      raise JaxmemError(
          f"{first[0]} is sharded on {_describe(first[1])} but {where} on {_describe(ds)}; "
          "put every input on one set of devices (one mesh), or pass target= to compile for one"
      )


def _on(leaf: Any, sharding: NamedSharding) -> Any:
  """A leaf as compiled for the target: with its own sharding (checked to be over the target's
  devices) or else ``sharding`` (replicated)."""
  if not _is_array(leaf):
    return leaf
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=_own_sharding(leaf) or sharding)


def _names(fn: Callable, n: int, jit_kwargs: dict[str, Any]) -> tuple[str, ...]:
  """The names of the non-static positional arguments: ``fn``'s parameter names (``args[i]``
  for those under ``*args`` or where it has no signature)."""
  static = jit_kwargs.get("static_argnums", ())
  static = {static} if isinstance(static, int) else set(static)
  static = {i % n for i in static} if n else set()
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    params = []
  names = []
  for i in range(n):
    p = params[i] if i < len(params) else None
    if p is not None and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
      names.append(p.name)
    else:
      names.append(f"args[{i}]")
  static_names = jit_kwargs.get("static_argnames", ())
  static_names = {static_names} if isinstance(static_names, str) else set(static_names)
  return tuple(name for i, name in enumerate(names) if i not in static and name not in static_names)

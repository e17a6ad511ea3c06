"""``analyze``: the compiler's memory figures for any jittable function of your own."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxmem.compiler.flops import jaxpr_flops
from jaxmem.compiler.report import MemoryReport, read_compiled
from jaxmem.compiler.startup import start_jax
from jaxmem.compiler.targets import Target, cpu_devices_needed, get_target


def compile_timed(lowered: jax.stages.Lowered) -> tuple[jax.stages.Compiled, float]:
  """Compiles and returns the executable with the wall time the compiler took."""
  start = time.perf_counter()
  compiled = lowered.compile()
  return compiled, time.perf_counter() - start


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lowering:
  """``fn`` traced and lowered for a target: what :func:`analyze` and ``jaxmem.explain`` compile."""

  traced: jax.stages.Traced
  lowered: jax.stages.Lowered
  target: Target | None  # None: where jax.jit would put it


def lower_for_target(fn: Callable, *args: Any, target: str | Target | None = None, **jit_kwargs) -> Lowering:
  """Starts JAX, resolves ``target``, replicates the inputs that carry no sharding of their own
  over its devices, then traces and lowers ``jax.jit(fn, **jit_kwargs)`` for ``args``.

  A function already wrapped in ``jax.jit`` is traced as it is when no ``jit_kwargs`` are given,
  so its own shardings and donated arguments hold (jitting it again would drop the donation:
  only the outermost jit donates).
  """
  start_jax(cpu_devices_needed([target]) if isinstance(target, str) else 1)
  if target is not None:
    if isinstance(target, str):
      target = get_target(target)
    replicated = NamedSharding(target.make_mesh((("devices", target.num_devices),)), PartitionSpec())
    args = jax.tree_util.tree_map(lambda a: _on(a, replicated), args)
  jitted = fn if not jit_kwargs and hasattr(fn, "trace") and hasattr(fn, "lower") else jax.jit(fn, **jit_kwargs)
  traced = jitted.trace(*args)
  return Lowering(traced=traced, lowered=traced.lower(), target=target)


def analyze(fn: Callable, *args: Any, target: str | Target | None = None, **jit_kwargs) -> MemoryReport:
  """Compiles ``fn`` for ``args`` and reports the compiler's per-device memory and cost.

  ``args`` may be concrete arrays or ``jax.ShapeDtypeStruct`` (nothing is allocated). With
  ``target=None`` the program is compiled where ``jax.jit`` would put it, so the report equals
  ``jax.jit(fn, **jit_kwargs).lower(*args).compile().memory_analysis()``. With a target
  (``"cpu:4"``, or an accelerator target name), inputs that carry no sharding of their own are
  replicated over the target's devices.

  >>> import jax, jax.numpy as jnp
  >>> x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
  >>> analyze(lambda a: a @ a, x).output_size_in_bytes
  524288
  """
  lowering = lower_for_target(fn, *args, target=target, **jit_kwargs)
  compiled, seconds = compile_timed(lowering.lowered)
  return read_compiled(compiled, compile_seconds=seconds, program_flops=jaxpr_flops(lowering.traced.jaxpr.jaxpr))


def _on(leaf: Any, sharding: NamedSharding) -> Any:
  if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
    return leaf
  existing = getattr(leaf, "sharding", None)
  if isinstance(leaf, jax.ShapeDtypeStruct) and existing is not None:
    return leaf
  if isinstance(leaf, jax.Array):
    # A concrete array already lives on some devices; keep its layout only when it is on the target.
    if set(leaf.sharding.device_set) <= set(sharding.mesh.devices.flat):
      return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

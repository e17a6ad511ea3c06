"""Whether a target's compiler works on this machine, and the probe compiles that find out.

Every call here that can reach libtpu or the CUDA plugin runs under ``quiet()``: the first TPU
topology makes libtpu print TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES warnings and an
INVALID_ARGUMENT line to fd 2, and none of it is actionable (checked on jax 0.10.2, libtpu
0.0.42.1, jax-cuda12-plugin 0.10.2, no accelerator).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem._quiet import quiet
from jaxmem.xla import compile_timed


class CompilerAvailability(NamedTuple):
  """Whether a target's compiler works here, and why not. True only when it does, so
  ``if not tpu_compiler_available():`` reads right (a plain ``(ok, why)`` tuple is always true);
  a tuple still, so ``ok, why = ...`` and ``[0]`` keep working."""

  ok: bool
  why: str = ""

  def __bool__(self) -> bool:
    return self.ok


AVAILABLE = CompilerAvailability(ok=True)


def compile_probe(devices, shape, fn):
  """Compiles fn for a float32 argument of `shape` replicated over `devices`."""
  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return compile_timed(jax.jit(fn).lower(jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)), quietly=False)[0]


def quietly(fn):
  """(fn(), None) or (None, the exception), with fd 2 silenced throughout.

  The exception is caught inside quiet() so that libtpu's and the plugin's start-up noise is not
  replayed: callers turn these failures into one-line JaxmemErrors or unavailable answers.
  """
  with quiet():
    try:
      return fn(), None
    except Exception as e:
      return None, e


def first_line(e: BaseException | None) -> str:
  text = str(e).strip() if e is not None else ""
  return text.splitlines()[0] if text else type(e).__name__

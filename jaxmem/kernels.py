"""FLOP counters for kernels a jaxpr cannot see into, registered by the code that defines them.

A fused kernel's call is one jaxpr equation: a cuDNN custom call has no jaxpr at all, and a Pallas
kernel's body is one grid step whose loops run a data-dependent number of times. The code that
defines such a kernel knows its FLOPs from its operand shapes and registers a counter here
(:mod:`jaxmem.models.attention_registry` registers the attention kernels' when it is imported,
which ``import jaxmem`` does); the compiler's FLOP counter (:mod:`jaxmem.compiler.flops`) asks the
counters about each equation. A leaf, so the models register and the compiler consults without
either importing the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KernelFlops = Callable[[Any], "float | None"]  # a jaxpr equation -> its FLOPs, or None: not this counter's kernel

_COUNTERS: list[KernelFlops] = []


def register_kernel_flops(counter: KernelFlops) -> KernelFlops:
  """Adds ``counter`` (once; registering it again changes nothing) and returns it, so it can decorate."""
  if counter not in _COUNTERS:
    _COUNTERS.append(counter)
  return counter


def kernel_flops(eqn: Any) -> float | None:
  """The FLOPs of jaxpr equation ``eqn`` by the first registered counter that knows its kernel,
  else None (not a registered kernel's call)."""
  for counter in _COUNTERS:
    flops = counter(eqn)
    if flops is not None:
      return flops
  return None

"""FLOP counters for kernels a jaxpr cannot see into, registered by the code that defines them.

A fused kernel's call is one jaxpr equation: a cuDNN custom call has no jaxpr at all, and a Pallas
kernel's body is one grid step whose loops run a data-dependent number of times. The code that
defines such a kernel knows its FLOPs from its operand shapes and registers a counter here
(:mod:`jaxmem.models.attention_registry` registers the attention kernels' when it is imported,
which ``import jaxmem`` does); the compiler's FLOP counter (:mod:`jaxmem.compiler.flops`) asks the
counters about each equation. A leaf, so the models register and the compiler consults without
either importing the other.

It also holds the fused attention kernels' accounting (:func:`attention_kernel_flops`, the
tables below), which both sides use: the models' counters on a jaxpr equation's shapes, and the
schedule walk (:mod:`jaxmem.hlo.ops`) on the optimized HLO's custom call, so the kernel's time is
counted the same way where only the compiled program is at hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KernelFlops = Callable[[Any], "float | None"]  # a jaxpr equation -> its FLOPs, or None: not this counter's kernel

_COUNTERS: list[KernelFlops] = []

# Products of a T x S block per kernel call, as multiples of 2*T*S*(head size): (q/k head-size
# terms, v head-size terms). FlashAttention's accounting (Dao 2023, "FlashAttention-2", section
# 4.1 and Algorithm 2: the backward recomputes q k^T): splash's forward (q k^T, p v), its dq kernel
# (q k^T, dO v^T, dS k) and dk/dv kernel (q k^T, dO v^T, p^T dO, dS^T q); cuDNN's forward and its
# one fused backward (the five products of Algorithm 2); Pallas Triton's ``mha`` kernels.
SPLASH_TERMS = {"fwd": (1, 1), "dq": (2, 1), "dkv": (2, 2)}
CUDNN_TERMS = {"fwd": (1, 1), "bwd": (3, 2)}
TRITON_TERMS = {"mha_forward": (1, 1), "mha_backward": (4, 3)}


def attention_kernel_flops(terms: tuple[int, int], *, pairs: int, t: int, s: int, h: int, vd: int, causal: bool) -> float:
  """Matrix FLOPs of one fused attention call: ``pairs`` (batch x query heads) T x S blocks, q/k
  head size ``h``, v head size ``vd``; halved under a causal mask (the kernels skip the blocks
  above the diagonal)."""
  flops = 2.0 * pairs * t * s * (terms[0] * h + terms[1] * vd)
  return flops / 2 if causal else flops


def splash_part(kernel: str) -> str | None:
  """Which of splash's kernels a Pallas kernel name is (``splash_mha_dkv...`` -> ``dkv``), else None."""
  if not kernel.startswith("splash_"):
    return None
  return next((p for p in ("dkv", "dq", "fwd") if f"_{p}" in kernel), None)


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

"""FLOPs of one fused attention kernel call, from its operand shapes: each registry entry's
accounting (:attr:`~.attention_registry.AttentionImpl.kernel_flops`), read by
``jaxmem.compiler.flops`` as it walks a jaxpr.

Why from the shapes: a cuDNN call has no jaxpr at all, and a Pallas kernel's body is one grid
step whose loops run a data-dependent number of times. The accounting is FlashAttention's (Dao
2023, "FlashAttention-2", section 4.1): the matrix multiplications only, ``2*T*S*H`` per (batch,
query head) for each T x S product with a head size H, halved under a causal mask (the kernels
skip blocks above the diagonal). Forward: q k^T and p v, ``4*B*N*T*S*H`` for equal q/k and v
head sizes. Backward: what each kernel computes, including the recomputation of q k^T that
FlashAttention-2's backward does (Algorithm 2): cuDNN the five products of Algorithm 2 (2.5 x
the forward), splash its dq kernel (q k^T, dO v^T, dS k) and dk/dv kernel (q k^T, dO v^T, p^T dO,
dS^T q), Triton the same seven in one kernel. cuDNN's call says whether its mask is causal;
splash and Triton calls are counted as causal, the only way jaxmem's decoders call them.

Each function takes one jaxpr equation and returns None when it is not that kernel's.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

from jaxmem.kernels import CUDNN_TERMS as _CUDNN
from jaxmem.kernels import SPLASH_TERMS as _SPLASH
from jaxmem.kernels import TRITON_TERMS as _TRITON
from jaxmem.kernels import attention_kernel_flops, splash_part


def _floats(eqn: Any) -> list:
  """The floating operands of rank 3 or more: q, k and v come first in every kernel counted here."""
  avals = [v.aval for v in eqn.invars if hasattr(v.aval, "dtype")]
  return [a for a in avals if jnp.issubdtype(a.dtype, jnp.floating) and a.ndim >= 3]


def _attention(terms: tuple[int, int], q, k, v, *, heads_first: bool, causal: bool) -> float:
  """Matmul FLOPs of one attention kernel call: q, k, v avals in [..., N, T, H] (heads_first)
  or [B, T, N, H] layout."""
  t_axis = -2 if heads_first else 1
  t, s, h, vd = q.shape[t_axis], k.shape[t_axis], q.shape[-1], v.shape[-1]
  pairs = math.prod(q.shape) // (t * h)  # batch x query heads
  return attention_kernel_flops(terms, pairs=pairs, t=t, s=s, h=h, vd=vd, causal=causal)


def _pallas_kernel(eqn: Any) -> str | None:
  """The kernel name of a ``pallas_call`` equation, else None."""
  return str(eqn.params.get("name") or "") if eqn.primitive.name == "pallas_call" else None


def cudnn_flops(eqn: Any) -> float | None:
  """cuDNN's fused attention custom calls (``dot_product_attention_*_fwd`` / ``_bwd``)."""
  name = eqn.primitive.name
  if not (name.startswith("dot_product_attention_") and ("_fwd" in name or "_bwd" in name)):
    return None
  q, k, v = _floats(eqn)[:3]
  layout = int(getattr(eqn.params.get("layout"), "value", eqn.params.get("layout") or 0))
  causal = "CAUSAL" in str(eqn.params.get("mask_type", "")).upper()
  return _attention(_CUDNN["fwd" if "_fwd" in name else "bwd"], q, k, v, heads_first=layout == 1, causal=causal)


def splash_flops(eqn: Any) -> float | None:
  """Pallas splash attention's forward, dq and dk/dv kernels (``splash_*``), causal."""
  part = splash_part(_pallas_kernel(eqn) or "")
  if part is None:
    return None
  q, k, v = _floats(eqn)[:3]
  return _attention(_SPLASH[part], q, k, v, heads_first=True, causal=True)


def triton_flops(eqn: Any) -> float | None:
  """Pallas Triton ``mha`` forward and backward kernels, causal, and its backward's
  preprocessing (D = rowsum(dO * O): elementwise)."""
  kernel = _pallas_kernel(eqn)
  if kernel in _TRITON:
    q, k, v = _floats(eqn)[:3]
    return _attention(_TRITON[kernel], q, k, v, heads_first=False, causal=True)
  if kernel == "mha_preprocess_backward":
    return 2.0 * math.prod(eqn.invars[0].aval.shape)
  return None

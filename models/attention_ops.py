"""The attention computation itself, pluggable: ``attend(q, k, v, *, causal) -> context``.

The Attention modules project, rotate and name; *how* softmax(q k^T / sqrt(h)) v is computed is
an :data:`AttendFn` the caller picks (plain einsums here; fused kernels elsewhere), so the same
model compiles to the program a production trainer would run on each target.

Shapes (B batch, T query positions, S key positions, N query heads, K kv heads, H q/k head
size, V v head size):

  q_btnh [B, T, N, H], k_bskh [B, S, K, H], v_bskv [B, S, K, V]  ->  ctx_btnv [B, T, N, V]

K divides N (grouped-query attention: query head n reads kv head n // (N // K), the grouping
Llama's ``repeat_kv`` implies); V may differ from H (multi-head latent attention). Causal means
query t sees keys s <= t (T == S in training).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

# attend(q_btnh, k_bskh, v_bskv, *, causal=True) -> ctx_btnv, in the dtype of v.
AttendFn = Callable[..., jax.Array]


def dot_attend(
  q_btnh: jax.Array,
  k_bskh: jax.Array,
  v_bskv: jax.Array,
  *,
  causal: bool = True,
  scores_dtype: jnp.dtype = jnp.float32,
) -> jax.Array:
  """Attention as plain einsums (Vaswani et al. 2017, eq. 1): the full T x S score matrix is
  materialised, in ``scores_dtype``; the softmax is computed in float32 (bf16 exp/sum over
  thousands of keys loses the tail) and its probabilities are cast to v's dtype."""
  b, t, n, h = q_btnh.shape
  k = k_bskh.shape[2]
  g = n // k
  q_btkgh = q_btnh.reshape(b, t, k, g, h)
  scores_bkgts = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_bskh, preferred_element_type=scores_dtype)
  scores_bkgts = scores_bkgts * jnp.asarray(1.0 / math.sqrt(h), scores_dtype)
  if causal:
    s = k_bskh.shape[1]
    # Query t sits at position t + (S - T): with S == T that is the usual lower triangle.
    visible_ts = jnp.arange(s)[None, :] <= (jnp.arange(t) + (s - t))[:, None]
    scores_bkgts = jnp.where(visible_ts, scores_bkgts, jnp.finfo(scores_dtype).min)
  probs_bkgts = jax.nn.softmax(scores_bkgts.astype(jnp.float32), axis=-1).astype(v_bskv.dtype)
  ctx_btkgv = jnp.einsum("bkgts,bskv->btkgv", probs_bkgts, v_bskv)
  return ctx_btkgv.reshape(b, t, n, v_bskv.shape[-1])

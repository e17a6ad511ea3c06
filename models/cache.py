"""The KV cache a decoder keeps between generation steps (grouped-query aware).

Keys and values are cached per *kv* head: ``k`` and ``v`` are each [layers, batch, kv_heads,
context, head_dim], so grouped-query attention (Llama 3: 8 kv heads for 32 to 128 query
heads) caches ``num_heads / num_kv_heads`` times less than multi-head attention would. Whole
model, in bytes (both tensors):

  2 * layers * kv_heads * head_dim * context * batch * bytes_per_element

(e.g. Llama 3.1 8B, 128k context, batch 1, bf16: 2 * 32 * 8 * 128 * 131072 * 2 = 16 GiB).

The kv heads sit before the context (as in Hugging Face's and vLLM's caches). Attention treats
(batch, kv_heads) as batch dimensions of its two matmuls, and XLA's GPU layout assignment wants
batch dimensions major: with [.., context, kv_heads, ..] it gave the cache a transposed layout
inside the decode step's layer loop, and so transposed the whole donated cache into and out of
the loop every step (a temporary as large as the cache; TPU, free to tile, did not).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from .config import ModelConfig
from .names import BATCH, HEAD_DIM, KV_HEADS, LAYERS

# The cache's position axis: no sharding rule names it, so it stays whole on every device.
CACHE_SEQ = "cache_seq"
# Logical axes of cache.k and cache.v, for the caller's logical->mesh rules.
CACHE_AXES: tuple[str, ...] = (LAYERS, BATCH, KV_HEADS, CACHE_SEQ, HEAD_DIM)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """k_lbksh, v_lbksh: [layers, batch, kv_heads, context, head_dim], in the compute dtype."""

  k_lbksh: jax.Array
  v_lbksh: jax.Array

  @property
  def context(self) -> int:
    return self.k_lbksh.shape[3]

  @staticmethod
  def shape(cfg: ModelConfig, *, batch: int, context: int) -> tuple[int, ...]:
    return (cfg.num_layers, batch, cfg.num_kv_heads, context, cfg.head_dim)

  @classmethod
  def zeros(cls, cfg: ModelConfig, *, batch: int, context: int, dtype=None) -> KVCache:
    dt = cfg.compute_jnp_dtype if dtype is None else jnp.dtype(dtype)
    shape = cls.shape(cfg, batch=batch, context=context)
    return cls(jnp.zeros(shape, dt), jnp.zeros(shape, dt))

  @classmethod
  def abstract(cls, cfg: ModelConfig, *, batch: int, context: int, dtype=None, sharding=None) -> KVCache:
    """ShapeDtypeStructs only: nothing allocated."""
    dt = cfg.compute_jnp_dtype if dtype is None else jnp.dtype(dtype)
    sds = jax.ShapeDtypeStruct(cls.shape(cfg, batch=batch, context=context), dt, sharding=sharding)
    return cls(sds, sds)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalKVCache:
  """The KV cache of a model with local attention: the global layers' keys and values over the
  whole context (k_lbksh, v_lbksh: [global layers, batch, kv_heads, context, head_dim], Gemma 4's
  with the global layers' own kv heads and head_dim, and without its KV-shared layers) and the
  windowed layers' over their window only (k_local, v_local: [windowed layers, batch, kv_heads,
  min(window, context), head_dim]), a ring written at position mod window (Attention.cached)."""

  k_lbksh: jax.Array
  v_lbksh: jax.Array
  k_local: jax.Array
  v_local: jax.Array

  @property
  def context(self) -> int:
    return max(self.k_lbksh.shape[3], self.k_local.shape[3])

  @staticmethod
  def shapes(cfg: ModelConfig, *, batch: int, context: int) -> tuple[tuple[int, ...], ...]:
    # Gemma 4's KV-shared layers have no cache of their own (they read their source layer's).
    n_local, n_global = cfg.num_cached_layers(True), cfg.num_cached_layers(False)
    # The global layers' kv heads and head_dim: Gemma 4's own (ModelConfig.attention_geometry);
    # with k_eq_v they still cache both keys and values (transformers' cache.update takes both).
    global_kv, global_h, _ = cfg.attention_geometry(None)
    full = (n_global, batch, global_kv, context, global_h)
    local = (n_local, batch, cfg.num_kv_heads, min(cfg.sliding_window or context, context), cfg.head_dim)
    return full, full, local, local

  @classmethod
  def abstract(cls, cfg: ModelConfig, *, batch: int, context: int, dtype=None, sharding=None) -> LocalKVCache:
    dt = cfg.compute_jnp_dtype if dtype is None else jnp.dtype(dtype)
    return cls(*(jax.ShapeDtypeStruct(s, dt, sharding=sharding) for s in cls.shapes(cfg, batch=batch, context=context)))

  @classmethod
  def zeros(cls, cfg: ModelConfig, *, batch: int, context: int, dtype=None) -> LocalKVCache:
    dt = cfg.compute_jnp_dtype if dtype is None else jnp.dtype(dtype)
    return cls(*(jnp.zeros(s, dt) for s in cls.shapes(cfg, batch=batch, context=context)))


def kv_cache_bytes(cfg: ModelConfig, *, batch: int, context: int, bytes_per_element: float | None = None) -> int:
  """Whole-model KV cache bytes: 2 * kv_heads * head_dim * batch * bytes * (global layers *
  context + windowed layers * min(window, context)); without a window, 2 * layers * kv_heads *
  head_dim * context * batch * bytes."""
  per = cfg.compute_jnp_dtype.itemsize if bytes_per_element is None else bytes_per_element
  if cfg.sliding_window is not None:
    return int(sum(math.prod(s) for s in LocalKVCache.shapes(cfg, batch=batch, context=context)) * per)
  return int(2 * math.prod(KVCache.shape(cfg, batch=batch, context=context)) * per)

"""The KV cache from its formula: bytes against context and batch, what a cache holds per token, and
the dtypes a cache can be stored in (:data:`KV_CACHE_DTYPES`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxmem.models import ModelConfig, cache_bytes, get_config
from jaxmem.records import Record
from jaxmem.registry import Registry


def attention_kind(cfg: ModelConfig) -> str:
  """MLA (latent cache), MHA (a kv head per query head) or GQA."""
  if cfg.is_mla:
    return "MLA"
  return "MHA" if cfg.num_kv_heads == cfg.num_heads else "GQA"


def kv_cache_table(
    model: str | ModelConfig, *, contexts: Sequence[int], batches: Sequence[int], bytes_per_element: float = 2
) -> list[dict[str, Any]]:
  """Whole-model KV cache bytes for every (batch, context), from
  ``2 * layers * kv_heads * head_dim * context * batch * bytes`` (bf16: 2 bytes), or for
  multi-head latent attention ``layers * (kv_lora_rank + qk_rope_head_dim) * context * batch *
  bytes`` (``kv_heads`` is then None: every head reads the one latent)."""
  cfg = get_config(model) if isinstance(model, str) else model
  return [
      dict(
          model=cfg.name,
          batch=b,
          context=c,
          kv_heads=None if cfg.is_mla else cfg.num_kv_heads,
          kv_cache_bytes=cache_bytes(cfg, batch=b, context=c, bytes_per_element=bytes_per_element),
      )
      for b in batches
      for c in contexts
  ]




@dataclasses.dataclass(frozen=True, kw_only=True)
class KvCacheDtype(Record):
  """How a KV cache stores keys and values: ``dtype`` (jnp's name) at ``bits`` a value. Written
  into the cache by a plain cast where the model writes it and read back to the compute dtype
  where attention reads it (:meth:`jaxmem.models.Attention.cached` casts both ways), so the
  compiler sees the stored bytes as the cache's arguments. No scales are stored: vLLM's fp8 cache
  keeps one per tensor (a few bytes), MaxText's int8 and int4 caches one per token and head (its
  ``kv_quant_axis``), which this leaves out and says so where it matters."""

  name: str
  dtype: str
  description: str = ""

  @property
  def bits(self) -> int:
    return jax.dtypes.itemsize_bits(jnp.dtype(self.dtype))

  @property
  def bytes_per_element(self) -> float:
    return self.bits / 8


KV_CACHE_DTYPES: Registry[KvCacheDtype] = Registry("KV cache dtype", {
    "bf16": KvCacheDtype(name="bf16", dtype="bfloat16", description="bfloat16"),
    "fp16": KvCacheDtype(name="fp16", dtype="float16", description="float16"),
    "fp8": KvCacheDtype(name="fp8", dtype="float8_e4m3fn", description="float8 e4m3 (vLLM's fp8, fp8_e4m3)"),
    "int8": KvCacheDtype(name="int8", dtype="int8", description="int8 (MaxText's kv_quant_dtype int8; scales not stored)"),
    "int4": KvCacheDtype(name="int4", dtype="int4", description="int4, two a byte (MaxText's int4; scales not stored)"),
}, field="kv_cache_dtype")


def kv_cache_dtype(name: str | None, cfg: ModelConfig) -> KvCacheDtype:
  """The KV cache's storage: ``name`` from :data:`KV_CACHE_DTYPES`, or the model's compute dtype
  where none is given (``None`` or ``auto``, vLLM's word for it)."""
  if name is None or name == "auto":
    dt = jnp.dtype(cfg.compute_jnp_dtype)
    return next((d for d in KV_CACHE_DTYPES.values() if jnp.dtype(d.dtype) == dt),
                KvCacheDtype(name=dt.name, dtype=dt.name, description="the compute dtype"))
  return KV_CACHE_DTYPES.get(name)

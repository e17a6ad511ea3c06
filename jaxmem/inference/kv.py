"""The KV cache from its formula: bytes against context and batch, and what a cache holds per token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxmem.models import ModelConfig, cache_bytes, get_config


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



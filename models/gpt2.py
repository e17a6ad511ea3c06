"""GPT-2's family (Radford et al. 2019): learned absolute positions, a table of ``max_seq_len``
rows added to the token embeddings, and no RoPE. (Its LayerNorms, GELU MLP and biases are the
``gpt2`` style's, read where those layers are built: :mod:`.layers`, :mod:`.mlp`,
:mod:`.attention`.)"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.errors import JaxmemError

from .config import ModelConfig
from .family import Family, WeightHook, Where, value
from .layers import param
from .names import EMBED, POS



class GPT2(Family):
  name: ClassVar[str] = "gpt2"

  def applies(self, cfg: ModelConfig) -> bool:
    return cfg.style == "gpt2"

  def init_model(self, model: nnx.Module, rngs: nnx.Rngs) -> None:
    cfg = model.cfg
    # GPT-2 initialises its position table with std 0.01 (openai/gpt-2 model.py, "wpe").
    model.pos_embed_pd = param(
      rngs, nnx.initializers.normal(stddev=0.01), (cfg.max_seq_len, cfg.d_model), (POS, EMBED), cfg.param_jnp_dtype
    )

  def rope_dims(self, cfg: ModelConfig) -> None:
    return None

  def embed_positions(
    self, model: nnx.Module, x_btd: jax.Array, where: Where, weights: WeightHook | None = None
  ) -> jax.Array:
    cfg, t = model.cfg, where.t
    if where.start is None:  # a train step's sequence (positions 0..t-1, or its natural ones)
      if t > cfg.max_seq_len:
        raise JaxmemError(f"model {cfg.name!r}: sequence length {t} exceeds max_seq_len {cfg.max_seq_len}")
      table = model.pos_embed_pd
      table_td = table[:t] if where.natural is None else jnp.take(table[...], where.natural, axis=0)
    else:  # tokens at start.. of a cache
      if where.context > cfg.max_seq_len:
        raise JaxmemError(f"model {cfg.name!r}: context {where.context} exceeds max_seq_len {cfg.max_seq_len}")
      table_td = jax.lax.dynamic_slice_in_dim(value(model.pos_embed_pd, weights), where.start, t, axis=0)
    return x_btd + table_td.astype(x_btd.dtype)[None]

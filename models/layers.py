"""Parameter creation with logical axes, the normalisation layers and the token embedding.

Every parameter is an ``nnx.Param`` created through ``nnx.with_partitioning`` so that
``nnx.get_partition_spec(state)`` yields one logical axis name (see ``names.py``) per
dimension. Parameters are stored in ``param_dtype`` and cast to the compute dtype where they
are used, so XLA sees the same casts a mixed-precision train step has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from .config import ModelConfig
from .names import EMBED, NORM, VOCAB

# constrain(x, logical_axes) -> x: the caller's hook for sharding constraints on activations.
Constrain = Callable[[jax.Array, tuple[str | None, ...]], jax.Array]


def no_constraint(x: jax.Array, logical_axes: tuple[str | None, ...]) -> jax.Array:
  del logical_axes
  return x


def param(
  rngs: nnx.Rngs,
  init: nnx.Initializer,
  shape: Sequence[int],
  axes: Sequence[str],
  dtype: jnp.dtype,
) -> nnx.Param:
  """An ``nnx.Param`` of ``shape`` tagged with one logical axis name per dimension."""
  assert len(shape) == len(axes), (shape, axes)
  value = nnx.with_partitioning(init, tuple(axes))(rngs.params(), tuple(shape), dtype)
  # eager_sharding=False: the names are logical, not mesh axes. With flax's default (shard at
  # creation) building a model outside a mesh fails, and inside one it would need the
  # caller's logical->mesh rules; callers apply those to `nnx.get_partition_spec` instead.
  return nnx.Param(value, eager_sharding=False)


# GPT-2 initialises weights N(0, 0.02) (Radford et al. 2019; openai/gpt-2 model.py), which
# Llama implementations commonly reuse. Values do not affect memory figures, only that the
# toy models train sensibly in tests.
DEFAULT_INIT = nnx.initializers.normal(stddev=0.02)


class LayerNorm(nnx.Module):
  """LayerNorm with scale and bias (Ba et al. 2016), as in GPT-2."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.eps = cfg.norm_eps
    self.dtype = cfg.compute_jnp_dtype
    self.scale_d = param(rngs, nnx.initializers.ones, (cfg.d_model,), (NORM,), cfg.param_jnp_dtype)
    self.bias_d = param(rngs, nnx.initializers.zeros, (cfg.d_model,), (NORM,), cfg.param_jnp_dtype)

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    # Statistics in float32: bf16 mean/variance over thousands of channels loses too much.
    x32_btd = x_btd.astype(jnp.float32)
    mean_bt1 = jnp.mean(x32_btd, axis=-1, keepdims=True)
    var_bt1 = jnp.mean(jnp.square(x32_btd - mean_bt1), axis=-1, keepdims=True)
    y_btd = (x32_btd - mean_bt1) * jax.lax.rsqrt(var_bt1 + self.eps)
    y_btd = y_btd * self.scale_d[...].astype(jnp.float32) + self.bias_d[...].astype(jnp.float32)
    return y_btd.astype(self.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm with scale, no bias (Zhang & Sennrich 2019), as in Llama."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.eps = cfg.norm_eps
    self.dtype = cfg.compute_jnp_dtype
    self.scale_d = param(rngs, nnx.initializers.ones, (cfg.d_model,), (NORM,), cfg.param_jnp_dtype)

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    x32_btd = x_btd.astype(jnp.float32)
    ms_bt1 = jnp.mean(jnp.square(x32_btd), axis=-1, keepdims=True)
    y_btd = x32_btd * jax.lax.rsqrt(ms_bt1 + self.eps) * self.scale_d[...].astype(jnp.float32)
    return y_btd.astype(self.dtype)


def make_norm(cfg: ModelConfig, *, rngs: nnx.Rngs) -> LayerNorm | RMSNorm:
  return LayerNorm(cfg, rngs=rngs) if cfg.style == "gpt2" else RMSNorm(cfg, rngs=rngs)


class Embed(nnx.Module):
  """Token embedding table; also the output projection when embeddings are tied."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.dtype = cfg.compute_jnp_dtype
    self.table_vd = param(rngs, DEFAULT_INIT, (cfg.vocab_size, cfg.d_model), (VOCAB, EMBED), cfg.param_jnp_dtype)

  def __call__(self, tokens_bt: jax.Array) -> jax.Array:
    # Gather, then cast: casting the table first would materialise a V x D copy.
    return jnp.take(self.table_vd[...], tokens_bt, axis=0).astype(self.dtype)

  def attend(self, x_btd: jax.Array) -> jax.Array:
    """Logits against the (tied) table, accumulated and returned in float32."""
    return jnp.einsum(
      "btd,vd->btv", x_btd, self.table_vd[...].astype(self.dtype), preferred_element_type=jnp.float32
    )


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  """``cap * tanh(x / cap)`` (Gemma 2's soft-capping of scores and logits); ``x`` itself for None."""
  return x if cap is None else cap * jnp.tanh(x / cap)

"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", section 3.4.2).

Llama 3 uses RoPE with base ``theta`` = 500000 (Llama 3 paper, section 3.2). We use the
"rotate half" layout (channel i pairs with channel i + head_dim/2), as in the Hugging Face
Llama port and MaxText, rather than Meta's interleaved pairs: the two are the same rotation
under a fixed permutation of the projection weights, and cost the same memory and FLOPs.
Llama 3.1's long-context frequency rescaling is left out: it changes values, not shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """(sin_tk, cos_tk), float32, k = head_dim // 2: the angle of position t in channel pair k.

  Frequencies theta^(-2k/head_dim) follow RoFormer eq. (15).
  """
  inv_freq_k = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angle_tk = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq_k[None, :]
  return jnp.sin(angle_tk), jnp.cos(angle_tk)


def rope_tables_at(positions_t: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """(sin_tk, cos_tk) for explicit (possibly traced) positions: a decode step's token sits at
  position ``pos``, not 0. Same frequencies as :func:`rope_tables` (RoFormer eq. 15)."""
  inv_freq_k = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angle_tk = positions_t.astype(jnp.float32)[:, None] * inv_freq_k[None, :]
  return jnp.sin(angle_tk), jnp.cos(angle_tk)


def apply_rope(x_btnh: jax.Array, sin_tk: jax.Array, cos_tk: jax.Array) -> jax.Array:
  """Rotates each (i, i + head_dim/2) channel pair of x by its position's angle."""
  # Rotate in float32 (as the HF and MaxText ports do): bf16 has 8 mantissa bits, too few
  # for sin/cos at large positions; the result goes back to the compute dtype.
  x32_btnh = x_btnh.astype(jnp.float32)
  half = x_btnh.shape[-1] // 2
  x1_btnk, x2_btnk = x32_btnh[..., :half], x32_btnh[..., half:]
  sin_1t1k, cos_1t1k = sin_tk[None, :, None, :], cos_tk[None, :, None, :]
  out_btnh = jnp.concatenate(
    [x1_btnk * cos_1t1k - x2_btnk * sin_1t1k, x2_btnk * cos_1t1k + x1_btnk * sin_1t1k], axis=-1
  )
  return out_btnh.astype(x_btnh.dtype)

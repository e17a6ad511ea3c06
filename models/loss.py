"""Next-token cross entropy, whole or vocabulary-tiled (MaxText's ``num_vocab_tiling``).

The float32 logits of a train step are [B, T, V]: with Llama 3's 128,256-token vocabulary at
8 x 8192 tokens that one tensor is 34 GB, and its gradient as much again. Tiling computes the
output projection and the cross entropy over ``tiles`` slices of the B*T rows in a
``lax.scan``, each slice under ``jax.checkpoint``: the forward keeps only each tile's scalar
loss, and the backward recomputes one tile's logits at a time, so at most one tile's logits
(and their gradient) exist at once. MaxText does the same with a scan and a custom VJP
(``utils/vocabulary_tiling.py``); ``jax.checkpoint`` around the tile gives the same
recompute-per-tile backward.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from jaxmem.errors import JaxmemError

from .layers import Constrain, no_constraint
from .names import BATCH, EMBED, SEQ


def cross_entropy(
  x_btd: jax.Array,
  targets_bt: jax.Array,
  logits_fn: Callable[[jax.Array], jax.Array],
  *,
  vocab_tiles: int = 1,
  constrain: Constrain = no_constraint,
) -> jax.Array:
  """Mean of ``softmax_cross_entropy_with_integer_labels(logits_fn(x), targets)`` (float32).

  ``vocab_tiles == 1`` is exactly that expression (the untiled program). With more tiles,
  tile i holds positions i, i + tiles, i + 2 * tiles, ... of every sequence (a strided split of
  the sequence axis, ``seq / tiles`` positions each): each tile keeps the whole batch, so it is
  split over the data-parallel devices as the hidden states are, and a sequence-sharded T is
  split evenly too. The sum over tiles divided by B*T is the same mean.

  Raises:
    JaxmemError: ``vocab_tiles`` is not a positive divisor of the sequence length.
  """
  b, t, d = x_btd.shape
  if not isinstance(vocab_tiles, int) or vocab_tiles < 1 or t % vocab_tiles:
    raise JaxmemError(
      f"vocab tiles must be a positive divisor of the sequence length {t}, got {vocab_tiles!r}"
    )
  if vocab_tiles == 1:
    return optax.softmax_cross_entropy_with_integer_labels(logits_fn(x_btd), targets_bt).mean()

  c = t // vocab_tiles
  # [B, T, D] -> [tiles, B, T/tiles, D]: position c_i * tiles + n goes to tile n.
  x_nbcd = jnp.moveaxis(x_btd.reshape(b, c, vocab_tiles, d), 2, 0)
  y_nbc = jnp.moveaxis(targets_bt.reshape(b, c, vocab_tiles), 2, 0)

  def tile_loss(x_bcd: jax.Array, y_bc: jax.Array) -> jax.Array:
    x_bcd = constrain(x_bcd, (BATCH, SEQ, EMBED))
    return optax.softmax_cross_entropy_with_integer_labels(logits_fn(x_bcd), y_bc).sum()

  # prevent_cse=False: inside a scan it is unnecessary (JAX's advice) and only blocks fusion.
  tile_loss = jax.checkpoint(tile_loss, prevent_cse=False)

  def body(total: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
    return total + tile_loss(*xs), None

  total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (x_nbcd, y_nbc))
  return total / (b * t)

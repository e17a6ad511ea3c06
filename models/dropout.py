"""Dropout (Srivastava et al. 2014) where Megatron's GPT applies it, for training only.

Megatron's GPT (and GPT-2/3) drop out four activations: the embeddings' sum, the attention
probabilities, the attention block's output and the MLP's output, each before it joins the
residual stream. Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4.1) count a one-byte mask per dropped element among the saved
activations: ``as²b`` for the attention probabilities and ``sbh`` for each of the two block
outputs, part of their 34·sbh + 5·as²b per layer. ``jax.random.bernoulli`` gives a boolean mask,
one byte per element, so the compiled program keeps what they count.

A :class:`Dropout` holds the rate and one key; :meth:`Dropout.at` derives the key of each place
(``fold_in``), so the layer's masks are independent and recomputing one (selective
recomputation recomputes the attention core) draws the same mask again.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

# Where a mask is drawn inside a layer: the salt folded into the layer's key.
ATTENTION_PROBS = 0
ATTENTION_OUT = 1
MLP_OUT = 2
EMBEDDINGS = 3


@dataclasses.dataclass(frozen=True)
class Dropout:
  """Drop each element with probability ``rate`` and scale the rest by 1 / (1 - rate)."""

  rate: float
  key: jax.Array

  def at(self, salt: int) -> Dropout:
    return Dropout(self.rate, jax.random.fold_in(self.key, salt))

  def __call__(self, x: jax.Array) -> jax.Array:
    keep = jax.random.bernoulli(self.key, 1.0 - self.rate, x.shape)
    return _masked(x, keep, 1.0 / (1.0 - self.rate))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _masked(x: jax.Array, keep: jax.Array, scale: float) -> jax.Array:
  """``x`` scaled where ``keep``, zero elsewhere. A custom VJP so that the backward pass keeps the
  boolean mask alone, as Megatron's dropout does: ``jnp.where``'s own jit (or ``lax.select``'s
  instantiated zero tangent) would keep one or two more tensors of ``x``'s shape and dtype."""
  return jax.lax.select(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros_like(x))


def _masked_fwd(x, keep, scale):
  return _masked(x, keep, scale), keep


def _masked_bwd(scale, keep, g):
  return jax.lax.select(keep, g * jnp.asarray(scale, g.dtype), jnp.zeros_like(g)), None


_masked.defvjp(_masked_fwd, _masked_bwd)


def maybe(dropout: Dropout | None, salt: int, x: jax.Array) -> jax.Array:
  """``x`` through ``dropout`` at place ``salt``; ``x`` itself without dropout (the program is then
  exactly the one without this module)."""
  return x if dropout is None else dropout.at(salt)(x)

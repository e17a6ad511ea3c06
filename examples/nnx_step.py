"""A step factory for a Flax NNX model: jaxmem's sweeps on a model of your own.

A Llama-style decoder (RMSNorm, grouped-query attention, SwiGLU MLP) written with NNX
modules, trained with AdamW. ``make_step`` builds its train step with abstract inputs (the
model is created under ``nnx.eval_shape``: nothing is allocated) at a given batch, sequence
length and remat policy, sharded FSDP-style over the mesh jaxmem passes; ``make_tiny_step`` is
the same step at test size. Try::

    python -m jaxmem compare --step examples/nnx_step.py:make_step --target tpu:v5p-8
    python -m jaxmem fit --step examples/nnx_step.py:make_step --target gpu:h100x8
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import jaxmem


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
  vocab: int = 32_000
  d_model: int = 2048
  heads: int = 16
  kv_heads: int = 4
  layers: int = 8
  d_ff: int = 5632
  dtype: Any = jnp.bfloat16  # compute; parameters and optimizer state stay float32


# About 0.55B parameters: a TinyLlama-width decoder with eight layers.
DEFAULT = Config()
TINY = Config(vocab=32_000, d_model=64, heads=4, kv_heads=2, layers=2, d_ff=160)


class Attention(nnx.Module):
  def __init__(self, c: Config, *, rngs: nnx.Rngs):
    self.c = c
    hd = c.d_model // c.heads
    self.q = nnx.Linear(c.d_model, c.heads * hd, use_bias=False, dtype=c.dtype, rngs=rngs)
    self.kv = nnx.Linear(c.d_model, 2 * c.kv_heads * hd, use_bias=False, dtype=c.dtype, rngs=rngs)
    self.out = nnx.Linear(c.heads * hd, c.d_model, use_bias=False, dtype=c.dtype, rngs=rngs)

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    c = self.c
    b, t, _ = x_btd.shape
    hd = c.d_model // c.heads
    q_btnh = self.q(x_btd).reshape(b, t, c.heads, hd)
    k_btkh, v_btkh = jnp.split(self.kv(x_btd).reshape(b, t, 2 * c.kv_heads, hd), 2, axis=2)
    ctx_btnh = jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, is_causal=True)
    return self.out(ctx_btnh.reshape(b, t, c.heads * hd))


class Block(nnx.Module):
  def __init__(self, c: Config, *, rngs: nnx.Rngs):
    self.norm1 = nnx.RMSNorm(c.d_model, dtype=c.dtype, rngs=rngs)
    self.attn = Attention(c, rngs=rngs)
    self.norm2 = nnx.RMSNorm(c.d_model, dtype=c.dtype, rngs=rngs)
    self.gate_up = nnx.Linear(c.d_model, 2 * c.d_ff, use_bias=False, dtype=c.dtype, rngs=rngs)
    self.down = nnx.Linear(c.d_ff, c.d_model, use_bias=False, dtype=c.dtype, rngs=rngs)

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    x_btd = x_btd + self.attn(self.norm1(x_btd))
    gate_btf, up_btf = jnp.split(self.gate_up(self.norm2(x_btd)), 2, axis=-1)
    return x_btd + self.down(jax.nn.silu(gate_btf) * up_btf)


class Decoder(nnx.Module):
  def __init__(self, c: Config, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(c.vocab, c.d_model, dtype=c.dtype, rngs=rngs)
    self.blocks = nnx.List([Block(c, rngs=rngs) for _ in range(c.layers)])
    self.norm = nnx.RMSNorm(c.d_model, dtype=c.dtype, rngs=rngs)
    self.head = nnx.Linear(c.d_model, c.vocab, use_bias=False, dtype=c.dtype, rngs=rngs)

  def __call__(self, tokens_bt: jax.Array, remat: Any = None) -> jax.Array:
    x_btd = self.embed(tokens_bt)
    for block in self.blocks:
      # remat: a jax.checkpoint policy for each block, or None for no checkpoint at all.
      x_btd = block(x_btd) if remat is None else nnx.remat(lambda b, x: b(x), policy=remat)(block, x_btd)
    return self.head(self.norm(x_btd)).astype(jnp.float32)


def build(cfg: Config, *, batch: int, seq: int, remat: Any, mesh: jax.sharding.Mesh | None) -> tuple:
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  tx = optax.adamw(1e-3)
  opt_state = jax.eval_shape(tx.init, params)
  tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

  def train_step(params, opt_state, tokens_bt, targets_bt):
    def loss_fn(p):
      logits_btv = nnx.merge(graphdef, p)(tokens_bt, remat=remat)
      return optax.softmax_cross_entropy_with_integer_labels(logits_btv, targets_bt).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  args: tuple = (params, opt_state, tokens, tokens)
  jit_kwargs: dict[str, Any] = {"donate_argnums": (0, 1)}
  if mesh is not None and "fsdp" in mesh.shape:  # FSDP: every tree split over fsdp, the batch over the data axes
    data_axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
    tok_sh = NamedSharding(mesh, PartitionSpec(data_axes))
    p_sh, o_sh = jaxmem.fsdp_shardings(params, mesh), jaxmem.fsdp_shardings(opt_state, mesh)
    place = lambda t, s: jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), t, s)  # noqa: E731
    args = (place(params, p_sh), place(opt_state, o_sh), place(tokens, tok_sh), place(tokens, tok_sh))
    jit_kwargs["out_shardings"] = (p_sh, o_sh, NamedSharding(mesh, PartitionSpec()))
  return train_step, args, jit_kwargs


def make_step(*, batch: int, seq: int, remat: Any, mesh: jax.sharding.Mesh | None = None) -> tuple:
  """The train step at ``batch`` x ``seq`` under ``remat``: ``(fn, args, jit_kwargs)``."""
  return build(DEFAULT, batch=batch, seq=seq, remat=remat, mesh=mesh)


def make_tiny_step(*, batch: int, seq: int, remat: Any, mesh: jax.sharding.Mesh | None = None) -> tuple:
  """The same step at test size (two narrow layers; the vocabulary keeps its size)."""
  return build(TINY, batch=batch, seq=seq, remat=remat, mesh=mesh)

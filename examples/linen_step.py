"""A step factory for a Flax Linen model: jaxmem's sweeps on a model of your own.

A GPT-style decoder written with Linen's own layers (``nn.MultiHeadDotProductAttention``,
``nn.LayerNorm``, ``nn.Dense``), trained with AdamW. ``make_step`` builds its train step with
abstract inputs at a given batch, sequence length and remat policy, sharded FSDP-style over the
mesh jaxmem passes; ``make_tiny_step`` is the same step at test size. Try::

    python -m jaxmem compare --step examples/linen_step.py:make_step --target gpu:h100
    python -m jaxmem fit --step examples/linen_step.py:make_step --target gpu:h100
    python -m jaxmem scale --step examples/linen_step.py:make_step --over seq=512,1024,2048
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

import jaxmem


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
  vocab: int = 32_768
  d_model: int = 1024
  heads: int = 16
  layers: int = 8
  d_ff: int = 4096
  dtype: Any = jnp.bfloat16  # compute; parameters and optimizer state stay float32


# About 168M parameters: GPT-2 medium's width, eight layers, a Llama-sized vocabulary.
DEFAULT = Config()
TINY = Config(vocab=32_000, d_model=64, heads=4, layers=2, d_ff=256)


class Block(nn.Module):
  cfg: Config

  @nn.compact
  def __call__(self, x_btd: jax.Array) -> jax.Array:
    c = self.cfg
    mask = nn.make_causal_mask(jnp.ones(x_btd.shape[:2], jnp.int32))
    h_btd = nn.LayerNorm(dtype=c.dtype)(x_btd)
    x_btd = x_btd + nn.MultiHeadDotProductAttention(num_heads=c.heads, dtype=c.dtype, deterministic=True)(h_btd, mask=mask)
    h_btd = nn.LayerNorm(dtype=c.dtype)(x_btd)
    h_btf = nn.gelu(nn.Dense(c.d_ff, dtype=c.dtype)(h_btd))
    return x_btd + nn.Dense(c.d_model, dtype=c.dtype)(h_btf)


class Decoder(nn.Module):
  cfg: Config
  remat: Any = None  # a jax.checkpoint policy, or None for no remat

  @nn.compact
  def __call__(self, tokens_bt: jax.Array) -> jax.Array:
    c = self.cfg
    x_btd = nn.Embed(c.vocab, c.d_model, dtype=c.dtype)(tokens_bt)
    x_btd = x_btd + self.param("pos", nn.initializers.normal(0.02), (tokens_bt.shape[1], c.d_model)).astype(c.dtype)
    block = Block if self.remat is None else nn.remat(Block, policy=self.remat)
    for i in range(c.layers):
      x_btd = block(c, name=f"block_{i}")(x_btd)
    x_btd = nn.LayerNorm(dtype=c.dtype)(x_btd)
    return nn.Dense(c.vocab, dtype=c.dtype, name="head")(x_btd).astype(jnp.float32)


def build(cfg: Config, *, batch: int, seq: int, remat: Any, mesh: jax.sharding.Mesh | None) -> tuple:
  model = Decoder(cfg, remat=remat)
  tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  tx = optax.adamw(1e-3)
  opt_state = jax.eval_shape(tx.init, params)

  def train_step(params, opt_state, batch):
    def loss_fn(p):
      logits_btv = model.apply({"params": p}, batch["tokens"])
      return optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  data = {"tokens": tokens, "targets": tokens}
  jit_kwargs: dict[str, Any] = {"donate_argnums": (0, 1)}
  if mesh is not None:  # FSDP: parameters and optimizer state split over fsdp, the batch over every data axis
    p_sh = jaxmem.fsdp_shardings(params, mesh, "fsdp") if "fsdp" in mesh.shape else _replicated(params, mesh)
    o_sh = jaxmem.fsdp_shardings(opt_state, mesh, "fsdp") if "fsdp" in mesh.shape else _replicated(opt_state, mesh)
    data_axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
    d_sh = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec(data_axes or None)), data)
    params, opt_state, data = (_placed(t, s) for t, s in ((params, p_sh), (opt_state, o_sh), (data, d_sh)))
    jit_kwargs["out_shardings"] = (p_sh, o_sh, NamedSharding(mesh, PartitionSpec()))
  return train_step, (params, opt_state, data), jit_kwargs


def _replicated(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), tree)


def _placed(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def make_step(*, batch: int, seq: int, remat: Any, mesh: jax.sharding.Mesh | None = None) -> tuple:
  """The train step at ``batch`` x ``seq`` under ``remat``: ``(fn, args, jit_kwargs)``."""
  return build(DEFAULT, batch=batch, seq=seq, remat=remat, mesh=mesh)


def make_tiny_step(*, batch: int, seq: int, remat: Any, mesh: jax.sharding.Mesh | None = None) -> tuple:
  """The same step at test size (two narrow layers; the vocabulary keeps its size)."""
  return build(TINY, batch=batch, seq=seq, remat=remat, mesh=mesh)

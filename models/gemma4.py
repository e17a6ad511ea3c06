"""Gemma 4's family (transformers' Gemma4TextConfig, Gemma4TextModel, Gemma4TextDecoderLayer;
its fields: :class:`~.config.Gemma4Spec`): Gemma 3's decoder (windows, sandwich norms, GeGLU,
per-head q/k norms, read from the config's concerns) plus

- the global layers' own attention geometry (their head_dim, kv heads, keys as values: built by
  :class:`~.attention.Attention` from ``ModelConfig.attention_geometry``), so their own RoPE width;
- per-layer embeddings (PLE): a table and a projection give every layer an input of its own,
  computed before the layers (:meth:`Gemma4.layer_inputs`), which each layer gates by its
  output and projects back after its MLP (:meth:`Gemma4Block.after_ffn`);
- KV sharing: the last ``kv_shared_layers`` layers attend to the keys and values of the last
  earlier layer of their type (:meth:`Gemma4.layer_ranges`: the "store" and "reuse" segments the
  transformer runs), their MLP twice as wide with ``kv_shared_double_mlp``;
- the MoE block: the experts beside the dense MLP, each with its own norms
  (:meth:`Gemma4Block.ffn`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from .attention import HeadRMSNorm
from .block import Block, gathered
from .config import Gemma4Spec, ModelConfig, StepChoices
from .family import Family, WeightHook, value, with_weights
from .layers import DEFAULT_INIT, Constrain, make_norm, param
from .mlp import make_mlp
from .moe import ExpertsFn, MoE
from .names import BATCH, EMBED, MLP, NORM_SEQ, VOCAB



class Gemma4Block(Block):
  """Gemma4TextDecoderLayer: the block, with the MoE block beside the dense MLP, the per-layer
  input after the MLP, and a KV-shared layer's MLP twice as wide (use_double_wide_mlp)."""

  def init_ffn(self, cfg: ModelConfig, *, choices: StepChoices, out_init: nnx.Initializer, rngs: nnx.Rngs) -> None:
    # Gemma 4's use_double_wide_mlp: a KV-shared layer's MLP is twice as wide (Gemma4TextMLP).
    mlp_cfg = dataclasses.replace(cfg, d_ff=2 * cfg.d_ff) if self.kv_shared and cfg.kv_shared_double_mlp else cfg
    self.mlp = MoE(cfg, choices=choices, out_init=out_init, rngs=rngs) if self.is_moe else make_mlp(
      mlp_cfg, out_init=out_init, rngs=rngs
    )
    # The MoE block (Gemma4TextDecoderLayer with enable_moe_block): the dense MLP stays beside
    # the experts (``mlp``), with post_feedforward_layernorm_1 on its output (post_dense_norm),
    # pre_feedforward_layernorm_2 on the experts' input (experts_norm) and
    # post_feedforward_layernorm_2 on their output (post_experts_norm).
    self.beside_dense = self.is_moe and cfg.moe_beside_dense
    if self.beside_dense:
      self.dense_mlp = make_mlp(mlp_cfg, out_init=out_init, rngs=rngs)
      self.post_dense_norm = make_norm(cfg, rngs=rngs)
      self.experts_norm = make_norm(cfg, rngs=rngs)
      self.post_experts_norm = make_norm(cfg, rngs=rngs)
    # Per-layer embeddings (Gemma4TextDecoderLayer: per_layer_input_gate, per_layer_projection,
    # post_per_layer_input_norm), applied after the MLP's residual.
    self.per_layer = bool(cfg.per_layer_dim)
    if self.per_layer:
      q, pdt = cfg.per_layer_dim, cfg.param_jnp_dtype
      self.gelu = cfg.mlp_act == "gelu_tanh"
      self.dtype = cfg.compute_jnp_dtype
      self.ple_gate_dq = param(rngs, DEFAULT_INIT, (cfg.d_model, q), (EMBED, MLP), pdt)
      self.ple_proj_qd = param(rngs, out_init, (q, cfg.d_model), (MLP, EMBED), pdt)
      self.ple_norm = make_norm(cfg, rngs=rngs)

  def ffn(self, x_btd: jax.Array, constrain: Constrain, experts: ExpertsFn | None) -> jax.Array:
    if not self.beside_dense:
      return super().ffn(x_btd, constrain, experts)
    # Gemma4TextDecoderLayer.forward: post_feedforward_layernorm(post_feedforward_layernorm_1(mlp(
    # pre_feedforward_layernorm(x))) + post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(x))),
    # the router taking x itself (the residual before any norm).
    h_btd = gathered(self.pre("mlp_norm", x_btd), constrain)
    dense_btd = self.post_dense_norm(self.dense_mlp(h_btd, constrain=constrain))
    routed_btd = self.mlp(
      gathered(self.experts_norm(x_btd), constrain), constrain=constrain, experts=experts,
      route_btd=gathered(x_btd, constrain),
    )
    return self.post_mlp_norm(dense_btd + self.post_experts_norm(routed_btd))

  def after_ffn(self, x_btd: jax.Array, layer_input: jax.Array | None, constrain: Constrain) -> jax.Array:
    """x + norm(proj(act(gate(x)) * this layer's per-layer input)): Gemma4TextDecoderLayer.forward's
    last residual (before its layer_scalar, a buffer of ones)."""
    if not self.per_layer:
      return x_btd
    h_btq = jnp.einsum("btd,dq->btq", x_btd, self.ple_gate_dq[...].astype(self.dtype))
    h_btq = (jax.nn.gelu(h_btq, approximate=True) if self.gelu else jax.nn.silu(h_btq)) * layer_input.astype(self.dtype)
    y_btd = jnp.einsum("btq,qd->btd", h_btq, self.ple_proj_qd[...].astype(self.dtype))
    return x_btd + constrain(self.ple_norm(y_btd), (BATCH, NORM_SEQ, EMBED))


class Gemma4(Family):
  name = "gemma4"
  block = Gemma4Block

  def applies(self, cfg: ModelConfig) -> bool:
    return cfg.gemma4 != Gemma4Spec()

  def init_model(self, model: nnx.Module, rngs: nnx.Rngs) -> None:
    cfg = model.cfg
    if cfg.per_layer_dim:  # Gemma4TextModel: embed_tokens_per_layer, per_layer_model_projection, its norm
      lq, pdt = cfg.num_layers * cfg.per_layer_dim, cfg.param_jnp_dtype
      model.ple_table_vq = param(rngs, DEFAULT_INIT, (cfg.per_layer_vocab, lq), (VOCAB, EMBED), pdt)
      model.ple_proj_dq = param(rngs, DEFAULT_INIT, (cfg.d_model, lq), (EMBED, MLP), pdt)
      model.ple_norm = HeadRMSNorm(cfg, rngs=rngs, head_dim=cfg.per_layer_dim)

  def rope_dims(self, cfg: ModelConfig) -> tuple[int, int]:
    """The global layers' RoPE width is their own head_dim (global_head_dim)."""
    return cfg.head_dim, cfg.attention_geometry(None)[1] if cfg.has_global_geometry else cfg.head_dim

  def layer_inputs(
    self, model: nnx.Module, tokens_bt: jax.Array, x_btd: jax.Array, weights: WeightHook | None = None
  ) -> jax.Array | None:
    """Every layer's per-layer input [batch, seq, layers, per_layer_dim] (None without per-layer
    embeddings): Gemma4TextModel.get_per_layer_inputs (the table's rows scaled by
    sqrt(per_layer_dim)) plus project_per_layer_inputs (the embeddings projected, scaled by
    d_model^-1/2 and RMS-normed per layer), summed and scaled by 2^-1/2. Computed before the
    layers and live across all of them, as there."""
    cfg = model.cfg
    if not cfg.per_layer_dim:
      return None
    b, t = tokens_bt.shape
    lq, q, dt = (cfg.num_layers, cfg.per_layer_dim), cfg.per_layer_dim, cfg.compute_jnp_dtype
    rows = jax.tree.map(lambda a: jnp.take(a, tokens_bt, axis=0), model.ple_table_vq.get_value())
    rows_btq = (rows if weights is None else weights(rows)).astype(dt) * math.sqrt(q)
    proj_btq = jnp.einsum("btd,dq->btq", x_btd, value(model.ple_proj_dq, weights).astype(dt)) * cfg.d_model**-0.5
    norm = with_weights(model.ple_norm, weights)
    return (norm(proj_btq.reshape(b, t, *lq)) + rows_btq.reshape(b, t, *lq)) * 2**-0.5

  def layer_ranges(self, cfg: ModelConfig, period: int) -> tuple[tuple[int, int, str], ...]:
    """KV sharing: whole periods before the shared layers (ModelConfig's _check_kv_sharing), the
    last of them "store"s its keys and values for the shared ones, which "reuse" them."""
    if not cfg.kv_shared_layers:
      return super().layer_ranges(cfg, period)
    fs = cfg.first_kv_shared_layer
    return ((0, fs - period, "own"), (fs - period, fs, "store"), (fs, cfg.num_layers, "reuse"))

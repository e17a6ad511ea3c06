"""The decoder-only Transformer: embeddings, a scanned stack of pre-norm blocks, the head.

Blocks are built once, stacked along a leading "layers" axis (``nnx.vmap`` over split RNGs),
and run with ``jax.lax.scan``. XLA therefore compiles one block body whatever the depth, so
compile time stays flat from 8 to 126 layers, and the stacked parameters and the per-layer
residuals saved for the backward pass show up as single [layers, ...] buffers in XLA's
memory figures, as they do in MaxText and other scanned production models.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxmem.errors import JaxmemError

from .attention import Attention, HeadRMSNorm
from .attention_ops import AttendFn
from .cache import KVCache, LocalKVCache
from .config import ModelConfig
from .dropout import ATTENTION_OUT, ATTENTION_PROBS, EMBEDDINGS, MLP_OUT, Dropout, maybe
from .layers import DEFAULT_INIT, Constrain, Embed, make_norm, no_constraint, param
from .loss import cross_entropy
from .mla import MLACache, MLAttention
from .mlp import make_mlp
from .moe import ExpertsFn, MoE
from .names import BATCH, DECODER_LAYER_INPUT, EMBED, LAYERS, MLP, NORM_SEQ, POS, SEQ, VOCAB
from .pipeline import Pipeline
from .pipeline import run as run_pipeline
from .rope import rope_tables, rope_tables_at

# A jax.checkpoint policy, e.g. jax.checkpoint_policies.nothing_saveable.
RematPolicy = Callable[..., Any]
# weights(stored) -> usable: maps a pytree of stored parameter values (an nnx.State, or one
# value) to the same pytree with plain arrays, e.g. dequantizing int8 values with their scales.
WeightHook = Callable[[Any], Any]


def _with_weights(module: nnx.Module, weights: WeightHook | None) -> nnx.Module:
  """The module rebuilt around ``weights(its parameters)``."""
  if weights is None:
    return module
  graphdef, state = nnx.split(module)
  return nnx.merge(graphdef, weights(state))


def _check_prefill_attend(attend: AttendFn | None, pos: Any) -> None:
  """``attend`` sees only the new keys, which are all a query may see only at pos 0."""
  if attend is not None and not (isinstance(pos, (int, np.integer)) and not isinstance(pos, bool) and pos == 0):
    raise JaxmemError(
      f"attend= serves prefill at pos=0 only (got pos={pos!r}); decode attends to the cache with einsums: drop attend"
    )


def _value(p: nnx.Param, weights: WeightHook | None) -> jax.Array:
  v = p.get_value()
  return v if weights is None else weights(v)


class Block(nnx.Module):
  """x + attn(norm(x)), then x + mlp(norm(x)): the pre-norm block of GPT-2 and Llama.

  ``moe`` swaps the MLP for a mixture of experts (:class:`~.moe.MoE`); ``cfg.kv_lora_rank``
  swaps attention for multi-head latent attention (:class:`~.mla.MLAttention`).
  """

  def __init__(
    self, cfg: ModelConfig, *, moe: bool = False, window: int | None = None, kv_shared: bool = False, rngs: nnx.Rngs
  ):
    # GPT-2 scales the init of the projections that write into the residual stream by
    # 1/sqrt(2 * num_layers) (Radford et al. 2019, section 2.3), so the stream's variance does
    # not grow with depth.
    out_init = nnx.initializers.normal(stddev=0.02 / math.sqrt(2 * cfg.num_layers))
    # cfg.norm_layout: pre-norms (attn_norm, mlp_norm) unless "post"; norms of each sub-block's
    # output (post_attn_norm, post_mlp_norm) unless "pre" (Gemma 2/3 have both, OLMo 2 the latter).
    self.layout = cfg.norm_layout
    if self.layout != "post":
      self.attn_norm = make_norm(cfg, rngs=rngs)
      self.mlp_norm = make_norm(cfg, rngs=rngs)
    if self.layout != "pre":
      self.post_attn_norm = make_norm(cfg, rngs=rngs)
      self.post_mlp_norm = make_norm(cfg, rngs=rngs)
    if cfg.is_mla:
      self.attn = MLAttention(cfg, out_init=out_init, rngs=rngs)
    else:  # a global layer may have attention of its own shape (Gemma 4: ModelConfig.attention_geometry)
      self.attn = Attention(cfg, out_init=out_init, rngs=rngs, global_layer=window is None, kv_shared=kv_shared)
    self.is_moe = moe
    self.window = window  # this layer's local attention window (None: global)
    self.kv_shared = kv_shared  # Gemma 4: attends to an earlier layer's keys and values
    # Gemma 4's use_double_wide_mlp: a KV-shared layer's MLP is twice as wide (Gemma4TextMLP).
    mlp_cfg = dataclasses.replace(cfg, d_ff=2 * cfg.d_ff) if kv_shared and cfg.kv_shared_double_mlp else cfg
    self.mlp = MoE(cfg, out_init=out_init, rngs=rngs) if moe else make_mlp(mlp_cfg, out_init=out_init, rngs=rngs)
    # Gemma 4's MoE block (Gemma4TextDecoderLayer with enable_moe_block): the dense MLP stays beside
    # the experts (``mlp``), with post_feedforward_layernorm_1 on its output (post_dense_norm),
    # pre_feedforward_layernorm_2 on the experts' input (experts_norm) and
    # post_feedforward_layernorm_2 on their output (post_experts_norm).
    self.beside_dense = moe and cfg.moe_beside_dense
    if self.beside_dense:
      self.dense_mlp = make_mlp(mlp_cfg, out_init=out_init, rngs=rngs)
      self.post_dense_norm = make_norm(cfg, rngs=rngs)
      self.experts_norm = make_norm(cfg, rngs=rngs)
      self.post_experts_norm = make_norm(cfg, rngs=rngs)
    # Gemma 4's per-layer embeddings (Gemma4TextDecoderLayer: per_layer_input_gate,
    # per_layer_projection, post_per_layer_input_norm), applied after the MLP's residual.
    self.per_layer = bool(cfg.per_layer_dim)
    if self.per_layer:
      q, pdt = cfg.per_layer_dim, cfg.param_jnp_dtype
      self.gelu = cfg.mlp_act == "gelu_tanh"
      self.dtype = cfg.compute_jnp_dtype
      self.ple_gate_dq = param(rngs, DEFAULT_INIT, (cfg.d_model, q), (EMBED, MLP), pdt)
      self.ple_proj_qd = param(rngs, out_init, (q, cfg.d_model), (MLP, EMBED), pdt)
      self.ple_norm = make_norm(cfg, rngs=rngs)

  def _per_layer(self, x_btd: jax.Array, per_layer_btq: jax.Array | None, constrain: Constrain) -> jax.Array:
    """x + norm(proj(act(gate(x)) * this layer's per-layer input)): Gemma4TextDecoderLayer.forward's
    last residual (before its layer_scalar, a buffer of ones)."""
    if not self.per_layer:
      return x_btd
    h_btq = jnp.einsum("btd,dq->btq", x_btd, self.ple_gate_dq[...].astype(self.dtype))
    h_btq = (jax.nn.gelu(h_btq, approximate=True) if self.gelu else jax.nn.silu(h_btq)) * per_layer_btq.astype(self.dtype)
    y_btd = jnp.einsum("btq,qd->btd", h_btq, self.ple_proj_qd[...].astype(self.dtype))
    return x_btd + constrain(self.ple_norm(y_btd), (BATCH, NORM_SEQ, EMBED))

  def _pre(self, norm: str, x_btd: jax.Array) -> jax.Array:
    return x_btd if self.layout == "post" else getattr(self, norm)(x_btd)

  def _post(self, norm: str, y_btd: jax.Array) -> jax.Array:
    return y_btd if self.layout == "pre" else getattr(self, norm)(y_btd)

  def _window(self) -> dict:
    return {} if self.window is None else {"window": self.window}

  def _ffn(self, x_btd: jax.Array, constrain: Constrain, experts: ExpertsFn | None) -> jax.Array:
    h_btd = _gathered(self._pre("mlp_norm", x_btd), constrain)
    if self.beside_dense:
      # Gemma4TextDecoderLayer.forward: post_feedforward_layernorm(post_feedforward_layernorm_1(mlp(
      # pre_feedforward_layernorm(x))) + post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(x))),
      # the router taking x itself (the residual before any norm).
      dense_btd = self.post_dense_norm(self.dense_mlp(h_btd, constrain=constrain))
      routed_btd = self.mlp(
        _gathered(self.experts_norm(x_btd), constrain), constrain=constrain, experts=experts,
        route_btd=_gathered(x_btd, constrain),
      )
      return self.post_mlp_norm(dense_btd + self.post_experts_norm(routed_btd))
    if self.is_moe:
      return self._post("post_mlp_norm", self.mlp(h_btd, constrain=constrain, experts=experts))
    return self._post("post_mlp_norm", self.mlp(h_btd, constrain=constrain))

  def __call__(
    self,
    x_btd: jax.Array,
    *,
    rope_sin_tk: jax.Array | None,
    rope_cos_tk: jax.Array | None,
    constrain: Constrain,
    attend: AttendFn | None = None,
    experts: ExpertsFn | None = None,
    dropout: Dropout | None = None,
    kv: tuple[jax.Array, jax.Array] | None = None,
    return_kv: bool = False,
    per_layer_btq: jax.Array | None = None,
  ) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """The block in training: ``dropout`` (one layer's, :mod:`.dropout`) drops the attention
    probabilities and both sub-blocks' outputs before they join the residual stream. ``kv``:
    a KV-shared layer's keys and values; ``return_kv``: (x, this layer's (k, v)) (Attention).
    ``per_layer_btq``: this layer's per-layer input (Gemma 4's per-layer embeddings)."""
    attn = self.attn(
      _gathered(self._pre("attn_norm", x_btd), constrain), rope_sin_tk=rope_sin_tk, rope_cos_tk=rope_cos_tk,
      constrain=constrain, attend=attend, dropout=None if dropout is None else dropout.at(ATTENTION_PROBS),
      **self._window(), **self._kv(kv, return_kv),
    )
    attn_btd, layer_kv = attn if return_kv else (attn, None)
    attn_btd = self._post("post_attn_norm", attn_btd)
    x_btd = constrain(x_btd + maybe(dropout, ATTENTION_OUT, attn_btd), (BATCH, NORM_SEQ, EMBED))
    x_btd = x_btd + maybe(dropout, MLP_OUT, self._ffn(x_btd, constrain, experts))
    x_btd = constrain(self._per_layer(x_btd, per_layer_btq, constrain), (BATCH, NORM_SEQ, EMBED))
    return (x_btd, layer_kv) if return_kv else x_btd

  @staticmethod
  def _kv(kv: tuple[jax.Array, jax.Array] | None, return_kv: bool) -> dict:
    """The KV-sharing keywords for Attention, only where set (MLA takes none)."""
    return {**({} if kv is None else {"kv": kv}), **({"return_kv": True} if return_kv else {})}

  def cached(
    self,
    x_btd: jax.Array,
    *layer_cache: jax.Array,
    pos: jax.Array,
    rope_sin_tk: jax.Array | None,
    rope_cos_tk: jax.Array | None,
    constrain: Constrain,
    attend: AttendFn | None = None,
    kv: tuple[jax.Array, jax.Array] | None = None,
    return_kv: bool = False,
    per_layer_btq: jax.Array | None = None,
  ) -> tuple[jax.Array, ...]:
    """The block for tokens at pos.. against this layer's cache arrays (KV: k, v; MLA: latent,
    rope key; see Attention.cached and MLAttention.cached): (x_btd, *updated cache arrays).
    ``attend`` serves prefill (see Transformer.cached). A KV-shared layer reads the cache of the
    layer it shares with, gets that layer's new keys and values (``kv``) and returns (x_btd,);
    ``return_kv`` appends this layer's new (k, v) (Attention.cached)."""
    attn_btd, *layer_cache = self.attn.cached(
      self._pre("attn_norm", x_btd), *layer_cache, pos=pos, rope_sin_tk=rope_sin_tk, rope_cos_tk=rope_cos_tk,
      constrain=constrain, attend=attend, **self._window(), **self._kv(kv, return_kv),
    )
    x_btd = constrain(x_btd + self._post("post_attn_norm", attn_btd), (BATCH, SEQ, EMBED))
    x_btd = x_btd + self._ffn(x_btd, constrain, None)
    x_btd = self._per_layer(x_btd, per_layer_btq, constrain)
    return (constrain(x_btd, (BATCH, SEQ, EMBED)), *layer_cache)


def _gathered(h_btd: jax.Array, constrain: Constrain) -> jax.Array:
  """A norm's output, computed where the residual stream is (split along the sequence over the
  tensor axis under sequence parallelism), then whole along the sequence for the column-parallel
  matmuls that take it in: Megatron's all-gather ``g`` (Korthikanti et al. 2022, section 4.2.2,
  figure 5). Without sequence parallelism both constraints are the one the stream already has."""
  return constrain(constrain(h_btd, (BATCH, NORM_SEQ, EMBED)), (BATCH, SEQ, EMBED))


def _block_stack(
  cfg: ModelConfig, num: int, *, moe: bool, window: int | None = None, kv_shared: bool = False, rngs: nnx.Rngs
) -> Block:
  """``num`` Blocks stacked: split_rngs gives each layer its own key, vmap stacks the resulting
  parameters on axis 0 and prepends "layers" to their logical axes."""

  @nnx.split_rngs(splits=num)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYERS})
  def make_blocks(rngs: nnx.Rngs) -> Block:
    return Block(cfg, moe=moe, window=window, kv_shared=kv_shared, rngs=rngs)

  return make_blocks(rngs)


@dataclasses.dataclass(frozen=True)
class Segment:
  """Layers first .. first + groups * len(kinds) - 1 of a model whose layers differ in a
  repeating pattern: ``groups`` repetitions of ``kinds``, each (MoE, window) for one position of
  the pattern. Each position is one stack of ``groups`` blocks; one scan over the groups runs
  the positions in turn, so every layer's window and MLP are fixed when it is compiled.

  ``kv`` (Gemma 4's KV sharing, transformers' Gemma4TextConfig.kv_sharing_modes): "own", layers
  with their own keys and values; "store", the one period before the shared layers, whose last
  layer of each attention type hands its keys and values on; "reuse", the shared layers."""

  first: int
  groups: int
  kinds: tuple[tuple[bool, int | None], ...]
  kv: str = "own"

  def stores(self, p: int) -> bool:
    """Whether position ``p`` is the last of its attention type in a "store" segment."""
    return self.kv == "store" and all(w != self.kinds[p][1] for _, w in self.kinds[p + 1 :])


def layer_segments(cfg: ModelConfig) -> tuple[Segment, ...]:
  """The segments of a patterned model (``cfg.is_patterned``): the dense prefix and the rest,
  each as whole periods of the pattern plus the remainder (Gemma 3 27B's 62 layers: 10 groups
  of five local and one global layer, then two local layers)."""
  every = cfg.global_every if cfg.sliding_window is not None else 0
  period = math.lcm(every or 1, cfg.moe_every if cfg.is_moe else 1)
  kind = lambda i: (cfg.layer_is_moe(i), cfg.layer_window(i))  # noqa: E731
  out = []
  dense = cfg.first_dense_layers if cfg.is_moe else 0
  ranges = ((0, dense, "own"), (dense, cfg.num_layers, "own"))
  if cfg.kv_shared_layers:  # whole periods before the shared layers (ModelConfig's _check_kv_sharing)
    fs = cfg.first_kv_shared_layer
    ranges = ((0, fs - period, "own"), (fs - period, fs, "store"), (fs, cfg.num_layers, "reuse"))
  for a, b, kv in ranges:
    n = b - a
    if n <= 0:
      continue
    groups, rest = divmod(n, period)
    if groups:
      out.append(Segment(a, groups, tuple(kind(i) for i in range(a, a + period)), kv))
    if rest:
      out.append(Segment(a + groups * period, 1, tuple(kind(i) for i in range(b - rest, b)), kv))
  return tuple(out)


def _segment_slices(per_layer_btlq: jax.Array | None, seg: Segment) -> jax.Array | None:
  """A segment's per-layer inputs as scan xs: [groups, period, batch, seq, per_layer_dim]."""
  if per_layer_btlq is None:
    return None
  b, t, _, q = per_layer_btlq.shape
  period = len(seg.kinds)
  x_btgpq = per_layer_btlq[:, :, seg.first : seg.first + seg.groups * period].reshape(b, t, seg.groups, period, q)
  return jnp.transpose(x_btgpq, (2, 3, 0, 1, 4))


class Transformer(nnx.Module):
  """Decoder-only language model; ``cfg.style`` selects GPT-2 or Llama 3 (see ModelConfig).

  Parameters (``nnx.Param``, logical axes in brackets; block parameters are stacked, with
  "layers" prepended):
    embed.table_vd [vocab, embed]; pos_embed_pd [pos, embed] (gpt2);
    blocks.{attn_norm,mlp_norm}.scale_d (and .bias_d for gpt2) [layers, norm];
    blocks.attn.w_q_dnh [layers, embed, heads, head_dim], w_k_dkh / w_v_dkh
      [layers, embed, kv_heads, head_dim], w_o_nhd [layers, heads, head_dim, embed] (a Gemma 4
      global layer's with its own kv heads and head_dim, and no w_v_dkh with k_eq_v)
      (+ biases b_q_nh, b_k_kh, b_v_kh, b_o_d for gpt2; b_q_nh, b_k_kh, b_v_kh with qkv_bias;
      q_norm.scale_h, k_norm.scale_h [layers, norm] with qk_norm);
    blocks.mlp: gpt2 w_in_df, b_in_f, w_out_fd, b_out_d; llama3 w_gate_df, w_up_df,
      w_down_fd [layers, embed|mlp, ...];
    final_norm.scale_d (.bias_d) [norm]; unembed_dv [embed, vocab] unless tied;
    Gemma 4's per-layer embeddings: ple_table_vq [vocab, embed] (per_layer_vocab rows of
      num_layers * per_layer_dim), ple_proj_dq [embed, mlp], ple_norm.scale_h [norm], and in
      every block ple_gate_dq [layers, embed, mlp], ple_proj_qd [layers, mlp, embed],
      ple_norm.scale_d [layers, norm]; a Gemma 4 KV-shared block's attn has no w_k_dkh, w_v_dkh
      or k_norm.
  Mixture-of-experts models stack their first ``first_dense_layers`` layers in ``blocks`` and
  the rest in ``moe_blocks``, whose ``mlp`` is an MoE: router.w_router_de [layers, embed, exp_scores]
  (+ b_select_e [layers, exp_scores]), w_gate_edf / w_up_edf [layers, exp, embed, mlp], w_down_efd
  [layers, exp, mlp, embed], and shared.* (a SwiGLU) with shared experts. MLA models' ``attn``
  holds w_q_a_dq, q_norm_q, w_q_b_qnh (or w_q_dnh), w_kv_a_dx, kv_norm_c, w_k_b_cnh, w_v_b_cnv,
  w_o_nvd (see mla.py).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = Embed(cfg, rngs=rngs)
    if cfg.style == "gpt2":
      # GPT-2 initialises its position table with std 0.01 (openai/gpt-2 model.py, "wpe").
      self.pos_embed_pd = param(
        rngs, nnx.initializers.normal(stddev=0.01), (cfg.max_seq_len, cfg.d_model), (POS, EMBED),
        cfg.param_jnp_dtype,
      )

    # One Block per layer, in stacks of identical blocks (see _block_stack): `blocks` holds the
    # layers with a dense MLP (every layer of a dense model, the first_dense_layers of an MoE
    # one), `moe_blocks` the mixture-of-experts layers after them. Each stack is one scan.
    # A patterned model (layers differing in a repeating pattern: local and global attention,
    # MoE and dense MLPs) has one stack per position of each segment instead, blocks_{s}_{p}
    # (layer_segments).
    if cfg.is_patterned:
      for s, seg in enumerate(layer_segments(cfg)):
        for p, (moe, window) in enumerate(seg.kinds):
          stack = _block_stack(cfg, seg.groups, moe=moe, window=window, kv_shared=seg.kv == "reuse", rngs=rngs)
          setattr(self, f"blocks_{s}_{p}", stack)
    else:
      window = cfg.layer_window(0)  # every layer's, unpatterned
      if cfg.num_dense_layers:
        self.blocks = _block_stack(cfg, cfg.num_dense_layers, moe=False, window=window, rngs=rngs)
      if cfg.num_moe_layers:
        self.moe_blocks = _block_stack(cfg, cfg.num_moe_layers, moe=True, window=window, rngs=rngs)
    if cfg.per_layer_dim:  # Gemma4TextModel: embed_tokens_per_layer, per_layer_model_projection, its norm
      lq, pdt = cfg.num_layers * cfg.per_layer_dim, cfg.param_jnp_dtype
      self.ple_table_vq = param(rngs, DEFAULT_INIT, (cfg.per_layer_vocab, lq), (VOCAB, EMBED), pdt)
      self.ple_proj_dq = param(rngs, DEFAULT_INIT, (cfg.d_model, lq), (EMBED, MLP), pdt)
      self.ple_norm = HeadRMSNorm(cfg, rngs=rngs, head_dim=cfg.per_layer_dim)
    self.final_norm = make_norm(cfg, rngs=rngs)
    if not cfg.tie_embeddings:
      self.unembed_dv = param(rngs, DEFAULT_INIT, (cfg.d_model, cfg.vocab_size), (EMBED, VOCAB), cfg.param_jnp_dtype)

  def stacks(self) -> list[tuple[Block, int, int]]:
    """(stacked blocks, first layer, number of layers) in layer order: the dense layers, then
    the MoE layers, each when present."""
    cfg = self.cfg
    if cfg.is_patterned:
      raise JaxmemError(f"model {cfg.name!r}: its layers differ in a pattern; use segment_stacks()")
    out = []
    if cfg.num_dense_layers:
      out.append((self.blocks, 0, cfg.num_dense_layers))
    if cfg.num_moe_layers:
      out.append((self.moe_blocks, cfg.num_dense_layers, cfg.num_moe_layers))
    return out

  def segment_stacks(self) -> list[tuple[Segment, list[Block]]]:
    """A patterned model's segments, each with its stacks of blocks, one per pattern position."""
    return [
      (seg, [getattr(self, f"blocks_{s}_{p}") for p in range(len(seg.kinds))])
      for s, seg in enumerate(layer_segments(self.cfg))
    ]

  @property
  def rope_dim(self) -> int:
    # MLA rotates only its decoupled qk_rope_head_dim channels (mla.py, eqs. 14-15).
    return self.cfg.qk_rope_head_dim if self.cfg.is_mla else self.cfg.head_dim

  @property
  def global_rope_dim(self) -> int:
    """The global layers' RoPE width: their own head_dim in Gemma 4, else rope_dim."""
    return self.cfg.attention_geometry(None)[1] if self.cfg.has_global_geometry else self.rope_dim

  def __call__(
    self,
    tokens_bt: jax.Array,
    *,
    remat: RematPolicy | None = None,
    constrain: Constrain | None = None,
    attend: AttendFn | None = None,
    experts: ExpertsFn | None = None,
    pipeline: Pipeline | None = None,
    dropout_key: jax.Array | None = None,
  ) -> jax.Array:
    """Float32 next-token logits [batch, seq, vocab] for integer tokens [batch, seq]:
    ``logits(hidden(tokens_bt, ...))``; the arguments are :meth:`hidden`'s."""
    constrain = no_constraint if constrain is None else constrain
    x_btd = self.hidden(
      tokens_bt, remat=remat, constrain=constrain, attend=attend, experts=experts, pipeline=pipeline,
      dropout_key=dropout_key,
    )
    return self.logits(x_btd, constrain=constrain)

  def loss(
    self,
    tokens_bt: jax.Array,
    targets_bt: jax.Array,
    *,
    remat: RematPolicy | None = None,
    constrain: Constrain | None = None,
    attend: AttendFn | None = None,
    experts: ExpertsFn | None = None,
    vocab_tiles: int = 1,
    pipeline: Pipeline | None = None,
    dropout_key: jax.Array | None = None,
  ) -> jax.Array:
    """Mean next-token cross entropy (float32 scalar) of the logits against ``targets_bt``.

    ``vocab_tiles`` > 1 computes the output projection and the cross entropy tile by tile
    under ``jax.checkpoint`` (MaxText's ``num_vocab_tiling``; see :func:`.loss.cross_entropy`),
    so the float32 [batch, seq, vocab] logits never exist whole; 1 is exactly
    ``optax.softmax_cross_entropy_with_integer_labels(self(tokens_bt), targets_bt).mean()``.
    """
    constrain = no_constraint if constrain is None else constrain
    x_btd = self.hidden(
      tokens_bt, remat=remat, constrain=constrain, attend=attend, experts=experts, pipeline=pipeline,
      dropout_key=dropout_key,
    )
    return cross_entropy(
      x_btd, targets_bt, functools.partial(self.logits, constrain=constrain), vocab_tiles=vocab_tiles,
      constrain=constrain,
    )

  def hidden(
    self,
    tokens_bt: jax.Array,
    *,
    remat: RematPolicy | None = None,
    constrain: Constrain | None = None,
    attend: AttendFn | None = None,
    experts: ExpertsFn | None = None,
    pipeline: Pipeline | None = None,
    dropout_key: jax.Array | None = None,
  ) -> jax.Array:
    """The final-normed hidden states [batch, seq, d_model] (compute dtype) for tokens [batch, seq].

    Args:
      tokens_bt: int token ids, shape [batch, seq], seq <= max_seq_len for gpt2.
      remat: None runs the blocks without any ``jax.checkpoint`` (the baseline: every
        residual the backward pass needs is saved). A policy callable (e.g.
        ``jax.checkpoint_policies.dots_saveable``) wraps the scanned block body in
        ``jax.checkpoint(body, policy=remat, prevent_cse=False)``; prevent_cse is
        unnecessary inside scan (JAX's own advice) and would only block optimisation.
      constrain: ``constrain(x, logical_axes) -> x`` applied to the embeddings, the residual
        stream, q/k/v, attention context, MLP hidden, block outputs and logits; typically
        ``jax.lax.with_sharding_constraint`` through the caller's logical->mesh rules.
      attend: how attention is computed (:data:`AttendFn`); None is plain einsum attention.
      experts: how an MoE layer's routed experts are computed (:data:`~.moe.ExpertsFn`, e.g.
        a sharded one); None is the implementation ``cfg.moe_impl`` names.
      pipeline: each stack of layers pipelined over the ``stage`` mesh axis
        (:mod:`.pipeline`: GPipe or MaxText's circular schedule); None runs the layers in one scan.
      dropout_key: a PRNG key for ``cfg.dropout`` (training): the embeddings, attention
        probabilities and both sub-blocks' outputs are dropped, each layer with its own key.
        None, or a rate of 0, runs without dropout.
    """
    cfg = self.cfg
    constrain = no_constraint if constrain is None else constrain
    _, t = tokens_bt.shape

    x_btd = self.embed(tokens_bt)
    rope_sin_tk = rope_cos_tk = None
    # A context-parallel attend stores the sequence load balanced (context_attention.py): its
    # ``positions`` give each storage index's natural position, for the position encodings.
    positions = getattr(attend, "positions", None)
    positions_t = None if positions is None else jnp.asarray(positions(t))
    if cfg.style == "gpt2":
      if t > cfg.max_seq_len:
        raise JaxmemError(f"model {cfg.name!r}: sequence length {t} exceeds max_seq_len {cfg.max_seq_len}")
      table_td = self.pos_embed_pd[:t] if positions_t is None else jnp.take(self.pos_embed_pd[...], positions_t, axis=0)
      x_btd = x_btd + table_td.astype(x_btd.dtype)[None]
    elif positions_t is not None:
      rope_sin_tk, rope_cos_tk = rope_tables_at(positions_t, self.rope_dim, cfg.rope_theta)
    else:
      # Computed once outside the scan and closed over: identical for every layer.
      rope_sin_tk, rope_cos_tk = rope_tables(t, self.rope_dim, cfg.rope_theta)
    rope_global = (rope_sin_tk, rope_cos_tk)
    if self.global_rope_dim != self.rope_dim:  # Gemma 4's global layers: their own head_dim
      rope_global = (
        rope_tables_at(positions_t, self.global_rope_dim, cfg.rope_theta) if positions_t is not None
        else rope_tables(t, self.global_rope_dim, cfg.rope_theta)
      )
    dropout = Dropout(cfg.dropout, dropout_key) if cfg.dropout and dropout_key is not None else None
    x_btd = constrain(maybe(dropout, EMBEDDINGS, x_btd), (BATCH, NORM_SEQ, EMBED))
    if cfg.is_patterned:
      if dropout is not None or pipeline is not None:
        raise JaxmemError(f"model {cfg.name!r}: dropout and a stage axis are not built for layers that differ in a pattern")
      x_btd = self._patterned(
        x_btd, remat=remat, rope=(rope_sin_tk, rope_cos_tk), rope_global=rope_global, constrain=constrain,
        attend=attend, experts=experts, per_layer_btlq=self.per_layer_inputs(tokens_bt, x_btd),
      )
      return constrain(self.final_norm(x_btd), (BATCH, NORM_SEQ, EMBED))

    for index, (stack, _, num) in enumerate(self.stacks()):
      # Split once: the scan carries the residual stream and slices one layer of parameters
      # per step; merging inside the body rebuilds a plain Block around that slice.
      block_def, block_state = nnx.split(stack)

      # Each layer's dropout key rides the scan beside its parameters (xs), one per layer.
      layer_keys = None if dropout is None else jax.random.split(dropout.at(EMBEDDINGS + 1 + index).key, num)

      def body(carry_btd: jax.Array, xs: Any, block_def=block_def) -> tuple[jax.Array, None]:
        layer_state, layer_key = xs
        # The layer's input, by name, so a remat policy can offload it (names.DECODER_LAYER_INPUT).
        carry_btd = checkpoint_name(carry_btd, DECODER_LAYER_INPUT)
        block = nnx.merge(block_def, layer_state)
        y_btd = block(
          carry_btd, rope_sin_tk=rope_sin_tk, rope_cos_tk=rope_cos_tk, constrain=constrain, attend=attend,
          experts=experts, dropout=None if layer_key is None else Dropout(cfg.dropout, layer_key),
        )
        return y_btd, None

      if remat is not None:
        body = jax.checkpoint(body, policy=remat, prevent_cse=False)
      if pipeline is None:
        x_btd, _ = jax.lax.scan(body, x_btd, (block_state, layer_keys))
      else:  # one group of layers per stage and iteration, the same body scanned inside it
        if dropout is not None:
          raise JaxmemError("`dropout` with a stage axis is not built (the pipeline's iterations carry no keys); drop one")
        stage_fn = lambda state, x, body=body: jax.lax.scan(body, x, (state, None))[0]  # noqa: E731
        x_btd = run_pipeline(pipeline, stage_fn, block_state, x_btd, layer_policy=remat)

    return constrain(self.final_norm(x_btd), (BATCH, NORM_SEQ, EMBED))

  def _patterned(self, x_btd, *, remat, rope, rope_global, constrain, attend, experts, per_layer_btlq=None) -> jax.Array:
    """The layers of a patterned model: per segment, one scan over its groups, each step
    running the pattern's positions in turn (each layer under its own jax.checkpoint).
    ``rope_global``: the global layers' RoPE tables (their own head_dim in Gemma 4).

    Gemma 4's KV sharing: the "store" segment's scan returns the keys and values of its last
    layer of each attention type, and the "reuse" segment's layers close over them, so they stay
    live (and are saved for the backward pass) across every shared layer (Segment.kv).
    ``per_layer_btlq``: Gemma 4's per-layer inputs (per_layer_inputs), a slice per layer riding
    the scan beside its parameters."""
    shared: dict[int | None, tuple[jax.Array, jax.Array]] = {}  # window (None: global) -> (k, v)
    for seg, stacks in self.segment_stacks():
      split = [nnx.split(stack) for stack in stacks]
      defs = [d for d, _ in split]

      def layer(carry_btd, xs, block_def, rope, kv, store):
        layer_state, per_layer_btq = xs
        carry_btd = checkpoint_name(carry_btd, DECODER_LAYER_INPUT)
        block = nnx.merge(block_def, layer_state)
        return block(
          carry_btd, rope_sin_tk=rope[0], rope_cos_tk=rope[1], constrain=constrain, attend=attend, experts=experts,
          kv=kv, return_kv=store, per_layer_btq=per_layer_btq,
        )

      stores = [seg.stores(p) for p in range(len(seg.kinds))]
      runs = [
        functools.partial(
          layer, block_def=d, rope=rope_global if window is None else rope,
          kv=shared[window] if seg.kv == "reuse" else None, store=store,
        )
        for d, (_, window), store in zip(defs, seg.kinds, stores, strict=True)
      ]
      if remat is not None:
        runs = [jax.checkpoint(r, policy=remat, prevent_cse=False) for r in runs]

      def body(carry_btd, xs, runs=runs, stores=stores):
        states, per_layer_pbtq = xs
        stored = []
        for p, (run, layer_state, store) in enumerate(zip(runs, states, stores, strict=True)):
          layer_xs = (layer_state, None if per_layer_pbtq is None else per_layer_pbtq[p])
          if store:
            carry_btd, kv = run(carry_btd, layer_xs)
            stored.append(kv)
          else:
            carry_btd = run(carry_btd, layer_xs)
        return carry_btd, tuple(stored)

      per_layer = _segment_slices(per_layer_btlq, seg)
      x_btd, stored = jax.lax.scan(body, x_btd, (tuple(state for _, state in split), per_layer))
      windows = [window for (_, window), store in zip(seg.kinds, stores, strict=True) if store]
      for window, kv in zip(windows, stored, strict=True):  # the last group's: the layers before the shared ones
        shared[window] = jax.tree.map(lambda a: a[-1], kv)
    return x_btd

  def per_layer_inputs(self, tokens_bt: jax.Array, x_btd: jax.Array, weights: WeightHook | None = None) -> jax.Array | None:
    """Every layer's per-layer input [batch, seq, layers, per_layer_dim] (Gemma 4's per-layer
    embeddings; None without them): Gemma4TextModel.get_per_layer_inputs (the table's rows
    scaled by sqrt(per_layer_dim)) plus project_per_layer_inputs (the embeddings projected,
    scaled by d_model^-1/2 and RMS-normed per layer), summed and scaled by 2^-1/2. Computed
    before the layers and live across all of them, as there."""
    cfg = self.cfg
    if not cfg.per_layer_dim:
      return None
    b, t = tokens_bt.shape
    lq, q, dt = (cfg.num_layers, cfg.per_layer_dim), cfg.per_layer_dim, cfg.compute_jnp_dtype
    rows = jax.tree.map(lambda a: jnp.take(a, tokens_bt, axis=0), self.ple_table_vq.get_value())
    rows_btq = (rows if weights is None else weights(rows)).astype(dt) * math.sqrt(q)
    proj_btq = jnp.einsum("btd,dq->btq", x_btd, _value(self.ple_proj_dq, weights).astype(dt)) * cfg.d_model**-0.5
    norm = _with_weights(self.ple_norm, weights)
    return (norm(proj_btq.reshape(b, t, *lq)) + rows_btq.reshape(b, t, *lq)) * 2**-0.5

  def logits(self, x_btd: jax.Array, *, constrain: Constrain | None = None) -> jax.Array:
    """Float32 logits [batch, seq, vocab] of final-normed hidden states (the output projection);
    soft-capped, c * tanh(logits / c), with ``cfg.final_softcap`` (Gemma 2)."""
    constrain = no_constraint if constrain is None else constrain
    if self.cfg.tie_embeddings:
      logits_btv = self.embed.attend(x_btd)
    else:
      logits_btv = jnp.einsum(
        "btd,dv->btv", x_btd, self.unembed_dv[...].astype(x_btd.dtype), preferred_element_type=jnp.float32
      )
    if self.cfg.final_softcap is not None:
      cap = self.cfg.final_softcap
      logits_btv = cap * jnp.tanh(logits_btv / cap)
    return constrain(logits_btv, (BATCH, SEQ, VOCAB))

  def cached(
    self,
    tokens_bt: jax.Array,
    cache: KVCache | MLACache,
    *,
    pos: jax.Array | int = 0,
    constrain: Constrain | None = None,
    weights: WeightHook | None = None,
    last_only: bool = True,
    attend: AttendFn | None = None,
  ) -> tuple[jax.Array, KVCache | MLACache]:
    """Inference with a KV cache: (float32 logits, the updated cache).

    ``tokens_bt`` sit at positions pos .. pos+t-1; their keys and values are written into
    ``cache`` (see :class:`KVCache`; an MLA model takes an :class:`~.mla.MLACache` of latents,
    ``mla.cache_class(cfg)``) and every query attends to the cached positions up to its
    own. Prefill is a prompt at ``pos=0``; decode is one token (t = 1) at ``pos``. ``pos`` may be
    traced, so one compiled decode step serves every position. With ``last_only`` the logits are
    those of the last token only ([batch, 1, vocab]), which is all generation needs.

    ``weights`` (a :data:`WeightHook`) turns stored parameters into arrays. It is applied to one
    layer's parameters *inside* the scanned body, so a dequantized copy of at most one layer
    can exist at a time, and to the embedding, final norm and unembedding where they are used.
    The cache is carried through the layer scan and updated in place one layer at a time; its
    kv heads precede its positions so that GPU, too, updates it in place (see :mod:`.cache`).

    ``attend`` (an :data:`AttendFn`) serves prefill only: at ``pos=0`` (a Python 0, so that it
    is known when tracing) the prompt attends to its own keys with it, e.g. a fused kernel.
    Decode attends to the cache with einsums, so ``attend`` with any other ``pos`` is an error.
    """
    cfg = self.cfg
    constrain = no_constraint if constrain is None else constrain
    _, t = tokens_bt.shape
    _check_prefill_attend(attend, pos)
    pos = jnp.asarray(pos, jnp.int32)

    if weights is None:
      x_btd = self.embed(tokens_bt)
    else:
      # Gather the stored rows (and, quantized, their per-row scales) first, then make them
      # usable: the hook on the whole table would dequantize all V x D of it for B x T rows.
      rows = jax.tree.map(lambda a: jnp.take(a, tokens_bt, axis=0), self.embed.table_vd.get_value())
      x_btd = weights(rows).astype(cfg.compute_jnp_dtype)
    rope_sin_tk = rope_cos_tk = None
    if cfg.style == "gpt2":
      if cache.context > cfg.max_seq_len:
        raise JaxmemError(
          f"model {cfg.name!r}: context {cache.context} exceeds max_seq_len {cfg.max_seq_len}"
        )
      pos_pd = _value(self.pos_embed_pd, weights)
      x_btd = x_btd + jax.lax.dynamic_slice_in_dim(pos_pd, pos, t, axis=0).astype(x_btd.dtype)[None]
    else:
      rope_sin_tk, rope_cos_tk = rope_tables_at(pos + jnp.arange(t), self.rope_dim, cfg.rope_theta)
    rope_global = (rope_sin_tk, rope_cos_tk)
    if self.global_rope_dim != self.rope_dim:  # Gemma 4's global layers: their own head_dim
      rope_global = rope_tables_at(pos + jnp.arange(t), self.global_rope_dim, cfg.rope_theta)
    x_btd = constrain(x_btd, (BATCH, SEQ, EMBED))

    per_layer_btlq = self.per_layer_inputs(tokens_bt, x_btd, weights)
    arrays = tuple(getattr(cache, f.name) for f in dataclasses.fields(cache))
    shared: dict = {}  # Gemma 4's KV sharing: window -> the new tokens' (k, v) of the layer shared
    for seg, stacks in self._cache_segments():
      x_btd, arrays = self._cached_segment(
        stacks, seg, x_btd, arrays, local_cache=isinstance(cache, LocalKVCache), pos=pos,
        rope_sin_tk=rope_sin_tk, rope_cos_tk=rope_cos_tk, rope_global=rope_global, constrain=constrain,
        weights=weights, attend=attend, shared=shared, per_layer=_segment_slices(per_layer_btlq, seg),
      )

    if last_only:
      x_btd = x_btd[:, -1:]
    x_btd = _with_weights(self.final_norm, weights)(x_btd)
    if cfg.tie_embeddings:
      # The output projection contracts with every row, so here the whole (tied) table is
      # dequantized: a V x D temporary that gathering rows cannot avoid.
      logits_btv = _with_weights(self.embed, weights).attend(x_btd)
    else:
      logits_btv = jnp.einsum(
        "btd,dv->btv", x_btd, _value(self.unembed_dv, weights).astype(x_btd.dtype),
        preferred_element_type=jnp.float32,
      )
    if cfg.final_softcap is not None:
      logits_btv = cfg.final_softcap * jnp.tanh(logits_btv / cfg.final_softcap)
    return constrain(logits_btv, (BATCH, SEQ, VOCAB)), type(cache)(*arrays)

  def _cache_segments(self) -> list[tuple[Segment, list[Block]]]:
    """Every segment with its stacks; an unpatterned model's stacks are segments of one position."""
    if self.cfg.is_patterned:
      return self.segment_stacks()
    window = self.cfg.layer_window(0)
    return [(Segment(first, num, ((stack.is_moe, window),)), [stack]) for stack, first, num in self.stacks()]

  def _cache_slices(self, seg: Segment, *, local_cache: bool, n_arrays: int) -> list[tuple[int, int, int, int]]:
    """For each layer of ``seg``'s period, (lo, hi, base, per): it reads and writes cache arrays
    ``lo:hi`` at index ``base + group * per`` (see :meth:`_cached_segment`)."""
    first, kinds = seg.first, seg.kinds
    windowed = lambda i: self.cfg.layer_window(i) is not None  # noqa: E731
    plan = []
    for p, (_, window) in enumerate(kinds):
      if not local_cache:
        plan.append((0, n_arrays, first + p, len(kinds)))
        continue
      local = window is not None
      if seg.kv == "reuse":  # the layer shared with: the same slice for every group
        before = sum(windowed(i) == local for i in range(self.cfg.kv_source(first + p)))
        plan.append((2, 4, before, 0) if local else (0, 2, before, 0))
        continue
      before = sum(windowed(i) == local for i in range(first + p))
      per = sum((w is not None) == local for _, w in kinds)
      plan.append((2, 4, before, per) if local else (0, 2, before, per))
    return plan

  def _cached_segment(
    self,
    stacks: list[Block],
    seg: Segment,
    x_btd: jax.Array,
    arrays: tuple[jax.Array, ...],
    *,
    local_cache: bool,
    pos: jax.Array,
    rope_sin_tk: jax.Array | None,
    rope_cos_tk: jax.Array | None,
    rope_global: tuple[jax.Array | None, jax.Array | None],
    constrain: Constrain,
    weights: WeightHook | None,
    attend: AttendFn | None = None,
    shared: dict,
    per_layer: jax.Array | None = None,
  ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """Scans one segment's groups over the whole-model cache arrays ([layers, ...] each),
    returning the residual stream and the updated arrays. A layer reads and writes its slice of
    the arrays of its kind: with a LocalKVCache, a windowed layer's of the windowed layers'
    (arrays 2, 3), a global layer's of the global layers' (0, 1), each indexed by how many layers
    of its kind come before it; otherwise every array, indexed by the layer.

    Gemma 4's KV-shared layers (``seg.kv`` "reuse") read the slice of the layer they share with
    and write none (the cache has no slices of theirs); the "store" segment's layers they share
    with put their new tokens' keys and values in ``shared``, by window, for prefill."""
    groups, kinds = seg.groups, seg.kinds
    split = [nnx.split(stack) for stack in stacks]
    period = len(kinds)
    plan = self._cache_slices(seg, local_cache=local_cache, n_arrays=len(arrays))
    stores = [seg.stores(p) for p in range(period)]
    reused = {w: shared[w] for _, w in kinds} if seg.kv == "reuse" else {}

    def body(carry, xs):
      x_btd, arrays = carry
      states, g, per_layer_pbtq = xs
      stored = []
      for p, ((block_def, _), layer_state, (lo, hi, base, per), (_, window), store) in enumerate(
        zip(split, states, plan, kinds, stores, strict=True)
      ):
        per_layer_btq = None if per_layer_pbtq is None else per_layer_pbtq[p]
        sin_tk, cos_tk = rope_global if window is None else (rope_sin_tk, rope_cos_tk)
        if weights is not None:
          # Inside the body: one layer's weights are made usable (dequantized) per step.
          layer_state = weights(layer_state)
        block = nnx.merge(block_def, layer_state)
        i = base + g * per
        if seg.kv == "reuse":  # reads the shared slice, writes nothing
          (x_btd,) = block.cached(
            x_btd, *(a[i] for a in arrays[lo:hi]), pos=pos, rope_sin_tk=sin_tk, rope_cos_tk=cos_tk,
            constrain=constrain, attend=attend, kv=reused[window], per_layer_btq=per_layer_btq,
          )
          continue
        # This layer's cache is read out, updated and written back whole. Writing only the new
        # token into the carried [layers, ...] cache instead lets TPU's layout choices for that
        # write reach the loop carry, and TPU then copies the whole cache around the loop.
        x_btd, *layer_arrays = block.cached(
          x_btd, *(a[i] for a in arrays[lo:hi]), pos=pos, rope_sin_tk=sin_tk, rope_cos_tk=cos_tk,
          constrain=constrain, attend=attend, return_kv=store, per_layer_btq=per_layer_btq,
        )
        if store:
          *layer_arrays, k_btkh, v_btkh = layer_arrays
          stored.append((k_btkh, v_btkh))
        updated = tuple(
          jax.lax.dynamic_update_index_in_dim(a, u, i, 0) for a, u in zip(arrays[lo:hi], layer_arrays, strict=True)
        )
        arrays = arrays[:lo] + updated + arrays[hi:]
      return (x_btd, arrays), tuple(stored)

    # Carried whole (not scan xs/ys, which would need a second, output buffer), the donated
    # cache is one buffer for every step of the loop and becomes the output.
    xs = (tuple(state for _, state in split), jnp.arange(groups, dtype=jnp.int32), per_layer)
    (x_btd, arrays), stored = jax.lax.scan(body, (x_btd, arrays), xs)
    windows = [window for (_, window), store in zip(kinds, stores, strict=True) if store]
    for window, kv in zip(windows, stored, strict=True):
      shared[window] = jax.tree.map(lambda a: a[-1], kv)
    return x_btd, arrays

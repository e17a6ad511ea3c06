"""Causal self-attention: multi-head (GPT-2) and grouped-query (Llama 3) in one module.

Grouped-query attention (Ainslie et al. 2023) shares each of ``num_kv_heads`` key/value heads
among ``num_heads // num_kv_heads`` query heads; multi-head attention is the case
``num_kv_heads == num_heads``. How softmax(q k^T) v is computed is an
:data:`~.attention_ops.AttendFn` the caller chooses (:mod:`.attention_ops`); the default is plain
einsums with a causal mask (Vaswani et al. 2017, eq. 1), which materialise the full T x T score
matrix, in the compute dtype as MaxText computes them by default.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .attention_ops import AttendFn, Local, dot_attend
from .config import ModelConfig
from .dropout import Dropout
from .fp8 import Einsum
from .layers import DEFAULT_INIT, Constrain, param
from .names import (
  BATCH,
  CONTEXT,
  EMBED,
  HEAD_DIM,
  HEADS,
  KEY_PROJ,
  KV_HEADS,
  NORM,
  NORM_SEQ,
  OUT_PROJ,
  QUERY_PROJ,
  SEQ,
  VALUE_PROJ,
)
from .rope import apply_rope


class HeadRMSNorm(nnx.Module):
  """RMSNorm over the last (head_dim) axis of [..., heads, head_dim], one scale shared by all
  heads: Qwen3's q_norm / k_norm (Qwen Team 2025, "Qwen3 Technical Report", section 2)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, head_dim: int | None = None):
    self.eps = cfg.norm_eps
    h = cfg.head_dim if head_dim is None else head_dim  # a Gemma 4 global layer's own head_dim
    self.scale_h = param(rngs, nnx.initializers.ones, (h,), (NORM,), cfg.param_jnp_dtype)

  def __call__(self, x_btnh: jax.Array) -> jax.Array:
    # Statistics in float32, as RMSNorm does; the result goes back to the compute dtype.
    x32_btnh = x_btnh.astype(jnp.float32)
    ms_btn1 = jnp.mean(jnp.square(x32_btnh), axis=-1, keepdims=True)
    y_btnh = x32_btnh * jax.lax.rsqrt(ms_btn1 + self.eps) * self.scale_h[...].astype(jnp.float32)
    return y_btnh.astype(x_btnh.dtype)


def scaleless_rms_norm(x_btnh: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last (head_dim) axis without a scale: Gemma 4's v_norm
  (transformers' Gemma4RMSNorm with with_scale=False, in Gemma4TextAttention)."""
  x32_btnh = x_btnh.astype(jnp.float32)
  ms_btn1 = jnp.mean(jnp.square(x32_btnh), axis=-1, keepdims=True)
  return (x32_btnh * jax.lax.rsqrt(ms_btn1 + eps)).astype(x_btnh.dtype)


def _ring_write(cache_bksh: jax.Array, new_btkh: jax.Array, pos: jax.Array) -> jax.Array:
  """The ring cache with tokens at positions pos.. written to slots position mod S; of more than
  S new tokens only the last S stay."""
  s, t = cache_bksh.shape[2], new_btkh.shape[1]
  new_bkth = jnp.swapaxes(new_btkh, 1, 2).astype(cache_bksh.dtype)
  if t == 1:
    zero = jnp.zeros((), jnp.int32)
    return jax.lax.dynamic_update_slice(cache_bksh, new_bkth, (zero, zero, jnp.mod(pos, s).astype(jnp.int32), zero))
  m = min(t, s)
  slots = jnp.mod(pos + t - m + jnp.arange(m), s)
  return cache_bksh.at[:, :, slots, :].set(new_bkth[:, :, t - m:], unique_indices=True)


def _softmax_with_sink(scores: jax.Array, sink: jax.Array | None) -> jax.Array:
  if sink is None:
    return jax.nn.softmax(scores, axis=-1)
  sink = jnp.broadcast_to(sink.astype(scores.dtype), scores.shape[:-1] + (1,))
  return jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]


class FullRMSNorm(nnx.Module):
  """RMSNorm over all heads' channels of [..., heads, head_dim] together, one scale per channel:
  OLMo 2's q_norm / k_norm over the whole projection (transformers' Olmo2Attention)."""

  def __init__(self, cfg: ModelConfig, heads: int, axis: str, *, rngs: nnx.Rngs):
    self.eps = cfg.norm_eps
    self.scale_nh = param(rngs, nnx.initializers.ones, (heads, cfg.head_dim), (axis, HEAD_DIM), cfg.param_jnp_dtype)

  def __call__(self, x_btnh: jax.Array) -> jax.Array:
    x32_btnh = x_btnh.astype(jnp.float32)
    ms_bt11 = jnp.mean(jnp.square(x32_btnh), axis=(-2, -1), keepdims=True)
    y_btnh = x32_btnh * jax.lax.rsqrt(ms_bt11 + self.eps) * self.scale_nh[...].astype(jnp.float32)
    return y_btnh.astype(x_btnh.dtype)


class Attention(nnx.Module):
  """Causal self-attention with optional biases (GPT-2: q/k/v/out; Qwen2: q/k/v), optional
  per-head q/k RMSNorm (Qwen3) and optional RoPE (Llama 3 style).

  ``global_layer``: the attention of a global (full-attention) layer, with Gemma 4's own
  geometry for those layers (``cfg.attention_geometry(None)``: kv heads, head_dim, and with
  k_eq_v no v projection, the values being the k projection's output).

  ``kv_shared``: a Gemma 4 KV-shared layer (transformers' Gemma4TextAttention with
  is_kv_shared_layer): q, q_norm and o only; it attends to the keys and values its caller hands
  it (``kv``), those of the last earlier layer of its type, and has no cache of its own."""

  def __init__(
    self, cfg: ModelConfig, *, out_init: nnx.Initializer, rngs: nnx.Rngs, global_layer: bool = False,
    kv_shared: bool = False, einsum: Einsum = jnp.einsum,
  ):
    k, h, self.k_eq_v = cfg.attention_geometry(None if global_layer else cfg.sliding_window)
    self.einsum = einsum  # the projections' (models/fp8.py: fp8 under quantization fp8_full)
    self.kv_shared = kv_shared
    d, n = cfg.d_model, cfg.num_heads
    pdt = cfg.param_jnp_dtype
    self.norm_eps = cfg.norm_eps
    self.v_norm = cfg.v_norm
    self.dtype = cfg.compute_jnp_dtype
    self.use_rope = cfg.style == "llama3"
    self.w_q_dnh = param(rngs, DEFAULT_INIT, (d, n, h), (EMBED, HEADS, HEAD_DIM), pdt)
    self.kv_heads = k
    if not kv_shared:
      self.w_k_dkh = param(rngs, DEFAULT_INIT, (d, k, h), (EMBED, KV_HEADS, HEAD_DIM), pdt)
    if not (self.k_eq_v or kv_shared):
      self.w_v_dkh = param(rngs, DEFAULT_INIT, (d, k, h), (EMBED, KV_HEADS, HEAD_DIM), pdt)
    self.w_o_nhd = param(rngs, out_init, (n, h, d), (HEADS, HEAD_DIM, EMBED), pdt)
    # GPT-2 has biases on all four projections; Qwen2 (cfg.qkv_bias) on q, k and v only.
    # use_bias is the output projection's bias (read by __call__ and cached).
    self.use_bias = cfg.style == "gpt2" or cfg.out_bias
    self.qkv_bias = cfg.style == "gpt2" or cfg.qkv_bias
    zeros = nnx.initializers.zeros
    if self.qkv_bias:
      self.b_q_nh = param(rngs, zeros, (n, h), (HEADS, HEAD_DIM), pdt)
      self.b_k_kh = param(rngs, zeros, (k, h), (KV_HEADS, HEAD_DIM), pdt)
      self.b_v_kh = param(rngs, zeros, (k, h), (KV_HEADS, HEAD_DIM), pdt)
    if self.use_bias:
      self.b_o_d = param(rngs, zeros, (d,), (EMBED,), pdt)
    # Qwen3: one RMSNorm scale over head_dim shared by every q head, one by every k head.
    self.qk_norm = cfg.qk_norm or cfg.qk_norm_full
    if cfg.qk_norm:
      self.q_norm = HeadRMSNorm(cfg, rngs=rngs, head_dim=h)
      if not kv_shared:
        self.k_norm = HeadRMSNorm(cfg, rngs=rngs, head_dim=h)
    elif cfg.qk_norm_full:
      self.q_norm = FullRMSNorm(cfg, n, HEADS, rngs=rngs)
      self.k_norm = FullRMSNorm(cfg, k, KV_HEADS, rngs=rngs)
    # GPT-OSS: one sink logit per query head (its `sinks` parameter).
    self.has_sinks = cfg.attention_sinks
    if self.has_sinks:
      self.sinks_n = param(rngs, zeros, (n,), (HEADS,), pdt)
    self.softcap = cfg.attn_softcap
    self.chunked = cfg.window_chunked

  def layer_features(self, window: int | None) -> dict:
    """The keywords ``attend`` gets for this layer: its window, soft-cap and sinks, where set."""
    out: dict = {}
    if window is not None:
      out["local"] = Local(window, self.chunked)
    if self.softcap is not None:
      out["softcap"] = self.softcap
    if self.has_sinks:
      out["sinks"] = self.sinks_n[...].astype(jnp.float32)
    return out

  def _w(self, v: nnx.Param) -> jax.Array:
    return v[...].astype(self.dtype)

  def project(
    self,
    x_btd: jax.Array,
    *,
    rope_sin_tk: jax.Array | None,
    rope_cos_tk: jax.Array | None,
    constrain: Constrain,
  ) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """(q_btnh, k_btkh, v_btkh): the projections, biases, checkpoint names, RoPE, constraints
    (a KV-shared layer's k and v None: it has no projections for them)."""
    q_btnh = self.einsum("btd,dnh->btnh", x_btd, self._w(self.w_q_dnh))
    if self.kv_shared:
      q_btnh = checkpoint_name(q_btnh, QUERY_PROJ)
      if self.qk_norm:
        q_btnh = self.q_norm(q_btnh)
      q_btnh = apply_rope(q_btnh, rope_sin_tk, rope_cos_tk)
      return constrain(q_btnh, (BATCH, SEQ, HEADS, HEAD_DIM)), None, None
    k_btkh = self.einsum("btd,dkh->btkh", x_btd, self._w(self.w_k_dkh))
    # attention_k_eq_v (Gemma 4's global layers): the values are the k projection's output,
    # taken before k's norm and RoPE (transformers' Gemma4TextAttention.forward).
    v_btkh = k_btkh if self.k_eq_v else self.einsum("btd,dkh->btkh", x_btd, self._w(self.w_v_dkh))
    if self.qkv_bias:
      q_btnh = q_btnh + self._w(self.b_q_nh)
      k_btkh = k_btkh + self._w(self.b_k_kh)
      v_btkh = v_btkh + self._w(self.b_v_kh)
    # Named right after the projections (before q/k norm and RoPE), where MaxText names them,
    # so a policy saving "query_proj" keeps the projection output and recomputes only the
    # cheap norm and rotation.
    q_btnh = checkpoint_name(q_btnh, QUERY_PROJ)
    k_btkh = checkpoint_name(k_btkh, KEY_PROJ)
    v_btkh = checkpoint_name(v_btkh, VALUE_PROJ)
    if self.qk_norm:
      # Before RoPE, as Qwen3 does (transformers' Qwen3Attention.forward).
      q_btnh = self.q_norm(q_btnh)
      k_btkh = self.k_norm(k_btkh)
    if self.v_norm:
      v_btkh = scaleless_rms_norm(v_btkh, self.norm_eps)
    if self.use_rope:
      q_btnh = apply_rope(q_btnh, rope_sin_tk, rope_cos_tk)
      k_btkh = apply_rope(k_btkh, rope_sin_tk, rope_cos_tk)
    q_btnh = constrain(q_btnh, (BATCH, SEQ, HEADS, HEAD_DIM))
    k_btkh = constrain(k_btkh, (BATCH, SEQ, KV_HEADS, HEAD_DIM))
    v_btkh = constrain(v_btkh, (BATCH, SEQ, KV_HEADS, HEAD_DIM))
    return q_btnh, k_btkh, v_btkh

  def cached(
    self,
    x_btd: jax.Array,
    cache_k_bksh: jax.Array,
    cache_v_bksh: jax.Array,
    *,
    pos: jax.Array,
    rope_sin_tk: jax.Array | None,
    rope_cos_tk: jax.Array | None,
    constrain: Constrain,
    attend: AttendFn | None = None,
    window: int | None = None,
    kv: tuple[jax.Array, jax.Array] | None = None,
    return_kv: bool = False,
  ) -> tuple[jax.Array, ...]:
    """Attention for tokens at positions pos .. pos+t-1 against a KV cache of S positions.

    A windowed layer (``window``) keeps a ring of S = min(window, context) positions: position p
    is written to slot p mod S, and a query sees the slots whose positions fall in its window.

    The new keys and values are written into the cache at ``pos`` (in place once the caller
    donates the cache) and the queries attend to every cached position <= their own: prefill
    is ``pos = 0`` with the prompt, decode one token at ``pos``. Keys and values are cached
    per kv head, so grouped-query attention caches ``num_kv_heads`` heads, not ``num_heads``;
    kv heads come before positions ([batch, kv_heads, S, head_dim]: see :mod:`.cache`).
    Returns (out_btd, new cache_k, new cache_v).

    ``attend`` (prefill only: the caller guarantees ``pos == 0``) computes the attention of
    the new tokens over their own keys, which at ``pos = 0`` are every position they may see:
    plain causal self-attention, so a fused kernel serves it. None attends over the cache with
    einsums (decode, or prefill the way it was compiled before).

    A KV-shared layer (Gemma 4) reads the cache of the layer it shares with and writes nothing:
    it gets the new tokens' keys and values of that layer (``kv``) for prefill and returns
    (out_btd,) only. ``return_kv`` (the layer it shares with) appends the new tokens' (k, v).
    """
    q_btnh, k_btkh, v_btkh = self.project(x_btd, rope_sin_tk=rope_sin_tk, rope_cos_tk=rope_cos_tk, constrain=constrain)
    if self.kv_shared:
      k_btkh, v_btkh = kv
    out = self._cached_attend(
      q_btnh, k_btkh, v_btkh, cache_k_bksh, cache_v_bksh, pos=pos, constrain=constrain, attend=attend, window=window,
    )
    if self.kv_shared:
      return (out[0],)
    return (*out, k_btkh, v_btkh) if return_kv else out

  def _cached_attend(self, q_btnh, k_btkh, v_btkh, cache_k_bksh, cache_v_bksh, *, pos, constrain, attend, window):
    """cached's attention: the cache written (unless KV-shared), then prefill over the new keys
    or decode over the cache; (out_btd, cache_k, cache_v)."""
    b, t, n, h = q_btnh.shape
    s, k = cache_k_bksh.shape[2], self.kv_heads
    g = n // k
    layer = self.layer_features(window)
    if self.kv_shared:  # the cache holds this step's keys already: the sharing layer wrote them
      pass
    elif window is not None:
      cache_k_bksh, cache_v_bksh = (
        constrain(_ring_write(c, new, pos), (BATCH, KV_HEADS, None, HEAD_DIM))
        for c, new in ((cache_k_bksh, k_btkh), (cache_v_bksh, v_btkh))
      )
    else:
      zero = jnp.zeros((), jnp.int32)
      at = (zero, zero, pos.astype(jnp.int32), zero)
      new_k_bkth = jnp.swapaxes(k_btkh, 1, 2).astype(cache_k_bksh.dtype)
      new_v_bkth = jnp.swapaxes(v_btkh, 1, 2).astype(cache_v_bksh.dtype)
      cache_k_bksh = constrain(jax.lax.dynamic_update_slice(cache_k_bksh, new_k_bkth, at), (BATCH, KV_HEADS, None, HEAD_DIM))
      cache_v_bksh = constrain(jax.lax.dynamic_update_slice(cache_v_bksh, new_v_bkth, at), (BATCH, KV_HEADS, None, HEAD_DIM))

    if attend is not None or (window is not None and t > 1):
      # Prefill (a prompt at position 0): the prompt attends to its own keys. A windowed layer's
      # cache keeps only its last positions, so its prefill always attends this way.
      attend = dot_attend if attend is None else attend
      ctx_btnh = constrain(attend(q_btnh, k_btkh, v_btkh, causal=True, **layer), (BATCH, SEQ, HEADS, HEAD_DIM))
      return self._output(ctx_btnh, constrain=constrain), cache_k_bksh, cache_v_bksh

    q_btkgh = q_btnh.reshape(b, t, k, g, h)
    scores_bkgts = jnp.einsum(
      "btkgh,bksh->bkgts", q_btkgh, cache_k_bksh.astype(self.dtype), preferred_element_type=jnp.float32
    )
    scores_bkgts = scores_bkgts * (1.0 / math.sqrt(h))
    if self.softcap is not None:
      scores_bkgts = self.softcap * jnp.tanh(scores_bkgts / self.softcap)
    q_pos_t = pos + jnp.arange(t)
    if window is None:
      # Query t sits at position pos + t and sees cached positions up to its own.
      visible_ts = jnp.arange(s)[None, :] <= q_pos_t[:, None]
    else:
      # Slot j of the ring holds the latest position p = j (mod S) not after the query's.
      p_ts = q_pos_t[:, None] - jnp.mod(q_pos_t[:, None] - jnp.arange(s)[None, :], s)
      visible_ts = (p_ts >= 0) & Local(window, self.chunked).visible(q_pos_t, p_ts[0])
    scores_bkgts = jnp.where(visible_ts, scores_bkgts, jnp.finfo(jnp.float32).min)
    sink = layer.get("sinks")
    probs_bkgts = _softmax_with_sink(scores_bkgts, None if sink is None else sink.reshape(k, g)[..., None, None])
    probs_bkgts = probs_bkgts.astype(self.dtype)
    ctx_btkgh = jnp.einsum("bkgts,bksh->btkgh", probs_bkgts, cache_v_bksh.astype(self.dtype))
    ctx_btnh = constrain(ctx_btkgh.reshape(b, t, n, h), (BATCH, SEQ, HEADS, HEAD_DIM))
    return self._output(ctx_btnh, constrain=constrain), cache_k_bksh, cache_v_bksh

  def _output(self, ctx_btnh: jax.Array, *, constrain: Constrain) -> jax.Array:
    """The output projection (+ bias) of the attention context, constrained: a row-parallel
    matmul's partial sums, reduced (scattered along the sequence under sequence parallelism)."""
    out_btd = self.einsum("btnh,nhd->btd", ctx_btnh, self._w(self.w_o_nhd))
    if self.use_bias:
      out_btd = out_btd + self._w(self.b_o_d)
    return constrain(out_btd, (BATCH, NORM_SEQ, EMBED))

  def __call__(
    self,
    x_btd: jax.Array,
    *,
    rope_sin_tk: jax.Array | None,
    rope_cos_tk: jax.Array | None,
    constrain: Constrain,
    attend: AttendFn | None = None,
    dropout: Dropout | None = None,
    window: int | None = None,
    kv: tuple[jax.Array, jax.Array] | None = None,
    return_kv: bool = False,
  ) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """``dropout`` drops the attention probabilities: ``attend`` is then called with it (dot
    attention takes it; a train step wraps any other ``attend`` to say what it does with it).
    ``window``: this layer's local attention window (None: global). ``kv``: a KV-shared layer's
    keys and values (those of the layer it shares with); ``return_kv`` returns (out, (k, v)),
    for the layer whose keys and values later layers share (Gemma4TextAttention's "store")."""
    q_btnh, k_btkh, v_btkh = self.project(x_btd, rope_sin_tk=rope_sin_tk, rope_cos_tk=rope_cos_tk, constrain=constrain)
    if self.kv_shared:
      k_btkh, v_btkh = kv
    attend = dot_attend if attend is None else attend
    layer = self.layer_features(window)
    if dropout is None:
      ctx_btnh = attend(q_btnh, k_btkh, v_btkh, causal=True, **layer)
    else:
      ctx_btnh = attend(q_btnh, k_btkh, v_btkh, causal=True, dropout=dropout, **layer)
    ctx_btnh = constrain(ctx_btnh, (BATCH, SEQ, HEADS, HEAD_DIM))
    # Named here, outside every attention implementation, so name-based remat policies see the
    # same "context" whichever kernel computed it.
    ctx_btnh = checkpoint_name(ctx_btnh, CONTEXT)
    out_btd = checkpoint_name(self._output(ctx_btnh, constrain=constrain), OUT_PROJ)
    return (out_btd, (k_btkh, v_btkh)) if return_kv else out_btd

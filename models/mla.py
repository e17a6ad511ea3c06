"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434, section 2.1).

Keys and values are rebuilt per head from one compressed latent per token, so inference caches
that latent instead of keys and values. With h_t the block input, n_h heads, per-head sizes d_h
(``qk_nope_head_dim``), d_h^R (``qk_rope_head_dim``) and d_v (``v_head_dim``), latent widths
d_c (``kv_lora_rank``) and d_c' (``q_lora_rank``), in the V2 paper's equations:

  c^KV_t = W^DKV h_t                    (9)   latent, d_c wide, RMS-normalised (``kv_norm``)
  k^C_t  = W^UK c^KV_t                  (10)  per-head keys, n_h x d_h
  v^C_t  = W^UV c^KV_t                  (11)  per-head values, n_h x d_v
  c^Q_t  = W^DQ h_t,  q^C_t = W^UQ c^Q_t      (12), (13); c^Q RMS-normalised (``q_norm``)
  q^R_t  = RoPE(W^QR c^Q_t)             (14)  decoupled rotary query, n_h x d_h^R
  k^R_t  = RoPE(W^KR h_t)               (15)  one rotary key shared by all heads, d_h^R
  q_t,i = [q^C_t,i; q^R_t,i],  k_t,i = [k^C_t,i; k^R_t]            (16), (17)
  o_t,i = sum_j softmax_j(q_t,i . k_j,i / sqrt(d_h + d_h^R)) v^C_j,i  (18)
  u_t   = W^O [o_t,1; ...; o_t,n_h]     (19)

(the same as DeepSeek-V3, arXiv 2412.19437, eqs. 1-11). As in DeepSeek's code and MaxText,
W^DKV and W^KR are one matrix (``w_kv_a_dx``, x = d_c + d_h^R) and W^UQ and W^QR one matrix
(``w_q_b_qnh``); with ``q_lora_rank`` 0 the query is projected directly (DeepSeek-V2-Lite).

Training computes (18) through the caller's ``attend`` hook (:mod:`.attention_ops`) with the
assembled q, k [B, T, n_h, d_h + d_h^R] and v [B, T, n_h, d_v], so fused kernels apply, and
names the context outside that call, as :class:`~.attention.Attention` does.

Inference caches, per token and layer, only c^KV_t and k^R_t (V2 paper, section 2.1.2 and
table 1: (d_c + d_h^R) l elements per token over l layers; "only the blue-boxed vectors need to
be cached", V3 paper section 2.1.1): see :class:`MLACache` and :func:`mla_cache_bytes`. DeepSeek-V3
caches 512 + 64 = 576 values per token and layer where multi-head attention with the same heads
would cache 128 x (192 + 128) = 40,960.

RoPE here rotates halves (:mod:`.rope`) where DeepSeek rotates interleaved pairs, and YaRN's
context-extension rescaling of the frequencies and the softmax scale is left out: both change
values, not shapes or memory.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .attention_ops import AttendFn, dot_attend
from .block import Block
from .cache import CACHE_SEQ, KVCache, LocalKVCache, kv_cache_bytes
from .config import ModelConfig
from .family import Family
from .layers import DEFAULT_INIT, Constrain, param
from .dropout import Dropout
from .names import (
  BATCH,
  CONTEXT,
  EMBED,
  HEAD_DIM,
  HEADS,
  KEY_PROJ,
  KV_LORA,
  KV_WA_PROJ,
  LAYERS,
  MLA_KV,
  MLA_Q,
  NORM,
  OUT_PROJ,
  Q_LORA,
  QUERY_PROJ,
  QUERY_WA_PROJ,
  NORM_SEQ,
  SEQ,
  VALUE_PROJ,
)
from .rope import apply_rope


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis (Zhang & Sennrich 2019), statistics in float32."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps) * scale.astype(jnp.float32)
  return y.astype(x.dtype)


class MLAttention(nnx.Module):
  """Causal multi-head latent attention: training through ``attend``, inference on an MLACache."""

  def __init__(self, cfg: ModelConfig, *, out_init: nnx.Initializer, rngs: nnx.Rngs):
    d, n, pdt = cfg.d_model, cfg.num_heads, cfg.param_jnp_dtype
    rq, c = cfg.q_lora_rank, cfg.kv_lora_rank
    nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    self.dtype, self.eps, self.nope, self.c = cfg.compute_jnp_dtype, cfg.norm_eps, nope, c
    self.use_q_lora = rq > 0
    ones = nnx.initializers.ones
    if self.use_q_lora:
      self.w_q_a_dq = param(rngs, DEFAULT_INIT, (d, rq), (EMBED, Q_LORA), pdt)  # W^DQ
      self.q_norm_q = param(rngs, ones, (rq,), (NORM,), pdt)
      self.w_q_b_qnh = param(rngs, DEFAULT_INIT, (rq, n, nope + rope), (Q_LORA, HEADS, HEAD_DIM), pdt)  # W^UQ; W^QR
    else:
      self.w_q_dnh = param(rngs, DEFAULT_INIT, (d, n, nope + rope), (EMBED, HEADS, HEAD_DIM), pdt)
    self.w_kv_a_dx = param(rngs, DEFAULT_INIT, (d, c + rope), (EMBED, KV_LORA), pdt)  # W^DKV; W^KR
    self.kv_norm_c = param(rngs, ones, (c,), (NORM,), pdt)
    self.w_k_b_cnh = param(rngs, DEFAULT_INIT, (c, n, nope), (KV_LORA, HEADS, HEAD_DIM), pdt)  # W^UK
    self.w_v_b_cnv = param(rngs, DEFAULT_INIT, (c, n, v), (KV_LORA, HEADS, HEAD_DIM), pdt)  # W^UV
    self.w_o_nvd = param(rngs, out_init, (n, v, d), (HEADS, HEAD_DIM, EMBED), pdt)  # W^O

  def _w(self, p: nnx.Param) -> jax.Array:
    return p[...].astype(self.dtype)

  def _queries(self, x_btd, sin_tk, cos_tk, constrain) -> tuple[jax.Array, jax.Array]:
    """(q^C [B, T, N, d_h], rotated q^R [B, T, N, d_h^R]): eqs. (12)-(14)."""
    if self.use_q_lora:
      cq_btq = checkpoint_name(jnp.einsum("btd,dq->btq", x_btd, self._w(self.w_q_a_dq)), QUERY_WA_PROJ)
      cq_btq = checkpoint_name(_rms_norm(cq_btq, self.q_norm_q[...], self.eps), MLA_Q)
      cq_btq = constrain(cq_btq, (BATCH, SEQ, Q_LORA))
      q_btnh = jnp.einsum("btq,qnh->btnh", cq_btq, self._w(self.w_q_b_qnh))
    else:
      q_btnh = jnp.einsum("btd,dnh->btnh", x_btd, self._w(self.w_q_dnh))
    return q_btnh[..., : self.nope], apply_rope(q_btnh[..., self.nope :], sin_tk, cos_tk)

  def _latent(self, x_btd, sin_tk, cos_tk, constrain) -> tuple[jax.Array, jax.Array]:
    """(normalised c^KV [B, T, d_c], rotated k^R [B, T, d_h^R]): eqs. (9) and (15), what the
    inference cache holds."""
    a_btx = checkpoint_name(jnp.einsum("btd,dx->btx", x_btd, self._w(self.w_kv_a_dx)), KV_WA_PROJ)
    ckv_btc = checkpoint_name(_rms_norm(a_btx[..., : self.c], self.kv_norm_c[...], self.eps), MLA_KV)
    ckv_btc = constrain(ckv_btc, (BATCH, SEQ, KV_LORA))
    kr_btr = apply_rope(a_btx[..., None, self.c :], sin_tk, cos_tk)[:, :, 0]
    return ckv_btc, kr_btr

  def _out(self, ctx_btnv: jax.Array, constrain: Constrain) -> jax.Array:
    out_btd = jnp.einsum("btnv,nvd->btd", ctx_btnv, self._w(self.w_o_nvd))  # eq. (19)
    return constrain(out_btd, (BATCH, NORM_SEQ, EMBED))  # row-parallel: reduced (scattered under SP)

  def __call__(
    self,
    x_btd: jax.Array,
    *,
    rope_sin_tk: jax.Array,
    rope_cos_tk: jax.Array,
    constrain: Constrain,
    attend: AttendFn | None = None,
    dropout: Dropout | None = None,
  ) -> jax.Array:
    """Training (and any full-sequence) attention: eqs. (9)-(19) with keys and values expanded
    per head, so ``attend`` sees ordinary multi-head q, k, v (v narrower than q and k).
    ``dropout`` drops the attention probabilities, as :class:`~.attention.Attention` does."""
    qc_btnh, qr_btnr = self._queries(x_btd, rope_sin_tk, rope_cos_tk, constrain)
    ckv_btc, kr_btr = self._latent(x_btd, rope_sin_tk, rope_cos_tk, constrain)
    return self._expanded(qc_btnh, qr_btnr, ckv_btc, kr_btr, constrain=constrain, attend=attend, dropout=dropout)

  def _expanded(
    self, qc_btnh, qr_btnr, ckv_btc, kr_btr, *, constrain: Constrain, attend: AttendFn | None,
    dropout: Dropout | None = None,
  ) -> jax.Array:
    """Eqs. (16)-(19) with keys and values expanded per head from the latents (the naive form)."""
    b, t, n, _ = qc_btnh.shape
    kc_btnh = jnp.einsum("btc,cnh->btnh", ckv_btc, self._w(self.w_k_b_cnh))
    v_btnv = jnp.einsum("btc,cnv->btnv", ckv_btc, self._w(self.w_v_b_cnv))
    q_btnh = jnp.concatenate([qc_btnh, qr_btnr], axis=-1)
    k_btnh = jnp.concatenate([kc_btnh, jnp.broadcast_to(kr_btr[:, :, None], (b, t, n, kr_btr.shape[-1]))], axis=-1)
    # Named once assembled (MaxText's attention_mla.py names them here too).
    q_btnh = constrain(checkpoint_name(q_btnh, QUERY_PROJ), (BATCH, SEQ, HEADS, HEAD_DIM))
    k_btnh = constrain(checkpoint_name(k_btnh, KEY_PROJ), (BATCH, SEQ, HEADS, HEAD_DIM))
    v_btnv = constrain(checkpoint_name(v_btnv, VALUE_PROJ), (BATCH, SEQ, HEADS, HEAD_DIM))
    attend = dot_attend if attend is None else attend
    extra = {} if dropout is None else {"dropout": dropout}
    ctx_btnv = attend(q_btnh, k_btnh, v_btnv, causal=True, **extra)
    ctx_btnv = checkpoint_name(constrain(ctx_btnv, (BATCH, SEQ, HEADS, HEAD_DIM)), CONTEXT)
    return checkpoint_name(self._out(ctx_btnv, constrain), OUT_PROJ)

  def cached(
    self,
    x_btd: jax.Array,
    latent_bsc: jax.Array,
    rope_k_bsr: jax.Array,
    *,
    pos: jax.Array,
    rope_sin_tk: jax.Array,
    rope_cos_tk: jax.Array,
    constrain: Constrain,
    attend: AttendFn | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention for tokens at pos .. pos+t-1 against an MLA cache of S positions.

    Writes this step's c^KV and k^R at ``pos`` and attends in the absorbed form (V2 paper,
    section 2.1.2: W^UK can be absorbed into W^UQ and W^UV into W^O): the query's no-RoPE part
    is mapped into the latent space (q^C W^UK, n_h x d_c), scored against the cached latents
    directly, and the latent-space context is expanded by W^UV only for the t new tokens. This
    is DeepSeek's own default (``attn_impl = "absorb"`` in its inference/model.py) and what
    serving stacks run, because the naive form would expand n_h x (d_h + d_h^R + d_v) keys and
    values for every cached position, a temporary 71x the cache for DeepSeek-V3.
    With ``attend`` (prefill at position 0 only; the caller checks), the prompt attends to its own
    tokens in the naive form through ``attend`` (as in training), which is how serving stacks run
    prefill; the latents are cached all the same.
    Returns (out_btd, new latent cache, new rope-key cache).
    """
    s = latent_bsc.shape[1]
    t = x_btd.shape[1]
    qc_btnh, qr_btnr = self._queries(x_btd, rope_sin_tk, rope_cos_tk, constrain)
    ckv_btc, kr_btr = self._latent(x_btd, rope_sin_tk, rope_cos_tk, constrain)
    zero = jnp.zeros((), jnp.int32)
    at = (zero, pos.astype(jnp.int32), zero)
    latent_bsc = jax.lax.dynamic_update_slice(latent_bsc, ckv_btc.astype(latent_bsc.dtype), at)
    rope_k_bsr = jax.lax.dynamic_update_slice(rope_k_bsr, kr_btr.astype(rope_k_bsr.dtype), at)
    latent_bsc = constrain(latent_bsc, (BATCH, None, KV_LORA))
    rope_k_bsr = constrain(rope_k_bsr, (BATCH, None, HEAD_DIM))
    if attend is not None:
      return self._expanded(qc_btnh, qr_btnr, ckv_btc, kr_btr, constrain=constrain, attend=attend), latent_bsc, rope_k_bsr

    ql_btnc = jnp.einsum("btnh,cnh->btnc", qc_btnh, self._w(self.w_k_b_cnh))
    scores_bnts = jnp.einsum(
      "btnc,bsc->bnts", ql_btnc, latent_bsc.astype(self.dtype), preferred_element_type=jnp.float32
    ) + jnp.einsum("btnr,bsr->bnts", qr_btnr, rope_k_bsr.astype(self.dtype), preferred_element_type=jnp.float32)
    scores_bnts = scores_bnts * (1.0 / math.sqrt(qc_btnh.shape[-1] + qr_btnr.shape[-1]))  # eq. (18)
    visible_ts = jnp.arange(s)[None, :] <= (pos + jnp.arange(t))[:, None]
    scores_bnts = jnp.where(visible_ts, scores_bnts, jnp.finfo(jnp.float32).min)
    probs_bnts = jax.nn.softmax(scores_bnts, axis=-1).astype(self.dtype)
    ctxl_btnc = jnp.einsum("bnts,bsc->btnc", probs_bnts, latent_bsc.astype(self.dtype))
    ctx_btnv = jnp.einsum("btnc,cnv->btnv", ctxl_btnc, self._w(self.w_v_b_cnv))
    ctx_btnv = constrain(ctx_btnv, (BATCH, SEQ, HEADS, HEAD_DIM))
    return self._out(ctx_btnv, constrain), latent_bsc, rope_k_bsr


# Logical axes of MLACache's two arrays, for the caller's logical->mesh rules.
MLA_CACHE_AXES: tuple[tuple[str, ...], tuple[str, ...]] = (
  (LAYERS, BATCH, CACHE_SEQ, KV_LORA),
  (LAYERS, BATCH, CACHE_SEQ, HEAD_DIM),
)


class MLABlock(Block):
  """The block with multi-head latent attention in place of grouped-query attention."""

  def make_attention(self, cfg: ModelConfig, *, out_init: nnx.Initializer, rngs: nnx.Rngs) -> nnx.Module:
    return MLAttention(cfg, out_init=out_init, rngs=rngs)


class MLA(Family):
  """DeepSeek's family (V2, V3; ``kv_lora_rank`` > 0): MLA in every block, RoPE over its decoupled
  ``qk_rope_head_dim`` channels only (eqs. 14-15), the latent cache (:class:`MLACache`)."""

  name = "mla"
  block = MLABlock

  def applies(self, cfg: ModelConfig) -> bool:
    return cfg.is_mla

  def rope_dims(self, cfg: ModelConfig) -> tuple[int, int]:
    return cfg.qk_rope_head_dim, cfg.qk_rope_head_dim


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MLACache:
  """MLA's inference cache, in the compute dtype: latent_lbsc [layers, batch, context,
  kv_lora_rank] (the normalised c^KV) and rope_k_lbsr [layers, batch, context,
  qk_rope_head_dim] (the rotated k^R). No head axis: every head reads the same latent."""

  latent_lbsc: jax.Array
  rope_k_lbsr: jax.Array

  @property
  def context(self) -> int:
    return self.latent_lbsc.shape[2]

  @staticmethod
  def shapes(cfg: ModelConfig, *, batch: int, context: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lead = (cfg.num_layers, batch, context)
    return (*lead, cfg.kv_lora_rank), (*lead, cfg.qk_rope_head_dim)

  @classmethod
  def zeros(cls, cfg: ModelConfig, *, batch: int, context: int, dtype=None) -> MLACache:
    dt = cfg.compute_jnp_dtype if dtype is None else jnp.dtype(dtype)
    return cls(*(jnp.zeros(s, dt) for s in cls.shapes(cfg, batch=batch, context=context)))

  @classmethod
  def abstract(cls, cfg: ModelConfig, *, batch: int, context: int, dtype=None, sharding=None) -> MLACache:
    """ShapeDtypeStructs only: nothing allocated. One ``sharding`` serves both (same rank)."""
    dt = cfg.compute_jnp_dtype if dtype is None else jnp.dtype(dtype)
    shapes = cls.shapes(cfg, batch=batch, context=context)
    return cls(*(jax.ShapeDtypeStruct(s, dt, sharding=sharding) for s in shapes))


def mla_cache_bytes(cfg: ModelConfig, *, batch: int, context: int, bytes_per_element: float | None = None) -> int:
  """Whole-model MLA cache bytes: layers * batch * context * (kv_lora_rank + qk_rope_head_dim)
  * bytes (V2 paper, table 1: (d_c + d_h^R) l elements per token)."""
  per = cfg.compute_jnp_dtype.itemsize if bytes_per_element is None else bytes_per_element
  return int(cfg.num_layers * batch * context * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * per)


def cache_class(cfg: ModelConfig) -> type[KVCache] | type[MLACache] | type[LocalKVCache]:
  """The inference cache ``Transformer(cfg).cached`` takes: MLACache for MLA models,
  LocalKVCache for models with local attention, else KVCache."""
  if cfg.is_mla:
    return MLACache
  return LocalKVCache if cfg.sliding_window is not None else KVCache


def cache_bytes(cfg: ModelConfig, *, batch: int, context: int, bytes_per_element: float | None = None) -> int:
  """Whole-model inference cache bytes for either kind of attention."""
  fn = mla_cache_bytes if cfg.is_mla else kv_cache_bytes
  return fn(cfg, batch=batch, context=context, bytes_per_element=bytes_per_element)

"""The attention computation itself, pluggable: ``attend(q, k, v, *, causal) -> context``.

The Attention modules project, rotate and name; *how* softmax(q k^T / sqrt(h)) v is computed is
an :data:`AttendFn` the caller picks, so the same model compiles to the program a production
trainer would run on each target. This module holds the two pure-JAX implementations:

* :func:`dot_attend`: plain einsums that materialise the T x S scores (the reference);
* :func:`chunked_attend`: blockwise online softmax with a FlashAttention-2-style backward pass,
  which never holds more than one block of scores and compiles on every backend.

The fused kernels (Pallas splash, cuDNN, Pallas Triton) and the registry that picks one per
target are in :mod:`.attention_kernels` and :mod:`.attention_registry`.

Shapes (B batch, T query positions, S key positions, N query heads, K kv heads, H q/k head
size, V v head size):

  q_btnh [B, T, N, H], k_bskh [B, S, K, H], v_bskv [B, S, K, V]  ->  ctx_btnv [B, T, N, V]

K divides N (grouped-query attention: query head n reads kv head n // (N // K), the grouping
Llama's ``repeat_kv`` implies); V may differ from H (multi-head latent attention). Causal means
query t sees keys s <= t + (S - T) (T == S in training: the usual lower triangle).

Per-layer features reach ``attend`` as keywords, passed only when a layer has them, so an
``AttendFn`` that knows none of them serves every other model unchanged:

* ``local=Local(window, chunked)``: local attention. Sliding (Mistral, Gemma, GPT-OSS): query
  position q sees keys q - window < k <= q, transformers' ``sliding_window`` mask. Chunked
  (Llama 4's ``attention_chunk_size``): q sees keys of its own aligned chunk,
  k // window == q // window, k <= q.
* ``softcap=c``: scores become c * tanh(scores / c) before the mask (Gemma 2's
  ``attn_logit_softcapping``).
* ``sinks=s_n``: one logit per query head [N] that joins every softmax denominator and attends
  to nothing (GPT-OSS's attention sinks); computed by :func:`dot_attend`, :func:`chunked_attend`
  and splash (attention_kernels). cuDNN and Triton have none, so the registry does not choose
  them for a model with sinks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from .dropout import Dropout
from .names import CONTEXT

# attend(q_btnh, k_bskh, v_bskv, *, causal=True) -> ctx_btnv, in the dtype of v.
AttendFn = Callable[..., jax.Array]

# A large finite negative for masked scores, MaxText's DEFAULT_MASK_VALUE
# (-0.7 * float32 max): finite, so a fully masked block row gives exp(mask - max) = 0 or 1
# instead of NaN, and representable in bfloat16.
_MASK_FRACTION = -0.7


def _mask_value(dtype: jnp.dtype) -> float:
  return _MASK_FRACTION * float(jnp.finfo(dtype).max)


@dataclasses.dataclass(frozen=True)
class Local:
  """A layer's local attention: the last ``window`` positions (sliding), or its own aligned chunk
  of ``window`` positions when ``chunked`` (see the module docstring)."""

  window: int
  chunked: bool = False

  def visible(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """[tq, sk] booleans: the window's part of the mask (causality is checked apart)."""
    if self.chunked:
      return (k_pos[None, :] // self.window) == (q_pos[:, None] // self.window)
    return k_pos[None, :] > q_pos[:, None] - self.window


def _visible(
  q_pos: jax.Array, k_pos: jax.Array, *, causal: bool, kv_len: int, local: Local | None = None
) -> jax.Array:
  """[.., tq, sk] booleans: key position k_pos[s] is visible from query position q_pos[t]."""
  ok = (k_pos[None, :] < kv_len) & (k_pos[None, :] >= 0)
  if causal:
    ok = ok & (k_pos[None, :] <= q_pos[:, None])
  if local is not None:
    ok = ok & local.visible(q_pos, k_pos)
  return ok


def _cap(scores: jax.Array, softcap: float | None) -> jax.Array:
  if softcap is None:
    return scores
  c = jnp.asarray(softcap, scores.dtype)
  return c * jnp.tanh(scores / c)


# --- dot: the reference --------------------------------------------------------------------


def dot_attend(
  q_btnh: jax.Array,
  k_bskh: jax.Array,
  v_bskv: jax.Array,
  *,
  causal: bool = True,
  scores_dtype: jnp.dtype | str | None = None,
  dropout: Dropout | None = None,
  local: Local | None = None,
  softcap: float | None = None,
  sinks: jax.Array | None = None,
) -> jax.Array:
  """Attention as plain einsums (Vaswani et al. 2017, eq. 1): the full T x S scores exist,
  except under ``local`` attention in training (T == S longer than the window), where the
  sequence is cut into blocks of ``window`` queries, each scored against the keys it can see
  (its own block and, sliding, the one before: :func:`_dot_local`), so the scores are
  T x 2W (sliding) or T x W (chunked) rather than T x T.

  ``dropout`` drops attention probabilities (Megatron's attention dropout): a one-byte mask of
  the [B, N, T, S] scores' shape, as Korthikanti et al. 2022 count it (section 4.1).

  ``scores_dtype`` follows MaxText's ``float32_qk_product`` (``layers/attention_op.py``,
  ``apply_attention_dot`` and ``compute_local_attention``):

  * ``None`` (the default, MaxText's ``float32_qk_product=False``): q k^T in the inputs'
    dtype (bfloat16 in a bf16 model), masked, then MaxText's softmax: the row max, the
    unnormalised exponentials exp(s - max) and their row sum in that same dtype, the
    exponentials times v, and only then the division by the sum. The [B, N, T, S] scores and
    exponentials are both in the compute dtype. MaxText folds 1/sqrt(H) into the query
    projection's initialiser; here q is scaled before the product, which costs a [B, T, N, H]
    multiply and no [.., T, S] one.
  * ``float32``: q k^T accumulated and kept in float32, scaled, masked, a float32 softmax whose
    probabilities are cast to v's dtype for the product with v (jaxmem's program before MaxText's
    default was followed; bf16 exp/sum over thousands of keys loses the tail).

  Any other dtype computes the scores in that dtype the float32 way.
  """
  b, t, n, h = q_btnh.shape
  s, k = k_bskh.shape[1], k_bskh.shape[2]
  g = n // k
  vd = v_bskv.shape[-1]
  if local is not None and causal and t == s and t > local.window:
    return _dot_local(
      q_btnh, k_bskh, v_bskv, local=local, scores_dtype=scores_dtype, dropout=dropout, softcap=softcap, sinks=sinks
    )
  visible_ts = None
  if causal or local is not None:
    # Query t sits at position t + (S - T): with S == T that is the usual lower triangle.
    visible_ts = _visible(jnp.arange(t) + (s - t), jnp.arange(s), causal=causal, kv_len=s, local=local)
  sink_kg11 = None if sinks is None else sinks.reshape(k, g)[..., None, None]
  if scores_dtype is None:
    q_btkgh = (q_btnh * jnp.asarray(1.0 / math.sqrt(h), q_btnh.dtype)).reshape(b, t, k, g, h)
    scores_bkgts = _cap(jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_bskh.astype(q_btnh.dtype)), softcap)
    if visible_ts is not None:
      scores_bkgts = jnp.where(visible_ts, scores_bkgts, _mask_value(scores_bkgts.dtype))
    max_bkgt1 = jnp.max(scores_bkgts, axis=-1, keepdims=True)
    if sink_kg11 is not None:
      max_bkgt1 = jnp.maximum(max_bkgt1, sink_kg11.astype(max_bkgt1.dtype))
    exps_bkgts = jnp.exp(scores_bkgts - max_bkgt1)
    sum_bkgt1 = jnp.sum(exps_bkgts, axis=-1, keepdims=True)
    if sink_kg11 is not None:  # the sink's exp joins the denominator and attends to nothing
      sum_bkgt1 = sum_bkgt1 + jnp.exp(sink_kg11.astype(max_bkgt1.dtype) - max_bkgt1)
    if dropout is not None:  # dropping exp(s - max) before the division drops the probabilities
      exps_bkgts = dropout(exps_bkgts)
    ctx_btkgv = jnp.einsum("bkgts,bskv->btkgv", exps_bkgts, v_bskv.astype(exps_bkgts.dtype))
    ctx_btkgv = ctx_btkgv / jnp.transpose(sum_bkgt1, (0, 3, 1, 2, 4))
    return ctx_btkgv.reshape(b, t, n, vd).astype(v_bskv.dtype)

  sdt = jnp.dtype(scores_dtype)
  q_btkgh = q_btnh.reshape(b, t, k, g, h)
  scores_bkgts = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_bskh, preferred_element_type=sdt)
  scores_bkgts = _cap(scores_bkgts * jnp.asarray(1.0 / math.sqrt(h), sdt), softcap)
  if visible_ts is not None:
    scores_bkgts = jnp.where(visible_ts, scores_bkgts, jnp.finfo(sdt).min)
  probs_bkgts = _softmax_f32(scores_bkgts, sink_kg11).astype(v_bskv.dtype)
  if dropout is not None:
    probs_bkgts = dropout(probs_bkgts)
  ctx_btkgv = jnp.einsum("bkgts,bskv->btkgv", probs_bkgts, v_bskv)
  return ctx_btkgv.reshape(b, t, n, vd)


def _softmax_f32(scores: jax.Array, sink: jax.Array | None) -> jax.Array:
  """Float32 softmax over the last axis; a sink logit (broadcast to the rows) joins each
  denominator only."""
  scores = scores.astype(jnp.float32)
  if sink is None:
    return jax.nn.softmax(scores, axis=-1)
  sink = jnp.broadcast_to(sink.astype(jnp.float32), scores.shape[:-1] + (1,))
  return jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]


def _dot_local(q_btnh, k_bskh, v_bskv, *, local, scores_dtype, dropout, softcap, sinks):
  """Local attention in blocks (MaxText's ``compute_local_attention`` does the same): T is
  padded to C blocks of W = ``local.window`` queries; block c's queries are scored against the
  keys of block c (chunked) or of blocks c - 1 and c (sliding), [B, C, K, G, W, S'] with S' = W
  or 2W, masked by position, so the scores kept are T x S' per head instead of T x T."""
  b, t, n, h = q_btnh.shape
  k, vd, w = k_bskh.shape[2], v_bskv.shape[-1], local.window
  g = n // k
  c = -(-t // w)
  pad = ((0, 0), (0, c * w - t), (0, 0), (0, 0))
  q_bcwkgh = jnp.pad(q_btnh, pad).reshape(b, c, w, k, g, h)
  k_bcwkh, v_bcwkv = (jnp.pad(x, pad).reshape(b, c, w, k, x.shape[-1]) for x in (k_bskh, v_bskv))
  q_pos_cw = jnp.arange(c)[:, None] * w + jnp.arange(w)[None, :]
  if local.chunked:
    k_bcskh, v_bcskv, k_pos_cs = k_bcwkh, v_bcwkv, q_pos_cw
  else:  # the block before (zeros before the first) and this one
    prev = lambda x: jnp.pad(x, ((0, 0), (1, 0), (0, 0), (0, 0), (0, 0)))[:, :-1]  # noqa: E731
    k_bcskh = jnp.concatenate([prev(k_bcwkh), k_bcwkh], axis=2)
    v_bcskv = jnp.concatenate([prev(v_bcwkv), v_bcwkv], axis=2)
    k_pos_cs = jnp.concatenate([q_pos_cw - w, q_pos_cw], axis=1)
  visible_cws = jax.vmap(lambda qp, kp: _visible(qp, kp, causal=True, kv_len=t, local=local))(q_pos_cw, k_pos_cs)
  visible_c11ws = visible_cws[:, None, None]
  sink_kg11 = None if sinks is None else sinks.reshape(k, g)[..., None, None]
  sdt = q_btnh.dtype if scores_dtype is None else jnp.dtype(scores_dtype)
  q_bcwkgh = q_bcwkgh * jnp.asarray(1.0 / math.sqrt(h), q_btnh.dtype)
  scores = jnp.einsum("bcwkgh,bcskh->bckgws", q_bcwkgh, k_bcskh.astype(q_btnh.dtype), preferred_element_type=sdt)
  scores = jnp.where(visible_c11ws, _cap(scores, softcap), _mask_value(sdt))
  probs = _softmax_f32(scores, sink_kg11).astype(v_bskv.dtype)
  if dropout is not None:
    probs = dropout(probs)
  ctx_bcwkgv = jnp.einsum("bckgws,bcskv->bcwkgv", probs, v_bcskv.astype(probs.dtype))
  return ctx_bcwkgv.reshape(b, c * w, n, vd)[:, :t].astype(v_bskv.dtype)


# --- chunked: blockwise online softmax with a FlashAttention-2 backward ----------------------

# Block length along T and S. 512 is what MaxText's splash defaults use (sa_block_* = 512) and
# what FlashAttention-2 uses on GPU for head sizes <= 128; a sequence shorter than that is one
# block, so short sequences pay no padding.
CHUNK_BLOCK = 512


def _block_and_padded(n: int, block: int) -> tuple[int, int]:
  """(block length, n padded up to a multiple of it)."""
  bl = min(block, n)
  return bl, -(-n // bl) * bl


def chunked_attend(
  q_btnh: jax.Array,
  k_bskh: jax.Array,
  v_bskv: jax.Array,
  *,
  causal: bool = True,
  block_q: int = CHUNK_BLOCK,
  block_kv: int = CHUNK_BLOCK,
  local: Local | None = None,
  softcap: float | None = None,
  sinks: jax.Array | None = None,
) -> jax.Array:
  """Memory-efficient exact attention in pure JAX, for every backend.

  ``local`` and ``softcap`` enter each block's scores (the mask and the tanh, forward and
  backward). ``sinks`` [N] (GPT-OSS's one logit per query head, as transformers'
  ``eager_attention_forward`` in ``modeling_gpt_oss`` concatenates to every row of scores, and
  as :func:`dot_attend` does: neither scaled nor soft-capped) start each row's online softmax
  (m = sink, l = 1, acc = 0), so the log-sum-exp includes them and they attend to nothing; their
  gradient is computed in the backward pass. With ``sinks=None`` the compiled program is the
  one chunked compiled before it took sinks (same lowering), so no row's figures move.

  Forward: for each block of ``block_q`` queries, a scan over blocks of ``block_kv`` keys
  keeps a running row max m, row sum l and output accumulator (the online softmax of Milakov &
  Gimelshein 2018, used blockwise by Rabe & Staats 2021 and Dao 2023, FlashAttention-2
  Algorithm 1), in float32. Only the output and the log-sum-exp m + log l of each row are kept.

  Backward (``jax.custom_vjp``): recomputes each block's probabilities from q, k and the saved
  log-sum-exp (FlashAttention-2 Algorithm 2), in two passes as splash attention's separate dq
  and dk/dv kernels do: one over query blocks accumulating dq, one over key blocks accumulating
  dk and dv, so no full-size float32 accumulator is carried. Peak temporaries are a few
  [B, N, block_q, block_kv] float32 blocks, not [B, N, T, S].

  Every block pair is computed (masked), as the einsum reference does, so the FLOPs equal
  :func:`dot_attend`'s. T and S need not be multiples of the blocks: the inputs are padded and
  padded keys masked. The output and the log-sum-exp carry the ``context`` checkpoint name (as
  MaxText's splash call names its residuals), so a remat policy saving ``context`` keeps what
  the backward pass needs.
  """
  t, s = q_btnh.shape[1], k_bskh.shape[1]
  bq, tp = _block_and_padded(t, block_q)
  bk, sp = _block_and_padded(s, block_kv)
  if tp != t:
    q_btnh = jnp.pad(q_btnh, ((0, 0), (0, tp - t), (0, 0), (0, 0)))
  if sp != s:
    k_bskh = jnp.pad(k_bskh, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
    v_bskv = jnp.pad(v_bskv, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
  # [N] -> [K, G]: query head n is kv head n // G's g = n % G (the GQA grouping of q_btkgh).
  sink_kg = None if sinks is None else sinks.astype(jnp.float32).reshape(k_bskh.shape[2], -1)
  out_btnv = _flash(q_btnh, k_bskh, v_bskv, (causal, local, softcap), bq, bk, s, s - t, sink_kg)
  return out_btnv[:, :t] if tp != t else out_btnv


def _scores(q_bqkgh, k_bskh, i, j, *, bq, bk, mask, kv_len, offset):
  """One block's masked, scaled (and soft-capped) float32 scores [B, K, G, bq, bk] (query block
  i, key block j); ``mask`` is (causal, local, softcap)."""
  causal, local, softcap = mask
  scale = 1.0 / math.sqrt(q_bqkgh.shape[-1])
  s_bkgqs = jnp.einsum("bqkgh,bskh->bkgqs", q_bqkgh, k_bskh, preferred_element_type=jnp.float32) * scale
  q_pos = i * bq + jnp.arange(bq) + offset
  k_pos = j * bk + jnp.arange(bk)
  visible = _visible(q_pos, k_pos, causal=causal, kv_len=kv_len, local=local)
  return jnp.where(visible, _cap(s_bkgqs, softcap), _mask_value(jnp.float32))


def _slice(x, i, size, axis=1):
  return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=axis)


def _flash_forward(q_btnh, k_bskh, v_bskv, causal, bq, bk, kv_len, offset, sink_kg):
  """(out_btnv, lse_nbkgq): padded inputs; lse blocked by query block, [T/bq, B, K, G, bq].
  ``sink_kg`` (float32 [K, G], or None) is each head's sink logit, in every row's lse."""
  b, tp, n, h = q_btnh.shape
  sp, k = k_bskh.shape[1], k_bskh.shape[2]
  g, vd = n // k, v_bskv.shape[-1]
  q_btkgh = q_btnh.reshape(b, tp, k, g, h)
  blk = functools.partial(_scores, bq=bq, bk=bk, mask=causal, kv_len=kv_len, offset=offset)

  def one_query_block(i):
    q_bqkgh = _slice(q_btkgh, i, bq)

    def kv_step(carry, j):
      m_bkgq, l_bkgq, acc_bkgqv = carry
      s_bkgqs = blk(q_bqkgh, _slice(k_bskh, j, bk), i, j)
      m_new = jnp.maximum(m_bkgq, jnp.max(s_bkgqs, axis=-1))
      p_bkgqs = jnp.exp(s_bkgqs - m_new[..., None])
      corr_bkgq = jnp.exp(m_bkgq - m_new)
      l_bkgq = l_bkgq * corr_bkgq + jnp.sum(p_bkgqs, axis=-1)
      pv_bkgqv = jnp.einsum(
        "bkgqs,bskv->bkgqv", p_bkgqs.astype(v_bskv.dtype), _slice(v_bskv, j, bk), preferred_element_type=jnp.float32
      )
      return (m_new, l_bkgq, acc_bkgqv * corr_bkgq[..., None] + pv_bkgqv), None

    # Every row sees a key in some block (its own position), and a masked score is finite
    # (_mask_value), so m is finite after the first step and -inf never meets -inf.
    if sink_kg is None:
      m0_bkgq, l0_bkgq = jnp.full((b, k, g, bq), -jnp.inf, jnp.float32), jnp.zeros((b, k, g, bq), jnp.float32)
    else:  # the sink as a first key of score sink, value 0: exp(sink - m) joins l, nothing joins acc
      m0_bkgq = jnp.broadcast_to(sink_kg[None, :, :, None], (b, k, g, bq))
      l0_bkgq = jnp.ones((b, k, g, bq), jnp.float32)
    init = (m0_bkgq, l0_bkgq, jnp.zeros((b, k, g, bq, vd), jnp.float32))
    (m_bkgq, l_bkgq, acc_bkgqv), _ = jax.lax.scan(kv_step, init, jnp.arange(sp // bk))
    out_bqkgv = jnp.transpose(acc_bkgqv / l_bkgq[..., None], (0, 3, 1, 2, 4)).astype(v_bskv.dtype)
    return out_bqkgv, m_bkgq + jnp.log(l_bkgq)

  out_nbqkgv, lse_nbkgq = jax.lax.map(one_query_block, jnp.arange(tp // bq))
  out_btnv = jnp.moveaxis(out_nbqkgv, 0, 1).reshape(b, tp, n, vd)
  return out_btnv, lse_nbkgq


# sink_kg (float32 [K, G] or None, an empty pytree) is the last, differentiable argument.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _flash(q_btnh, k_bskh, v_bskv, causal, bq, bk, kv_len, offset, sink_kg):
  return _flash_forward(q_btnh, k_bskh, v_bskv, causal, bq, bk, kv_len, offset, sink_kg)[0]


def _flash_fwd(q_btnh, k_bskh, v_bskv, causal, bq, bk, kv_len, offset, sink_kg):
  out_btnv, lse_nbkgq = _flash_forward(q_btnh, k_bskh, v_bskv, causal, bq, bk, kv_len, offset, sink_kg)
  out_btnv = checkpoint_name(out_btnv, CONTEXT)
  lse_nbkgq = checkpoint_name(lse_nbkgq, CONTEXT)
  return out_btnv, (q_btnh, k_bskh, v_bskv, out_btnv, lse_nbkgq, sink_kg)


def _flash_bwd(causal, bq, bk, kv_len, offset, res, dout_btnv):
  """FlashAttention-2 Algorithm 2 (Dao 2023), as a dq pass and a dk/dv pass; with sinks, their
  gradient from the saved log-sum-exp."""
  q_btnh, k_bskh, v_bskv, out_btnv, lse_nbkgq, sink_kg = res
  b, tp, n, h = q_btnh.shape
  sp, k = k_bskh.shape[1], k_bskh.shape[2]
  g, vd = n // k, v_bskv.shape[-1]
  scale = 1.0 / math.sqrt(h)
  q_btkgh = q_btnh.reshape(b, tp, k, g, h)
  do_btkgv = dout_btnv.reshape(b, tp, k, g, vd)
  # D_i = rowsum(dO_i * O_i) (Algorithm 2, line 4): the softmax backward's per-row term.
  d_bkgt = jnp.einsum(
    "btkgv,btkgv->bkgt", do_btkgv.astype(jnp.float32), out_btnv.reshape(b, tp, k, g, vd).astype(jnp.float32)
  )
  blk = functools.partial(_scores, bq=bq, bk=bk, mask=causal, kv_len=kv_len, offset=offset)

  def probs_and_dscores(i, j):
    """(P, dS) of block (i, j), float32 [B, K, G, bq, bk], and the block's q, dO, k."""
    q_blk, do_blk = _slice(q_btkgh, i, bq), _slice(do_btkgv, i, bq)
    k_blk, v_blk = _slice(k_bskh, j, bk), _slice(v_bskv, j, bk)
    s_bkgqs = blk(q_blk, k_blk, i, j)
    p_bkgqs = jnp.exp(s_bkgqs - lse_nbkgq[i][..., None])
    dp_bkgqs = jnp.einsum("bqkgv,bskv->bkgqs", do_blk, v_blk, preferred_element_type=jnp.float32)
    ds_bkgqs = p_bkgqs * (dp_bkgqs - _slice(d_bkgt, i, bq, axis=3)[..., None])
    softcap = causal[2]
    if softcap is not None:  # through c * tanh(s / c): d/ds = 1 - tanh^2 (masked entries: p = 0, clipped)
      ds_bkgqs = ds_bkgqs * (1.0 - jnp.square(jnp.clip(s_bkgqs / softcap, -1.0, 1.0)))
    return p_bkgqs, ds_bkgqs, q_blk, do_blk, k_blk

  def dq_block(i):
    def step(dq_bqkgh, j):
      _, ds_bkgqs, _, _, k_blk = probs_and_dscores(i, j)
      return dq_bqkgh + jnp.einsum("bkgqs,bskh->bqkgh", ds_bkgqs, k_blk.astype(jnp.float32)) * scale, None

    dq_bqkgh, _ = jax.lax.scan(step, jnp.zeros((b, bq, k, g, h), jnp.float32), jnp.arange(sp // bk))
    return dq_bqkgh.astype(q_btnh.dtype)

  def dkv_block(j):
    def step(carry, i):
      dk_bskh, dv_bskv = carry
      p_bkgqs, ds_bkgqs, q_blk, do_blk, _ = probs_and_dscores(i, j)
      dv_bskv = dv_bskv + jnp.einsum(
        "bkgqs,bqkgv->bskv", p_bkgqs.astype(do_blk.dtype), do_blk, preferred_element_type=jnp.float32
      )
      dk_bskh = dk_bskh + jnp.einsum("bkgqs,bqkgh->bskh", ds_bkgqs, q_blk.astype(jnp.float32)) * scale
      return (dk_bskh, dv_bskv), None

    init = (jnp.zeros((b, bk, k, h), jnp.float32), jnp.zeros((b, bk, k, vd), jnp.float32))
    (dk_bskh, dv_bskv), _ = jax.lax.scan(step, init, jnp.arange(tp // bq))
    return dk_bskh.astype(k_bskh.dtype), dv_bskv.astype(v_bskv.dtype)

  dq_nbqkgh = jax.lax.map(dq_block, jnp.arange(tp // bq))
  dk_nbskh, dv_nbskv = jax.lax.map(dkv_block, jnp.arange(sp // bk))
  dq_btnh = jnp.moveaxis(dq_nbqkgh, 0, 1).reshape(b, tp, n, h)
  dk_bskh = jnp.moveaxis(dk_nbskh, 0, 1).reshape(b, sp, k, h)
  dv_bskv = jnp.moveaxis(dv_nbskv, 0, 1).reshape(b, sp, k, vd)
  return dq_btnh, dk_bskh, dv_bskv, _sink_grad(sink_kg, lse_nbkgq, d_bkgt)


def _sink_grad(sink_kg, lse_nbkgq, d_bkgt):
  """d sink [K, G] (None without sinks). The sink is one more logit of each row whose value is
  zero, so its dP is 0 and its dS = P_sink (0 - D) (Algorithm 2's dS = P o (dP - D)):
  d sink = -sum over the head's rows of exp(sink - lse) D. Padded query rows have dO = 0, so
  D = 0 there."""
  if sink_kg is None:
    return None
  nq, b, k, g, bq = lse_nbkgq.shape
  d_nbkgq = jnp.moveaxis(d_bkgt.reshape(b, k, g, nq, bq), 3, 0)
  p_sink_nbkgq = jnp.exp(sink_kg[None, None, :, :, None] - lse_nbkgq)
  return -jnp.sum(p_sink_nbkgq * d_nbkgq, axis=(0, 1, 4))


_flash.defvjp(_flash_fwd, _flash_bwd)

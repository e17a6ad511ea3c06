"""Attention over a sequence sharded on the ``context`` mesh axis, under ``jax.shard_map``.

Two strategies, as MaxText's ``context_parallel_strategy`` names them:

* ``all_gather`` (MaxText's default): each device all-gathers the keys and values over the
  sequence axes and runs its own queries through the local kernel (splash on TPU, cuDNN on GPU,
  the pure-JAX blockwise kernel on CPU, see :data:`ALL_GATHER_KERNELS`). The backward pass is
  the all-gather's transpose: the key/value gradients are reduce-scattered.
* ``ring`` (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers"): each
  device keeps its own queries and key/value block; the key/value blocks travel round the ring
  with ``ppermute``, ``n - 1`` hops, each merged into the running online softmax (Milakov &
  Gimelshein 2018). A custom VJP streams the backward pass the same way (FlashAttention-2's
  Algorithm 2 per block, Dao 2023): the key/value blocks travel again and their gradients
  travel with them, ``n`` hops, home. No device ever holds a full-length key or value.

Causal load balancing (MaxText's ``context_parallel_load_balance``, Brandon et al. 2023 "Striped
Attention" / the zig-zag layout of Llama 3's context parallelism): the sequence is stored in an
order where device ``d`` of ``n`` holds natural chunks ``d`` and ``2n - 1 - d`` (of ``2n``), so
every device has one early and one late chunk and the same causal work. The data loader feeds
tokens and targets in that order (MaxText reorders the batch once, ``reorder_causal_load_balanced``);
the model reads the natural positions of its storage order from the attend function's
``positions`` (RoPE and learned positions), and the masks below compare natural positions.
The loss is a sum over positions, so it is the same in either order.

Both keep the ``context`` checkpoint name on what their backward pass saves (output and
log-sum-exp; splash names its own residuals so), as the single-device kernels do.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh

from jaxmem.errors import JaxmemError
from jaxmem.registry import publish

from .attention_ops import AttendFn
from .mesh_axes import MeshAxes, require, shard_map
from .names import CONTEXT

STRATEGIES: tuple[str, ...] = publish("context strategy", ("all_gather", "ring"))
DEFAULT_STRATEGY = "all_gather"
# The local kernel each strategy can run its queries through. ring merges partial softmaxes, so
# its block kernel must return the log-sum-exp and take it back in the backward pass: the
# pure-JAX one does; jax's fused kernels do not expose that (splash's residuals are not
# differentiable, cuDNN's VJP drops the log-sum-exp's cotangent).
RING_KERNELS = ("chunked",)
# all_gather: splash takes a shard's queries against all keys with a static mask plus segment
# ids (below). cuDNN aligns its causal mask at the first key and takes no offset, so each query
# chunk runs as a merge of mask-free parts (keys before the chunk, by a padding length) and the
# chunk's own causal diagonal (:func:`_merged_attend`). jax's Triton kernel takes neither an
# offset nor a key length.
ALL_GATHER_KERNELS = ("chunked", "dot", "splash", "cudnn")
BLOCK = 512  # block length of the pure-JAX kernel along queries and keys (as attention_ops)


def strategy_problem(strategy: str, kernel: str, available: tuple[str, ...] | None = None) -> str | None:
  """Why ``kernel`` cannot run the local attention of ``strategy``, or None; the message names
  the kernels that can (of ``available``, the platform's, when given)."""
  if strategy not in STRATEGIES:
    return f"unknown context strategy {strategy!r}; valid: {', '.join(STRATEGIES)}"
  able = RING_KERNELS if strategy == "ring" else ALL_GATHER_KERNELS
  able = tuple(a for a in able if available is None or a in available)
  if kernel in able:
    return None
  why = (
    "its blocks merge partial softmaxes, which needs a kernel that returns and takes back the "
    "log-sum-exp (the pure-JAX one)" if strategy == "ring"
    else "jax's kernel aligns its causal mask at the first key and takes no offset, key lengths or "
    "segment ids for a shard's queries"
  )
  return f"context strategy {strategy} cannot run {kernel}: {why}; use attention {' or '.join(able)}"


def seq_multiple(strategy: str, kernel: str, ways: int) -> int:
  """What the sequence must be a multiple of over ``ways`` sequence shards: two chunks per
  device (load balancing), each a whole number of the kernel's blocks (splash: 128 lanes)."""
  del strategy
  block = 128 if kernel == "splash" else 1
  return 2 * ways * block


def check_seq(seq: int, ways: int, strategy: str, kernel: str) -> None:
  """A sequence the load-balanced layout (or the kernel's block) cannot divide: one line naming
  the nearest valid length."""
  m = seq_multiple(strategy, kernel, ways)
  if seq % m:
    below = seq // m * m
    nearest = below if below and seq - below <= below + m - seq else below + m
    what = f"2 chunks x {ways} context shards" + (" of splash's 128-lane blocks" if kernel == "splash" else "")
    raise JaxmemError(
      f"seq {seq} cannot be split into {what} (context strategy {strategy}, attention {kernel}); "
      f"use a multiple of {m}, nearest {nearest}"
    )


def load_balanced_positions(seq: int, ways: int) -> np.ndarray:
  """The natural position of each storage index: device d holds natural chunks d and 2n-1-d."""
  c = seq // (2 * ways)
  chunks = np.stack([np.arange(ways), 2 * ways - 1 - np.arange(ways)], axis=1).reshape(-1)
  return (chunks[:, None] * c + np.arange(c)[None, :]).reshape(-1).astype(np.int32)


def shard_positions(d: jax.Array, local: int, ways: int) -> jax.Array:
  """Natural positions [local] of device ``d``'s shard (traced ``d``: inside the shard_map)."""
  c = local // 2
  r = jnp.arange(c, dtype=jnp.int32)
  return jnp.concatenate([d * c + r, (2 * ways - 1 - d) * c + r])


# --- the pure-JAX block kernel, over explicit positions ------------------------------------


def _scores(q_bqkgh, k_bskh, qpos_q, kpos_s, causal):
  """One block's scaled float32 scores [B, K, G, bq, bk], masked by natural positions."""
  scale = 1.0 / math.sqrt(q_bqkgh.shape[-1])
  s_bkgqs = jnp.einsum("bqkgh,bskh->bkgqs", q_bqkgh, k_bskh, preferred_element_type=jnp.float32) * scale
  if not causal:
    return s_bkgqs
  return jnp.where(kpos_s[None, :] <= qpos_q[:, None], s_bkgqs, -0.7 * float(jnp.finfo(jnp.float32).max))


def _blocks(n: int) -> int:
  """The block length along n positions: the largest divisor of n that divides BLOCK (a
  sequence in fit's steps of 128 per shard gets blocks of 128 at least), so a length that is no
  multiple of 512 never becomes one block of scores as long as the shard."""
  return math.gcd(n, BLOCK)


def _fold(q_btkgh, k_bskh, v_bskv, qpos_t, kpos_s, causal, stats):
  """The online softmax's running (m, l, acc) over query blocks, [nq, B, K, G, bq(, V)], with
  the keys k_bskh folded in block by block (FlashAttention-2 Algorithm 1's inner loop)."""
  bq, bk = _blocks(q_btkgh.shape[1]), _blocks(k_bskh.shape[1])
  nk = k_bskh.shape[1] // bk

  def one_query_block(args):
    i, (m, l, acc) = args
    q_blk, qp = jax.lax.dynamic_slice_in_dim(q_btkgh, i * bq, bq, 1), jax.lax.dynamic_slice_in_dim(qpos_t, i * bq, bq)

    def step(carry, j):
      m, l, acc = carry
      k_blk = jax.lax.dynamic_slice_in_dim(k_bskh, j * bk, bk, 1)
      v_blk = jax.lax.dynamic_slice_in_dim(v_bskv, j * bk, bk, 1)
      s = _scores(q_blk, k_blk, qp, jax.lax.dynamic_slice_in_dim(kpos_s, j * bk, bk), causal)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.exp(s - m_new[..., None])
      corr = jnp.exp(m - m_new)
      pv = jnp.einsum("bkgqs,bskv->bkgqv", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
      return (m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv), None

    return jax.lax.scan(step, (m, l, acc), jnp.arange(nk))[0]

  return jax.lax.map(one_query_block, (jnp.arange(q_btkgh.shape[1] // bq), stats))


def _init_stats(b, t, k, g, vd):
  nq, bq = t // _blocks(t), _blocks(t)
  return (
    jnp.full((nq, b, k, g, bq), -jnp.inf, jnp.float32),
    jnp.zeros((nq, b, k, g, bq), jnp.float32),
    jnp.zeros((nq, b, k, g, bq, vd), jnp.float32),
  )


def _finish(stats, dtype):
  """(out_btnv, lse [nq, B, K, G, bq]) from the running statistics."""
  m, l, acc = stats
  nq, b, k, g, bq, vd = acc.shape
  out = jnp.transpose(acc / l[..., None], (1, 0, 4, 2, 3, 5)).reshape(b, nq * bq, k * g, vd)
  return out.astype(dtype), m + jnp.log(l)


def _grads(q_btkgh, k_bskh, v_bskv, qpos_t, kpos_s, causal, do_btkgv, lse, d_nbkgq, kv_dtype=jnp.float32):
  """(dq [B,T,K,G,H] f32, dk, dv in ``kv_dtype``) of one key block set, FlashAttention-2
  Algorithm 2 with the global log-sum-exp ``lse`` and D = rowsum(dO * O), both [nq, B, K, G, bq].
  Each key block's gradients are summed in float32 and cast as the block is done, so a
  full-length set (all_gather's) is held in ``kv_dtype``."""
  bq, bk = _blocks(q_btkgh.shape[1]), _blocks(k_bskh.shape[1])
  nq, nk = q_btkgh.shape[1] // bq, k_bskh.shape[1] // bk
  scale = 1.0 / math.sqrt(q_btkgh.shape[-1])
  sl = jax.lax.dynamic_slice_in_dim

  def block(i, j):
    q_blk, do_blk = sl(q_btkgh, i * bq, bq, 1), sl(do_btkgv, i * bq, bq, 1)
    k_blk, v_blk = sl(k_bskh, j * bk, bk, 1), sl(v_bskv, j * bk, bk, 1)
    p = jnp.exp(_scores(q_blk, k_blk, sl(qpos_t, i * bq, bq), sl(kpos_s, j * bk, bk), causal) - lse[i][..., None])
    dp = jnp.einsum("bqkgv,bskv->bkgqs", do_blk, v_blk, preferred_element_type=jnp.float32)
    return p, p * (dp - d_nbkgq[i][..., None]), q_blk, do_blk, k_blk

  def dq_block(i):
    def step(dq, j):
      _, ds, _, _, k_blk = block(i, j)
      return dq + jnp.einsum("bkgqs,bskh->bqkgh", ds, k_blk.astype(jnp.float32)) * scale, None

    b, _, k, g, h = q_btkgh.shape
    return jax.lax.scan(step, jnp.zeros((b, bq, k, g, h), jnp.float32), jnp.arange(nk))[0]

  def dkv_block(j):
    def step(carry, i):
      dk, dv = carry
      p, ds, q_blk, do_blk, _ = block(i, j)
      dv = dv + jnp.einsum("bkgqs,bqkgv->bskv", p.astype(do_blk.dtype), do_blk, preferred_element_type=jnp.float32)
      return (dk + jnp.einsum("bkgqs,bqkgh->bskh", ds, q_blk.astype(jnp.float32)) * scale, dv), None

    b, _, k, h = k_bskh.shape
    init = (jnp.zeros((b, bk, k, h), jnp.float32), jnp.zeros((b, bk, k, v_bskv.shape[-1]), jnp.float32))
    dk, dv = jax.lax.scan(step, init, jnp.arange(nq))[0]
    return dk.astype(kv_dtype), dv.astype(kv_dtype)

  dq = jnp.moveaxis(jax.lax.map(dq_block, jnp.arange(nq)), 0, 1).reshape(q_btkgh.shape)
  dk, dv = jax.lax.map(dkv_block, jnp.arange(nk))
  flat = lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], nk * bk, *x.shape[3:])  # noqa: E731
  return dq, flat(dk), flat(dv)


def _grouped(q_btnh, k_bskh):
  b, t, n, h = q_btnh.shape
  k = k_bskh.shape[2]
  return q_btnh.reshape(b, t, k, n // k, h)


def _d_term(do_btkgv, out_btnv, bq):
  """D = rowsum(dO * O) (FlashAttention-2 Algorithm 2, line 4), blocked as the lse."""
  b, t, k, g, vd = do_btkgv.shape
  d = jnp.einsum("btkgv,btkgv->bkgt", do_btkgv.astype(jnp.float32), out_btnv.reshape(b, t, k, g, vd).astype(jnp.float32))
  return jnp.moveaxis(d.reshape(b, k, g, t // bq, bq), 3, 0)


# --- all_gather: the local kernel over every key -------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def local_attend(q_btnh, k_bskh, v_bskv, qpos_t, kpos_s, causal):
  """This shard's queries over keys at natural positions ``kpos_s`` (pure JAX, blockwise)."""
  return _local_fwd(q_btnh, k_bskh, v_bskv, qpos_t, kpos_s, causal)[0]


def _local_fwd(q_btnh, k_bskh, v_bskv, qpos_t, kpos_s, causal):
  q = _grouped(q_btnh, k_bskh)
  b, t, k, g, _ = q.shape
  stats = _fold(q, k_bskh, v_bskv, qpos_t, kpos_s, causal, _init_stats(b, t, k, g, v_bskv.shape[-1]))
  out, lse = _finish(stats, v_bskv.dtype)
  out, lse = checkpoint_name(out, CONTEXT), checkpoint_name(lse, CONTEXT)
  return out, (q_btnh, k_bskh, v_bskv, qpos_t, kpos_s, out, lse)


def _local_bwd(causal, res, dout_btnv):
  q_btnh, k_bskh, v_bskv, qpos_t, kpos_s, out, lse = res
  q = _grouped(q_btnh, k_bskh)
  do = dout_btnv.reshape(*q.shape[:4], v_bskv.shape[-1])
  d = _d_term(do, out, _blocks(q.shape[1]))
  dq, dk, dv = _grads(q, k_bskh, v_bskv, qpos_t, kpos_s, causal, do, lse, d, kv_dtype=k_bskh.dtype)
  return dq.reshape(q_btnh.shape).astype(q_btnh.dtype), dk, dv.astype(v_bskv.dtype), None, None


local_attend.defvjp(_local_fwd, _local_bwd)


def _dot_local(q_btnh, k_bskh, v_bskv, qpos_t, kpos_s, causal):
  """The einsum reference over natural positions (materialises [T_local, S] scores)."""
  q = _grouped(q_btnh, k_bskh)
  s = _scores(q, k_bskh, qpos_t, kpos_s, causal)
  p = jax.nn.softmax(s, axis=-1).astype(v_bskv.dtype)
  out = jnp.einsum("bkgts,bskv->btkgv", p, v_bskv)
  return out.reshape(*q_btnh.shape[:3], v_bskv.shape[-1])


def _splash_kernel(c: int, s: int, heads: int, causal: bool, interpret: bool):
  """The splash kernel for chunks of c queries over s keys. Built in each trace that uses it
  (its mask metadata becomes arrays of that trace: a kernel kept across programs would carry
  another program's arrays in as constants); the host-side processing of the mask, about a
  minute and a half for 32k x 1M, is cached by jax (``_process_mask``'s lru_cache) per shape."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  from .attention_kernels import splash_block

  bq, bkv = splash_block(c), splash_block(s)
  mask = sm.CausalMask((c, s), offset=s - c) if causal else sm.FullMask((c, s))
  sizes = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                        block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  return sk.make_splash_mha(sm.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1, q_seq_shards=1,
                            residual_checkpoint_name=CONTEXT, interpret=interpret)


def _splash_local(interpret: bool):
  """Splash over one chunk of c queries at a time against all T keys: the keys are taken in a
  window that ends at the chunk's last position (a gather of the storage-ordered keys), so one
  static mask, ``CausalMask((c, T), offset=T - c)``, serves every device and chunk; the window's
  wrapped-around future keys are masked by segment ids (kv 0, q 1)."""

  def run(q_btnh, k_bskh, v_bskv, qpos_t, kpos_s, causal):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    t_local, n, h = q_btnh.shape[1:]
    s = k_bskh.shape[1]
    c = t_local // 2
    kernel = _splash_kernel(c, s, n, causal, interpret)
    inverse = jnp.argsort(kpos_s)  # storage index of each natural position
    q_bnth = jnp.swapaxes(q_btnh * jnp.asarray(1.0 / math.sqrt(h), q_btnh.dtype), 1, 2)
    outs = []
    for part in range(2):
      end = qpos_t[part * c + c - 1] + 1  # the chunk's natural end
      nat = (jnp.arange(s, dtype=jnp.int32) + end) % s  # window index -> natural position
      visible = (jnp.arange(s) >= s - end) if causal else jnp.ones((s,), bool)
      seg = sk.SegmentIds(q=jnp.ones((c,), jnp.int32), kv=visible.astype(jnp.int32))
      k_w, v_w = jnp.take(k_bskh, inverse[nat], axis=1), jnp.take(v_bskv, inverse[nat], axis=1)
      q_part = q_bnth[:, :, part * c:(part + 1) * c]
      run_one = lambda q, k, v: kernel(q, k, v, segment_ids=seg)  # noqa: E731
      outs.append(jax.vmap(run_one)(q_part, jnp.swapaxes(k_w, 1, 2), jnp.swapaxes(v_w, 1, 2)))
    return jnp.swapaxes(jnp.concatenate(outs, axis=2), 1, 2).astype(v_bskv.dtype)

  return run


# --- all_gather with cuDNN: a query chunk as a merge of parts aligned at their first key ----


def _fused_part(implementation: str):
  """``part(q, k, v, kv_len, causal) -> (out [B,T,N,H], lse [B,T,N] float32)``: the fused kernel
  over one key set, its causal mask aligned at the first key (query i sees key i) and, with
  ``kv_len`` [B], the keys from ``kv_len`` on masked. ``cudnn``: jax's cuDNN flash attention
  through ``fused_attention_stablehlo.dot_product_attention`` (the public
  ``jax.nn.dot_product_attention`` casts the log-sum-exp to the inputs' dtype, too coarse in
  bfloat16 to merge parts with); ``xla``: the same call through XLA's reference path, how the
  CPU tests check the merge without a GPU."""

  def part(q, k, v, kv_len, causal):
    scale = 1.0 / math.sqrt(q.shape[-1])
    if implementation != "cudnn":
      out, lse = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal, key_value_seq_lengths=kv_len,
                                              implementation=implementation, return_residual=True)
      return out, lse.astype(jnp.float32)
    from jax._src.cudnn import fused_attention_stablehlo as fa

    if kv_len is None:
      mask = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK
      out, lse = fa.dot_product_attention(q, k, v, scale=scale, mask_type=mask, qkv_layout="BTNH", return_residual=True)
    else:
      mask = fa.MaskType.PADDING_CAUSAL if causal else fa.MaskType.PADDING
      q_len = jnp.full((q.shape[0],), q.shape[1], jnp.int32)
      out, lse = fa.dot_product_attention(q, k, v, q_seqlen=q_len, kv_seqlen=kv_len, scale=scale, mask_type=mask,
                                          qkv_layout="BTNH", return_residual=True)
    return out, jnp.swapaxes(lse, 1, 2).astype(jnp.float32)  # cuDNN's statistics are [B, N, T]

  return part


def _valid(kv_len):
  """[B, 1, 1] whether a part has any key (None: every part without a length has)."""
  return None if kv_len is None else (kv_len > 0)[:, None, None]


def _weights(lses, lens, total):
  """Each part's share exp(lse_k - lse) of the merged softmax [B, T, N] (0 for an empty part)."""
  return [jnp.exp(l - total) if n is None else jnp.where(_valid(n), jnp.exp(l - total), 0.0) for l, n in zip(lses, lens)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _merged_attend(implementation, causals, q, ks, vs, lens):
  """Attention of queries ``q`` over the union of key sets ``ks``/``vs`` (each with its
  ``causals`` flag and ``lens`` padding length or None), merged by their log-sum-exps
  (Milakov & Gimelshein 2018): out = sum_k exp(lse_k - lse) out_k, lse = logsumexp_k lse_k."""
  return _merged_fwd(implementation, causals, q, ks, vs, lens)[0]


def _merged_fwd(implementation, causals, q, ks, vs, lens):
  part = _fused_part(implementation)
  outs, lses = zip(*(part(q, k, v, n, c) for k, v, n, c in zip(ks, vs, lens, causals)))
  lses = [l if n is None else jnp.where(_valid(n), l, -jnp.inf) for l, n in zip(lses, lens)]
  total = jax.nn.logsumexp(jnp.stack(lses), axis=0)
  out = sum(w[..., None] * (o if n is None else jnp.where(_valid(n)[..., None], o, 0)).astype(jnp.float32)
            for w, o, n in zip(_weights(lses, lens, total), outs, lens))
  out, total = checkpoint_name(out.astype(q.dtype), CONTEXT), checkpoint_name(total, CONTEXT)
  return out, (q, ks, vs, lens, out, total)


def _merged_bwd(implementation, causals, res, dout):
  """Each part's kernel backward with the cotangent scaled by its share, plus what its
  log-sum-exp's cotangent g_k = w_k (D_k - D) adds (D = rowsum(dO * O), D_k the part's; jax's
  cuDNN VJP drops that cotangent, fused_attention_stablehlo's _dot_product_attention_bwd_rule):
  dS += g P, i.e. dq += scale g (P K) and dK += scale P^T (g q), both from the same kernel with
  the keys as its values (its output, and its value gradient)."""
  q, ks, vs, lens, out, total = res
  part = _fused_part(implementation)
  scale = 1.0 / math.sqrt(q.shape[-1])
  do = dout.astype(jnp.float32)
  d_all = jnp.sum(do * out.astype(jnp.float32), axis=-1)
  dq = jnp.zeros(q.shape, jnp.float32)
  dks, dvs = [], []
  for k, v, n, c in zip(ks, vs, lens, causals):
    (o, l), pull = jax.vjp(lambda q_, k_, v_: part(q_, k_, v_, n, c), q, k, v)  # noqa: B023
    w = _weights([l], [n], total)[0]
    g = w * (jnp.sum(do * o.astype(jnp.float32), axis=-1) - d_all)
    dq_k, dk, dv = pull(((w[..., None] * do).astype(o.dtype), jnp.zeros_like(l)))
    (pk, _), pull_v = jax.vjp(lambda v_: part(q, k, v_, n, c), k)  # noqa: B023
    (dk_g,) = pull_v(((g[..., None] * q.astype(jnp.float32)).astype(pk.dtype), jnp.zeros_like(l)))
    dq_k = dq_k.astype(jnp.float32) + scale * g[..., None] * pk.astype(jnp.float32)
    dk = dk.astype(jnp.float32) + scale * dk_g.astype(jnp.float32)
    if n is not None:  # an empty part's kernel output is undefined: it contributes nothing
      keep = _valid(n)[..., None]
      dq_k, dk, dv = jnp.where(keep, dq_k, 0), jnp.where(keep, dk, 0), jnp.where(keep, dv, 0)
    dq = dq + dq_k
    dks.append(dk.astype(k.dtype))
    dvs.append(dv.astype(v.dtype))
  return dq.astype(q.dtype), tuple(dks), tuple(dvs), jax.tree_util.tree_map(lambda _: None, lens)


_merged_attend.defvjp(_merged_fwd, _merged_bwd)


def _cudnn_all_gather(q, k, v, axis, ways, causal, implementation):
  """all_gather with a fused kernel aligned at the first key (cuDNN). The keys are gathered as
  two halves in natural order, without a reordered copy: the first halves of every shard are
  natural chunks 0..n-1, and the second halves, each sent first to the mirror device (d to
  n-1-d), chunks n..2n-1. Query chunk j (natural positions [jc, (j+1)c)) sees the keys before it
  with no mask (a padding length into the halves) and its own chunk, the shard's local keys,
  under the causal mask aligned at its first key: the union is exactly j's causal window."""
  c = q.shape[1] // 2
  d = jax.lax.axis_index(axis)
  mirror = [(i, ways - 1 - i) for i in range(ways)]
  gather = lambda x: jax.lax.all_gather(x, axis, axis=1, tiled=True)  # noqa: E731
  k1, v1 = gather(k[:, :c]), gather(v[:, :c])
  k2, v2 = gather(jax.lax.ppermute(k[:, c:], axis, mirror)), gather(jax.lax.ppermute(v[:, c:], axis, mirror))
  q, d = _tied(q, d)
  b, half = q.shape[0], ways * c
  length = lambda n: jnp.full((b,), n, jnp.int32)  # noqa: E731
  if not causal:
    return _merged_attend(implementation, (False, False), q, (k1, k2), (v1, v2), (None, None))
  first = _merged_attend(implementation, (False, True), q[:, :c], (k1, k[:, :c]), (v1, v[:, :c]), (length(d * c), None))
  # The back chunk 2n-1-d: every front key, the back keys before it, its own.
  second = _merged_attend(implementation, (False, False, True), q[:, c:], (k1, k2, k[:, c:]), (v1, v2, v[:, c:]),
                          (None, length(half - (d + 1) * c), None))
  return jnp.concatenate([first, second], axis=1)


# --- ring -----------------------------------------------------------------------------------


def _tied(q, *positions):
  """``q`` and ``positions`` through one optimization barrier, so the positions depend on the
  layer's data. Positions alone are constants: inside a remat'd scan over layers, JAX's partial
  evaluation would hoist the masks computed from them out of the layer and stack them over
  every block pair as residuals (measured: 64 GiB of booleans per device for Llama 2 7B at
  128k tokens over context=8), whatever the remat policy says."""
  return jax.lax.optimization_barrier((q, *positions))


def _rotate(x, axis, ways):
  """Each device's block to the next device of the ring (device d receives d - 1's)."""
  return jax.lax.ppermute(x, axis, perm=[(i, (i + 1) % ways) for i in range(ways)])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def ring_attend_local(q_btnh, k_bskh, v_bskv, axis, ways, causal):
  """Ring attention of this shard (inside a shard_map over ``axis`` of ``ways`` devices)."""
  return _ring_fwd(q_btnh, k_bskh, v_bskv, axis, ways, causal)[0]


def _ring_fwd(q_btnh, k_bskh, v_bskv, axis, ways, causal):
  q_btnh, d = _tied(q_btnh, jax.lax.axis_index(axis))
  q = _grouped(q_btnh, k_bskh)
  b, t, k, g, _ = q.shape
  qpos = shard_positions(d, t, ways)

  def hop(carry, step):
    stats, k_blk, v_blk = carry
    kpos = shard_positions((d - step) % ways, k_blk.shape[1], ways)
    stats = _fold(q, k_blk, v_blk, qpos, kpos, causal, stats)
    return (stats, _rotate(k_blk, axis, ways), _rotate(v_blk, axis, ways)), None

  init = (_init_stats(b, t, k, g, v_bskv.shape[-1]), k_bskh, v_bskv)
  # n - 1 hops with a rotation after each, then the last block without one.
  (stats, k_last, v_last), _ = jax.lax.scan(hop, init, jnp.arange(ways - 1))
  kpos = shard_positions((d - (ways - 1)) % ways, k_last.shape[1], ways)
  out, lse = _finish(_fold(q, k_last, v_last, qpos, kpos, causal, stats), v_bskv.dtype)
  out, lse = checkpoint_name(out, CONTEXT), checkpoint_name(lse, CONTEXT)
  return out, (q_btnh, k_bskh, v_bskv, out, lse)


def _ring_bwd(axis, ways, causal, res, dout_btnv):
  q_btnh, k_bskh, v_bskv, out, lse = res
  q_btnh, d = _tied(q_btnh, jax.lax.axis_index(axis))
  q = _grouped(q_btnh, k_bskh)
  do = dout_btnv.reshape(*q.shape[:4], v_bskv.shape[-1])
  qpos = shard_positions(d, q.shape[1], ways)
  dterm = _d_term(do, out, _blocks(q.shape[1]))

  def grads(step, k_blk, v_blk):
    kpos = shard_positions((d - step) % ways, k_blk.shape[1], ways)
    return _grads(q, k_blk, v_blk, qpos, kpos, causal, do, lse, dterm)

  def hop(carry, step):
    dq, k_blk, v_blk, dk, dv = carry
    dq_i, dk_i, dv_i = grads(step, k_blk, v_blk)
    # The key/value gradients travel with their blocks, so they arrive home after n hops.
    dk, dv = _rotate(dk + dk_i, axis, ways), _rotate(dv + dv_i, axis, ways)
    return (dq + dq_i, _rotate(k_blk, axis, ways), _rotate(v_blk, axis, ways), dk, dv), None

  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)  # noqa: E731
  init = (zeros(q), k_bskh, v_bskv, zeros(k_bskh), zeros(v_bskv))
  (dq, k_last, v_last, dk, dv), _ = jax.lax.scan(hop, init, jnp.arange(ways - 1))
  dq_i, dk_i, dv_i = grads(ways - 1, k_last, v_last)  # the last block: no key/value hop after it
  dk, dv = _rotate(dk + dk_i, axis, ways), _rotate(dv + dv_i, axis, ways)
  dq = dq + dq_i
  return dq.reshape(q_btnh.shape).astype(q_btnh.dtype), dk.astype(k_bskh.dtype), dv.astype(v_bskv.dtype)


ring_attend_local.defvjp(_ring_fwd, _ring_bwd)


# --- the AttendFn ---------------------------------------------------------------------------


class ContextAttend:
  """An :data:`~.attention_ops.AttendFn` for a context-sharded sequence: ``strategy`` with the
  local ``kernel``, under shard_map over the batch, sequence and head axes of ``axes``.
  ``positions(t)`` is the natural position of each storage index (the load-balanced order)."""

  def __init__(self, strategy: str, kernel: str, mesh: Mesh, axes: MeshAxes, *, interpret: bool = False,
               fused_implementation: str = "cudnn"):
    problem = strategy_problem(strategy, kernel)
    if problem:
      raise JaxmemError(problem)
    self.strategy, self.kernel = strategy, kernel
    self.mesh, self.axes = mesh, require(axes, mesh, f"context strategy {strategy}")
    self.ways = axes.ways("seq")
    self.interpret = interpret
    # cudnn's part kernel; "xla" runs the same call through XLA's reference path (CPU tests).
    self.fused_implementation = fused_implementation

  def positions(self, t: int) -> np.ndarray:
    return load_balanced_positions(t, self.ways)

  def __call__(self, q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True) -> jax.Array:
    axes, ways, t = self.axes, self.ways, q_btnh.shape[1]
    check_seq(t, ways, self.strategy, self.kernel)
    seq_axis = axes.entry("seq")
    spec = axes.spec("batch", "seq", "heads", None)
    if self.strategy == "ring":
      body = lambda q, k, v: ring_attend_local(q, k, v, seq_axis, ways, causal)  # noqa: E731
    elif self.kernel == "cudnn":
      impl = self.fused_implementation
      body = lambda q, k, v: _cudnn_all_gather(q, k, v, seq_axis, ways, causal, impl)  # noqa: E731
    else:
      local = {"chunked": local_attend, "dot": _dot_local, "splash": _splash_local(self.interpret)}[self.kernel]
      kpos_all = jnp.asarray(load_balanced_positions(t, ways))

      def body(q, k, v):
        k_all = jax.lax.all_gather(k, seq_axis, axis=1, tiled=True)
        v_all = jax.lax.all_gather(v, seq_axis, axis=1, tiled=True)
        qpos = shard_positions(jax.lax.axis_index(seq_axis), q.shape[1], ways)
        q, qpos, kpos = _tied(q, qpos, kpos_all)
        return local(q, k_all, v_all, qpos, kpos, causal)

    return shard_map(body, mesh=self.mesh, axes=axes, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(
      q_btnh, k_bskh, v_bskv
    )

"""The decoder-only Transformer: embeddings, a scanned stack of pre-norm blocks, the head.

Blocks are built once, stacked along a leading "layers" axis (``nnx.vmap`` over split RNGs),
and run with ``jax.lax.scan``. XLA therefore compiles one block body whatever the depth, so
compile time stays flat from 8 to 126 layers, and the stacked parameters and the per-layer
residuals saved for the backward pass show up as single [layers, ...] buffers in XLA's
memory figures, as they do in MaxText and other scanned production models.

What a model family adds (its positions, its blocks, its layers' own inputs, which layers share
keys and values) it says through its :class:`~.family.Family` (:mod:`.families`), which this
module calls at fixed points; the stacks and their order are the layer plan's
(:mod:`.layer_plan`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxmem.errors import JaxmemError

from .attention_ops import AttendFn
from .block import Block, KVShare, Rope
from .cache import KVCache, LocalKVCache
from .config import ModelConfig, StepChoices
from .dropout import EMBEDDINGS, Dropout, maybe
from .families import family_of
from .family import NO_ROPE, WeightHook, Where, value, with_weights
from .layer_plan import Segment, stack_names, stack_plan
from .layers import DEFAULT_INIT, Constrain, Embed, make_norm, no_constraint, param, softcap
from .loss import cross_entropy
from .mla import MLACache
from .moe import ExpertsFn
from .names import BATCH, DECODER_LAYER_INPUT, EMBED, LAYERS, NORM_SEQ, SEQ, VOCAB
from .pipeline import Pipeline
from .pipeline import run as run_pipeline
from .rope import rope_tables, rope_tables_at

# A jax.checkpoint policy, e.g. jax.checkpoint_policies.nothing_saveable.
RematPolicy = Callable[..., Any]


def _check_prefill_attend(attend: AttendFn | None, pos: Any) -> None:
  """``attend`` sees only the new keys, which are all a query may see only at pos 0."""
  if attend is not None and not (isinstance(pos, (int, np.integer)) and not isinstance(pos, bool) and pos == 0):
    raise JaxmemError(
      f"attend= serves prefill at pos=0 only (got pos={pos!r}); decode attends to the cache with einsums: drop attend"
    )


def _block_stack(
  block: type[Block], cfg: ModelConfig, seg: Segment, p: int, *, choices: StepChoices, rngs: nnx.Rngs
) -> Block:
  """The ``seg.groups`` blocks of position ``p`` of a segment, stacked: split_rngs gives each
  layer its own key, vmap stacks the resulting parameters on axis 0 and prepends "layers" to
  their logical axes."""
  moe, window = seg.kinds[p]

  @nnx.split_rngs(splits=seg.groups)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYERS})
  def make_blocks(rngs: nnx.Rngs) -> Block:
    return block(cfg, moe=moe, window=window, kv_shared=seg.kv == "reuse", choices=choices, rngs=rngs)

  return make_blocks(rngs)


@dataclasses.dataclass(frozen=True)
class _Cached:
  """What every layer of one cached call shares: the tokens' first position, the RoPE tables of
  the windowed and the global layers, the constraint, the weight hook, prefill's attend, and
  whether the cache holds the windowed layers apart (a LocalKVCache)."""

  pos: jax.Array
  rope: Rope
  rope_global: Rope
  constrain: Constrain
  weights: WeightHook | None
  attend: AttendFn | None
  local_cache: bool = False


def _segment_slices(per_layer_btlq: jax.Array | None, seg: Segment) -> jax.Array | None:
  """A segment's per-layer inputs as scan xs: [groups, period, batch, seq, width]."""
  if per_layer_btlq is None:
    return None
  b, t, _, q = per_layer_btlq.shape
  period = len(seg.kinds)
  x_btgpq = per_layer_btlq[:, :, seg.first : seg.first + seg.groups * period].reshape(b, t, seg.groups, period, q)
  return jnp.transpose(x_btgpq, (2, 3, 0, 1, 4))


class Transformer(nnx.Module):
  """Decoder-only language model of ``cfg`` (:class:`~.config.ModelConfig`), built by its family
(``family``, :func:`~.families.family_of`: GPT-2, MLA, Gemma 4 or the RoPE decoder the rest
share) and run as ``choices`` (:class:`~.config.StepChoices`) say.

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

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, choices: StepChoices | None = None):
    """``choices``: how a step runs the model (:class:`~.config.StepChoices`: its dropout, its
    experts' implementation); the defaults where None."""
    self.cfg = cfg
    self.choices = StepChoices() if choices is None else choices
    self.family = family_of(cfg)
    self.embed = Embed(cfg, rngs=rngs)
    self.family.init_model(self, rngs)
    # One Block per layer, in stacks of identical blocks (layer_plan.stack_plan): `blocks` holds
    # the layers with a dense MLP (every layer of a dense model, the first_dense_layers of an MoE
    # one), `moe_blocks` the mixture-of-experts layers after them. Each stack is one scan. A
    # patterned model (layers differing in a repeating pattern: local and global attention, MoE
    # and dense MLPs) has one stack per position of each segment instead, blocks_{s}_{p}.
    for name, seg in stack_plan(cfg):
      for p, attr in enumerate(stack_names(name, seg, cfg.is_patterned)):
        setattr(self, attr, _block_stack(self.family.block, cfg, seg, p, choices=self.choices, rngs=rngs))
    self.final_norm = make_norm(cfg, rngs=rngs)
    if not cfg.tie_embeddings:
      self.unembed_dv = param(rngs, DEFAULT_INIT, (cfg.d_model, cfg.vocab_size), (EMBED, VOCAB), cfg.param_jnp_dtype)

  def segment_stacks(self) -> list[tuple[Segment, list[Block]]]:
    """Every segment with its stacks of blocks, one per pattern position, in layer order (an
    unpatterned model's stacks are segments of one position)."""
    patterned = self.cfg.is_patterned
    return [
      (seg, [getattr(self, attr) for attr in stack_names(name, seg, patterned)]) for name, seg in stack_plan(self.cfg)
    ]

  def stacks(self) -> list[tuple[Block, int, int]]:
    """(stacked blocks, first layer, number of layers) in layer order: the dense layers, then
    the MoE layers, each when present."""
    if self.cfg.is_patterned:
      raise JaxmemError(f"model {self.cfg.name!r}: its layers differ in a pattern; use segment_stacks()")
    return [(stack, seg.first, seg.groups) for seg, (stack,) in self.segment_stacks()]

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
    vocab_tiles: int = 1,
    constrain: Constrain | None = None,
    **run: Any,
  ) -> jax.Array:
    """Mean next-token cross entropy (float32 scalar) of the logits against ``targets_bt``;
    ``run`` are :meth:`hidden`'s keywords (``remat``, ``attend``, ``experts``, ``pipeline``,
    ``dropout_key``).

    ``vocab_tiles`` > 1 computes the output projection and the cross entropy tile by tile
    under ``jax.checkpoint`` (MaxText's ``num_vocab_tiling``; see :func:`.loss.cross_entropy`),
    so the float32 [batch, seq, vocab] logits never exist whole; 1 is exactly
    ``optax.softmax_cross_entropy_with_integer_labels(self(tokens_bt), targets_bt).mean()``.
    """
    constrain = no_constraint if constrain is None else constrain
    x_btd = self.hidden(tokens_bt, constrain=constrain, **run)
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
        a sharded one); None is the implementation ``choices.moe_impl`` names.
      pipeline: each stack of layers pipelined over the ``stage`` mesh axis
        (:mod:`.pipeline`: GPipe or MaxText's circular schedule); None runs the layers in one scan.
      dropout_key: a PRNG key for ``choices.dropout`` (training): the embeddings, attention
        probabilities and both sub-blocks' outputs are dropped, each layer with its own key.
        None, or a rate of 0, runs without dropout.
    """
    constrain = no_constraint if constrain is None else constrain
    _, t = tokens_bt.shape
    # A context-parallel attend stores the sequence load balanced (context_attention.py): its
    # ``positions`` give each storage index's natural position, for the position encodings.
    positions = getattr(attend, "positions", None)
    where = Where(t, natural=None if positions is None else jnp.asarray(positions(t)))
    x_btd, rope, rope_global = self._positions(self.embed(tokens_bt), where)
    rate = self.choices.dropout
    dropout = Dropout(rate, dropout_key) if rate and dropout_key is not None else None
    x_btd = constrain(maybe(dropout, EMBEDDINGS, x_btd), (BATCH, NORM_SEQ, EMBED))
    if self.cfg.is_patterned:
      if dropout is not None or pipeline is not None:
        raise JaxmemError(
          f"model {self.cfg.name!r}: dropout and a stage axis are not built for layers that differ in a pattern"
        )
      x_btd = self._patterned(
        x_btd, remat=remat, rope=rope, rope_global=rope_global, constrain=constrain, attend=attend, experts=experts,
        per_layer_btlq=self.family.layer_inputs(self, tokens_bt, x_btd),
      )
    else:
      x_btd = self._stacked(
        x_btd, remat=remat, rope=rope, constrain=constrain, attend=attend, experts=experts, pipeline=pipeline,
        dropout=dropout,
      )
    return constrain(self.final_norm(x_btd), (BATCH, NORM_SEQ, EMBED))

  def _positions(
    self, x_btd: jax.Array, where: Where, weights: WeightHook | None = None
  ) -> tuple[jax.Array, Rope, Rope]:
    """(the embeddings with the family's positions in, the RoPE tables of the windowed layers,
    of the global layers), the tables computed once outside the layers' scan and closed over."""
    x_btd = self.family.embed_positions(self, x_btd, where, weights)
    dims = self.family.rope_dims(self.cfg)
    if dims is None:
      return x_btd, NO_ROPE, NO_ROPE
    theta, at = self.cfg.rope_theta, where.explicit()

    def tables(dim: int) -> Rope:
      return rope_tables(where.t, dim, theta) if at is None else rope_tables_at(at, dim, theta)

    local, glob = dims
    rope = tables(local)
    # Gemma 4's global layers: their own head_dim (a cache's positions counted again for them).
    return x_btd, rope, rope if glob == local else tables(glob)

  def _stacked(self, x_btd, *, remat, rope, constrain, attend, experts, pipeline, dropout) -> jax.Array:
    """The layers of an unpatterned model: each stack one scan (or pipelined over stages)."""
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
          carry_btd, rope=rope, constrain=constrain, attend=attend, experts=experts,
          dropout=None if layer_key is None else Dropout(dropout.rate, layer_key),
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
    return x_btd


  def _patterned(self, x_btd, *, remat, rope, rope_global, constrain, attend, experts, per_layer_btlq=None) -> jax.Array:
    """The layers of a patterned model: per segment, one scan over its groups, each step
    running the pattern's positions in turn (each layer under its own jax.checkpoint).
    ``rope_global``: the global layers' RoPE tables (their own head_dim in Gemma 4).

    Gemma 4's KV sharing: the "store" segment's scan returns the keys and values of its last
    layer of each attention type, and the "reuse" segment's layers close over them, so they stay
    live (and are saved for the backward pass) across every shared layer (Segment.kv).
    ``per_layer_btlq``: the layers' own inputs (the family's layer_inputs: Gemma 4's per-layer
    inputs), a slice per layer riding the scan beside its parameters."""
    shared: dict[int | None, tuple[jax.Array, jax.Array]] = {}  # window (None: global) -> (k, v)
    for seg, stacks in self.segment_stacks():
      split = [nnx.split(stack) for stack in stacks]
      defs = [d for d, _ in split]

      def layer(carry_btd, xs, block_def, rope, share):
        layer_state, per_layer_btq = xs
        carry_btd = checkpoint_name(carry_btd, DECODER_LAYER_INPUT)
        block = nnx.merge(block_def, layer_state)
        return block(
          carry_btd, rope=rope, constrain=constrain, attend=attend, experts=experts, share=share,
          layer_input=per_layer_btq,
        )

      stores = [seg.stores(p) for p in range(len(seg.kinds))]
      runs = [
        functools.partial(
          layer, block_def=d, rope=rope_global if window is None else rope,
          share=KVShare(kv=shared[window] if seg.kv == "reuse" else None, store=store),
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

  def logits(
    self, x_btd: jax.Array, *, constrain: Constrain | None = None, weights: WeightHook | None = None
  ) -> jax.Array:
    """Float32 logits [batch, seq, vocab] of final-normed hidden states: the output projection
    (the embedding table where tied; ``weights`` makes the stored one usable), soft-capped,
    c * tanh(logits / c), with ``cfg.final_softcap`` (Gemma 2)."""
    constrain = no_constraint if constrain is None else constrain
    if self.cfg.tie_embeddings:
      # The output projection contracts with every row, so with ``weights`` the whole (tied)
      # table is dequantized: a V x D temporary that gathering rows cannot avoid.
      logits_btv = with_weights(self.embed, weights).attend(x_btd)
    else:
      logits_btv = jnp.einsum(
        "btd,dv->btv", x_btd, value(self.unembed_dv, weights).astype(x_btd.dtype), preferred_element_type=jnp.float32
      )
    return constrain(softcap(logits_btv, self.cfg.final_softcap), (BATCH, SEQ, VOCAB))

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
    where = Where(t, start=pos, context=cache.context)
    x_btd, rope, rope_global = self._positions(x_btd, where, weights)
    x_btd = constrain(x_btd, (BATCH, SEQ, EMBED))

    per_layer_btlq = self.family.layer_inputs(self, tokens_bt, x_btd, weights)
    arrays = tuple(getattr(cache, f.name) for f in dataclasses.fields(cache))
    shared: dict = {}  # Gemma 4's KV sharing: window -> the new tokens' (k, v) of the layer shared
    run = _Cached(pos, rope, rope_global, constrain, weights, attend, local_cache=isinstance(cache, LocalKVCache))
    for seg, stacks in self.segment_stacks():
      x_btd, arrays = self._cached_segment(
        stacks, seg, x_btd, arrays, run, shared=shared, per_layer=_segment_slices(per_layer_btlq, seg)
      )

    if last_only:
      x_btd = x_btd[:, -1:]
    x_btd = with_weights(self.final_norm, weights)(x_btd)
    return self.logits(x_btd, constrain=constrain, weights=weights), type(cache)(*arrays)

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
    self, stacks: list[Block], seg: Segment, x_btd: jax.Array, arrays: tuple[jax.Array, ...], run: _Cached, *,
    shared: dict, per_layer: jax.Array | None = None,
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
    plan = self._cache_slices(seg, local_cache=run.local_cache, n_arrays=len(arrays))
    pos, constrain, attend, weights = run.pos, run.constrain, run.attend, run.weights
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
        rope = run.rope_global if window is None else run.rope
        if weights is not None:
          # Inside the body: one layer's weights are made usable (dequantized) per step.
          layer_state = weights(layer_state)
        block = nnx.merge(block_def, layer_state)
        i = base + g * per
        if seg.kv == "reuse":  # reads the shared slice, writes nothing
          (x_btd,) = block.cached(
            x_btd, *(a[i] for a in arrays[lo:hi]), pos=pos, rope=rope, constrain=constrain, attend=attend,
            share=KVShare(kv=reused[window]), layer_input=per_layer_btq,
          )
          continue
        # This layer's cache is read out, updated and written back whole. Writing only the new
        # token into the carried [layers, ...] cache instead lets TPU's layout choices for that
        # write reach the loop carry, and TPU then copies the whole cache around the loop.
        x_btd, *layer_arrays = block.cached(
          x_btd, *(a[i] for a in arrays[lo:hi]), pos=pos, rope=rope, constrain=constrain, attend=attend,
          share=KVShare(store=store), layer_input=per_layer_btq,
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

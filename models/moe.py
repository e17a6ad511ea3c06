"""Mixture-of-experts feed-forward block: a router, routed SwiGLU experts, shared experts.

Each token's router chooses ``experts_per_token`` (k) of ``num_experts`` (E) experts; the block
returns ``sum_j w_j * expert_{e_j}(x) + shared(x)``, every expert a SwiGLU of width
``expert_d_ff`` (F) (Shazeer et al. 2017 for the sparsely gated layer; Fedus et al. 2021 and
Lepikhin et al. 2020 for top-k routing at scale).

Router (:func:`select_experts`), per token, in float32:

* ``softmax`` scoring (Mixtral, Jiang et al. 2024 section 2.1; Qwen3-MoE): scores
  s = softmax(x W_r) over all E experts, the k largest chosen, their weights renormalised to sum
  to 1 (``router_norm_topk``, Qwen's ``norm_topk_prob``). That equals Mixtral's
  Softmax(TopK(x W_r)) over the chosen logits.
* ``sigmoid`` scoring (DeepSeek-V3, arXiv 2412.19437 section 2.1.2, eqs. 12-16): affinities
  s = sigmoid(x W_r); the choice ranks s + b, where the bias b (``router_bias``) only steers the
  choice (its auxiliary-loss-free balancing: b gets no gradient and is updated outside the
  optimizer), optionally limited to the ``expert_groups_per_token`` best of ``expert_groups``
  groups, each group ranked by the sum of its two best s + b (DeepSeek-V3's ``Gate`` in
  ``inference/model.py``); the weights are the chosen s renormalised, times
  ``routed_scaling`` (2.5; ``routed_scaling_factor`` in its config.json).

Routed experts, two implementations with the same math (``StepChoices.moe_impl``):

* :func:`dropless_experts`: every (token, choice) copy is sorted by expert and the experts run
  as grouped matmuls (MaxText's ``sparse_matmul`` path): ``jax.lax.ragged_dot``, or megablox's
  TPU kernel ``gmm`` (:mod:`.moe_kernels`, the ``matmul`` argument). Nothing is dropped; buffers
  are [B*T*k, D] and [B*T*k, F].
* :func:`capacity_experts`: GShard's dispatch and combine einsums (Lepikhin et al. 2020,
  section 2.2 and Algorithm 1) with ``capacity_factor`` slots per expert and sequence:
  C = ceil(capacity_factor * T * k / E) (Fedus et al. 2021, section 2.2: capacity = tokens per
  batch / experts x capacity factor, here with k copies per token), at most T. Copies beyond an
  expert's C slots are dropped (contribute zero); first choices are placed before second ones
  (GShard's Algorithm 1). Buffers are [E, B, C, D], [E, B, C, F] and the [B, T, E, C] masks,
  so memory grows with the capacity factor.

Sharding: expert weights carry the logical axis "exp" (``names.EXPERT``). The capacity path
constrains its dispatched activations to ("exp", "batch", None, "embed"), so a caller that maps
"exp" to a mesh axis that also splits the batch gets all-to-all between the token-sharded and
expert-sharded layouts (GShard's scheme). The dropless path sorts tokens, which GSPMD cannot
split along the sorted dimension: under a batch-sharded mesh it gathers every token to every
device. A caller with a mesh therefore passes its own ``experts`` function, e.g.
:func:`dropless_experts` inside ``jax.shard_map`` over the batch axes with a
``jax.lax.ragged_all_to_all`` over the expert axis, as MaxText does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .config import ModelConfig, StepChoices
from .layers import DEFAULT_INIT, Constrain, param
from .mlp import SwiGLU
from .moe_kernels import GroupedMatmul, ragged_dot
from .names import BATCH, EMBED, EXPERT, EXPERT_SCORES, MLP, MOE_MLPWI_0, MOE_MLPWI_1, MOE_MLPWO, ROUTER_LOGITS, SEQ

# experts(x_btd, weights_btk, experts_btk, w_gate_edf, w_up_edf, w_down_efd, *, constrain)
#   -> y_btd: the routed experts' weighted sum for every token (shared experts excluded).
# weights_btk float32, experts_btk int32 in [0, E); weights in the compute dtype.
ExpertsFn = Callable[..., jax.Array]


def select_experts(
  logits_bte: jax.Array,
  *,
  k: int,
  scoring: str,
  norm_topk: bool = True,
  scaling: float = 1.0,
  bias_e: jax.Array | None = None,
  groups: int = 1,
  groups_per_token: int = 1,
) -> tuple[jax.Array, jax.Array]:
  """(weights_btk float32, experts_btk int32) from router logits (rules in the module docstring)."""
  logits_bte = logits_bte.astype(jnp.float32)
  scores_bte = jax.nn.softmax(logits_bte, axis=-1) if scoring == "softmax" else jax.nn.sigmoid(logits_bte)
  choice_bte = scores_bte if bias_e is None else scores_bte + bias_e.astype(jnp.float32)
  if groups > 1:
    e = choice_bte.shape[-1]
    choice_btgx = choice_bte.reshape(*choice_bte.shape[:-1], groups, e // groups)
    # DeepSeek-V3 ranks groups by their two best biased scores; without a bias, by the best.
    if bias_e is None:
      group_btg = jnp.max(choice_btgx, axis=-1)
    else:
      group_btg = jnp.sum(jax.lax.top_k(choice_btgx, 2)[0], axis=-1)
    _, best_btj = jax.lax.top_k(group_btg, groups_per_token)
    keep_btg = jnp.any(best_btj[..., :, None] == jnp.arange(groups), axis=-2)
    choice_bte = jnp.where(keep_btg[..., None], choice_btgx, -jnp.inf).reshape(choice_bte.shape)
  _, experts_btk = jax.lax.top_k(choice_bte, k)
  weights_btk = jnp.take_along_axis(scores_bte, experts_btk, axis=-1)
  if norm_topk:
    weights_btk = weights_btk / jnp.sum(weights_btk, axis=-1, keepdims=True)
  return weights_btk * scaling, experts_btk.astype(jnp.int32)


class Router(nnx.Module):
  """Router logits x W_r [B, T, E] (named ``router_logits``) and the top-k choice."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, e, pdt = cfg.d_model, cfg.num_experts, cfg.param_jnp_dtype
    self.dtype = cfg.compute_jnp_dtype
    # Plain values, not a bound function: module attributes that are not arrays become part of
    # the (hashed, compared) graph definition.
    self.k, self.scoring, self.norm_topk = cfg.experts_per_token, cfg.router_scoring, cfg.router_norm_topk
    self.scaling, self.groups = cfg.routed_scaling, cfg.expert_groups
    self.groups_per_token = cfg.expert_groups_per_token
    self.w_router_de = param(rngs, DEFAULT_INIT, (d, e), (EMBED, EXPERT_SCORES), pdt)
    self.use_bias = cfg.router_bias
    if self.use_bias:
      # A parameter so that it is stored, sharded and counted with the model (DeepSeek-V3's
      # checkpoint holds it); it only ranks experts, so its gradient is zero.
      self.b_select_e = param(rngs, nnx.initializers.zeros, (e,), (EXPERT_SCORES,), pdt)
    # Gemma 4's router (transformers' Gemma4TextRouter): its input is RMS-normed without a scale
    # of its own, then times a learned scale [D] (``scale``) and 1/sqrt(D); the chosen weights
    # times a learned per-expert scale [E] (``per_expert_scale``). Both initialised to ones.
    self.gemma = cfg.moe_beside_dense
    if self.gemma:
      self.eps = cfg.norm_eps
      self.scale_d = param(rngs, nnx.initializers.ones, (d,), (EMBED,), pdt)
      self.expert_scale_e = param(rngs, nnx.initializers.ones, (e,), (EXPERT_SCORES,), pdt)

  def logits(self, x_btd: jax.Array, *, constrain: Constrain) -> jax.Array:
    if self.gemma:  # Gemma4TextRouter.forward: norm (no scale), * scale * hidden_size**-0.5
      x_f = x_btd.astype(jnp.float32)
      x_f = x_f * jax.lax.rsqrt(jnp.mean(x_f * x_f, axis=-1, keepdims=True) + self.eps)
      x_f = x_f * self.scale_d[...].astype(jnp.float32) * x_btd.shape[-1] ** -0.5
      x_btd = x_f.astype(self.dtype)
    # Compute-dtype inputs, float32 accumulation and output: the scores feed a top-k and a
    # softmax over up to 256 experts, where bf16 ties and rounding would change the choice.
    logits_bte = jnp.einsum(
      "btd,de->bte", x_btd, self.w_router_de[...].astype(self.dtype), preferred_element_type=jnp.float32
    )
    # The expert dimension stays whole: every device needs all E scores for its tokens' top-k.
    return checkpoint_name(constrain(logits_bte, (BATCH, SEQ, None)), ROUTER_LOGITS)

  def __call__(self, x_btd: jax.Array, *, constrain: Constrain) -> tuple[jax.Array, jax.Array]:
    weights_btk, experts_btk = select_experts(
      self.logits(x_btd, constrain=constrain), k=self.k, scoring=self.scoring, norm_topk=self.norm_topk,
      scaling=self.scaling, bias_e=self.b_select_e[...] if self.use_bias else None, groups=self.groups,
      groups_per_token=self.groups_per_token,
    )
    if self.gemma:  # Gemma4TextRouter: top_k_weights * per_expert_scale[top_k_index], after renormalising
      weights_btk = weights_btk * self.expert_scale_e[...].astype(jnp.float32)[experts_btk]
    return weights_btk, experts_btk


@jax.custom_vjp
def _permute(x_md: jax.Array, order_m: jax.Array) -> jax.Array:
  """x[order] for a permutation ``order``, whose gradient is the inverse gather (not a
  scatter-add, which XLA cannot tell is a permutation); MaxText's ``_sort_activations``."""
  return x_md[order_m]


def _permute_fwd(x_md, order_m):
  return x_md[order_m], order_m


def _permute_bwd(order_m, g_md):
  return g_md[jnp.argsort(order_m)], None


_permute.defvjp(_permute_fwd, _permute_bwd)


def _swiglu_named(gate: jax.Array, up: jax.Array, act: str = "silu") -> jax.Array:
  """act(gate) * up: SwiGLU, or with ``act`` "gelu_tanh" GeGLU (Gemma4TextExperts, GELU's tanh
  form); ``ModelConfig.expert_act``."""
  gate = checkpoint_name(gate, MOE_MLPWI_0)
  h = jax.nn.gelu(gate, approximate=True) if act == "gelu_tanh" else jax.nn.silu(gate)
  return h * checkpoint_name(up, MOE_MLPWI_1)


def dropless_experts(
  x_btd: jax.Array,
  weights_btk: jax.Array,
  experts_btk: jax.Array,
  w_gate_edf: jax.Array,
  w_up_edf: jax.Array,
  w_down_efd: jax.Array,
  *,
  constrain: Constrain,
  matmul: GroupedMatmul = ragged_dot,
  act: str = "silu",
) -> jax.Array:
  """Routed experts over tokens sorted by expert, as grouped matmuls (``matmul``:
  ``jax.lax.ragged_dot`` unless given, :mod:`.moe_kernels`).

  The B*T tokens are copied k times (M = B*T*k rows), the copies sorted by chosen expert so
  each expert's rows are contiguous, and each expert's SwiGLU applied to its group; the outputs
  are unsorted and summed with the router weights. All tokens passed in form one group: see the
  module docstring for running it per shard.
  """
  del constrain  # no dimension of the sorted copies maps to a mesh axis (module docstring)
  b, t, d = x_btd.shape
  k = experts_btk.shape[-1]
  e = w_gate_edf.shape[0]
  flat_m = experts_btk.reshape(-1)  # token-major: copy j of token n is row n*k + j
  order_m = jnp.argsort(flat_m, stable=True)
  group_sizes_e = jnp.bincount(flat_m, length=e).astype(jnp.int32)
  x_md = _permute(jnp.repeat(x_btd.reshape(b * t, d), k, axis=0), order_m)
  gate_mf = matmul(x_md, w_gate_edf, group_sizes_e)
  up_mf = matmul(x_md, w_up_edf, group_sizes_e)
  h_mf = _swiglu_named(gate_mf, up_mf, act)
  out_md = checkpoint_name(matmul(h_mf, w_down_efd, group_sizes_e), MOE_MLPWO)
  out_nkd = _permute(out_md, jnp.argsort(order_m)).reshape(b * t, k, d)
  y_nd = jnp.einsum(
    "nkd,nk->nd", out_nkd, weights_btk.reshape(b * t, k).astype(out_nkd.dtype), preferred_element_type=jnp.float32
  )
  return y_nd.reshape(b, t, d).astype(x_btd.dtype)


def expert_capacity(tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
  """Slots per expert and sequence: ceil(capacity_factor * tokens * k / E), at least 1, at most
  ``tokens`` (a token chooses an expert at most once, so more slots can never fill)."""
  return int(min(tokens, max(1, math.ceil(capacity_factor * tokens * k / num_experts))))


def capacity_experts(
  x_btd: jax.Array,
  weights_btk: jax.Array,
  experts_btk: jax.Array,
  w_gate_edf: jax.Array,
  w_up_edf: jax.Array,
  w_down_efd: jax.Array,
  *,
  constrain: Constrain,
  capacity_factor: float = 1.25,
  act: str = "silu",
) -> jax.Array:
  """Routed experts through GShard's dispatch and combine einsums, C slots per expert per
  sequence (each batch row is one of GShard's groups); copies past C are dropped."""
  b, t, _ = x_btd.shape
  k = experts_btk.shape[-1]
  e = w_gate_edf.shape[0]
  c = expert_capacity(t, k, e, capacity_factor)
  # Slots are filled choice-major (every token's first choice, then the second, ...), and in
  # sequence order within a choice: a running count per expert gives each copy its 1-based slot.
  chosen_bkte = jax.nn.one_hot(jnp.swapaxes(experts_btk, 1, 2), e, dtype=jnp.int32)
  slot_bkte = jnp.cumsum(chosen_bkte.reshape(b, k * t, e), axis=1).reshape(b, k, t, e) * chosen_bkte
  kept_bkte = (slot_bkte <= c) & (chosen_bkte > 0)
  # A token chooses an expert at most once, so summing over the k choices loses nothing.
  slot_bte = jnp.sum(jnp.where(kept_bkte, slot_bkte, 0), axis=1)
  gate_bte = jnp.sum(jnp.where(kept_bkte, jnp.swapaxes(weights_btk, 1, 2)[..., None], 0.0), axis=1)
  dtype = x_btd.dtype
  dispatch_btec = jax.nn.one_hot(slot_bte - 1, c, dtype=dtype)  # slot 0 (not kept) -> all zeros
  combine_btec = dispatch_btec * gate_bte[..., None].astype(dtype)

  # Dispatch where the tokens are (every device fills all experts' slots for its own sequences),
  # then move the slots to where the experts are: between the two layouts only the expert and
  # batch shardings trade places, which XLA's SPMD partitioner emits as an all-to-all (GShard,
  # section 3.3). Constraining straight to the expert layout lets XLA all-gather tokens instead.
  x_ebcd = constrain(jnp.einsum("btd,btec->ebcd", x_btd, dispatch_btec), (None, BATCH, None, EMBED))
  x_ebcd = constrain(x_ebcd, (EXPERT, BATCH, None, EMBED))
  gate_ebcf = constrain(jnp.einsum("ebcd,edf->ebcf", x_ebcd, w_gate_edf), (EXPERT, BATCH, None, MLP))
  up_ebcf = constrain(jnp.einsum("ebcd,edf->ebcf", x_ebcd, w_up_edf), (EXPERT, BATCH, None, MLP))
  h_ebcf = _swiglu_named(gate_ebcf, up_ebcf, act)
  out_ebcd = constrain(jnp.einsum("ebcf,efd->ebcd", h_ebcf, w_down_efd), (EXPERT, BATCH, None, EMBED))
  out_ebcd = checkpoint_name(out_ebcd, MOE_MLPWO)
  out_ebcd = constrain(out_ebcd, (None, BATCH, None, EMBED))  # back to the tokens: all-to-all
  return jnp.einsum("ebcd,btec->btd", out_ebcd, combine_btec)


def default_experts(moe_impl: str, capacity_factor: float) -> ExpertsFn:
  """The routed-expert implementation ``moe_impl`` (``StepChoices.moe_impl``) names."""
  if moe_impl == "capacity":
    return functools.partial(capacity_experts, capacity_factor=capacity_factor)
  return dropless_experts


class MoE(nnx.Module):
  """Router + E routed SwiGLU (GeGLU with ``cfg.expert_act`` gelu_tanh) experts (weights stacked on
  "exp") + optional shared experts."""

  def __init__(
    self, cfg: ModelConfig, *, choices: StepChoices = StepChoices(), out_init: nnx.Initializer, rngs: nnx.Rngs
  ):
    d, e, f, pdt = cfg.d_model, cfg.num_experts, cfg.expert_d_ff, cfg.param_jnp_dtype
    self.dtype = cfg.compute_jnp_dtype
    self.moe_impl, self.capacity_factor = choices.moe_impl, choices.capacity_factor
    self.act = cfg.expert_act
    self.router = Router(cfg, rngs=rngs)
    self.w_gate_edf = param(rngs, DEFAULT_INIT, (e, d, f), (EXPERT, EMBED, MLP), pdt)
    self.w_up_edf = param(rngs, DEFAULT_INIT, (e, d, f), (EXPERT, EMBED, MLP), pdt)
    self.w_down_efd = param(rngs, out_init, (e, f, d), (EXPERT, MLP, EMBED), pdt)
    self.has_shared = cfg.num_shared_experts > 0
    if self.has_shared:
      # The shared experts always run, so they are one dense SwiGLU of their summed width (as
      # DeepSeek-V3 and MaxText build them), tagged with the dense MLP's checkpoint names.
      self.shared = SwiGLU(
        dataclasses.replace(cfg, d_ff=cfg.num_shared_experts * f), out_init=out_init, rngs=rngs
      )

  def __call__(
    self,
    x_btd: jax.Array,
    *,
    constrain: Constrain,
    experts: ExpertsFn | None = None,
    route_btd: jax.Array | None = None,
  ) -> jax.Array:
    """The block's output [B, T, D]; ``experts`` replaces the routed-expert implementation.
    ``route_btd``: the router's input where it is not the experts' (Gemma 4 routes the residual
    and runs the experts on its pre_feedforward_layernorm_2)."""
    weights_btk, experts_btk = self.router(x_btd if route_btd is None else route_btd, constrain=constrain)
    run = default_experts(self.moe_impl, self.capacity_factor) if experts is None else experts
    # The activation only where it is not SwiGLU's, so an ExpertsFn written before it still serves.
    act = {} if self.act == "silu" else {"act": self.act}
    y_btd = run(
      x_btd, weights_btk, experts_btk, self.w_gate_edf[...].astype(self.dtype),
      self.w_up_edf[...].astype(self.dtype), self.w_down_efd[...].astype(self.dtype), constrain=constrain, **act,
    )
    y_btd = constrain(y_btd.astype(self.dtype), (BATCH, SEQ, EMBED))
    if self.has_shared:
      y_btd = y_btd + self.shared(x_btd, constrain=constrain)
    return y_btd

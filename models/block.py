"""One decoder layer: x + attn(norm(x)), then x + ffn(norm(x)), with the norms where
``cfg.norm_layout`` puts them.

:class:`Block` is every family's layer (:mod:`.family`): the attention of the config's
:class:`~.config.AttentionSpec` (with its window), the dense MLP or the mixture of experts
(:class:`~.moe.MoE`, run as the step's :class:`~.config.StepChoices` say), the step's dropout. A
family whose layer differs subclasses it in its own module and overrides the parts that differ:
the attention (:meth:`Block.make_attention`: DeepSeek's MLA), the feed-forward
(:meth:`Block.init_ffn`, :meth:`Block.ffn`) and what follows it (:meth:`Block.after_ffn`: Gemma 4's
per-layer inputs).
"""

from __future__ import annotations

import dataclasses
import math

import jax
from flax import nnx

from .attention import Attention
from .attention_ops import AttendFn
from .config import ModelConfig, StepChoices
from .dropout import ATTENTION_OUT, ATTENTION_PROBS, MLP_OUT, Dropout, maybe
from .layers import Constrain, make_norm
from .fp8 import projection
from .mlp import make_mlp
from .moe import ExpertsFn, MoE
from .names import BATCH, EMBED, NORM_SEQ, SEQ

# The keys and values one layer hands another (Gemma 4's KV sharing: models/gemma4.py).
KV = tuple[jax.Array, jax.Array]
# RoPE's (sin_tk, cos_tk) for the layer's positions, or (None, None) without rotary positions.
Rope = tuple[jax.Array | None, jax.Array | None]


@dataclasses.dataclass(frozen=True)
class KVShare:
  """How a layer takes part in KV sharing (Gemma 4's kv_sharing_modes; :class:`.layer_plan.Segment`):
  it attends to ``kv``, the keys and values of the layer it shares with ("reuse"), or with
  ``store`` hands its own on ("store")."""

  kv: KV | None = None
  store: bool = False

  def keywords(self) -> dict:
    """The KV-sharing keywords for Attention, only where set (MLA takes none)."""
    return {**({} if self.kv is None else {"kv": self.kv}), **({"return_kv": True} if self.store else {})}


class Block(nnx.Module):
  """x + attn(norm(x)), then x + mlp(norm(x)): the pre-norm block of GPT-2 and Llama.

  ``moe`` swaps the MLP for a mixture of experts (:class:`~.moe.MoE`), run as ``choices``
  (:class:`~.config.StepChoices`) names; ``window`` is this layer's attention window (None:
  global); ``kv_shared`` makes it attend to an earlier layer's keys and values (Gemma 4).
  """

  def __init__(
    self, cfg: ModelConfig, *, moe: bool = False, window: int | None = None, kv_shared: bool = False,
    choices: StepChoices = StepChoices(), rngs: nnx.Rngs,
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
    self.is_moe = moe
    self.window = window  # this layer's local attention window (None: global)
    self.kv_shared = kv_shared  # Gemma 4: attends to an earlier layer's keys and values
    # The einsum of the layer's projections: fp8 under quantization fp8_full (models/fp8.py).
    self.einsum = projection(choices.quantization)
    self.attn = self.make_attention(cfg, out_init=out_init, rngs=rngs)
    self.init_ffn(cfg, choices=choices, out_init=out_init, rngs=rngs)

  # --- what a family's block overrides ---------------------------------------------------------

  def make_attention(self, cfg: ModelConfig, *, out_init: nnx.Initializer, rngs: nnx.Rngs) -> nnx.Module:
    """This layer's attention; a global layer may have its own shape (Gemma 4:
    ModelConfig.attention_geometry)."""
    return Attention(cfg, out_init=out_init, rngs=rngs, global_layer=self.window is None, kv_shared=self.kv_shared,
                     einsum=self.einsum)

  def init_ffn(self, cfg: ModelConfig, *, choices: StepChoices, out_init: nnx.Initializer, rngs: nnx.Rngs) -> None:
    """This layer's feed-forward (``self.mlp``): the MoE or the dense MLP."""
    self.mlp = MoE(cfg, choices=choices, out_init=out_init, rngs=rngs) if self.is_moe else make_mlp(
      cfg, out_init=out_init, rngs=rngs, einsum=self.einsum
    )

  def ffn(self, x_btd: jax.Array, constrain: Constrain, experts: ExpertsFn | None) -> jax.Array:
    """The feed-forward sub-block's output (before its residual add), from the residual ``x_btd``."""
    h_btd = gathered(self.pre("mlp_norm", x_btd), constrain)
    if self.is_moe:
      return self.post("post_mlp_norm", self.mlp(h_btd, constrain=constrain, experts=experts))
    return self.post("post_mlp_norm", self.mlp(h_btd, constrain=constrain))

  def after_ffn(self, x_btd: jax.Array, layer_input: jax.Array | None, constrain: Constrain) -> jax.Array:
    """The residual stream after the feed-forward's add, given this layer's own input (the
    family's :meth:`~.family.Family.layer_inputs`, None without)."""
    del layer_input, constrain
    return x_btd

  # --- the block ---------------------------------------------------------------------------------

  def pre(self, norm: str, x_btd: jax.Array) -> jax.Array:
    return x_btd if self.layout == "post" else getattr(self, norm)(x_btd)

  def post(self, norm: str, y_btd: jax.Array) -> jax.Array:
    return y_btd if self.layout == "pre" else getattr(self, norm)(y_btd)

  def _window(self) -> dict:
    return {} if self.window is None else {"window": self.window}

  def __call__(
    self,
    x_btd: jax.Array,
    *,
    rope: Rope,
    constrain: Constrain,
    attend: AttendFn | None = None,
    experts: ExpertsFn | None = None,
    dropout: Dropout | None = None,
    share: KVShare = KVShare(),
    layer_input: jax.Array | None = None,
  ) -> jax.Array | tuple[jax.Array, KV]:
    """The block in training: ``dropout`` (one layer's, :mod:`.dropout`) drops the attention
    probabilities and both sub-blocks' outputs before they join the residual stream. ``share``:
    a KV-shared layer's keys and values, or (x, this layer's (k, v)) returned with
    ``share.store`` (Attention). ``layer_input``: this layer's own input (:meth:`after_ffn`)."""
    attn = self.attn(
      gathered(self.pre("attn_norm", x_btd), constrain), rope_sin_tk=rope[0], rope_cos_tk=rope[1],
      constrain=constrain, attend=attend, dropout=None if dropout is None else dropout.at(ATTENTION_PROBS),
      **self._window(), **share.keywords(),
    )
    attn_btd, layer_kv = attn if share.store else (attn, None)
    attn_btd = self.post("post_attn_norm", attn_btd)
    x_btd = constrain(x_btd + maybe(dropout, ATTENTION_OUT, attn_btd), (BATCH, NORM_SEQ, EMBED))
    x_btd = x_btd + maybe(dropout, MLP_OUT, self.ffn(x_btd, constrain, experts))
    x_btd = constrain(self.after_ffn(x_btd, layer_input, constrain), (BATCH, NORM_SEQ, EMBED))
    return (x_btd, layer_kv) if share.store else x_btd

  def cached(
    self,
    x_btd: jax.Array,
    *layer_cache: jax.Array,
    pos: jax.Array,
    rope: Rope,
    constrain: Constrain,
    attend: AttendFn | None = None,
    share: KVShare = KVShare(),
    layer_input: jax.Array | None = None,
  ) -> tuple[jax.Array, ...]:
    """The block for tokens at pos.. against this layer's cache arrays (KV: k, v; MLA: latent,
    rope key; see Attention.cached and MLAttention.cached): (x_btd, *updated cache arrays).
    ``attend`` serves prefill (see Transformer.cached). A KV-shared layer reads the cache of the
    layer it shares with, gets that layer's new keys and values (``share.kv``) and returns
    (x_btd,); ``share.store`` appends this layer's new (k, v) (Attention.cached)."""
    attn_btd, *layer_cache = self.attn.cached(
      self.pre("attn_norm", x_btd), *layer_cache, pos=pos, rope_sin_tk=rope[0], rope_cos_tk=rope[1],
      constrain=constrain, attend=attend, **self._window(), **share.keywords(),
    )
    x_btd = constrain(x_btd + self.post("post_attn_norm", attn_btd), (BATCH, SEQ, EMBED))
    x_btd = x_btd + self.ffn(x_btd, constrain, None)
    x_btd = self.after_ffn(x_btd, layer_input, constrain)
    return (constrain(x_btd, (BATCH, SEQ, EMBED)), *layer_cache)


def gathered(h_btd: jax.Array, constrain: Constrain) -> jax.Array:
  """A norm's output, computed where the residual stream is (split along the sequence over the
  tensor axis under sequence parallelism), then whole along the sequence for the column-parallel
  matmuls that take it in: Megatron's all-gather ``g`` (Korthikanti et al. 2022, section 4.2.2,
  figure 5). Without sequence parallelism both constraints are the one the stream already has."""
  return constrain(constrain(h_btd, (BATCH, NORM_SEQ, EMBED)), (BATCH, SEQ, EMBED))

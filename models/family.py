"""A model family: what it adds to the decoder, behind the one protocol the transformer calls.

:class:`~.transformer.Transformer` builds and runs what every decoder has: the token embeddings,
the stacks of scanned blocks (:mod:`.block`) in the layer pattern the config's windows and
experts make (:mod:`.layer_plan`), the final norm and the head. Where a family differs, it
answers through a :class:`Family` (this class is the base, the RoPE decoder of Llama and of the
families whose features are all in the config's concerns: Qwen, Mistral, Mixtral, Gemma 2/3,
GPT-OSS, OLMo 2, Llama 4). A new family is a module with its :class:`Family` subclass (and, where
its layers differ, its :class:`~.block.Block` subclass), added to :data:`.families.FAMILIES`:

- its positions (:meth:`Family.init_model`, :meth:`Family.embed_positions`: GPT-2's learned
  table, :mod:`.gpt2`; RoPE over the widths :meth:`Family.rope_dims` gives, MLA's rope channels or
  Gemma 4's global head_dim, or none);
- its layers (:attr:`Family.block`: MLA's attention, :mod:`.mla`; Gemma 4's feed-forward and
  per-layer inputs, :mod:`.gemma4`) and their inputs (:meth:`Family.layer_inputs`);
- which layers share keys and values (:meth:`Family.layer_ranges`: Gemma 4's KV sharing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from .block import Block, Rope
from .config import ModelConfig


# weights(stored) -> usable: maps a pytree of stored parameter values (an nnx.State, or one
# value) to the same pytree with plain arrays, e.g. dequantizing int8 values with their scales.
WeightHook = Callable[[Any], Any]
# Where a family has no rotary positions.
NO_ROPE: Rope = (None, None)


@dataclasses.dataclass(frozen=True)
class Where:
  """Where a step's ``t`` tokens sit. Training: positions 0..t-1, or ``natural`` (a
  context-parallel layout stores the sequence load balanced, :mod:`.context_attention`: each
  storage index's natural position). With a KV cache: ``start`` (a position, possibly traced)
  onwards, in a cache of ``context`` positions."""

  t: int
  natural: jax.Array | None = None
  start: jax.Array | None = None
  context: int | None = None

  def explicit(self) -> jax.Array | None:
    """The tokens' positions where they are not 0..t-1 (None where they are)."""
    return self.start + jnp.arange(self.t) if self.start is not None else self.natural


class Family:
  """The base family (see the module docstring); a subclass overrides what its family changes.
  ``model`` in the hooks is the :class:`~.transformer.Transformer` being built or run (its
  ``cfg``, its parameters)."""

  name: ClassVar[str] = "rope"
  block: ClassVar[type[Block]] = Block

  def applies(self, cfg: ModelConfig) -> bool:
    """Whether ``cfg`` is this family's (the registry asks in order; the base takes the rest)."""
    return True

  def init_model(self, model: nnx.Module, rngs: nnx.Rngs) -> None:
    """The family's parameters of the whole model (beside the embeddings, blocks and head)."""

  def rope_dims(self, cfg: ModelConfig) -> tuple[int, int] | None:
    """RoPE's widths on the windowed (or every) layers and on the global layers; None: the
    family has no rotary positions."""
    return cfg.head_dim, cfg.head_dim

  def embed_positions(
    self, model: nnx.Module, x_btd: jax.Array, where: Where, weights: WeightHook | None = None
  ) -> jax.Array:
    """The token embeddings with the tokens' positions in (none here: RoPE rotates q and k)."""
    del model, where, weights
    return x_btd

  def layer_inputs(
    self, model: nnx.Module, tokens_bt: jax.Array, x_btd: jax.Array, weights: WeightHook | None = None
  ) -> jax.Array | None:
    """Every layer's own input [batch, seq, layers, width], computed before the layers and
    sliced to each (:meth:`.block.Block.after_ffn`); None: the layers take none."""
    del model, tokens_bt, x_btd, weights
    return None

  def layer_ranges(self, cfg: ModelConfig, period: int) -> tuple[tuple[int, int, str], ...]:
    """The model's layers as ranges (first, end, how they hold keys and values), each laid out
    in whole ``period``-layer repetitions of its pattern and a remainder: "own", layers with
    their own (here, the dense prefix and the rest); Gemma 4's "store" and "reuse"
    (:class:`.layer_plan.Segment`)."""
    del period
    dense = cfg.first_dense_layers if cfg.is_moe else 0
    return ((0, dense, "own"), (dense, cfg.num_layers, "own"))


def value(p: nnx.Param, weights: Any) -> jax.Array:
  """A parameter's stored value made usable by ``weights`` (a WeightHook; None: as stored)."""
  v = p.get_value()
  return v if weights is None else weights(v)


def with_weights(module: nnx.Module, weights: Any) -> nnx.Module:
  """The module rebuilt around ``weights(its parameters)`` (a WeightHook; None: as it is)."""
  if weights is None:
    return module
  graphdef, state = nnx.split(module)
  return nnx.merge(graphdef, weights(state))

"""The prefill and decode programs: sharded, cache-donating steps over quantized weights.

Prefill runs a prompt of ``prompt`` tokens through the model and writes its keys and values
into a KV cache of ``prompt`` positions; decode runs one token against a cache of ``context``
positions (:meth:`jaxmem.models.Transformer.cached`). Both take the cache as an argument and
return it, donated, so XLA updates it in place as a serving loop would. Parameters are stored
in the chosen format (:mod:`jaxmem.inference.quant`) and dequantized inside the scanned layer
body, so the compiler's argument bytes are the stored bytes.

Sharding: weights as for training (``embed`` over ``fsdp``; heads, MLP and vocabulary over
``tensor``); the cache's batch over ``data`` and ``fsdp`` and its kv heads over ``tensor`` (left
whole, with a note, when the tensor axis does not divide them, as servers replicate kv heads
when the tensor-parallel degree exceeds them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxmem.hardware.targets import Target
from jaxmem.inference import quant
from jaxmem.inference.kv import KvCacheDtype
from jaxmem.models import (
    CACHE_AXES, MLA_CACHE_AXES, AttentionChoice, ModelConfig, StepChoices, cache_bytes, cache_class,
)
from jaxmem.program import sharding as shd
from jaxmem.program.train import abstract_model


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferProgram:
  step: Any
  args: tuple[Any, ...]
  weight_bytes: int
  weight_scale_bytes: int
  weight_bytes_per_device: int
  kv_cache_bytes: int
  kv_cache_bytes_per_device: int
  notes: tuple[str, ...] = ()



def _lenient_spec(logical: Sequence[str | None], shape: Sequence[int], jmesh) -> tuple[PartitionSpec, list[str]]:
  """Activation rules, leaving a dimension whole (with a note) where its axes do not divide it."""
  spec, left = shd.lenient_spec(logical, shape, jmesh)
  notes = [f"{name}={dim} is not divisible by {'x'.join(axes)}={ways}: the KV cache is replicated over it"
           for name, dim, axes, ways in left]
  return spec, notes


def abstract_cache(cfg: ModelConfig, *, batch: int, context: int, jmesh, dtype: Any = None) -> tuple[Any, Any, list[str]]:
  """(abstract cache, its tree of shardings, notes) for the model's kind of attention: a KVCache
  (keys and values per kv head) or, for multi-head latent attention, an MLACache (the latent and
  the RoPE key; ``models.cache_class``), each array sharded by its logical axes and stored in
  ``dtype`` (the compute dtype unless given)."""
  kind = cache_class(cfg)
  if cfg.is_mla:
    shapes, axes = kind.shapes(cfg, batch=batch, context=context), MLA_CACHE_AXES
  elif hasattr(kind, "shapes"):  # LocalKVCache: the global layers' and the windowed layers' pairs
    shapes = kind.shapes(cfg, batch=batch, context=context)
    axes = (CACHE_AXES,) * len(shapes)
  else:
    shape = kind.shape(cfg, batch=batch, context=context)
    shapes, axes = (shape, shape), (CACHE_AXES, CACHE_AXES)
  specs = [_lenient_spec(a, shp, jmesh) for a, shp in zip(axes, shapes, strict=True)]
  shardings = [NamedSharding(jmesh, spec) for spec, _ in specs]
  dtype = cfg.compute_jnp_dtype if dtype is None else jnp.dtype(dtype)
  cache = kind(*(jax.ShapeDtypeStruct(shp, dtype, sharding=sh) for shp, sh in zip(shapes, shardings, strict=True)))
  return cache, kind(*shardings), list(dict.fromkeys(n for _, ns in specs for n in ns))


def build_infer_program(
    cfg: ModelConfig,
    *,
    choices: StepChoices = StepChoices(),
    phase: str,
    fmt: quant.WeightFormat,
    batch: int,
    context: int,
    target: Target,
    mesh: shd.MeshSpec,
    attention: AttentionChoice | None = None,
    kv: KvCacheDtype | None = None,
) -> InferProgram:
  """The sharded, cache-donating prefill (``context`` = prompt length) or decode step of ``cfg``
  run as ``choices`` say (its experts' implementation); prefill attends through ``attention``
  (None: einsums over the cache, as decode does); the cache is stored as ``kv`` says (the compute
  dtype unless given)."""
  jmesh = target.make_mesh(mesh)
  graphdef, params, logical = abstract_model(cfg, choices)
  param_sh = shd.param_shardings(params, logical, jmesh)
  stored, stored_sh = quant.abstract_quantized(params, param_sh, fmt)
  cache, cache_tree_sh, notes = abstract_cache(cfg, batch=batch, context=context, jmesh=jmesh,
                                               dtype=None if kv is None else kv.dtype)
  t = context if phase == "prefill" else 1
  tok_sh = NamedSharding(jmesh, _lenient_spec(("batch", "seq"), (batch, t), jmesh)[0])
  logits_sh = NamedSharding(jmesh, _lenient_spec(("batch", "seq", "vocab"), (batch, 1, cfg.vocab_size), jmesh)[0])
  replicated = NamedSharding(jmesh, PartitionSpec())
  constrain = shd.activation_constrainer(jmesh)
  hook = quant.weight_hook(cfg.compute_jnp_dtype)

  attend = None if attention is None or phase != "prefill" else attention.attend

  def step(p, cache_tree, tokens_bt, pos):
    model = nnx.merge(graphdef, p)
    if attend is not None:  # prefill starts at position 0: a Python 0, as attend requires
      return model.cached(tokens_bt, cache_tree, pos=0, constrain=constrain, weights=hook, attend=attend)
    return model.cached(tokens_bt, cache_tree, pos=pos, constrain=constrain, weights=hook)

  jitted = jax.jit(
      step,
      in_shardings=(stored_sh, cache_tree_sh, tok_sh, replicated),
      out_shardings=(logits_sh, cache_tree_sh),
      donate_argnums=(1,),
  )
  args = (
      stored,
      cache,
      jax.ShapeDtypeStruct((batch, t), jnp.int32, sharding=tok_sh),
      jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
  )
  values, scales = quant.tree_stored_bytes(stored)
  kv_dev = sum(
      quant.stored_bytes(sh.shard_shape(a.shape), a.dtype) for a, sh in zip(jax.tree.leaves(cache), jax.tree.leaves(cache_tree_sh), strict=True)
  )
  return InferProgram(
      step=jitted,
      args=args,
      weight_bytes=int(values + scales),
      weight_scale_bytes=int(scales),
      weight_bytes_per_device=int(quant.tree_stored_bytes_per_device(stored, stored_sh)),
      kv_cache_bytes=cache_bytes(cfg, batch=batch, context=context,
                                 bytes_per_element=None if kv is None else kv.bytes_per_element),
      kv_cache_bytes_per_device=int(kv_dev),
      notes=tuple(f"kv cache: {n}" for n in notes),
  )



"""A plan's answer as a launch: the MaxText command-line overrides for a compiled configuration.

:func:`maxtext_overrides` maps a :class:`~jaxmem.planning.search.PlanResult`'s recommendation
(or any compiled row) to MaxText's ``key=value`` overrides of its ``configs/base.yml``, the
spelling ``python -m maxtext.trainers.pre_train.train`` and ``train_compile`` take after the
config file. Every name below is MaxText 0.2.5's (``configs/base.yml``, ``configs/types.py``,
``layers/nnx_decoders.py``); a choice of jaxmem's that MaxText has no spelling for is never
dropped in silence: it is left out of the overrides and named in ``notes``.

What maps:

- the mesh: each jaxmem axis to MaxText's axis of the same role, ``ici_*_parallelism`` within a
  slice and ``dcn_*_parallelism`` across the slices of a multi-slice TPU target (jaxmem lays the
  devices out slice-major, so the mesh's leading axes span the slices: the DCN factor of each
  axis is taken from the front). Every axis is written, 1 where unused, so MaxText's ``-1``
  defaults (``ici_fsdp_parallelism``, ``dcn_data_parallelism``) fill nothing.
- the batch: MaxText's global batch is ``per_device_batch_size`` x devices x
  ``gradient_accumulation_steps`` (``configs/types.py``, ``calculate_global_batch_sizes``), so
  ``per_device_batch_size`` is jaxmem's batch over the devices and the microbatches.
- ``seq`` -> ``max_target_length``; ``vocab_tiles`` -> ``num_vocab_tiling``; a stage axis's
  pipeline microbatches and repeats -> ``num_pipeline_microbatches``, ``num_pipeline_repeats``
  and ``num_layers_per_pipeline_stage`` (MaxText derives the repeats from the layers per stage,
  default 1: a circular pipeline, so both are written).
- remat: jaxmem's presets named after MaxText's and built from the same tensor names
  (:mod:`jaxmem.program.remat`) keep their names; ``full_offloaded`` and a per-tensor assignment
  (``names:save=...:offload=...``) become ``remat_policy=custom`` with each tensor's place; no
  remat (``none``) has no spelling: MaxText's parser reads ``none`` as None, which its scanned
  layers checkpoint as ``full``; the note gives the nearest ``custom`` map.
- attention: ``dot`` -> ``dot_product``, ``splash`` -> ``flash`` (MaxText's TPU flash is splash
  attention), ``cudnn`` -> ``cudnn_flash_jax`` (both ``jax.nn.dot_product_attention``'s cuDNN).
- the optimizer: ``adamw``, ``sgd`` and ``muon`` (optax's, as MaxText's) -> ``opt_type``.

The mesh axes, attention and optimizer names are :mod:`jaxmem.program.maxtext`'s tables, the ones
``--maxtext`` maps jaxmem's options through, so a plan's launch and a MaxText step agree.
- the model: ``model_name`` where jaxmem's preset is one of MaxText's models of the same name.

A plan of MaxText's own step (``plan --maxtext``) is in MaxText's names already: its launch is
the plan's overrides with its choices (mesh, batch, microbatches, remat, attention) after them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from jaxmem.errors import JaxmemError
from jaxmem.models import get_config
from jaxmem.program import maxtext as mx
from jaxmem.program import sharding as shd
from jaxmem.program.remat import ASSIGNMENT_PREFIX, CUSTOM_TENSORS, assignment_policy
from jaxmem.records import Configuration, Record

# jaxmem's mesh axis -> MaxText's ICI parallelism key (its DCN key the same with ``dcn_``).
MESH_KEYS = mx.MESH_KEYS
# jaxmem's attention implementation -> MaxText's ``attention``.
ATTENTIONS = mx.ATTENTIONS
# jaxmem's presets whose MaxText policy of the same name saves the same tensors (layers/nnx_decoders.py,
# get_remat_policy; jaxmem.program.remat builds them from the same checkpoint names).
REMAT_SAME_NAME = frozenset({
    "full", "minimal", "minimal_with_context", "save_dot_with_context_except_mlp", "save_dot_except_mlpwi",
    "save_dot_except_mlp", "save_qkv_proj", "qkv_proj_offloaded", "save_out_proj",
})
# jaxmem's presets that are MaxText models of the same name (configs/types.py, ModelName).
MODEL_NAMES = frozenset({"gpt3-175b", "gpt3-22b", "llama3-70b", "llama3-8b", "mistral-7b", "mixtral-8x22b",
                         "mixtral-8x7b", "qwen2.5-7b", "qwen3-30b-a3b", "qwen3-8b"})
OPTIMIZERS = mx.OPTIMIZERS  # MaxText's opt_type of the same update, by jaxmem's name
DTYPES = ("float32", "bfloat16", "float16")
# The configuration fields mapped above (or describing the row, not a choice): any other field
# away from its default is named in the notes.
_MAPPED = {"model", "target", "mesh", "batch", "num_devices", "seq", "remat", "attention", "microbatches",
           "vocab_tiles", "stages", "pipeline_microbatches", "pipeline_repeats", "bubble_fraction", "optimizer",
           "param_dtype", "dtype", "dropout", "context_strategy", "moments_dtype", "moe_impl", "capacity_factor"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaxTextLaunch(Record):
  """A configuration as MaxText overrides: ``overrides`` (key -> value, in the order written),
  ``notes`` (each choice of jaxmem's with no MaxText spelling, and how the others were spelled
  where it is not plain) and ``configuration`` (the row's, in a few words)."""

  configuration: str
  overrides: dict[str, Any]
  notes: tuple[str, ...] = ()

  def line(self) -> str:
    """The overrides as one command-line tail, ``key=value key=value ...``."""
    return " ".join(f"{k}={_value(v)}" for k, v in self.overrides.items())


def _value(v: Any) -> str:
  if isinstance(v, bool):
    return str(v).lower()
  return str(v)


def maxtext_overrides(result: Any, *, layers: int | None = None) -> MaxTextLaunch:
  """MaxText's overrides for ``result``: a :class:`~jaxmem.planning.search.PlanResult` (its
  recommendation) or a compiled row. ``layers``: the model's decoder layers, needed only for a
  pipeline's ``num_layers_per_pipeline_stage`` (read from the model's preset where omitted)."""
  row = _recommended(result) if hasattr(result, "recommended") else result
  if getattr(result, "maxtext", None):
    return _maxtext_plan_launch(result.maxtext, row)
  cfg = getattr(row, "config", row)
  if not isinstance(cfg, Configuration) and not all(hasattr(cfg, f) for f in ("mesh", "remat", "batch", "seq")):
    raise JaxmemError(f"maxtext_overrides takes a plan or a compiled row, not {type(result).__name__}")
  out: dict[str, Any] = {}
  notes: list[str] = []
  model = _model_config(cfg.model)
  _model(cfg.model, model, out, notes)
  _target(cfg, out)
  _mesh(cfg, out, notes)
  _batch(cfg, out, notes)
  out["max_target_length"] = cfg.seq
  _remat(cfg.remat, out, notes)
  _attention(cfg, out, notes)
  out["num_vocab_tiling"] = cfg.vocab_tiles or 1
  _pipeline(cfg, out, notes, layers if layers is not None else getattr(model, "num_layers", None))
  _optimizer_and_dtypes(cfg, out, notes)
  notes += _unmapped(cfg)
  words = f"{cfg.mesh} {cfg.remat} mb{cfg.microbatches} {cfg.attention or ''}".strip()
  return MaxTextLaunch(configuration=words, overrides=out, notes=tuple(notes))


def _maxtext_plan_launch(args: tuple[str, ...], row: Any) -> MaxTextLaunch:
  """A plan of MaxText's own step (``plan --maxtext``): its overrides, then the options the
  plan chose for ``row``, in MaxText's names already (the same mapping its compile used)."""
  micro = row.microbatches or 1
  chosen = dict(
      per_device_batch_size=mx.per_device_batch(row.batch, row.num_devices, micro), max_target_length=row.seq,
      gradient_accumulation_steps=micro, remat_policy=row.remat, attention=row.attention,
      **mx.mesh_overrides(shd.parse_mesh(row.mesh)),
  )
  out = {**mx.overrides(args), **chosen}
  words = f"{row.mesh} {row.remat} mb{micro} {row.attention}"
  return MaxTextLaunch(configuration=words, overrides=out, notes=(
      f"MaxText config {args[0]}: these overrides follow it (the plan's own, then what it chose)",))


def _model_config(name: str) -> Any:
  try:
    return get_config(name)
  except JaxmemError:  # a name this machine cannot resolve now (a Hub id offline): the notes say so
    return None


def _model(name: str, model: Any, out: dict[str, Any], notes: list[str]) -> None:
  """``model_name`` where MaxText has the model under jaxmem's name; else, for a plain Llama-style
  decoder (SwiGLU, pre-norm RMSNorm, RoPE, grouped-query attention, dense), its dimensions on
  MaxText's ``llama2`` decoder block (configs/base.yml's ``base_*`` keys); else a note."""
  if name in MODEL_NAMES:
    out["model_name"] = name
    return
  plain = model is not None and model.style in ("llama2", "llama3") and not model.is_moe and not model.kv_lora_rank \
      and model.mlp_act == "silu" and model.norm_layout == "pre" and not (model.qkv_bias or model.qk_norm or
      model.sliding_window or model.attention_sinks or model.attn_softcap or model.final_softcap or model.out_bias)
  if not plain:
    notes.append(f"model {name}: no MaxText model of that name; give MaxText its architecture (decoder_block, "
                 "base_emb_dim, base_num_decoder_layers, ...) or a model config file")
    return
  out.update(decoder_block="llama2", base_emb_dim=model.d_model, base_num_query_heads=model.num_heads,
             base_num_kv_heads=model.num_kv_heads, base_mlp_dim=model.d_ff, base_num_decoder_layers=model.num_layers,
             head_dim=model.head_dim, vocab_size=model.vocab_size, normalization_layer_epsilon=model.norm_eps,
             rope_max_timescale=int(model.rope_theta), logits_via_embedding=bool(model.tie_embeddings))
  notes.append(f"model {name}: not one of MaxText's models; written as its dimensions on MaxText's llama2 decoder "
               "block (rope scaling, if the model has any, is MaxText's default)")


def _recommended(result: Any) -> Any:
  if result.recommended is None:
    raise JaxmemError("the plan has no configuration that fits, so there is no launch to write; "
                      "raise the compile budget, lower the batch or the sequence, or use a larger target")
  return result.recommended


def _slices(target: str) -> int:
  """The slices of a multi-slice TPU target's name (``tpu:v5p-16x2slices``, as
  jaxmem.hardware.targets names it); 1 for any other."""
  m = re.search(r"x(\d+)slices$", target or "")
  return int(m.group(1)) if m else 1


def _target(cfg: Any, out: dict[str, Any]) -> None:
  if (cfg.target or "").startswith("gpu:"):
    out["hardware"] = "gpu"


def _mesh(cfg: Any, out: dict[str, Any], notes: list[str]) -> None:
  """``ici_*`` and ``dcn_*`` for every MaxText axis jaxmem maps (1 where unused): the slices
  taken from the leading axes, as the devices lie slice-major."""
  mesh = shd.parse_mesh(cfg.mesh)
  unknown = [a for a, _ in mesh if a not in MESH_KEYS]
  if unknown:
    notes.append(f"mesh axis {unknown[0]}: no MaxText axis of that role")
  left = _slices(cfg.target)
  dcn: dict[str, int] = {}
  for axis, size in mesh:
    take = math.gcd(size, left)
    if left > 1 and take not in (size, left):
      notes.append(f"mesh {cfg.mesh} does not split cleanly over {_slices(cfg.target)} slices; dcn_* left at 1")
      dcn, left = {}, 1
      break
    dcn[axis], left = take, left // take
  sizes = dict(mesh)
  for kind in ("ici", "dcn"):
    for axis, key in MESH_KEYS.items():
      n = dcn.get(axis, 1) if kind == "dcn" else sizes.get(axis, 1) // dcn.get(axis, 1)
      out[kind + key.removeprefix("ici")] = n


def _batch(cfg: Any, out: dict[str, Any], notes: list[str]) -> None:
  micro = cfg.microbatches or 1
  per_device = cfg.batch / (cfg.num_devices * micro)
  out["per_device_batch_size"] = int(per_device) if per_device == int(per_device) else per_device
  out["gradient_accumulation_steps"] = micro
  if per_device < 1:
    notes.append(f"per_device_batch_size {per_device:g} < 1: MaxText loads a full batch per device and trains on "
                 f"{cfg.batch // micro} sequences per microbatch (configs/types.py, calculate_global_batch_sizes)")


def _remat(name: str, out: dict[str, Any], notes: list[str]) -> None:
  if name in REMAT_SAME_NAME:
    out["remat_policy"] = name
  elif name == "none":
    nearest = " ".join(f"{t}=device" for t in CUSTOM_TENSORS if t != "decoder_layer_input")
    notes.append("remat none (no jax.checkpoint): no MaxText spelling; its parser reads remat_policy=none as None "
                 "(configs/pyconfig.py), which its scanned layers checkpoint as full (layers/nnx_decoders.py); "
                 f"nearest: remat_policy=custom {nearest}")
  elif name == "full_offloaded":
    out["remat_policy"], out["decoder_layer_input"] = "custom", "offload"
  elif name.startswith(ASSIGNMENT_PREFIX):
    _custom(assignment_policy(name), out, notes)
  else:
    notes.append(f"remat {name}: MaxText has no policy that saves the same tensors (its remat_policy values: full, "
                 "minimal, save_dot_except_mlp, save_qkv_proj, custom, ...); remat_policy left at MaxText's default")


def _custom(policy: Any, out: dict[str, Any], notes: list[str]) -> None:
  """A per-tensor assignment as MaxText's ``custom`` policy: each named tensor ``device`` or
  ``offload``, every other ``remat`` (MaxText's default for all but the layer input, which its
  scan keeps on the device whatever the policy)."""
  out["remat_policy"] = "custom"
  placed = {**{n: "device" for n in policy.saves}, **{n: "offload" for n in policy.offloads}}
  for n, where in sorted(placed.items()):
    if n in CUSTOM_TENSORS:
      out[n] = where
    else:
      notes.append(f"remat {policy.name}: tensor {n} has no MaxText custom-policy name of the same meaning; "
                   f"it is recomputed there")


def _attention(cfg: Any, out: dict[str, Any], notes: list[str]) -> None:
  name = cfg.attention
  if name in ATTENTIONS:
    out["attention"] = ATTENTIONS[name]
  elif name:
    notes.append(f"attention {name}: no MaxText kernel of that kind (its attention values: "
                 f"{', '.join(mx.MAXTEXT_ATTENTIONS)}); left at MaxText's autoselected")


def _pipeline(cfg: Any, out: dict[str, Any], notes: list[str], layers: int | None) -> None:
  stages = cfg.stages or 1
  if stages == 1:
    return
  repeats = getattr(cfg, "pipeline_repeats", None) or 1
  out["num_pipeline_microbatches"] = cfg.pipeline_microbatches or stages
  out["num_pipeline_repeats"] = repeats
  if layers is None:
    notes.append("num_layers_per_pipeline_stage: the model's layer count is not known here; give "
                 f"layers / ({stages} x {repeats})")
  else:
    out["num_layers_per_pipeline_stage"] = layers // (stages * repeats)


def _optimizer_and_dtypes(cfg: Any, out: dict[str, Any], notes: list[str]) -> None:
  opt = cfg.optimizer
  if opt in OPTIMIZERS:
    out["opt_type"] = opt
  elif opt:
    notes.append(f"optimizer {opt}: no MaxText opt_type of the same update ({', '.join(OPTIMIZERS)} map by name)")
  for field, key in (("param_dtype", "weight_dtype"), ("dtype", "dtype")):
    v = getattr(cfg, field, None)
    if v in DTYPES:
      out[key] = v
    elif v:
      notes.append(f"{field} {v}: not one of MaxText's {key} values here")
  moments = getattr(cfg, "moments_dtype", None)
  if moments and moments != cfg.param_dtype and moments in DTYPES:
    out["mu_dtype"] = moments
    notes.append(f"moments_dtype {moments}: MaxText's mu_dtype sets the first moment's dtype only; the second "
                 "follows weight_dtype")
  impl = getattr(cfg, "moe_impl", None)
  if impl == "dropless":  # MaxText's default: sorted tokens through grouped matmuls, none dropped
    out["sparse_matmul"], out["capacity_factor"] = True, -1
  elif impl == "capacity":  # GShard's dispatch and combine, copies past capacity dropped
    out["sparse_matmul"], out["capacity_factor"] = False, cfg.capacity_factor
  elif impl:
    notes.append(f"moe_impl {impl}: no MaxText spelling")
  if getattr(cfg, "dropout", 0.0):
    out["dropout_rate"] = cfg.dropout
  if dict(shd.parse_mesh(cfg.mesh)).get("context", 1) > 1 and getattr(cfg, "context_strategy", None):
    out["context_parallel_strategy"] = cfg.context_strategy


def _unmapped(cfg: Any) -> list[str]:
  """Every other choice the configuration made away from its default, named."""
  out = []
  for f in dataclasses.fields(Configuration):
    if f.name in _MAPPED or f.default is dataclasses.MISSING:
      continue
    v = getattr(cfg, f.name, f.default)
    if v is not None and v != f.default:
      out.append(f"{f.name} {v}: no MaxText override written for it; check MaxText's own setting")
  return out

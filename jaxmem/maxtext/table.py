"""The one mapping between jaxmem's options and MaxText's: for every sweep axis
(:data:`jaxmem.axes.AXES`) and configuration field, the MaxText options it sets and how its
values are spelt there, or why it has none.

Three readers, one table:

- ``--maxtext`` (:mod:`jaxmem.maxtext.plan`, :mod:`jaxmem.maxtext.step`): jaxmem's options on
  MaxText's own step, set once for the sweep or per configuration (:attr:`Row.per_task`);
- ``plan --maxtext`` (:mod:`jaxmem.maxtext.search`): the mesh, remat policy, microbatches and
  attention it searches, spelt through the same rows;
- ``plan --emit maxtext`` (:mod:`jaxmem.maxtext.emit`): a compiled configuration of jaxmem's
  own model as MaxText's overrides.

So the overrides emit writes are ones ``--maxtext`` takes, and an option with no MaxText
spelling is refused by both in the same words: :class:`NoMaxTextMapping`, which ``--maxtext``
raises and emit writes as a note (its field named bare). An axis without a row here is refused
whatever its value, so a new axis is refused until its row spells it.

Every MaxText name is MaxText 0.2.5's (``configs/base.yml``, ``configs/types.py``,
``layers/nnx_decoders.py``). Values are written as emit writes them (numbers as numbers);
``--maxtext`` passes them to MaxText's parser as text (:func:`text`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxmem.axes import AXES
from jaxmem.errors import JaxmemError
from jaxmem.mesh import MeshSpec
from jaxmem.program.optimizers import OPTIMIZERS
from jaxmem.program.remat import (
    ASSIGNMENT_PREFIX, CUSTOM_PREFIX, CUSTOM_TENSORS, RematPolicy, get_remat,
)


class NoMaxTextMapping(JaxmemError):
  """A jaxmem option MaxText cannot spell: ``name`` (the axis or field), ``value`` and ``why``.
  ``--maxtext`` raises it; emit writes :attr:`note`, the same words with the field bare."""

  def __init__(self, name: str, value: Any, why: str):
    self.name, self.value, self.why = name, value, why
    super().__init__(f"`{name}` {value} has no MaxText mapping: {why}")

  @property
  def note(self) -> str:
    return self.worded({})


class OverrideDisagrees(JaxmemError):
  """A jaxmem option given both ways, through jaxmem and in MaxText's overrides, to two values."""


# --------------------------------------------------------------------------- MaxText's names

# MaxText's remat_policy values (layers/nnx_decoders.py, get_remat_policy), which `--maxtext`'s
# remat axis takes by these names (its step is MaxText's). MaxText checkpoints every decoder
# layer whatever the policy ("none" and "full" both save nothing a name marks), so jaxmem's
# `none` (no jax.checkpoint at all) has no counterpart.
REMATS = (
    "full", "minimal", "minimal_with_context", "save_dot_with_context_except_mlp", "save_dot_except_mlpwi",
    "save_dot_except_mlp", "save_qkv_proj", "save_out_proj", "qkv_proj_offloaded", "minimal_offloaded", "custom",
    "minimal_with_quantization", "minimal_with_context_and_quantization",
)
OFFLOADING = ("qkv_proj_offloaded", "minimal_offloaded")
# `remat all` on MaxText's step: every policy but those that need more options (custom's names, quantization).
ALL_REMATS = tuple(n for n in REMATS if n != "custom" and "quantization" not in n)
# jaxmem's presets whose MaxText policy of the same name saves the same tensors (jaxmem.program.remat
# builds them from the same checkpoint names). Not minimal_offloaded: jaxmem's offloads every matmul
# without batch dimensions, MaxText's the projections by name.
REMAT_SAME_NAME = frozenset({
    "full", "minimal", "minimal_with_context", "save_dot_with_context_except_mlp", "save_dot_except_mlpwi",
    "save_dot_except_mlp", "save_qkv_proj", "qkv_proj_offloaded", "save_out_proj",
})

# jaxmem's attention names -> MaxText's `attention` values (configs/types.py, Attention; the
# kernels in layers/attention_op.py); MaxText's own names are taken as they are. splash is
# MaxText's TPU flash; jaxmem's cudnn is jax.nn.dot_product_attention's cuDNN kernel, MaxText's
# cudnn_flash_jax (cudnn_flash_te is Transformer Engine's).
ATTENTIONS = {"dot": "dot_product", "splash": "flash", "cudnn": "cudnn_flash_jax"}
MAXTEXT_ATTENTIONS = ("autoselected", "dot_product", "flash", "cudnn_flash_te", "cudnn_flash_jax")
AUTO = "auto"  # jaxmem's "the step chooses": MaxText's own (its config's, autoselected in base.yml)

# jaxmem's mesh axes -> MaxText's ICI parallelism keys (configs/types.py, ici_map; the DCN keys
# are the same with dcn_). MaxText's mesh (base.yml's mesh_axes) names these axes as jaxmem does.
# `sequence` (jaxmem's: activations only) has none: MaxText's mesh has no such axis of that role.
MESH_KEYS = {
    "data": "ici_data_parallelism", "fsdp": "ici_fsdp_parallelism", "tensor": "ici_tensor_parallelism",
    "context": "ici_context_parallelism", "expert": "ici_expert_parallelism", "stage": "ici_pipeline_parallelism",
}

# MaxText's opt_type values jaxmem's optimizer axis names the same way (configs/types.py,
# OptimizerType): MaxText's muon is optax.contrib.muon, as jaxmem's. adam_pax has no jaxmem optimizer.
OPTIMIZERS_SPELT = ("adamw", "sgd", "muon")
DTYPES = ("float32", "bfloat16", "float16")  # weight_dtype, dtype and mu_dtype values jaxmem's dtypes spell
CONTEXT_STRATEGIES = ("all_gather", "ring")  # context_parallel_strategy values of jaxmem's strategies' names

# jaxmem's presets that are MaxText models of the same name (configs/types.py, ModelName).
MODEL_NAMES = frozenset({"gpt3-175b", "gpt3-22b", "llama3-70b", "llama3-8b", "mistral-7b", "mixtral-8x22b",
                         "mixtral-8x7b", "qwen2.5-7b", "qwen3-30b-a3b", "qwen3-8b"})


# ------------------------------------------------------------------------------- the rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class At:
  """What a value's spelling depends on besides the value: the rest of its configuration (the
  mesh, the devices and slices, the microbatches, attention by MaxText's name, the parameters'
  dtype, the optimizer, the capacity factor, the model's decoder layers, a GPU target)."""

  mesh: MeshSpec = ()
  devices: int = 1
  slices: int = 1
  microbatches: int = 1
  attention: str | None = None
  param_dtype: str | None = None
  optimizer: str | None = None
  capacity_factor: float | None = None
  layers: int | None = None
  gpu: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
  """One jaxmem option and MaxText's spelling of it. ``write(value, at)``: MaxText's settings for
  ``value`` (``{}``: MaxText's own), or :class:`NoMaxTextMapping`; ``notes(value, at)``: what the
  spelling does not carry over, in words. ``per_task``: ``--maxtext`` sets it per configuration
  of a sweep (it depends on the mesh, or the sweep varies it), else once, in the overrides; given
  at its default it is MaxText's own. ``when_given``: a per-task option the factory sets from the
  task's value only where it was given (None otherwise: MaxText's own), where the mesh and kernel
  say it applies. ``also``: jaxmem's other axes this row spells with it."""

  name: str
  keys: tuple[str, ...]
  write: Callable[[Any, At], dict[str, Any]]
  notes: Callable[[Any, At], tuple[str, ...]] = lambda value, at: ()
  per_task: bool = False
  when_given: bool = False
  also: tuple[str, ...] = ()


def refused(name: str, why: str) -> Row:
  """A row for an option MaxText has no spelling of: every value given is refused with ``why``."""

  def write(value: Any, at: At) -> dict[str, Any]:
    raise NoMaxTextMapping(name, value, why)

  return Row(name=name, keys=(), write=write)


_OWN_OPTION = "no MaxText option does the same; set MaxText's own in the `maxtext` overrides"


# --- the mesh


def mesh_settings(mesh: MeshSpec, at: At) -> dict[str, Any]:
  """``ici_*`` and ``dcn_*`` for every MaxText axis jaxmem maps, 1 where unused (so MaxText's
  ``-1`` defaults fill nothing): the slices taken from the mesh's leading axes, as jaxmem lays the
  devices out slice-major."""
  unknown = [a for a, _ in mesh if a not in MESH_KEYS]
  if unknown:
    raise NoMaxTextMapping("mesh", f"axis {unknown[0]}", f"MaxText's mesh has no axis of that role (its axes: "
                           f"{', '.join(MESH_KEYS)}); set MaxText's own ici_*_parallelism instead")
  left, dcn = at.slices, {}
  for axis, size in mesh:
    take = math.gcd(size, left)
    if left > 1 and take not in (size, left):
      raise NoMaxTextMapping("mesh", ",".join(f"{a}={s}" for a, s in mesh), f"its leading axes do not split "
                             f"cleanly over {at.slices} slices; set MaxText's own ici_* and dcn_* instead")
    dcn[axis], left = take, left // take
  sizes = dict(mesh)
  out: dict[str, Any] = {}
  for kind in ("ici", "dcn"):
    for axis, key in MESH_KEYS.items():
      n = dcn.get(axis, 1) if kind == "dcn" else sizes.get(axis, 1) // dcn.get(axis, 1)
      out[kind + key.removeprefix("ici")] = n
  return out


def mesh_of(shape: Mapping[str, int], devices: int) -> MeshSpec:
  """MaxText's mesh (its axis -> size) in jaxmem's axes (sizes of 1 left out; FSDP over every
  device when all are 1); an axis jaxmem has none of, split, is one line."""
  out = []
  for axis, size in shape.items():
    if size == 1:
      continue
    if axis not in MESH_KEYS:  # MaxText's axis names where jaxmem has the same axis
      raise JaxmemError(f"MaxText's mesh splits its {axis} axis ({size}), which jaxmem has no axis for; set its "
                        f"ici_{axis}_parallelism to 1")
    out.append((axis, size))
  return tuple(out) or (("fsdp", devices),)


# --- the batch, the sequence, the microbatches


def per_device_batch(batch: int, at: At) -> dict[str, Any]:
  """The global batch as MaxText's ``per_device_batch_size``: MaxText's global batch is
  per_device_batch_size x devices x gradient_accumulation_steps (configs/types.py,
  calculate_global_batch_sizes). A fraction where the devices do not divide it, as MaxText
  allows; refused where MaxText's global batch would differ."""
  value = batch / (at.devices * at.microbatches)
  if int(value * at.devices) * at.microbatches != batch:
    raise NoMaxTextMapping("batch", batch, f"over {at.devices} devices x {at.microbatches} microbatches it is not a "
                           "per_device_batch_size MaxText can give back")
  return {"per_device_batch_size": int(value) if value == int(value) else value}


def _batch_notes(batch: int, at: At) -> tuple[str, ...]:
  per_device = batch / (at.devices * at.microbatches)
  if per_device >= 1:
    return ()
  return (f"per_device_batch_size {per_device:g} < 1: MaxText loads a full batch per device and trains on "
          f"{batch // at.microbatches} sequences per microbatch (configs/types.py, calculate_global_batch_sizes)",)


def _seq(seq: int, at: At) -> dict[str, Any]:
  return {"max_target_length": seq}


def _microbatches(mb: int, at: At) -> dict[str, Any]:
  return {"gradient_accumulation_steps": mb or 1}


# --- remat


def remat_settings(name: str, at: At | None = None) -> dict[str, Any]:
  """jaxmem's remat policy as MaxText's ``remat_policy``: a preset MaxText has under the same
  name as itself, ``full_offloaded`` and a per-tensor assignment (``names:...``, ``custom:...``)
  as MaxText's ``custom`` map with each tensor's place."""
  if name in REMAT_SAME_NAME:
    return {"remat_policy": name}
  if name == "full_offloaded":
    return {"remat_policy": "custom", "decoder_layer_input": "offload"}
  if name.startswith((ASSIGNMENT_PREFIX, CUSTOM_PREFIX)):
    policy = get_remat(name)
    placed = {**{n: "device" for n in policy.saves}, **{n: "offload" for n in policy.offloads}}
    return {"remat_policy": "custom", **{n: placed[n] for n in sorted(placed) if n in CUSTOM_TENSORS}}
  if name == "none":
    nearest = " ".join(f"{t}=device" for t in CUSTOM_TENSORS if t != "decoder_layer_input")
    raise NoMaxTextMapping("remat", name, "MaxText checkpoints every decoder layer: its parser reads "
                           "remat_policy=none as None (configs/pyconfig.py), which its scanned layers checkpoint as "
                           f"full (layers/nnx_decoders.py); nearest: remat_policy=custom {nearest}")
  raise NoMaxTextMapping("remat", name, "MaxText has no remat_policy that saves the same tensors (its values: "
                         f"{', '.join(REMATS)})")


def _remat_notes(name: str, at: At) -> tuple[str, ...]:
  """A per-tensor assignment's tensors MaxText's custom map has no name for: recomputed there."""
  if not name.startswith((ASSIGNMENT_PREFIX, CUSTOM_PREFIX)):
    return ()
  policy: RematPolicy = get_remat(name)
  return tuple(f"remat {policy.name}: tensor {n} has no MaxText custom-policy name of the same meaning; it is "
               "recomputed there" for n in sorted({*policy.saves, *policy.offloads}) if n not in CUSTOM_TENSORS)


def maxtext_remat(name: str) -> dict[str, Any]:
  """``--maxtext``'s remat value: MaxText's own policy names as they are (its step is MaxText's),
  else jaxmem's through :func:`remat_settings`."""
  return {"remat_policy": name} if name in REMATS else remat_settings(name)


def offloads(settings: Mapping[str, Any]) -> bool:
  """Whether MaxText's remat settings move tensors to host memory."""
  return settings.get("remat_policy") in OFFLOADING or "offload" in settings.values()


# --- attention


def attention(name: str | None) -> str | None:
  """jaxmem's attention name as MaxText's ``attention`` (None: MaxText's own, for ``auto`` or
  none); MaxText's own names as they are."""
  if name is None or name == AUTO:
    return None
  if name in MAXTEXT_ATTENTIONS:
    return name
  if name in ATTENTIONS:
    return ATTENTIONS[name]
  raise NoMaxTextMapping("attention", name, f"MaxText has no kernel of that kind (its attention values: "
                         f"{', '.join(MAXTEXT_ATTENTIONS)}; jaxmem's {', '.join(ATTENTIONS)} map onto them)")


def jaxmem_attention(name: str) -> str:
  """MaxText's ``attention`` value in jaxmem's name where jaxmem has the kernel (else as it is)."""
  return {v: k for k, v in ATTENTIONS.items()}.get(name, name)


def _attention(name: str | None, at: At) -> dict[str, Any]:
  spelt = attention(name)
  return {} if spelt is None else {"attention": spelt}


# --- the optimizer and the dtypes


def _optimizer(name: str | None, at: At) -> dict[str, Any]:
  if name is None:
    return {}
  if name not in OPTIMIZERS_SPELT:
    spelt = ", ".join(OPTIMIZERS_SPELT)
    raise NoMaxTextMapping("optimizer", name, f"MaxText has no opt_type of the same update ({spelt} map by name)")
  return {"opt_type": name}


def state_moments(opt_type: str) -> float:
  """The parameter-sized arrays of optimizer state MaxText's ``opt_type`` keeps per parameter,
  from jaxmem's optimizer of the same name (:data:`jaxmem.program.optimizers.OPTIMIZERS`); an
  opt_type jaxmem has no optimizer for, or one whose state is not declared, is refused."""
  if opt_type not in OPTIMIZERS_SPELT or opt_type not in OPTIMIZERS:
    spelt = ", ".join(OPTIMIZERS_SPELT)
    raise NoMaxTextMapping("optimizer", f"(MaxText's opt_type) {opt_type}", "jaxmem has no optimizer of that name, "
                           f"so its state per parameter is not known (MaxText's {spelt} map by name)")
  moments = OPTIMIZERS.get(opt_type).state_moments
  if moments is None:
    raise NoMaxTextMapping("optimizer", opt_type, "jaxmem's optimizer registry does not declare its state per "
                           "parameter")
  return moments


def _dtype(name: str, key: str) -> Callable[[Any, At], dict[str, Any]]:
  def write(value: str | None, at: At) -> dict[str, Any]:
    if value is None:
      return {}
    if value not in DTYPES:
      raise NoMaxTextMapping(name, value, f"not one of MaxText's {key} values jaxmem's spell ({', '.join(DTYPES)})")
    return {key: value}
  return write


def _moments(value: str | None, at: At) -> dict[str, Any]:
  """The moments' dtype as MaxText's ``mu_dtype`` (``""``, its default, inherits weight_dtype: so
  nothing is written for the parameters' dtype)."""
  if value is None or value == at.param_dtype:
    return {}
  if value not in DTYPES:
    raise NoMaxTextMapping("moments_dtype", value, f"not one of MaxText's mu_dtype values jaxmem's spell "
                           f"({', '.join(DTYPES)})")
  return {"mu_dtype": value}


def _moments_notes(value: str | None, at: At) -> tuple[str, ...]:
  if not _moments(value, at) or at.optimizer not in (None, "adamw"):
    return ()
  return (f"moments_dtype {value}: MaxText's mu_dtype sets the first moment's dtype only; the second follows "
          "weight_dtype",)


# --- the step's options


def _vocab_tiles(tiles: int | None, at: At) -> dict[str, Any]:
  return {"num_vocab_tiling": tiles or 1}


def _dropout(rate: float | None, at: At) -> dict[str, Any]:
  return {"dropout_rate": rate} if rate else {}


# fp8_full as the Ironwood recipes run it (tpu-recipes training/ironwood/llama3.1-70b/8k-fp8-tpu7x-4x4x4/xpk/
# run_recipe.sh and every other fp8 row): through qwix (MaxText 0.2.5 refuses fp8_full without it:
# layers/quantizations.py, maybe_quantize_model), with static scaling (fixed calibration: no amax reductions).
FP8_FULL = {"quantization": "fp8_full", "use_qwix_quantization": True,
            "weight_quantization_calibration_method": "fixed,-224,224",
            "act_quantization_calibration_method": "fixed,-224,224"}


def _quantization(value: str | None, at: At) -> dict[str, Any]:
  return dict(FP8_FULL) if value == "fp8_full" else {}


def _context_strategy(strategy: str | None, at: At) -> dict[str, Any]:
  """How attention crosses a context-sharded sequence, as MaxText's ``context_parallel_strategy``:
  only where the mesh has a context axis (jaxmem records none elsewhere). MaxText runs ring on a
  TPU only in its Tokamax splash kernel (configs/types.py), so ring is spelt with it and refused
  with any other kernel."""
  if strategy is None or dict(at.mesh).get("context", 1) < 2:
    return {}
  if strategy not in CONTEXT_STRATEGIES:
    raise NoMaxTextMapping("context_strategy", strategy, f"MaxText's context_parallel_strategy values jaxmem's spell: "
                           f"{', '.join(CONTEXT_STRATEGIES)}")
  if strategy == "ring" and not at.gpu:
    if at.attention != "flash":
      raise NoMaxTextMapping("context_strategy", strategy, "MaxText runs ring attention on TPU only in its Tokamax "
                             f"splash kernel (attention=flash, use_tokamax_splash=true), and attention here is "
                             f"{at.attention or 'its own'}")
    return {"context_parallel_strategy": strategy, "use_tokamax_splash": True}
  return {"context_parallel_strategy": strategy}


def _stages(at: At) -> int:
  return dict(at.mesh).get("stage", 1)


def _pipeline_microbatches(pm: int | None, at: At) -> dict[str, Any]:
  """A stage axis's pipeline microbatches (None: MaxText's own, as many as the stages)."""
  return {} if _stages(at) < 2 or pm is None else {"num_pipeline_microbatches": pm}


def _pipeline_repeats(repeats: int | None, at: At) -> dict[str, Any]:
  """MaxText's circular schedule over a stage axis: ``num_pipeline_repeats`` and the layers per
  stage MaxText derives the repeats from (``num_layers_per_pipeline_stage``, default 1), both
  written (None: MaxText's own)."""
  if _stages(at) < 2 or repeats is None:
    return {}
  out: dict[str, Any] = {"num_pipeline_repeats": repeats}
  if at.layers is not None:
    out["num_layers_per_pipeline_stage"] = at.layers // (_stages(at) * repeats)
  return out


def _pipeline_notes(repeats: int | None, at: At) -> tuple[str, ...]:
  if not _pipeline_repeats(repeats, at) or at.layers is not None:
    return ()
  return ("num_layers_per_pipeline_stage: the model's layer count is not known here; give "
          f"layers / ({_stages(at)} x {repeats})",)


def _moe(impl: str | None, at: At) -> dict[str, Any]:
  """A mixture of experts' path: dropless (MaxText's default: sorted tokens through grouped
  matmuls, none dropped) or capacity (GShard's dispatch and combine, copies past capacity
  dropped, at the capacity factor given, else MaxText's own)."""
  if impl is None:
    return {}
  if impl == "dropless":
    return {"sparse_matmul": True, "capacity_factor": -1}
  if impl == "capacity":
    return {"sparse_matmul": False, **({} if at.capacity_factor is None else {"capacity_factor": at.capacity_factor})}
  raise NoMaxTextMapping("moe_impl", impl, "MaxText's are dropless (sparse_matmul=true) and capacity "
                         "(sparse_matmul=false with a capacity_factor)")


def _experts_on_fsdp(on: bool | None, at: At) -> dict[str, Any]:
  """The experts' weights split on their expert dimension over fsdp: MaxText's
  ``fsdp_shard_on_exp`` (layers/moe.py; the DeepSeek-V3 and GPT-OSS recipes set it; MaxText's
  main branch since renamed it ``shard_exp_on_fsdp``). None: MaxText's own (off)."""
  return {} if on is None else {"fsdp_shard_on_exp": bool(on)}


# --- where it runs, and the model


def _target(name: str | None, at: At) -> dict[str, Any]:
  return {"hardware": "gpu"} if (name or "").startswith("gpu:") else {}


def plain_llama(model: Any) -> bool:
  """A plain Llama-style decoder (SwiGLU, pre-norm RMSNorm, RoPE, grouped-query attention,
  dense): what MaxText's ``llama2`` decoder block builds from its dimensions."""
  return model is not None and model.style in ("llama2", "llama3") and not model.is_moe and not model.kv_lora_rank \
      and model.mlp_act == "silu" and model.norm_layout == "pre" and not (model.qkv_bias or model.qk_norm or
      model.sliding_window or model.attention_sinks or model.attn_softcap or model.final_softcap or model.out_bias)


def model_settings(name: str, model: Any) -> dict[str, Any]:
  """``model_name`` where MaxText has the model under jaxmem's name; else, for a plain Llama-style
  decoder (``model``, its :class:`~jaxmem.models.ModelConfig`), its dimensions on MaxText's
  ``llama2`` decoder block (configs/base.yml's ``base_*`` keys); else refused."""
  if name in MODEL_NAMES:
    return {"model_name": name}
  if not plain_llama(model):
    raise NoMaxTextMapping("model", name, "MaxText has no model of that name; give MaxText its architecture "
                           "(decoder_block, base_emb_dim, base_num_decoder_layers, ...) or a model config file")
  return dict(decoder_block="llama2", base_emb_dim=model.d_model, base_num_query_heads=model.num_heads,
              base_num_kv_heads=model.num_kv_heads, base_mlp_dim=model.d_ff, base_num_decoder_layers=model.num_layers,
              head_dim=model.head_dim, vocab_size=model.vocab_size, normalization_layer_epsilon=model.norm_eps,
              rope_max_timescale=int(model.rope_theta), logits_via_embedding=bool(model.tie_embeddings))


def model_notes(name: str) -> tuple[str, ...]:
  if name in MODEL_NAMES:
    return ()
  return (f"model {name}: not one of MaxText's models; written as its dimensions on MaxText's llama2 decoder block "
          "(rope scaling, if the model has any, is MaxText's default)",)


# ------------------------------------------------------------------------------- the table

_ROWS = (
    Row(name="target", keys=("hardware",), write=_target),
    Row(name="mesh", keys=tuple(k for kind in ("ici", "dcn") for k in (kind + v.removeprefix("ici")
                                                                         for v in MESH_KEYS.values())),
        write=mesh_settings, per_task=True),
    Row(name="batch", keys=("per_device_batch_size",), write=per_device_batch, notes=_batch_notes, per_task=True),
    Row(name="microbatches", keys=("gradient_accumulation_steps",), write=_microbatches, per_task=True),
    Row(name="seq", keys=("max_target_length",), write=_seq, per_task=True),
    Row(name="remat", keys=("remat_policy", *CUSTOM_TENSORS), write=remat_settings, notes=_remat_notes, per_task=True),
    Row(name="attention", keys=("attention",), write=_attention, per_task=True),
    Row(name="vocab_tiles", keys=("num_vocab_tiling",), write=_vocab_tiles),
    Row(name="pipeline_microbatches", keys=("num_pipeline_microbatches",), write=_pipeline_microbatches,
        per_task=True, when_given=True),
    Row(name="pipeline_repeats", keys=("num_pipeline_repeats", "num_layers_per_pipeline_stage"),
        write=_pipeline_repeats, notes=_pipeline_notes, per_task=True, when_given=True),
    Row(name="optimizer", keys=("opt_type",), write=_optimizer),
    Row(name="param_dtype", keys=("weight_dtype",), write=_dtype("param_dtype", "weight_dtype")),
    Row(name="dtype", keys=("dtype",), write=_dtype("dtype", "dtype")),
    Row(name="moments_dtype", keys=("mu_dtype",), write=_moments, notes=_moments_notes),
    Row(name="moe_impl", keys=("sparse_matmul", "capacity_factor"), write=_moe, also=("capacity_factor",)),
    Row(name="fsdp_shard_on_exp", keys=("fsdp_shard_on_exp",), write=_experts_on_fsdp, per_task=True, when_given=True),
    Row(name="dropout", keys=("dropout_rate",), write=_dropout),
    Row(name="context_strategy", keys=("context_parallel_strategy", "use_tokamax_splash"), write=_context_strategy,
        per_task=True, when_given=True),
    Row(name="quantization", keys=tuple(FP8_FULL), write=_quantization, per_task=True, when_given=True),
    # The compiler release is no MaxText option: a task's worker process loads it (jaxmem.compilers).
    Row(name="compiler", keys=(), write=lambda value, at: {}, per_task=True, when_given=True),
)
ROWS: dict[str, Row] = {r.name: r for r in _ROWS}  # in the order a launch writes them
# The axes a row spells along with its own (capacity_factor with moe_impl): no row of their own.
SPELT_WITH = {a: r.name for r in _ROWS for a in r.also}
# The axes a MaxText step sets per configuration whatever the workload gives (the mesh, remat
# policy, attention and microbatches: MaxText's own where not given), which its rows record as
# each task set them (attention by MaxText's name).
TASK_AXES = tuple(r.name for r in _ROWS if r.per_task and not r.when_given and r.name in AXES)


def row(name: str) -> Row:
  """The row of jaxmem's option ``name`` (one another row spells with it: that row). An option
  with no row has no MaxText spelling (the scores' dtype, the master copy, the gradients'
  reduction dtype, sequence parallelism, the experts' grouped-matmul kernel, another package's
  axis): every value given is refused."""
  return ROWS.get(SPELT_WITH.get(name, name)) or refused(name, _OWN_OPTION)


def spell(names: Sequence[str], values: Mapping[str, Any], at: At) -> tuple[dict[str, Any], list[str]]:
  """The rows ``names`` at ``values`` (name -> value): MaxText's settings and, in the rows' order,
  the notes on them and each refusal's (:attr:`NoMaxTextMapping.note`). A refused row sets nothing."""
  out: dict[str, Any] = {}
  notes: list[str] = []
  for name in names:
    r, value = row(name), values.get(name)
    try:
      out.update(r.write(value, at))
    except NoMaxTextMapping as e:
      notes.append(e.note)
      continue
    notes += r.notes(value, at)
  return out, notes


def text(value: Any) -> str:
  """A setting as MaxText's command line takes it (``true`` for True)."""
  return str(value).lower() if isinstance(value, bool) else str(value)

"""ModelConfigs from Hugging Face-style ``config.json`` files.

``from_config(path_or_dict, *, name=None)`` reads the ``config.json`` of a checkpoint of one of
the families the models here can express and returns the :class:`ModelConfig` of the same
shapes:

  LlamaForCausalLM    style llama3
  MistralForCausalLM  style llama3; ``sliding_window`` recorded (see ModelConfig.notes)
  Qwen2ForCausalLM    style llama3 with biases on q, k and v (``qkv_bias``)
  Qwen3ForCausalLM    style llama3 with RMSNorm on each q and k head (``qk_norm``)
  GPT2LMHeadModel     style gpt2 (its own field names: n_embd, n_layer, n_head, n_positions)
  MixtralForCausalLM  Mistral's attention, every layer a softmax top-k router over
                      ``num_local_experts`` SwiGLU experts of width ``intermediate_size``
  Qwen3MoeForCausalLM Qwen3's attention, every layer a softmax top-k router (``norm_topk_prob``)
                      over ``num_experts`` experts of width ``moe_intermediate_size``
  DeepseekV3ForCausalLM  multi-head latent attention, ``first_k_dense_replace`` dense layers,
                      then sigmoid group-limited routing (``n_group``, ``topk_group``; the
                      ``noaux_tc`` selection bias) over ``n_routed_experts`` experts plus
                      ``n_shared_experts``; ``num_nextn_predict_layers`` recorded, not modelled

Every field of the file is accounted for: it is mapped to a ModelConfig field, checked to
hold a value the models can express, or on a list of fields that do not change memory (below,
with the reason). Anything else is a one-line :class:`JaxmemError` naming the field, so a
config this module does not understand is never analysed as a model it is not. The field
names and their defaults follow transformers' ``LlamaConfig``, ``MistralConfig``,
``Qwen2Config``, ``Qwen3Config``, ``GPT2Config``, ``MixtralConfig``, ``Qwen3MoeConfig`` and
DeepSeek's ``DeepseekV3Config`` (the checkpoint's configuration_deepseek.py). Mixture-of-experts
layouts the models here cannot express (experts every few layers, dense layers between MoE
ones) are refused, as is any MoE or MLA field in a dense architecture's file.

The checkpoint's ``torch_dtype`` is ignored: it is the storage dtype of the released weights,
while the train step's dtypes are ``param_dtype`` and ``dtype`` (``--param-dtype``,
``--dtype``), float32 parameters and bfloat16 compute by default, as for every preset.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxmem.errors import BadValue, JaxmemError
from jaxmem.inputs import Number, Whole, json_bool, json_list, json_object, json_string, strict_json

from .config import Gemma4Spec, MLASpec, ModelConfig

SUPPORTED: tuple[str, ...] = (
  "LlamaForCausalLM",
  "MistralForCausalLM",
  "Qwen2ForCausalLM",
  "Qwen3ForCausalLM",
  "GPT2LMHeadModel",
  "MixtralForCausalLM",
  "Qwen3MoeForCausalLM",
  "DeepseekV3ForCausalLM",
  "DeepseekV2ForCausalLM",
  "Gemma2ForCausalLM",
  "Gemma3ForCausalLM",
  "Gemma3ForConditionalGeneration",
  "Gemma4ForCausalLM",
  "Gemma4ForConditionalGeneration",
  "GptOssForCausalLM",
  "Llama4ForCausalLM",
  "Llama4ForConditionalGeneration",
  "Phi3ForCausalLM",
  "Glm4MoeForCausalLM",
  "Olmo2ForCausalLM",
)
# Multimodal checkpoints whose text model is built from their ``text_config`` (the vision tower
# and its projector are left out, with a note) -> the text architecture.
_TEXT_OF = {
  "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM", "Gemma4ForConditionalGeneration": "Gemma4ForCausalLM",
  "Llama4ForConditionalGeneration": "Llama4ForCausalLM",
}
# The multimodal wrapper's own fields: token ids, the vision tower's config, image layout.
_MULTIMODAL_IGNORED = frozenset({
  "text_config", "vision_config", "boi_token_index", "eoi_token_index", "image_token_index", "mm_tokens_per_image",
  "tie_word_embeddings", "processor_class", "image_token_id", "boi_token_id", "eoi_token_id",
  # Gemma 4's (Gemma4Config): the audio tower's config, audio and video token ids, image budget
  "audio_config", "audio_token_id", "video_token_id", "boa_token_id", "eoa_token_id", "eoa_token_index",
  "vision_soft_tokens_per_image",
})
# model_type -> architecture, for a config without "architectures".
_BY_MODEL_TYPE = {
  "llama": "LlamaForCausalLM",
  "mistral": "MistralForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
  "gpt2": "GPT2LMHeadModel",
  "mixtral": "MixtralForCausalLM",
  "qwen3_moe": "Qwen3MoeForCausalLM",
  "deepseek_v3": "DeepseekV3ForCausalLM",
  "deepseek_v2": "DeepseekV2ForCausalLM",
  "gemma2": "Gemma2ForCausalLM",
  "gemma3_text": "Gemma3ForCausalLM",
  "gemma3": "Gemma3ForConditionalGeneration",
  "gemma4_text": "Gemma4ForCausalLM",
  "gemma4": "Gemma4ForConditionalGeneration",
  "gpt_oss": "GptOssForCausalLM",
  "llama4_text": "Llama4ForCausalLM",
  "llama4": "Llama4ForConditionalGeneration",
  "phi3": "Phi3ForCausalLM",
  "glm4_moe": "Glm4MoeForCausalLM",
  "olmo2": "Olmo2ForCausalLM",
}
# Mixture-of-experts architectures -> the dense family whose attention and fields they share.
_MOE_BASE = {"MixtralForCausalLM": "MistralForCausalLM", "Qwen3MoeForCausalLM": "Qwen3ForCausalLM"}
_MOE_ARCHS = (
  *_MOE_BASE, "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "GptOssForCausalLM", "Llama4ForCausalLM",
  "Glm4MoeForCausalLM", "Gemma4ForCausalLM",  # Gemma 4: its enable_moe_block (26B-A4B)
)
_MLA_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
# MoE training and serving knobs that change no shape: auxiliary-loss coefficients, whether the
# router logits are returned, router noise, and the expert-parallel degree a server used.
_MOE_IGNORED = frozenset({
  "router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "aux_loss_alpha", "seq_aux", "ep_size",
})

# Fields accepted and ignored for every family, because they do not change memory:
_IGNORED = frozenset({
  # identity and bookkeeping (the name is taken from _name_or_path separately)
  "architectures", "model_type", "transformers_version", "auto_map", "_name_or_path", "name_or_path",
  "_commit_hash", "tokenizer_class", "_from_model_config",
  # token ids and generation defaults: values of the inputs, not shapes
  "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "use_cache",
  "max_length", "min_length", "do_sample", "temperature", "top_p", "top_k", "repetition_penalty",
  "num_beams", "num_return_sequences", "length_penalty", "no_repeat_ngram_size", "early_stopping",
  "task_specific_params", "prefix", "output_past",
  # initialisation: values of the parameters, not their shapes
  "initializer_range",
  # storage dtype of the released weights (see the module docstring)
  "torch_dtype", "dtype", "use_bfloat16",
  # dropout probabilities: jaxmem's train step has no dropout (no preset does), so no dropout
  # masks are compiled or counted whatever these say
  "attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout",
  # which attention kernel transformers would run: the model here compiles its own
  "_attn_implementation", "attn_implementation", "_attn_implementation_autoset",
  # transformers' output, head and export switches: nothing the train step computes
  "output_attentions", "output_hidden_states", "return_dict", "torchscript", "id2label", "label2id",
  "num_labels", "problem_type", "finetuning_task", "chunk_size_feed_forward", "is_decoder",
  "gradient_checkpointing",
  # GPT2DoubleHeadsModel's multiple-choice head, which GPT2LMHeadModel does not build
  "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
})

# Fields that make a model these modules cannot build (they are refused with a reason,
# before anything else is read, whatever the architecture claims to be).
_MOE_FIELDS = (
  "num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
  "n_shared_experts", "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
  "first_k_dense_replace", "moe_layer_freq",
)
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")

# RoPE variants that only change the rotation frequencies (values), never a shape: accepted.
_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "su")
_SILU = ("silu", "swish")  # transformers' ACT2FN maps both to SiLU
# GPT-2's tanh approximation of GELU (models/mlp.py uses approximate=True), under its names.
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")

_MISSING = object()


class _Fields:
  """The config's fields, read one at a time, so that whatever is left unread is refused; each
  read with the parser of its kind (:mod:`jaxmem.inputs`: a JSON integer or number in its
  range, true or false, a string, a list of its length), so a field of the wrong JSON type,
  range or length is one line naming it."""

  def __init__(self, raw: Mapping[str, Any], where: str):
    self.raw, self.where, self.seen = raw, where, set()

  def error(self, message: str) -> JaxmemError:
    return JaxmemError(f"{self.where}: {message}")

  def subject(self, key: str) -> str:
    return f"{self.where}: field {key!r}"

  def get(self, key: str, default: Any = _MISSING) -> Any:
    """The value of ``key``; a null or absent field is ``default`` (required without one)."""
    self.seen.add(key)
    value = self.raw.get(key)
    if value is None:
      if default is _MISSING:
        raise self.error(f"required field {key!r} is missing")
      return default
    return value

  def integer(self, key: str, default: Any = _MISSING, *, least: int | None = 1) -> int:
    """A JSON integer of at least ``least`` (a size: 1; a count that may be none: 0)."""
    return Whole(least=least, json=True)(self.get(key, default), self.subject(key))

  def number(self, key: str, default: Any = _MISSING, *, above: float | None = 0.0, least: float | None = None,
             most: float | None = None) -> float:
    """A JSON number above ``above`` (an epsilon, a RoPE base, a scale: above 0), from ``least``
    up to ``most``."""
    return Number(above=above, least=least, most=most, json=True)(self.get(key, default), self.subject(key))

  def flag(self, key: str, default: Any = _MISSING) -> bool:
    return json_bool(self.get(key, default), self.subject(key))

  def text(self, key: str, default: Any = _MISSING) -> str:
    return json_string(self.get(key, default), self.subject(key))

  def listed(self, key: str, default: Any = _MISSING, *, length: int | None = None) -> list[Any]:
    """A JSON list (of ``length`` items where given: one per layer)."""
    return json_list(self.get(key, default), self.subject(key), length=length)

  def refuse_if_true(self, key: str, why: str) -> None:
    if self.flag(key, False):
      raise self.error(f"{key} true is not supported: {why}")

  def check_all_read(self, arch: str, also_ignored: frozenset[str] = frozenset()) -> None:
    unknown = sorted(set(self.raw) - self.seen - _IGNORED - also_ignored)
    if unknown:
      raise self.error(
        f"unknown field(s) {', '.join(unknown)} for {arch}: jaxmem cannot tell whether they change "
        "memory; remove them from the file if they do not"
      )


def from_config(path_or_dict: str | os.PathLike[str] | Mapping[str, Any], *, name: str | None = None) -> ModelConfig:
  """The ModelConfig a Hugging Face-style ``config.json`` describes (see the module docstring).

  Args:
    path_or_dict: a path to the JSON file, or its contents as a mapping.
    name: the config's name; by default ``_name_or_path`` from the file if set, else the name
      of the file's directory for a file called ``config.json`` (the hub's layout, e.g.
      ``Qwen2.5-7B/config.json``), else the file name without ``.json``.

  Raises:
    JaxmemError: an unreadable file, an unsupported architecture, or a field whose value the
      models cannot express; one line, naming what is supported.
  """
  raw, where, file_name = _load(path_or_dict)
  arch = _architecture(raw, where)
  name = name or _default_name(raw, file_name, arch)
  vision = raw.get("vision_config") if arch == "Llama4ForConditionalGeneration" else None
  if vision is not None:
    vision = json_object(vision, f"{where}: field 'vision_config'")
  if arch in _TEXT_OF:
    raw, arch, where = _text_config(raw, arch, where)
  fields = _Fields(raw, where)
  _refuse_unbuildable(fields, arch)
  if arch == "GPT2LMHeadModel":
    return _gpt2(fields, name)
  if arch in _MLA_ARCHS:
    return _deepseek(fields, arch, name)
  if arch in _BUILDERS:
    cfg = _BUILDERS[arch](fields, name)
  else:
    cfg = _llama_family(fields, arch, name)
  if vision:
    cfg = dataclasses.replace(cfg, vision_params=_vision_params(vision, cfg.d_model, where))
  return cfg


def _vision_params(vision: Mapping[str, Any], text_hidden: int, where: str) -> int:
  """Llama 4's vision tower and projector, counted (:func:`.counting.llama4_vision_params`)."""
  from .counting import llama4_vision_params

  missing = [k for k in _VISION_COUNTED if vision.get(k) is None and k != "num_channels"]
  if missing:
    raise JaxmemError(f"{where}: vision_config needs integer {', '.join(missing)} to count the vision tower")
  counted = {k: Whole(json=True)(vision.get(k, 3), f"{where}: vision_config field {k!r}") for k in _VISION_COUNTED}
  return llama4_vision_params(counted, text_hidden)


# The vision_config fields Llama 4's vision tower is counted from (num_channels: 3 if absent);
# the others (its heads, activation, pixel shuffle ratio) change no parameter count.
_VISION_COUNTED = ("hidden_size", "intermediate_size", "num_hidden_layers", "patch_size", "image_size",
                   "projector_input_dim", "projector_output_dim", "vision_output_dim", "num_channels")


def _text_config(raw: Mapping[str, Any], arch: str, where: str) -> tuple[Mapping[str, Any], str, str]:
  """A multimodal config's text model: its ``text_config`` (the wrapper's other fields are the
  vision tower's and token ids, which do not change the text model's memory), with the
  wrapper's ``tie_word_embeddings`` where the text config leaves it out."""
  text = raw.get("text_config")
  if not isinstance(text, Mapping):
    raise JaxmemError(f"{where}: {arch} needs a text_config object")
  unknown = sorted(set(raw) - _MULTIMODAL_IGNORED - _IGNORED)
  if unknown:
    raise JaxmemError(f"{where}: unknown field(s) {', '.join(unknown)} for {arch}")
  text = {k: v for k, v in text.items() if k not in ("architectures", "model_type")}
  if "tie_word_embeddings" in raw and "tie_word_embeddings" not in text:
    text["tie_word_embeddings"] = raw["tie_word_embeddings"]
  return text, _TEXT_OF[arch], f"{where} (text_config)"


def _load(path_or_dict: Any) -> tuple[Mapping[str, Any], str, Path | None]:
  """(fields, where to say an error is, the file's path or None)."""
  if isinstance(path_or_dict, Mapping):
    return path_or_dict, "model config", None
  if not isinstance(path_or_dict, (str, os.PathLike)):
    raise BadValue("a model config", "a path to a config.json or its fields as a mapping", path_or_dict)
  path = Path(path_or_dict)
  try:
    text = path.read_text(encoding="utf-8")
  except OSError as e:
    raise JaxmemError(f"cannot read model config {path}: {e.strerror or e}") from None
  except (UnicodeDecodeError, ValueError):  # not text, or a path with a NUL in it
    raise JaxmemError(f"cannot read model config {path}: not a UTF-8 text file") from None
  raw = strict_json(text, str(path))
  if not isinstance(raw, dict):
    raise JaxmemError(f"{path}: a config.json holds a JSON object, got {type(raw).__name__}")
  return raw, str(path), path


def _architecture(raw: Mapping[str, Any], where: str) -> str:
  archs, model_type = raw.get("architectures"), raw.get("model_type")
  if archs is not None:  # transformers writes the one class the checkpoint is for
    arch = json_string(json_list(archs, f"{where}: field 'architectures'", length=1)[0], f"{where}: architectures[0]")
  elif model_type is not None:
    model_type = json_string(model_type, f"{where}: field 'model_type'")
    arch = _BY_MODEL_TYPE.get(model_type, model_type)
  else:
    arch = "no architectures or model_type"
  if arch not in SUPPORTED:
    raise JaxmemError(f"{where}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED)}")
  return arch


def _refuse_unbuildable(f: _Fields, arch: str) -> None:
  """Fields whose presence alone means a model the architecture's decoder here cannot express."""
  moe = [k for k in _MOE_FIELDS if f.raw.get(k) not in (None, 0, [], False)]
  if moe and arch not in _MOE_ARCHS:
    raise f.error(
      f"mixture-of-experts field(s) {', '.join(moe)} are not supported for {arch}; mixture-of-experts "
      f"architectures: {', '.join(_MOE_ARCHS)}"
    )
  mla = [k for k in _MLA_FIELDS if f.raw.get(k) is not None]
  if mla and arch not in _MLA_ARCHS:
    raise f.error(
      f"multi-head latent attention field(s) {', '.join(mla)} are not supported for {arch} (DeepseekV3ForCausalLM has them)"
    )
  quant = f.raw.get("quantization_config")
  if arch == "GptOssForCausalLM" and isinstance(quant, Mapping) and quant.get("quant_method") == "mxfp4":
    # GPT-OSS is released with MXFP4 experts: the storage of the published weights, like
    # torch_dtype; the train step's parameters are param_dtype.
    f.get("quantization_config")
  elif quant is not None:
    raise f.error(
      "quantization_config is not supported: the train step stores parameters in param_dtype; "
      "use the unquantized config, and inference's `weights` for quantized inference weights"
    )
  f.refuse_if_true("is_encoder_decoder", "jaxmem's models are decoder-only")
  f.refuse_if_true("add_cross_attention", "jaxmem's models have no cross-attention")
  if json_object(f.get("pruned_heads", {}), f.subject("pruned_heads")):
    raise f.error("pruned_heads is not supported: every layer here has the same number of heads")
  f.refuse_if_true("tie_encoder_decoder", "jaxmem's models are decoder-only")


def _default_name(raw: Mapping[str, Any], file_name: Path | None, arch: str) -> str:
  for key in ("_name_or_path", "name_or_path"):
    value = raw.get(key)
    if isinstance(value, str) and value.strip("/ "):
      # A hub id ("Qwen/Qwen2.5-7B") is kept whole; a local directory only by its last part.
      local = value.startswith(("/", ".", "~")) or os.path.isabs(value)
      return Path(value).name if local else value
  if file_name is not None:
    stem = file_name.parent.resolve().name if file_name.name == "config.json" else file_name.stem
    if stem:
      return stem
  return str(raw.get("model_type") or arch)


def _rope_theta(f: _Fields) -> float:
  """rope_theta, from ``rope_theta`` or transformers 5's ``rope_parameters``, after checking
  that any RoPE scaling only changes frequencies."""
  theta = f.number("rope_theta", 10_000.0)
  for key in ("rope_scaling", "rope_parameters"):
    spec = f.get(key, None)
    if spec is None:
      continue
    if not isinstance(spec, Mapping):
      raise f.error(f"field {key!r} must be an object, got {spec!r}")
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind not in _ROPE_TYPES:
      raise f.error(
        f"{key} type {kind!r} is not supported; supported: {', '.join(_ROPE_TYPES)} (they change "
        "RoPE frequencies, not shapes)"
      )
    if key == "rope_parameters" and spec.get("rope_theta") is not None:
      theta = spec["rope_theta"]
      if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        raise f.error(f"rope_parameters.rope_theta must be a number, got {theta!r}")
      theta = float(theta)
  return theta


def _sliding_window(f: _Fields, arch: str) -> int | None:
  """The window the checkpoint's attention uses, or None. Mistral applies ``sliding_window``
  to every layer; Qwen2/3 only with ``use_sliding_window`` (from layer ``max_window_layers``
  on; the layer split does not matter, since the window is recorded, not modelled)."""
  if arch == "LlamaForCausalLM":
    # Llama has no window; a "sliding_window" in its file is left unread, so refused.
    return None
  window = f.integer("sliding_window", 0, least=0) or None
  if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
    f.integer("max_window_layers", 0, least=0)
    if not f.flag("use_sliding_window", False):
      return None
  return window


def _check_layer_types(f: _Fields, num_layers: int) -> None:
  """transformers 4.53+ lists each layer's attention, one entry per layer; full or sliding is a
  mask, not a shape."""
  if f.get("layer_types", None) is None:
    return
  layer_types = f.listed("layer_types", length=num_layers)
  if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
    raise f.error(f"layer_types may only list full_attention and sliding_attention, got {layer_types!r}")


def _llama_family(f: _Fields, arch: str, name: str) -> ModelConfig:
  """Llama, Mistral, Qwen2 and Qwen3 (and Mixtral, Qwen3-MoE: their attention with MoE layers):
  pre-RMSNorm, RoPE, GQA and SwiGLU, as style llama3."""
  moe_arch, arch = arch, _MOE_BASE.get(arch, arch)  # the attention's family decides the rest
  act = f.get("hidden_act", "silu")
  if act not in _SILU:
    raise f.error(f"hidden_act {act!r} is not supported; supported: {', '.join(_SILU)} (the MLP here is SwiGLU)")
  f.refuse_if_true("mlp_bias", "the SwiGLU MLP here has no biases")
  if arch == "Qwen2ForCausalLM":
    # transformers' Qwen2 always puts biases on q, k and v (and none on o), whatever
    # attention_bias says; reading it here keeps it from being refused as unknown.
    f.flag("attention_bias", False)
  else:
    f.refuse_if_true(
      "attention_bias", "biases on all four attention projections are not supported (Qwen2ForCausalLM's q/k/v biases are)"
    )
  if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
    f.refuse_if_true("use_mrope", "multimodal RoPE (Qwen2-VL) is not supported")
  d, heads = f.integer("hidden_size"), f.integer("num_attention_heads")
  # transformers' defaults where a file leaves a field out (Qwen3Config: head_dim 128;
  # MistralConfig: 8 kv heads; the others: as many kv heads as heads, head_dim D / N).
  default_head_dim = 128 if arch == "Qwen3ForCausalLM" else d // max(heads, 1)
  if arch != "Qwen3ForCausalLM" and heads > 0 and d % heads and f.raw.get("head_dim") is None:
    raise f.error(f"hidden_size {d} is not a multiple of num_attention_heads {heads}; give head_dim")
  if moe_arch == "Qwen3MoeForCausalLM":
    default_head_dim = f.integer("head_dim")  # Qwen3MoeConfig's default is not checked here: required
  default_kv_heads = 8 if arch == "MistralForCausalLM" else heads
  default_positions = {"LlamaForCausalLM": 2048, "MistralForCausalLM": 4096 * 32}.get(arch, 32_768)
  _check_layer_types(f, f.integer("num_hidden_layers"))
  cfg = dict(
    name=name, style="llama3", vocab_size=f.integer("vocab_size"), d_model=d, num_layers=f.integer("num_hidden_layers"),
    num_heads=heads, num_kv_heads=f.integer("num_key_value_heads", default_kv_heads),
    head_dim=f.integer("head_dim", default_head_dim), d_ff=f.integer("intermediate_size"),
    max_seq_len=f.integer("max_position_embeddings", default_positions),
    tie_embeddings=f.flag("tie_word_embeddings", False), norm_eps=f.number("rms_norm_eps", 1e-6),
    rope_theta=_rope_theta(f), qkv_bias=arch == "Qwen2ForCausalLM", qk_norm=arch == "Qwen3ForCausalLM",
    sliding_window=_sliding_window(f, arch),
  )
  if arch == "Olmo2ForCausalLM":
    # OLMo 2: RMSNorm after each sub-block instead of before, and over all q and k channels.
    cfg.update(norm_layout="post", qk_norm_full=True)
  if moe_arch != arch:
    cfg.update(_moe(f, moe_arch, d_ff=cfg["d_ff"]))
  # pretraining_tp: how Llama 1/2 sliced matmuls during pretraining; same shapes either way.
  f.integer("pretraining_tp", 1)
  if arch == "Phi3ForCausalLM":  # RoPE frequencies (values): its original context, the share of a head rotated
    f.integer("original_max_position_embeddings", cfg["max_seq_len"])
    f.number("partial_rotary_factor", 1.0, most=1.0)
  f.check_all_read(moe_arch, _MOE_IGNORED if moe_arch != arch else frozenset())
  return ModelConfig(**cfg)


def _moe(f: _Fields, arch: str, *, d_ff: int) -> dict[str, Any]:
  """Mixtral's and Qwen3-MoE's expert fields: every layer an MoE layer, softmax top-k routing."""
  if arch == "MixtralForCausalLM":
    # Mixtral's experts are its MLP: intermediate_size is each expert's width (MixtralConfig),
    # and the top-k weights are a softmax over the chosen logits (renormalised).
    experts, width, norm_topk = f.integer("num_local_experts"), d_ff, True
  else:
    if f.integer("decoder_sparse_step", 1) != 1:
      raise f.error("decoder_sparse_step other than 1 (MoE every few layers) is not supported: every layer here is MoE")
    if f.listed("mlp_only_layers", []):
      raise f.error("mlp_only_layers is not supported: dense layers between MoE ones (only a dense prefix is)")
    experts, width = f.integer("num_experts"), f.integer("moe_intermediate_size")
    norm_topk = f.flag("norm_topk_prob", False)  # transformers' Qwen3MoeConfig default
  return dict(
    num_experts=experts, experts_per_token=f.integer("num_experts_per_tok"), expert_d_ff=width,
    router_scoring="softmax", router_norm_topk=norm_topk,
  )


# How a router scores its experts (DeepSeek's scoring_func).
_SCORING = ("softmax", "sigmoid")


def _scoring(f: _Fields, default: str) -> str:
  scoring = f.text("scoring_func", default)
  if scoring not in _SCORING:
    raise f.error(f"scoring_func {scoring!r} is not supported; supported: {', '.join(_SCORING)}")
  return scoring


# DeepSeek's topk_method (configuration_deepseek.py; the Gate of its inference/model.py): greedy
# is a plain top-k; group_limited_greedy (V2) the top-k within the topk_group best of n_group
# groups; noaux_tc (V3) the same ranked with the selection bias e_score_correction_bias.
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


# DeepSeek-V2's defaults where they differ from V3's (DeepseekV2Config, the checkpoint's
# configuration_deepseek.py): softmax scores, plain top-k, weights not renormalised.
_DEEPSEEK_DEFAULTS = {
  "DeepseekV3ForCausalLM": dict(topk_method="noaux_tc", scoring="sigmoid", norm_topk=True),
  "DeepseekV2ForCausalLM": dict(topk_method="greedy", scoring="softmax", norm_topk=False),
}


def _deepseek(f: _Fields, arch: str, name: str) -> ModelConfig:
  """DeepseekV2/V3ForCausalLM: multi-head latent attention, a dense prefix, then MoE layers with
  shared experts and softmax (V2) or sigmoid (V3) scores, greedy or group-limited routing."""
  defaults = _DEEPSEEK_DEFAULTS[arch]
  act = f.get("hidden_act", "silu")
  if act not in _SILU:
    raise f.error(f"hidden_act {act!r} is not supported; supported: {', '.join(_SILU)} (the MLP here is SwiGLU)")
  f.refuse_if_true("attention_bias", "MLA's projections here have no biases")
  heads = f.integer("num_attention_heads")
  nope, rope = f.integer("qk_nope_head_dim"), f.integer("qk_rope_head_dim")
  if f.integer("qk_head_dim", nope + rope) != nope + rope:
    raise f.error(f"qk_head_dim must be qk_nope_head_dim + qk_rope_head_dim = {nope + rope}")
  f.integer("head_dim", 0, least=0)  # newer transformers' name for the RoPE width: qk_rope_head_dim says it
  if f.integer("moe_layer_freq", 1) != 1:
    raise f.error("moe_layer_freq other than 1 (MoE every few layers) is not supported: every layer after the dense prefix is MoE")
  method = f.text("topk_method", defaults["topk_method"])
  if method not in _TOPK_METHODS:
    raise f.error(f"topk_method {method!r} is not supported; supported: {', '.join(_TOPK_METHODS)}")
  groups, per_token = f.integer("n_group", 1), f.integer("topk_group", 1)
  if method == "greedy":
    groups = per_token = 1
  cfg = dict(
    name=name, style="llama3", vocab_size=f.integer("vocab_size"), d_model=f.integer("hidden_size"),
    num_layers=f.integer("num_hidden_layers"), num_heads=heads, num_kv_heads=f.integer("num_key_value_heads", heads),
    head_dim=nope + rope, d_ff=f.integer("intermediate_size"), max_seq_len=f.integer("max_position_embeddings"),
    tie_embeddings=f.flag("tie_word_embeddings", False), norm_eps=f.number("rms_norm_eps", 1e-6),
    rope_theta=_rope_theta(f), num_experts=f.integer("n_routed_experts"),
    experts_per_token=f.integer("num_experts_per_tok"), num_shared_experts=f.integer("n_shared_experts", 0, least=0),
    expert_d_ff=f.integer("moe_intermediate_size"), first_dense_layers=f.integer("first_k_dense_replace", 0, least=0),
    router_scoring=_scoring(f, defaults["scoring"]), router_norm_topk=f.flag("norm_topk_prob", defaults["norm_topk"]),
    routed_scaling=f.number("routed_scaling_factor", 1.0), router_bias=method == "noaux_tc",
    expert_groups=groups, expert_groups_per_token=per_token, mtp_layers=f.integer("num_nextn_predict_layers", 0, least=0),
    mla=MLASpec(
      kv_lora_rank=f.integer("kv_lora_rank"), q_lora_rank=f.integer("q_lora_rank", 0, least=0), qk_nope_head_dim=nope,
      qk_rope_head_dim=rope, v_head_dim=f.integer("v_head_dim"),
    ),
  )
  f.refuse_if_true("mlp_bias", "the SwiGLU MLP here has no biases")
  f.integer("pretraining_tp", 1)  # how matmuls were sliced in pretraining; same shapes either way
  f.check_all_read(arch, _MOE_IGNORED)
  return ModelConfig(**cfg)


def _gpt2(f: _Fields, name: str) -> ModelConfig:
  """GPT2LMHeadModel, whose fields are named after the original TensorFlow code."""
  act = f.get("activation_function", "gelu_new")
  if act not in _TANH_GELU:
    raise f.error(
      f"activation_function {act!r} is not supported; supported: {', '.join(_TANH_GELU)} (GELU's tanh approximation)"
    )
  d, heads = f.integer("n_embd"), f.integer("n_head")
  if heads < 1 or d % heads:
    raise f.error(f"n_embd {d} is not a multiple of n_head {heads}")
  positions = f.integer("n_positions", f.integer("n_ctx", 1024))  # n_ctx: n_positions' older name
  cfg = dict(
    name=name, style="gpt2", vocab_size=f.integer("vocab_size"), d_model=d, num_layers=f.integer("n_layer"),
    num_heads=heads, num_kv_heads=heads, head_dim=d // heads, d_ff=f.integer("n_inner", 4 * d), max_seq_len=positions,
    tie_embeddings=f.flag("tie_word_embeddings", True), norm_eps=f.number("layer_norm_epsilon", 1e-5),
    rope_theta=10_000.0,
  )
  # Scaling and upcasting switches of the attention scores: values, not shapes.
  for key in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
    f.flag(key, False)
  f.check_all_read("GPT2LMHeadModel")
  return ModelConfig(**cfg)


def _pattern(f: _Fields, num_layers: int, period: int, *, key: str = "layer_types") -> None:
  """Checks a ``layer_types`` list against the local/global pattern the model is built with:
  layer i global when (i + 1) % period == 0 (or local everywhere, period 0)."""
  listed = f.get(key, None)
  if listed is None:
    return
  want = [
    "full_attention" if period and (i + 1) % period == 0 else "sliding_attention" for i in range(num_layers)
  ]
  if listed != want:
    raise f.error(
      f"{key} must repeat {period - 1} sliding_attention layer(s) then one full_attention (the pattern built here), "
      f"got {listed!r}"
    )


def _check_act(f: _Fields, keys: tuple[str, ...], allowed: tuple[str, ...], default: str) -> None:
  for key in keys:
    act = f.get(key, default)
    if act not in allowed:
      raise f.error(f"{key} {act!r} is not supported; supported: {', '.join(allowed)}")


def _softcap(f: _Fields, key: str, default: float | None) -> float | None:
  """A soft-cap: the file's (null: none), else the architecture's default."""
  if key not in f.raw:
    return default
  return None if f.get(key, None) is None else f.number(key)


def _theta(f: _Fields, default: float) -> float:
  """rope_theta with the architecture's default where the file gives none (any RoPE scaling
  checked by _rope_theta)."""
  given = "rope_theta" in f.raw or isinstance(f.raw.get("rope_parameters"), Mapping) and "rope_theta" in f.raw["rope_parameters"]
  theta = _rope_theta(f)
  return theta if given else default


def _gemma(f: _Fields, name: str, *, gemma3: bool) -> ModelConfig:
  """Gemma 2 and Gemma 3 (Gemma 3's text model; transformers' Gemma2Config and Gemma3TextConfig
  defaults): GeGLU MLP, RMSNorms before and after each sub-block, tied embeddings, local layers
  of ``sliding_window`` between global ones (Gemma 2 every other layer; Gemma 3 every
  ``sliding_window_pattern``-th global), attention-logit and final-logit soft-capping (Gemma 2;
  off in Gemma 3), per-head q/k RMSNorm (Gemma 3)."""
  _check_act(f, ("hidden_activation", "hidden_act"), _TANH_GELU, "gelu_pytorch_tanh")
  f.refuse_if_true("attention_bias", "Gemma's projections here have no biases")
  layers = f.integer("num_hidden_layers", 26)
  period = f.integer("sliding_window_pattern", 6) if gemma3 else 2
  _pattern(f, layers, period)
  # Scales and RoPE bases of the local layers: values, not shapes.
  f.number("query_pre_attn_scalar", 1.0)
  f.number("rope_local_base_freq", 10_000.0)
  f.text("cache_implementation", "hybrid")
  cfg = ModelConfig(
    name=name, style="llama3", vocab_size=f.integer("vocab_size", 262_208 if gemma3 else 256_000),
    d_model=f.integer("hidden_size", 2304), num_layers=layers, num_heads=f.integer("num_attention_heads", 8),
    num_kv_heads=f.integer("num_key_value_heads", 4), head_dim=f.integer("head_dim", 256),
    d_ff=f.integer("intermediate_size", 9216), max_seq_len=f.integer("max_position_embeddings", 131_072 if gemma3 else 8192),
    tie_embeddings=f.flag("tie_word_embeddings", True), norm_eps=f.number("rms_norm_eps", 1e-6),
    rope_theta=_theta(f, 1_000_000.0 if gemma3 else 10_000.0),
    mlp_act="gelu_tanh", norm_layout="sandwich", qk_norm=gemma3,
    sliding_window=f.integer("sliding_window", 4096), global_every=period,
    attn_softcap=_softcap(f, "attn_logit_softcapping", None if gemma3 else 50.0),
    final_softcap=_softcap(f, "final_logit_softcapping", None if gemma3 else 30.0),
  )
  f.refuse_if_true("use_bidirectional_attention", "the models here are causal")
  f.check_all_read("Gemma3ForCausalLM" if gemma3 else "Gemma2ForCausalLM")
  return cfg


# Gemma 4's RoPE per layer type (Gemma4TextConfig's rope_parameters: "default" on the sliding
# layers, "proportional" (a partial_rotary_factor of the head rotated) on the global ones).
_GEMMA4_ROPE_TYPES = ("default", "proportional")


def _gemma4_theta(f: _Fields) -> float:
  """The sliding layers' RoPE base, from Gemma 4's per-layer-type ``rope_parameters`` (the
  global layers' base and partial rotation change values, not shapes)."""
  spec = f.get("rope_parameters", None)
  if spec is None:
    return 10_000.0
  if not isinstance(spec, Mapping) or not all(isinstance(v, Mapping) for v in spec.values()):
    raise f.error(f"rope_parameters must map a layer type to its RoPE parameters, got {spec!r}")
  for kind, params in spec.items():
    if kind not in ("sliding_attention", "full_attention"):
      raise f.error(f"rope_parameters for layer type {kind!r}: the layer types are sliding_attention, full_attention")
    rope = params.get("rope_type", "default")
    if rope not in _GEMMA4_ROPE_TYPES:
      raise f.error(f"rope_parameters.{kind} type {rope!r} is not supported; supported: {', '.join(_GEMMA4_ROPE_TYPES)}")
  theta = spec.get("sliding_attention", {}).get("rope_theta", 10_000.0)
  if not isinstance(theta, (int, float)) or isinstance(theta, bool):
    raise f.error(f"rope_parameters.sliding_attention.rope_theta must be a number, got {theta!r}")
  return float(theta)


def _gemma4_moe(f: _Fields) -> dict:
  """The feed-forward fields of Gemma 4's MoE block (Gemma4TextConfig.enable_moe_block: every layer
  has it; Gemma4TextRouter, Gemma4TextExperts), none without it (its sizes then must be null)."""
  sizes = ("num_experts", "top_k_experts", "moe_intermediate_size", "expert_intermediate_size")
  if not f.flag("enable_moe_block", False):
    for key in sizes:  # inert without the block (null in a dense file)
      if f.get(key, None) is not None:
        raise f.error(f"{key} is set, but enable_moe_block is not: Gemma 4's experts come with the MoE block")
    return {}
  # expert_intermediate_size: an earlier release's name for moe_intermediate_size.
  width = f.get("moe_intermediate_size", None)
  alias = f.get("expert_intermediate_size", None)
  if width is None:
    width = alias
  elif alias is not None and alias != width:
    raise f.error(f"moe_intermediate_size {width!r} and expert_intermediate_size {alias!r} disagree")
  for key, value in (("num_experts", f.get("num_experts", None)), ("top_k_experts", f.get("top_k_experts", None)),
                     ("moe_intermediate_size", width)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise f.error(f"enable_moe_block needs {key} as a positive integer, got {value!r}")
  return {
    "num_experts": f.get("num_experts"), "experts_per_token": f.get("top_k_experts"), "expert_d_ff": width,
    # Gemma4TextRouter: softmax over all experts, top-k renormalised (then its per-expert scale);
    # Gemma4TextExperts: ACT2FN[hidden_activation], checked to be GELU's tanh form above.
    "router_scoring": "softmax", "router_norm_topk": True, "expert_act": "gelu_tanh",
  }


def _gemma4(f: _Fields, name: str) -> ModelConfig:
  """Gemma 4's text model (transformers 5's Gemma4TextConfig defaults; Gemma4TextAttention,
  Gemma4TextDecoderLayer): Gemma 3's block (GeGLU, sandwich norms, per-head q/k RMSNorm, tied
  embeddings, local layers between global ones as ``layer_types`` lists them) with the global
  layers' own head_dim (``global_head_dim``) and, with ``attention_k_eq_v``, their own kv heads
  (``num_global_key_value_heads``) and no v projection (values = the k projection's output), a
  scale-free RMSNorm on every layer's values, and final-logit soft-capping; KV sharing
  (``num_kv_shared_layers``: the last layers reuse the keys and values of the last earlier layer
  of their type, with ``use_double_wide_mlp`` a twice-wide MLP; Gemma4TextConfig.kv_sharing_modes);
  per-layer embeddings (``hidden_size_per_layer_input``, ``vocab_size_per_layer_input``:
  Gemma4TextModel's embed_tokens_per_layer and per_layer_model_projection, each layer's
  per_layer_input_gate and per_layer_projection); the MoE block (``enable_moe_block``, 26B-A4B:
  Gemma4TextRouter and Gemma4TextExperts of ``num_experts``, ``top_k_experts``,
  ``moe_intermediate_size``, GeGLU like the MLP, beside every layer's dense MLP:
  ModelConfig.moe_beside_dense). Not built, and so refused in one line: bidirectional attention
  over all tokens."""
  _check_act(f, ("hidden_activation",), _TANH_GELU, "gelu_pytorch_tanh")
  f.refuse_if_true("attention_bias", "Gemma 4's projections here have no biases")
  if f.text("use_bidirectional_attention", "") == "all":  # "vision": the image tokens', not built here
    raise f.error("use_bidirectional_attention 'all' is not supported: the models here are causal")
  moe = _gemma4_moe(f)
  layers = f.integer("num_hidden_layers", 30)
  listed = f.listed("layer_types", [])
  period = 6  # Gemma4TextConfig's default: five sliding layers per full one
  if "full_attention" in listed:
    period = listed.index("full_attention") + 1
  _pattern(f, layers, period)
  if layers % period:  # Gemma4TextConfig forces the last layer global, off the pattern built here
    raise f.error(f"num_hidden_layers {layers} is not a multiple of the {period}-layer pattern: Gemma 4's last layer is global")
  k_eq_v = f.flag("attention_k_eq_v", False)
  kv_heads = f.integer("num_key_value_heads", 4)
  global_kv = f.integer("num_global_key_value_heads", kv_heads)
  cfg = ModelConfig(
    name=name, style="llama3", vocab_size=f.integer("vocab_size", 262_144), d_model=f.integer("hidden_size", 2304),
    num_layers=layers, num_heads=f.integer("num_attention_heads", 8), num_kv_heads=kv_heads,
    head_dim=f.integer("head_dim", 256), d_ff=f.integer("intermediate_size", 9216),
    max_seq_len=f.integer("max_position_embeddings", 131_072), tie_embeddings=f.flag("tie_word_embeddings", True),
    norm_eps=f.number("rms_norm_eps", 1e-6), rope_theta=_gemma4_theta(f),
    mlp_act="gelu_tanh", norm_layout="sandwich", qk_norm=True,
    sliding_window=f.integer("sliding_window", 512), global_every=period,
    final_softcap=_softcap(f, "final_logit_softcapping", None), **moe,
    gemma4=Gemma4Spec(
      v_norm=True,
      # Gemma4TextConfig.__post_init__: the global layers' head_dim always, their kv heads only
      # with attention_k_eq_v (num_global_key_value_heads is ignored without it).
      global_head_dim=f.integer("global_head_dim", 512), global_kv_heads=global_kv if k_eq_v else 0,
      global_k_eq_v=k_eq_v,
      # Gemma4TextConfig.kv_sharing_modes / Gemma4TextMLP: the last num_kv_shared_layers reuse keys
      # and values; use_double_wide_mlp doubles their MLP only (inert without shared layers).
      kv_shared_layers=f.integer("num_kv_shared_layers", 0, least=0),
      kv_shared_double_mlp=f.flag("use_double_wide_mlp", False),
      # Gemma4TextConfig's defaults: 256 wide, over 262,144 tokens (0 wide: no per-layer embeddings).
      per_layer_dim=f.integer("hidden_size_per_layer_input", 256, least=0),
      per_layer_vocab=f.integer("vocab_size_per_layer_input", 262_144, least=0),
      moe_beside_dense=bool(moe),  # the experts beside every layer's dense MLP (enable_moe_block)
    ),
  )
  f.check_all_read("Gemma4ForCausalLM")
  return cfg


def _gpt_oss(f: _Fields, name: str) -> ModelConfig:
  """GPT-OSS (transformers' GptOssConfig): every layer MoE (softmax over the top-k router
  logits, a router bias), biases on all four attention projections, a sink logit per head,
  sliding windows of ``sliding_window`` on every other layer. Left out (notes): the experts'
  biases (0.03% of gpt-oss-20b's parameters) and SwiGLU's clamp (values)."""
  _check_act(f, ("hidden_act",), _SILU, "silu")
  layers = f.integer("num_hidden_layers", 36)
  _pattern(f, layers, 2)
  k = f.integer("num_experts_per_tok", f.integer("experts_per_token", 4))  # experts_per_token: its other name
  if f.integer("experts_per_token", k) != k:
    raise f.error("experts_per_token and num_experts_per_tok differ")
  f.number("swiglu_limit", 7.0)  # the clamp of its SwiGLU: values
  f.integer("initial_context_length", 4096)  # YaRN's original context: RoPE frequencies
  if not f.flag("attention_bias", True):
    raise f.error("attention_bias false is not supported: GPT-OSS's attention projections here have biases")
  cfg = ModelConfig(
    name=name, style="llama3", vocab_size=f.integer("vocab_size", 201_088), d_model=f.integer("hidden_size", 2880),
    num_layers=layers, num_heads=f.integer("num_attention_heads", 64), num_kv_heads=f.integer("num_key_value_heads", 8),
    head_dim=f.integer("head_dim", 64), d_ff=f.integer("intermediate_size", 2880),
    max_seq_len=f.integer("max_position_embeddings", 131_072), tie_embeddings=f.flag("tie_word_embeddings", False),
    norm_eps=f.number("rms_norm_eps", 1e-5), rope_theta=_theta(f, 150_000.0),
    qkv_bias=True, out_bias=True, attention_sinks=True, sliding_window=f.integer("sliding_window", 128), global_every=2,
    num_experts=f.integer("num_local_experts", 128), experts_per_token=k, expert_d_ff=f.integer("intermediate_size", 2880),
    router_scoring="softmax", router_norm_topk=True, router_bias=True,
  )
  f.check_all_read("GptOssForCausalLM", _MOE_IGNORED)
  return cfg


def _llama4(f: _Fields, name: str) -> ModelConfig:
  """Llama 4's text model (transformers' Llama4TextConfig): MoE layers every
  ``interleave_moe_layer_step``-th layer (a sigmoid-scored top-k router and one shared expert of
  width ``intermediate_size``; dense layers of ``intermediate_size_mlp``), and chunked attention
  of ``attention_chunk_size`` on the RoPE layers, every fourth layer (NoPE) global."""
  _check_act(f, ("hidden_act",), _SILU, "silu")
  f.refuse_if_true("attention_bias", "Llama 4's projections here have no biases")
  layers = f.integer("num_hidden_layers", 48)
  interval = f.integer("no_rope_layer_interval", 4)
  no_rope = f.listed("no_rope_layers", [])
  if no_rope and no_rope != [int((i + 1) % interval != 0) for i in range(layers)]:
    raise f.error(f"no_rope_layers must leave every {interval}th layer without RoPE (the pattern built here)")
  step = f.integer("interleave_moe_layer_step", 1)
  moe_layers = f.listed("moe_layers", list(range(step - 1, layers, step)))
  if moe_layers != list(range(step - 1, layers, step)):
    raise f.error(f"moe_layers must be every {step}th layer (interleave_moe_layer_step)")
  # Values: the L2 q/k norm without weights, attention temperature tuning, router noise.
  for key in ("use_qk_norm", "for_llm_compressor"):
    f.flag(key, False)
  if not isinstance(f.get("attn_temperature_tuning", True), bool):  # a switch, or (older files) its scale
    f.number("attn_temperature_tuning", above=None, least=0.0)
  for key in ("floor_scale", "attn_scale"):
    f.number(key, 1.0)
  cfg = ModelConfig(
    name=name, style="llama3", vocab_size=f.integer("vocab_size", 202_048), d_model=f.integer("hidden_size", 5120),
    num_layers=layers, num_heads=f.integer("num_attention_heads", 40), num_kv_heads=f.integer("num_key_value_heads", 8),
    head_dim=f.integer("head_dim", 128), d_ff=f.integer("intermediate_size_mlp", 16_384),
    max_seq_len=f.integer("max_position_embeddings", 4096 * 32), tie_embeddings=f.flag("tie_word_embeddings", False),
    norm_eps=f.number("rms_norm_eps", 1e-5), rope_theta=_theta(f, 500_000.0),
    sliding_window=f.integer("attention_chunk_size", 8192), global_every=interval, window_chunked=True,
    num_experts=f.integer("num_local_experts", 16), experts_per_token=f.integer("num_experts_per_tok", 1),
    num_shared_experts=1, expert_d_ff=f.integer("intermediate_size", 8192), moe_every=step,
    router_scoring="sigmoid", router_norm_topk=False,
  )
  f.check_all_read("Llama4ForCausalLM", _MOE_IGNORED)
  return cfg


def _glm4_moe(f: _Fields, name: str) -> ModelConfig:
  """GLM-4.5 (transformers' Glm4MoeConfig): ``first_k_dense_replace`` dense layers, then MoE
  layers of ``n_routed_experts`` (sigmoid scores, the noaux_tc selection bias, top-k
  renormalised and scaled) plus ``n_shared_experts``; q/k/v biases; optional per-head q/k
  RMSNorm (``use_qk_norm``); partial RoPE (values); the MTP layer recorded, not modelled."""
  _check_act(f, ("hidden_act",), _SILU, "silu")
  f.number("partial_rotary_factor", 0.5, most=1.0)
  groups, per_token = f.integer("n_group", 1), f.integer("topk_group", 1)
  cfg = ModelConfig(
    name=name, style="llama3", vocab_size=f.integer("vocab_size", 151_552), d_model=f.integer("hidden_size", 4096),
    num_layers=f.integer("num_hidden_layers", 46), num_heads=f.integer("num_attention_heads", 96),
    num_kv_heads=f.integer("num_key_value_heads", 8), head_dim=f.integer("head_dim", 128),
    d_ff=f.integer("intermediate_size", 10_944), max_seq_len=f.integer("max_position_embeddings", 131_072),
    tie_embeddings=f.flag("tie_word_embeddings", False), norm_eps=f.number("rms_norm_eps", 1e-5),
    rope_theta=_theta(f, 1_000_000.0),
    qkv_bias=f.flag("attention_bias", False), qk_norm=f.flag("use_qk_norm", False),
    num_experts=f.integer("n_routed_experts", 128), experts_per_token=f.integer("num_experts_per_tok", 8),
    num_shared_experts=f.integer("n_shared_experts", 1, least=0), expert_d_ff=f.integer("moe_intermediate_size", 1408),
    first_dense_layers=f.integer("first_k_dense_replace", 1, least=0), router_scoring="sigmoid",
    router_norm_topk=f.flag("norm_topk_prob", True), routed_scaling=f.number("routed_scaling_factor", 1.0),
    router_bias=True, expert_groups=groups, expert_groups_per_token=per_token,
    mtp_layers=f.integer("num_nextn_predict_layers", 0, least=0),
  )
  f.check_all_read("Glm4MoeForCausalLM", _MOE_IGNORED)
  return cfg


_BUILDERS = {
  "Gemma2ForCausalLM": lambda f, name: _gemma(f, name, gemma3=False),
  "Gemma3ForCausalLM": lambda f, name: _gemma(f, name, gemma3=True),
  "Gemma4ForCausalLM": _gemma4,
  "GptOssForCausalLM": _gpt_oss,
  "Llama4ForCausalLM": _llama4,
  "Glm4MoeForCausalLM": _glm4_moe,
}

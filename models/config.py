"""Model hyper-parameters, the named presets, and lookup by CLI name.

Preset sources (parameter counts in the tests are checked against these):

* GPT-2: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", table 2,
  with the sizes of the released checkpoints (124M/355M/774M/1558M; vocab 50257, context
  1024, d_ff = 4 d_model, head_dim 64).
* Llama 3: Llama Team 2024, "The Llama 3 Herd of Models", table 3 (8B/70B/405B), and the
  Llama 3.2 1B/3B model cards (``config.json`` on the Hugging Face hub: tied embeddings).
* Mistral 7B v0.3, Qwen2.5 7B/72B, Qwen3 8B: the ``config.json`` of each checkpoint on the
  Hugging Face hub (``mistralai/Mistral-7B-v0.3``, ``Qwen/Qwen2.5-7B``, ``Qwen/Qwen2.5-72B``,
  ``Qwen/Qwen3-8B``), copied field for field into ``tests/data/hf/`` (the tests check that
  :func:`models.hf.from_config` of each copy equals the preset); parameter counts from the model
  cards (7.25B, 7.61B, 72.7B, 8.2B).
* Mixture of experts, from each model's published ``config.json`` on the Hugging
  Face hub (the same numbers as MaxText's ``configs/models/*.yml``):
  Mixtral 8x7B / 8x22B (``mistralai/Mixtral-8x7B-v0.1``, ``mistralai/Mixtral-8x22B-v0.1``;
  Jiang et al. 2024, "Mixtral of Experts": 46.7B total / 12.9B active, 141B / 39B);
  Qwen3-30B-A3B (``Qwen/Qwen3-30B-A3B`` and its model card: 30.5B / 3.3B; Qwen3 report 2025);
  DeepSeek-V3 (``deepseek-ai/DeepSeek-V3`` config.json and the repository's
  ``inference/configs/config_671B.json``; DeepSeek-AI 2024, arXiv 2412.19437: 671B / 37B,
  the main model without the 14B multi-token-prediction module, which is left out here).
* GPT-3 shapes: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", table 3 (22B, 175B, 530B, 1T: heads, hidden size, layers) and section 6
  (sequence length 2048, vocabulary 51200); GPT-2's architecture otherwise (Brown et al. 2020,
  section 2.1: learned positions, pre-LayerNorm, GELU, d_ff = 4 d_model, tied embeddings).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np

from jaxmem.composed import Composed, Record, composed
from jaxmem.errors import JaxmemError
from jaxmem.registry import publish

from .fp8 import QUANTIZATIONS

Style = Literal["gpt2", "llama3"]
STYLES: tuple[str, ...] = ("gpt2", "llama3")
RouterScoring = Literal["softmax", "sigmoid"]
# The routed experts' gated activations (ModelConfig.expert_act).
EXPERT_ACTS = ("silu", "gelu_tanh")
ROUTER_SCORINGS: tuple[str, ...] = ("softmax", "sigmoid")
MoeImpl = Literal["dropless", "capacity"]
MlpAct = Literal["silu", "gelu_tanh"]
MLP_ACTS: tuple[str, ...] = ("silu", "gelu_tanh")
NormLayout = Literal["pre", "sandwich", "post"]
NORM_LAYOUTS: tuple[str, ...] = ("pre", "sandwich", "post")
MOE_IMPLS: tuple[str, ...] = publish("MoE implementation", ("dropless", "capacity"))

# Llama 3.1 / 3.2 context length and RoPE base (Llama 3 paper, section 3.2 and table 3).
_LLAMA3_ROPE_THETA = 500_000.0
_LLAMA3_MAX_SEQ_LEN = 131_072
_LLAMA3_VOCAB = 128_256
_GPT2_VOCAB = 50_257
_GPT2_MAX_SEQ_LEN = 1024


# --- the concerns a model config is composed of ------------------------------------------------
# Each a frozen record of its own (ModelConfig reads, builds and writes them flat: jaxmem.composed).
# Every feature defaults to off, so the GPT-2 and Llama presets name none of them.


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoreSpec(Record):
  """The sizes every model has, its style, dtypes and output head.

  ``style`` picks the architecture family:

  * ``"gpt2"``: pre-LayerNorm (with bias), learned positions (``max_seq_len`` rows), GELU MLP
    and attention projections with biases, tied embeddings, final LayerNorm.
  * ``"llama3"``: pre-RMSNorm, RoPE (``rope_theta``), grouped-query attention
    (``num_kv_heads`` < ``num_heads``), SwiGLU MLP, no biases, final RMSNorm; embeddings tied
    only if ``tie_embeddings``. ``head_dim`` is free: ``num_heads * head_dim`` need not equal
    ``d_model`` (Qwen3 4B: 32 heads of 128 on a 2560-wide residual stream).

  ``param_dtype`` is the storage dtype of the parameters; ``dtype`` is the compute dtype the
  weights are cast to at use. The output logits are always float32; dot attention's scores are
  in ``dtype`` unless float32 ones are asked for (``attention_ops.dot_attend``).
  ``final_softcap`` (Gemma 2): the logits become cap * tanh(logits / cap).
  """

  name: str
  style: Style
  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  d_ff: int
  max_seq_len: int
  tie_embeddings: bool
  rope_theta: float  # unused by "gpt2" (learned positions)
  param_dtype: str = "float32"
  dtype: str = "bfloat16"
  final_softcap: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionSpec(Record):
  """What an attention layer adds to the style's (Hugging Face families: Qwen2, Qwen3, OLMo 2,
  GPT-OSS, Gemma 2). ``qkv_bias`` and ``qk_norm`` apply to style "llama3" only (GPT-2 always has
  biases, and has no q/k norm)."""

  qkv_bias: bool = False  # biases on the q, k and v projections, none on the output (Qwen2)
  qk_norm: bool = False  # RMSNorm over head_dim of each q and k head, before RoPE (Qwen3)
  qk_norm_full: bool = False  # OLMo 2: RMSNorm over all q (N*H) and all k (K*H) channels
  out_bias: bool = False  # a bias on the attention output projection (GPT-OSS; gpt2 always has one)
  attention_sinks: bool = False  # GPT-OSS: one learned logit per head in every softmax's denominator
  attn_softcap: float | None = None  # Gemma 2: scores become cap * tanh(scores / cap)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WindowSpec(Record):
  """Local attention and the layer types it makes (models/attention_ops.py, attention_kernels.py;
  the KV cache in cache.py; the layer pattern in models/layer_plan.py): layer i attends to the
  last ``sliding_window`` positions only (Mistral v0.1, Gemma 2/3, GPT-OSS, Phi-3), or, with
  ``window_chunked``, to its own aligned chunk of that many positions (Llama 4's
  attention_chunk_size). ``global_every`` 0 windows every layer; P > 0 leaves layer i global
  when (i + 1) % P == 0 (Gemma 3: 6, five local layers per global one; Gemma 2 and GPT-OSS: 2;
  Llama 4: 4). None: no window."""

  sliding_window: int | None = None
  global_every: int = 0
  window_chunked: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormSpec(Record):
  """The norms: their epsilon, and where they sit: pre (x + f(norm(x)); Llama), sandwich
  (x + norm(f(norm(x))); Gemma 2/3) or post (x + norm(f(x)); OLMo 2)."""

  norm_eps: float
  norm_layout: NormLayout = "pre"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FeedForwardSpec(Record):
  """The MLP and the mixture of experts (models/mlp.py, models/moe.py). The defaults describe a
  dense model. MoE: layers first_dense_layers.. num_layers-1 (every ``moe_every``-th of them)
  replace the MLP by a router over num_experts gated experts of width expert_d_ff
  (experts_per_token chosen per token) plus num_shared_experts always-on experts of the same
  width. How the experts are run (dropless or capacity) is a step's choice, not the model's
  (:class:`StepChoices`)."""

  mlp_act: MlpAct = "silu"  # the gated MLP's activation: silu (SwiGLU) or gelu_tanh (GeGLU, Gemma)
  num_experts: int = 0  # routed experts per MoE layer; 0 means a dense model
  experts_per_token: int = 0  # top-k
  num_shared_experts: int = 0
  expert_d_ff: int = 0
  first_dense_layers: int = 0  # leading layers that keep the dense MLP (width d_ff)
  moe_every: int = 1  # Llama 4's interleave_moe_layer_step: after the dense prefix, layer i is MoE when (i + 1) % step == 0
  router_scoring: RouterScoring = "softmax"  # softmax (Mixtral, Qwen3-MoE) or sigmoid (DeepSeek-V3)
  router_norm_topk: bool = True  # renormalise the chosen k weights to sum to 1
  routed_scaling: float = 1.0  # multiplies the routed weights (DeepSeek-V3: 2.5)
  router_bias: bool = False  # DeepSeek-V3's selection-only bias (its e_score_correction_bias)
  expert_groups: int = 1  # DeepSeek-V3's group-limited routing: n_group ...
  expert_groups_per_token: int = 1  # ... and topk_group
  # The experts' gated activation: "silu" (SwiGLU: Mixtral, Qwen3-MoE, DeepSeek-V3) or "gelu_tanh"
  # (GeGLU: Gemma 4's Gemma4TextExperts, ACT2FN[hidden_activation]).
  expert_act: str = "silu"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLASpec(Record):
  """Multi-head latent attention (models/mla.py) when kv_lora_rank > 0; then head_dim is the q/k
  head size qk_nope_head_dim + qk_rope_head_dim and num_kv_heads == num_heads."""

  kv_lora_rank: int = 0  # width of the cached latent c^KV; 0 means ordinary attention
  q_lora_rank: int = 0  # width of the query latent c^Q; 0 projects queries directly
  qk_nope_head_dim: int = 0
  qk_rope_head_dim: int = 0
  v_head_dim: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma4Spec(Record):
  """Gemma 4's own features (transformers' Gemma4TextConfig; built by models/gemma4.py).

  The global (full-attention) layers' own attention geometry, with ``sliding_window`` and
  ``global_every`` (Gemma4TextAttention): 0 is the same as every layer's (head_dim,
  num_kv_heads); ``global_k_eq_v`` (attention_k_eq_v): the global layers have no v projection,
  their values are the k projection's output (normed apart). ``v_norm``: RMSNorm without a scale
  over each v head (its v_norm, with_scale=False).

  KV sharing (num_kv_shared_layers, kv_sharing_modes): the last ``kv_shared_layers`` layers have
  no k/v projections, k_norm or cache of their own and attend to the keys and values of the last
  earlier layer of their attention type (window or global). ``kv_shared_double_mlp``
  (use_double_wide_mlp): those layers' MLP is 2 * d_ff wide.

  Per-layer embeddings (PLE; Gemma4TextModel, Gemma4TextDecoderLayer): a second table
  [per_layer_vocab, num_layers * per_layer_dim] (hidden_size_per_layer_input,
  vocab_size_per_layer_input) and a projection of the embeddings to the same width give every
  layer a per_layer_dim input, which the layer gates by its output and projects back to d_model
  after its MLP. 0: none.

  The MoE block (Gemma4TextDecoderLayer with enable_moe_block), ``moe_beside_dense``: every MoE
  layer keeps its dense MLP (width d_ff, normed by post_feedforward_layernorm_1) beside the
  experts, which take the residual through their own pre-norm (pre_feedforward_layernorm_2) and
  post-norm (post_feedforward_layernorm_2); the two sum before post_feedforward_layernorm. The
  router is Gemma4TextRouter: a scale-free RMSNorm of the residual times a learned [D] scale and
  1/sqrt(D), softmax top-k renormalised, times a learned per-expert scale [E].
  """

  global_head_dim: int = 0
  global_kv_heads: int = 0
  global_k_eq_v: bool = False
  v_norm: bool = False
  kv_shared_layers: int = 0
  kv_shared_double_mlp: bool = False
  per_layer_dim: int = 0
  per_layer_vocab: int = 0
  moe_beside_dense: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordedSpec(Record):
  """What a checkpoint has that the step does not build (see ``ModelConfig.notes``).
  ``mtp_layers``: DeepSeek-V3's multi-token-prediction modules (num_nextn_predict_layers), an
  extra block and head per module for a training objective and speculative decoding; the 671B
  main model, as published, leaves them out. ``vision_params``: the parameters of a multimodal
  checkpoint's vision tower and its projector into the text model (Llama 4's, from its
  vision_config: models/hf.py), which a text train step does not run; count_params leaves them
  out, count_checkpoint_params adds them."""

  mtp_layers: int = 0
  vision_params: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepChoices(Record):
  """How a step runs a model, chosen per step and swept beside it (``--dropout``, ``--moe-impl``,
  ``--capacity-factor``), not what the model is: the model is built with them beside its config
  (``Transformer(cfg, choices=..., rngs=...)``). The defaults are every model's own.

  ``dropout``: Megatron's four dropouts (embeddings, attention probabilities, attention and MLP
  outputs) in the train step (models/dropout.py); 0 leaves the program exactly as without
  dropout. Attention probabilities are dropped under ``dot`` attention only (the fused kernels
  take no dropout). ``moe_impl``: how a mixture of experts' routed experts run, dropless (sorted
  tokens, ragged_dot) or capacity (GShard; models/moe.py), and ``capacity_factor`` the capacity
  path's slots per expert, as a multiple of the fair share (both ignored by a dense model).
  ``quantization``: the layers' projections (attention's q/k/v/o, the MLP's) in fp8 as MaxText's
  ``quantization=fp8_full`` runs them (``fp8_full``: models/fp8.py), or not (``none``)."""

  dropout: float = 0.0
  moe_impl: MoeImpl = "dropless"
  capacity_factor: float = 1.25
  quantization: str = "none"

  def __post_init__(self):
    d, f = self.dropout, self.capacity_factor
    if isinstance(d, bool) or not isinstance(d, (int, float, np.floating)) or not 0 <= d < 1:
      raise JaxmemError(f"dropout must be a probability in [0, 1), got {d!r}")
    if self.moe_impl not in MOE_IMPLS:
      raise JaxmemError(f"moe_impl must be one of {', '.join(MOE_IMPLS)}, got {self.moe_impl!r}")
    if isinstance(f, bool) or not isinstance(f, (int, float, np.floating)) or not f > 0:
      raise JaxmemError(f"capacity_factor must be > 0, got {f!r}")
    if self.quantization not in QUANTIZATIONS:
      raise JaxmemError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")


@composed
class ModelConfig(Composed):
  """Everything that fixes a model's parameter shapes and compute dtypes, composed of its
  concerns: ``core`` (:class:`CoreSpec`: sizes, style, dtypes, head), ``attention``
  (:class:`AttentionSpec`), ``windows`` (:class:`WindowSpec`: local attention and the layer
  types), ``norms`` (:class:`NormSpec`), ``ffn`` (:class:`FeedForwardSpec`: MLP and mixture of
  experts), ``mla`` (:class:`MLASpec`), ``gemma4`` (:class:`Gemma4Spec`: that family's own
  features) and ``recorded`` (:class:`RecordedSpec`: what is counted or noted, not built).

  Built, read and written flat, as a row is (:class:`jaxmem.composed.Composed`):
  ``ModelConfig(name=..., d_model=..., num_experts=8, ...)``, ``cfg.num_experts``,
  ``dataclasses.replace(cfg, d_ff=...)`` and ``cfg.as_dict()`` name the fields, whichever part
  declares them; a part may also be given whole (``ModelConfig(core=..., norms=...)``).

  How a step runs the model (dropout, the experts' implementation and capacity) is not part of
  it: :class:`StepChoices`, which the model is built with beside its config.
  """

  core: CoreSpec
  attention: AttentionSpec
  windows: WindowSpec
  norms: NormSpec
  ffn: FeedForwardSpec
  mla: MLASpec
  gemma4: Gemma4Spec
  recorded: RecordedSpec

  def __post_init__(self):
    if self.style not in STYLES:
      raise JaxmemError(f"model {self.name!r}: style must be one of {', '.join(STYLES)}, got {self.style!r}")
    for field in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff", "max_seq_len"):
      value = getattr(self, field)
      # bool is an int subclass; True layers is a typo, not a size.
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise JaxmemError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise JaxmemError(
        f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
      )
    # (MLA rotates only its qk_rope_head_dim channels, checked in _check_mla.)
    if self.style == "llama3" and self.head_dim % 2 and not self.kv_lora_rank:
      raise JaxmemError(f"model {self.name!r}: RoPE needs an even head_dim, got {self.head_dim}")
    if not self.norm_eps > 0:
      raise JaxmemError(f"model {self.name!r}: norm_eps must be > 0, got {self.norm_eps!r}")
    if self.style == "llama3" and not self.rope_theta > 0:
      raise JaxmemError(f"model {self.name!r}: rope_theta must be > 0, got {self.rope_theta!r}")
    for field in ("param_dtype", "dtype"):
      _float_dtype(self.name, field, getattr(self, field))
    self._check_architecture_flags()
    _check_moe(self)
    _check_mla(self)

  def _check_architecture_flags(self) -> None:
    for field in ("qkv_bias", "qk_norm"):
      value = getattr(self, field)
      if not isinstance(value, (bool, np.bool_)):
        raise JaxmemError(f"model {self.name!r}: {field} must be true or false, got {value!r}")
      if value and self.style != "llama3":
        raise JaxmemError(
          f"model {self.name!r}: {field} applies to style llama3 only (gpt2 always has q/k/v/out biases and no q/k norm)"
        )
    w = self.sliding_window
    if w is not None and (not isinstance(w, (int, np.integer)) or isinstance(w, bool) or w < 1):
      raise JaxmemError(f"model {self.name!r}: sliding_window must be a positive integer or None, got {w!r}")
    _check_features(self)

  @property
  def notes(self) -> tuple[str, ...]:
    """What the compiled figures do not reflect about this architecture, one line each."""
    out = []
    if self.mtp_layers:
      out.append(
        f"mtp_layers {self.mtp_layers} recorded, not modelled: the multi-token-prediction modules (DeepSeek-V3: "
        "14B parameters in one) are left out, so parameters, state and activations are the main model's"
      )
    if self.vision_params:
      out.append(
        f"vision tower counted, not built: the checkpoint's {self.vision_params / 1e9:.2f}B vision-encoder and "
        "projector parameters are in its total (count_checkpoint_params), not in this text step"
      )
    return tuple(out)

  @property
  def param_jnp_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  @property
  def compute_jnp_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def position_limit(self) -> int | None:
    """The longest sequence the model can take: its learned positions (``max_seq_len`` rows of
    GPT-2's position table); None where positions are computed (RoPE), which ``max_seq_len``
    (the context it was trained to) does not bound."""
    return self.max_seq_len if self.style == "gpt2" else None

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  @property
  def is_mla(self) -> bool:
    return self.kv_lora_rank > 0

  def layer_is_moe(self, i: int) -> bool:
    """Whether layer ``i`` has a mixture of experts (after the dense prefix, every ``moe_every``-th)."""
    return self.is_moe and i >= self.first_dense_layers and (i + 1) % self.moe_every == 0

  @property
  def has_global_geometry(self) -> bool:
    """Whether the global layers' attention differs in shape from the windowed ones' (Gemma 4)."""
    return bool(self.global_head_dim or self.global_kv_heads or self.global_k_eq_v)

  def attention_geometry(self, window: int | None) -> tuple[int, int, bool]:
    """(kv heads, head_dim, k_eq_v) of a layer with this ``window`` (None: a global layer)."""
    if window is None and self.sliding_window is not None:
      return (self.global_kv_heads or self.num_kv_heads, self.global_head_dim or self.head_dim, self.global_k_eq_v)
    return self.num_kv_heads, self.head_dim, False

  def layer_window(self, i: int) -> int | None:
    """Layer ``i``'s attention window (None: global attention)."""
    if self.sliding_window is None or (self.global_every and (i + 1) % self.global_every == 0):
      return None
    return self.sliding_window

  @property
  def is_patterned(self) -> bool:
    """Whether layers differ by more than the dense prefix (windows on some layers, MoE on some)."""
    return (self.sliding_window is not None and self.global_every > 0) or (self.is_moe and self.moe_every > 1)

  @property
  def num_windowed_layers(self) -> int:
    return sum(self.layer_window(i) is not None for i in range(self.num_layers))

  @property
  def first_kv_shared_layer(self) -> int:
    """The first layer that reuses an earlier layer's keys and values (num_layers: none does)."""
    return self.num_layers - self.kv_shared_layers

  def layer_shares_kv(self, i: int) -> bool:
    """Whether layer ``i`` reuses an earlier layer's keys and values (Gemma 4's "reuse" mode)."""
    return i >= self.first_kv_shared_layer

  def kv_source(self, i: int) -> int:
    """The layer whose keys and values layer ``i`` attends to: itself, or for a KV-shared layer
    the last layer before the shared ones with its attention type (transformers'
    Gemma4TextConfig.kv_sharing_modes: that layer "store"s them)."""
    if not self.layer_shares_kv(i):
      return i
    kind = self.layer_window(i)
    return max(j for j in range(self.first_kv_shared_layer) if self.layer_window(j) == kind)

  def num_cached_layers(self, windowed: bool) -> int:
    """Layers of one attention type (windowed or global) with a KV cache of their own."""
    first = self.first_kv_shared_layer
    return sum((self.layer_window(i) is not None) == windowed for i in range(first))

  @property
  def num_moe_layers(self) -> int:
    return sum(self.layer_is_moe(i) for i in range(self.num_layers)) if self.is_moe else 0

  @property
  def num_dense_layers(self) -> int:
    """Layers with a dense MLP: all of them in a dense model, the first few in an MoE one."""
    return self.num_layers - self.num_moe_layers

  # --- presets -------------------------------------------------------------------------------

  @classmethod
  def tiny(cls) -> ModelConfig:
    """Llama-3-style toy (GQA, RoPE, SwiGLU, untied) for tests: ~0.1M parameters."""
    return cls(
      name="tiny", style="llama3", vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
      head_dim=16, d_ff=128, max_seq_len=256, tie_embeddings=False, norm_eps=1e-5, rope_theta=10_000.0,
    )

  @classmethod
  def tiny_gpt2(cls) -> ModelConfig:
    """GPT-2-style toy (MHA, learned positions, GELU, tied) for tests: ~0.1M parameters."""
    return cls(
      name="tiny-gpt2", style="gpt2", vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=4,
      head_dim=16, d_ff=256, max_seq_len=256, tie_embeddings=True, norm_eps=1e-5, rope_theta=10_000.0,
    )

  @classmethod
  def tiny_moe(cls) -> ModelConfig:
    """Mixtral-style toy: every layer a softmax top-2 router over 8 SwiGLU experts."""
    return dataclasses.replace(
      cls.tiny(), name="tiny-moe", num_experts=8, experts_per_token=2, expert_d_ff=32,
    )

  @classmethod
  def tiny_mla(cls) -> ModelConfig:
    """DeepSeek-V3 in miniature: MLA, one dense layer, then sigmoid group-limited routing over 8
    experts (4 groups, 2 chosen) with a selection bias, plus one shared expert."""
    return cls(
      name="tiny-mla", style="llama3", vocab_size=256, d_model=64, num_layers=3, num_heads=4, num_kv_heads=4,
      head_dim=24, d_ff=128, max_seq_len=256, tie_embeddings=False, norm_eps=1e-6, rope_theta=10_000.0,
      ffn=FeedForwardSpec(
        num_experts=8, experts_per_token=2, num_shared_experts=1, expert_d_ff=32, first_dense_layers=1,
        router_scoring="sigmoid", routed_scaling=2.5, router_bias=True, expert_groups=4, expert_groups_per_token=2,
      ),
      mla=MLASpec(kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
    )

  @classmethod
  def mixtral_8x7b(cls) -> ModelConfig:
    """Mixtral 8x7B: 8 experts, top-2, every layer MoE, GQA with 8 kv heads."""
    return _mixtral(
      "mixtral-8x7b", vocab=32_000, d_model=4096, num_layers=32, num_heads=32, d_ff=14_336, max_seq_len=32_768
    )

  @classmethod
  def mixtral_8x22b(cls) -> ModelConfig:
    """Mixtral 8x22B."""
    return _mixtral(
      "mixtral-8x22b", vocab=32_768, d_model=6144, num_layers=56, num_heads=48, d_ff=16_384, max_seq_len=65_536
    )

  @classmethod
  def qwen3_30b_a3b(cls) -> ModelConfig:
    """Qwen3-30B-A3B: 128 experts of width 768, top-8 renormalised (norm_topk_prob), no shared
    expert, per-head q/k RMSNorms as every Qwen3."""
    return cls(
      name="qwen3-30b-a3b", style="llama3", vocab_size=151_936, d_model=2048, num_layers=48, num_heads=32,
      num_kv_heads=4, head_dim=128, d_ff=6144, max_seq_len=40_960, tie_embeddings=False, norm_eps=1e-6,
      rope_theta=1_000_000.0, num_experts=128, experts_per_token=8, expert_d_ff=768, qk_norm=True,
    )

  @classmethod
  def deepseek_v3(cls) -> ModelConfig:
    """DeepSeek-V3 (671B): MLA, 3 dense layers, then 1 shared + 256 routed experts, top-8 by
    sigmoid affinity with group-limited, bias-corrected selection (8 groups, 4 chosen), weights
    renormalised and scaled by 2.5. Left out: the multi-token-prediction module (recorded as
    mtp_layers, with a note), and YaRN's RoPE rescaling (values, not shapes)."""
    return cls(
      name="deepseek-v3", style="llama3", vocab_size=129_280, d_model=7168, num_layers=61, num_heads=128,
      num_kv_heads=128, head_dim=192, d_ff=18_432, max_seq_len=163_840, tie_embeddings=False, norm_eps=1e-6,
      rope_theta=10_000.0, mtp_layers=1,
      ffn=FeedForwardSpec(
        num_experts=256, experts_per_token=8, num_shared_experts=1, expert_d_ff=2048, first_dense_layers=3,
        router_scoring="sigmoid", routed_scaling=2.5, router_bias=True, expert_groups=8, expert_groups_per_token=4,
      ),
      mla=MLASpec(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    )

  @classmethod
  def gpt2_small(cls) -> ModelConfig:
    return _gpt2("gpt2-small", d_model=768, num_layers=12, num_heads=12)

  @classmethod
  def gpt2_medium(cls) -> ModelConfig:
    return _gpt2("gpt2-medium", d_model=1024, num_layers=24, num_heads=16)

  @classmethod
  def gpt2_large(cls) -> ModelConfig:
    return _gpt2("gpt2-large", d_model=1280, num_layers=36, num_heads=20)

  @classmethod
  def gpt2_xl(cls) -> ModelConfig:
    return _gpt2("gpt2-xl", d_model=1600, num_layers=48, num_heads=25)

  @classmethod
  def llama3_1b(cls) -> ModelConfig:
    """Llama 3.2 1B: head_dim 64, tied embeddings."""
    return _llama3("llama3-1b", d_model=2048, num_layers=16, num_heads=32, head_dim=64, d_ff=8192, tie=True)

  @classmethod
  def llama3_3b(cls) -> ModelConfig:
    """Llama 3.2 3B: tied embeddings."""
    return _llama3("llama3-3b", d_model=3072, num_layers=28, num_heads=24, head_dim=128, d_ff=8192, tie=True)

  @classmethod
  def llama3_8b(cls) -> ModelConfig:
    """Llama 3.1 8B."""
    return _llama3("llama3-8b", d_model=4096, num_layers=32, num_heads=32, head_dim=128, d_ff=14336, tie=False)

  @classmethod
  def llama3_70b(cls) -> ModelConfig:
    """Llama 3.1 70B."""
    return _llama3("llama3-70b", d_model=8192, num_layers=80, num_heads=64, head_dim=128, d_ff=28672, tie=False)

  @classmethod
  def llama3_405b(cls) -> ModelConfig:
    """Llama 3.1 405B."""
    return _llama3("llama3-405b", d_model=16384, num_layers=126, num_heads=128, head_dim=128, d_ff=53248, tie=False)

  @classmethod
  def mistral_7b(cls) -> ModelConfig:
    """Mistral 7B v0.3 (mistralai/Mistral-7B-v0.3 config.json): Llama-style with a 32768-token
    vocabulary, rope theta 1e6 and no sliding window (v0.1's 4096 window was dropped in v0.2)."""
    return cls(
      name="mistral-7b", style="llama3", vocab_size=32_768, d_model=4096, num_layers=32, num_heads=32,
      num_kv_heads=8, head_dim=128, d_ff=14_336, max_seq_len=32_768, tie_embeddings=False, norm_eps=1e-5,
      rope_theta=1_000_000.0,
    )

  @classmethod
  def qwen2_5_7b(cls) -> ModelConfig:
    """Qwen2.5 7B (Qwen/Qwen2.5-7B config.json): biases on q/k/v, untied; its sliding window is
    off (use_sliding_window false)."""
    return _qwen2_5("qwen2.5-7b", d_model=3584, num_layers=28, num_heads=28, num_kv_heads=4, d_ff=18_944, norm_eps=1e-6)

  @classmethod
  def qwen2_5_72b(cls) -> ModelConfig:
    """Qwen2.5 72B (Qwen/Qwen2.5-72B config.json): as 7B, with rms_norm_eps 1e-5."""
    return _qwen2_5("qwen2.5-72b", d_model=8192, num_layers=80, num_heads=64, num_kv_heads=8, d_ff=29_568, norm_eps=1e-5)

  @classmethod
  def qwen3_8b(cls) -> ModelConfig:
    """Qwen3 8B (Qwen/Qwen3-8B config.json): RMSNorm on each q and k head, no biases, untied."""
    return cls(
      name="qwen3-8b", style="llama3", vocab_size=151_936, d_model=4096, num_layers=36, num_heads=32,
      num_kv_heads=8, head_dim=128, d_ff=12_288, max_seq_len=40_960, tie_embeddings=False, norm_eps=1e-6,
      rope_theta=1_000_000.0, qk_norm=True,
    )


  @classmethod
  def gpt3_22b(cls) -> ModelConfig:
    """Korthikanti et al.'s 22B (table 3): 64 heads, hidden 6144, 48 layers."""
    return _gpt3("gpt3-22b", d_model=6144, num_layers=48, num_heads=64)

  @classmethod
  def gpt3_175b(cls) -> ModelConfig:
    """GPT-3 175B (Brown et al. 2020, table 2.1; Korthikanti et al. table 3): 96 heads, 12288, 96 layers."""
    return _gpt3("gpt3-175b", d_model=12288, num_layers=96, num_heads=96)

  @classmethod
  def gpt3_530b(cls) -> ModelConfig:
    """Korthikanti et al.'s 530B (table 3; MT-NLG's shape): 128 heads, hidden 20480, 105 layers."""
    return _gpt3("gpt3-530b", d_model=20480, num_layers=105, num_heads=128)

  @classmethod
  def gpt3_1t(cls) -> ModelConfig:
    """Korthikanti et al.'s 1T (table 3): 160 heads, hidden 25600, 128 layers."""
    return _gpt3("gpt3-1t", d_model=25600, num_layers=128, num_heads=160)


def _check_features(cfg: ModelConfig) -> None:
  bad = None
  for field in ("qk_norm_full", "out_bias", "attention_sinks", "window_chunked", "global_k_eq_v", "v_norm"):
    if not isinstance(getattr(cfg, field), (bool, np.bool_)):
      bad = f"{field} must be true or false, got {getattr(cfg, field)!r}"
  g, step = cfg.global_every, cfg.moe_every
  if bad:
    pass
  elif not isinstance(g, (int, np.integer)) or isinstance(g, bool) or g < 0:
    bad = f"global_every must be an integer >= 0, got {g!r}"
  elif not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 1:
    bad = f"moe_every must be a positive integer, got {step!r}"
  elif cfg.mlp_act not in MLP_ACTS:
    bad = f"mlp_act must be one of {', '.join(MLP_ACTS)}, got {cfg.mlp_act!r}"
  elif cfg.norm_layout not in NORM_LAYOUTS:
    bad = f"norm_layout must be one of {', '.join(NORM_LAYOUTS)}, got {cfg.norm_layout!r}"
  elif cfg.style != "llama3" and (
    cfg.mlp_act != "silu" or cfg.norm_layout != "pre" or cfg.qk_norm_full or cfg.attention_sinks or cfg.out_bias
    or cfg.sliding_window is not None
  ):
    bad = "mlp_act, norm_layout, qk_norm_full, out_bias, attention_sinks and sliding_window apply to style llama3 only"
  elif cfg.qk_norm and cfg.qk_norm_full:
    bad = "qk_norm (per head) and qk_norm_full (all channels) exclude each other"
  elif cfg.is_mla and (cfg.sliding_window is not None or cfg.attention_sinks or cfg.attn_softcap or cfg.qk_norm_full):
    bad = "multi-head latent attention takes no window, sinks, soft-capping or qk_norm_full here"
  for field in ("global_head_dim", "global_kv_heads"):
    value = getattr(cfg, field)
    if bad is None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0):
      bad = f"{field} must be an integer >= 0 (0: as every layer), got {value!r}"
  if bad is None and cfg.has_global_geometry:
    kv, h, _ = cfg.attention_geometry(None)
    if cfg.style != "llama3" or cfg.sliding_window is None or not cfg.global_every or cfg.is_mla:
      bad = "global_head_dim, global_kv_heads and global_k_eq_v need style llama3, a sliding_window and global_every > 0"
    elif cfg.num_heads % kv:
      bad = f"num_heads ({cfg.num_heads}) must be a multiple of global_kv_heads ({kv})"
    elif h % 2:
      bad = f"RoPE needs an even global_head_dim, got {h}"
  if bad is None:
    bad = _check_kv_sharing(cfg) or _check_per_layer(cfg)
  if bad is None and cfg.gemma4 != Gemma4Spec() and (cfg.style != "llama3" or cfg.is_mla):
    # One family builds a decoder (models/families.py): Gemma 4's is RoPE attention's.
    bad = "Gemma 4's features (gemma4: v_norm, moe_beside_dense, ...) need style llama3 and no MLA"
  for field in ("attn_softcap", "final_softcap"):
    cap = getattr(cfg, field)
    if bad is None and cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
      bad = f"{field} must be a number > 0 or None, got {cap!r}"
  if bad:
    raise JaxmemError(f"model {cfg.name!r}: {bad}")


def _check_kv_sharing(cfg: ModelConfig) -> str | None:
  """KV sharing is built for Gemma 4's layout: a local/global pattern whose last whole period
  before the shared layers holds the layers they reuse (E2B: 15 of 35, E4B: 24 of 42)."""
  n = cfg.kv_shared_layers
  if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 0 <= n < cfg.num_layers:
    return f"kv_shared_layers must be an integer in [0, num_layers), got {n!r}"
  if not isinstance(cfg.kv_shared_double_mlp, (bool, np.bool_)):
    return f"kv_shared_double_mlp must be true or false, got {cfg.kv_shared_double_mlp!r}"
  if not n:
    return None
  first, every = cfg.num_layers - n, cfg.global_every
  if cfg.style != "llama3" or cfg.sliding_window is None or not every or cfg.is_mla or cfg.is_moe:
    return "kv_shared_layers needs style llama3, a sliding_window, global_every > 0, no MLA and no MoE"
  if cfg.qkv_bias or cfg.qk_norm_full or cfg.out_bias or cfg.attention_sinks:
    return "kv_shared_layers takes no qkv_bias, qk_norm_full, out_bias or attention_sinks here"
  if first % every or first < every:
    return f"kv_shared_layers {n}: the {first} layers before them must be whole {every}-layer periods, at least one"
  return None


def _check_per_layer(cfg: ModelConfig) -> str | None:
  """Per-layer embeddings are built for Gemma 4's patterned stacks (Transformer._patterned)."""
  p, v = cfg.per_layer_dim, cfg.per_layer_vocab
  for field, value in (("per_layer_dim", p), ("per_layer_vocab", v)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
      return f"{field} must be an integer >= 0, got {value!r}"
  if not p:
    return None
  if v < 1:
    return f"per_layer_dim {p} needs per_layer_vocab >= 1, got {v}"
  if cfg.style != "llama3" or cfg.sliding_window is None or not cfg.global_every or cfg.is_mla or cfg.is_moe:
    return "per_layer_dim needs style llama3, a sliding_window, global_every > 0, no MLA and no MoE"
  return None


def _float_dtype(name: str, field: str, value: Any) -> None:
  try:
    dt = jnp.dtype(value)
  except (TypeError, ValueError):  # numpy raises either, by the kind of value (1e16: ValueError)
    dt = None
  if dt is None or not jnp.issubdtype(dt, jnp.floating):
    raise JaxmemError(f"model {name!r}: {field} must name a float dtype (e.g. float32, bfloat16), got {value!r}")


def _check_count(cfg: ModelConfig, field: str, *, least: int = 0) -> int:
  value = getattr(cfg, field)
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
    what = "a positive integer" if least == 1 else f"an integer >= {least}"
    raise JaxmemError(f"model {cfg.name!r}: {field} must be {what}, got {value!r}")
  return int(value)


def _check_moe(cfg: ModelConfig) -> None:
  """The MoE fields; they are ignored (and may hold anything valid) when num_experts is 0."""
  for field in ("num_experts", "experts_per_token", "num_shared_experts", "expert_d_ff", "first_dense_layers", "mtp_layers"):
    _check_count(cfg, field)
  groups = _check_count(cfg, "expert_groups", least=1)
  groups_per_token = _check_count(cfg, "expert_groups_per_token", least=1)
  e, k = cfg.num_experts, cfg.experts_per_token
  if not e:
    return
  bad = None
  if cfg.style != "llama3":
    bad = f"mixture-of-experts layers need style llama3 (SwiGLU experts), got {cfg.style!r}"
  elif not 1 <= k <= e:
    bad = f"experts_per_token must be between 1 and num_experts ({e}), got {k}"
  elif cfg.expert_d_ff < 1:
    bad = f"expert_d_ff must be a positive integer when num_experts > 0, got {cfg.expert_d_ff}"
  elif cfg.first_dense_layers >= cfg.num_layers:
    bad = (
      f"first_dense_layers ({cfg.first_dense_layers}) must be below num_layers ({cfg.num_layers}); "
      "use num_experts=0 for a dense model"
    )
  elif cfg.router_scoring not in ROUTER_SCORINGS:
    bad = f"router_scoring must be one of {', '.join(ROUTER_SCORINGS)}, got {cfg.router_scoring!r}"
  elif not cfg.routed_scaling > 0:
    bad = f"routed_scaling must be > 0, got {cfg.routed_scaling!r}"
  elif e % groups or groups_per_token > groups:
    bad = f"expert_groups ({groups}) must divide num_experts ({e}), be >= expert_groups_per_token ({groups_per_token})"
  elif k > groups_per_token * (e // groups):
    reachable = groups_per_token * (e // groups)
    bad = f"experts_per_token ({k}) exceeds the {reachable} experts in {groups_per_token} of {groups} groups"
  elif cfg.router_bias and groups > 1 and e // groups < 2:
    bad = "group-limited routing with router_bias ranks groups by their top-2 scores: give groups 2+ experts"
  elif cfg.expert_act not in EXPERT_ACTS:
    bad = f"expert_act must be one of {', '.join(EXPERT_ACTS)}, got {cfg.expert_act!r}"
  elif not isinstance(cfg.moe_beside_dense, (bool, np.bool_)):
    bad = f"moe_beside_dense must be true or false, got {cfg.moe_beside_dense!r}"
  elif cfg.moe_beside_dense and (
    cfg.norm_layout != "sandwich" or cfg.num_shared_experts or cfg.router_scoring != "softmax"
    or not cfg.router_norm_topk or cfg.routed_scaling != 1.0 or cfg.router_bias or groups > 1
  ):
    bad = (
      "moe_beside_dense (Gemma 4's MoE block) is built with norm_layout sandwich, a softmax router renormalised "
      "over its top-k, no shared experts, routed_scaling 1, no router_bias and no expert groups"
    )
  if bad:
    raise JaxmemError(f"model {cfg.name!r}: {bad}")


def _check_mla(cfg: ModelConfig) -> None:
  """The MLA fields; they are ignored when kv_lora_rank is 0."""
  for field in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
    _check_count(cfg, field)
  if not cfg.kv_lora_rank:
    return
  bad = None
  nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
  if cfg.style != "llama3":
    bad = f"multi-head latent attention needs style llama3 (RoPE), got {cfg.style!r}"
  elif nope < 1 or cfg.v_head_dim < 1 or rope < 2 or rope % 2:
    bad = (
      "MLA needs qk_nope_head_dim >= 1, v_head_dim >= 1 and an even qk_rope_head_dim >= 2, "
      f"got {nope}, {cfg.v_head_dim}, {rope}"
    )
  elif cfg.head_dim != nope + rope:
    bad = f"with MLA, head_dim is qk_nope_head_dim + qk_rope_head_dim = {nope + rope}, got {cfg.head_dim}"
  elif cfg.num_kv_heads != cfg.num_heads:
    bad = f"MLA gives each head its own keys and values: num_kv_heads must be {cfg.num_heads}, got {cfg.num_kv_heads}"
  if bad:
    raise JaxmemError(f"model {cfg.name!r}: {bad}")


def _gpt2(name: str, *, d_model: int, num_layers: int, num_heads: int) -> ModelConfig:
  return ModelConfig(
    name=name, style="gpt2", vocab_size=_GPT2_VOCAB, d_model=d_model, num_layers=num_layers,
    num_heads=num_heads, num_kv_heads=num_heads, head_dim=d_model // num_heads, d_ff=4 * d_model,
    max_seq_len=_GPT2_MAX_SEQ_LEN, tie_embeddings=True, norm_eps=1e-5, rope_theta=10_000.0,
  )


# Korthikanti et al. 2022, section 6: "a sequence length of 2048 and a vocabulary size of 51200"
# (GPT-2's 50257 tokens padded, as Megatron pads, to a multiple of 128 x its tensor size).
_GPT3_VOCAB = 51_200
_GPT3_MAX_SEQ_LEN = 2048


def _gpt3(name: str, *, d_model: int, num_layers: int, num_heads: int) -> ModelConfig:
  return dataclasses.replace(
    _gpt2(name, d_model=d_model, num_layers=num_layers, num_heads=num_heads),
    vocab_size=_GPT3_VOCAB, max_seq_len=_GPT3_MAX_SEQ_LEN,
  )


def _llama3(name: str, *, d_model: int, num_layers: int, num_heads: int, head_dim: int, d_ff: int, tie: bool) -> ModelConfig:
  # Every Llama 3 size uses 8 KV heads (Llama 3 paper, table 3).
  return ModelConfig(
    name=name, style="llama3", vocab_size=_LLAMA3_VOCAB, d_model=d_model, num_layers=num_layers,
    num_heads=num_heads, num_kv_heads=8, head_dim=head_dim, d_ff=d_ff, max_seq_len=_LLAMA3_MAX_SEQ_LEN,
    tie_embeddings=tie, norm_eps=1e-5, rope_theta=_LLAMA3_ROPE_THETA,
  )


def _qwen2_5(
  name: str, *, d_model: int, num_layers: int, num_heads: int, num_kv_heads: int, d_ff: int, norm_eps: float
) -> ModelConfig:
  # Every Qwen2.5 base model: head_dim 128, vocab 152064 (the embedding is padded past the
  # tokenizer's 151643 tokens), 128K context, rope theta 1e6 (Qwen/Qwen2.5-* config.json).
  return ModelConfig(
    name=name, style="llama3", vocab_size=152_064, d_model=d_model, num_layers=num_layers, num_heads=num_heads,
    num_kv_heads=num_kv_heads, head_dim=128, d_ff=d_ff, max_seq_len=131_072, tie_embeddings=False,
    norm_eps=norm_eps, rope_theta=1_000_000.0, qkv_bias=True,
  )


def _mixtral(
  name: str, *, vocab: int, d_model: int, num_layers: int, num_heads: int, d_ff: int, max_seq_len: int
) -> ModelConfig:
  # Both sizes: head_dim 128, 8 kv heads, RoPE base 1e6, RMSNorm eps 1e-5, untied, and 8
  # experts of the dense width (intermediate_size), 2 per token, softmax renormalised over the
  # chosen two (Jiang et al. 2024, section 2.1).
  return ModelConfig(
    name=name, style="llama3", vocab_size=vocab, d_model=d_model, num_layers=num_layers, num_heads=num_heads,
    num_kv_heads=8, head_dim=128, d_ff=d_ff, max_seq_len=max_seq_len, tie_embeddings=False, norm_eps=1e-5,
    rope_theta=1_000_000.0, num_experts=8, experts_per_token=2, expert_d_ff=d_ff,
  )

"""Flax NNX decoder-only Transformers (installed as ``jaxmem.models``).

GPT-2 and Llama 3 families at their published sizes (and Mistral, Qwen2.5 and Qwen3, through
architecture flags on the Llama 3 style), built so that XLA's memory figures for a
train step look like those of a production model: scanned layers, mixed precision (float32
parameters, bfloat16 compute, float32 logits; attention scores in the compute dtype unless
float32 is asked for, as in MaxText), logical axis names on every
parameter and sharding-constraint hooks on the main activations.

Public interface::

  ModelConfig                      frozen, keyword-only record composed of its concerns (CoreSpec,
                                   AttentionSpec, WindowSpec, NormSpec, FeedForwardSpec, MLASpec,
                                   Gemma4Spec, RecordedSpec), built, read and written flat;
                                   presets as classmethods
  StepChoices                      how a step runs the model (dropout, moe_impl,
                                   capacity_factor): given beside the config, not in it
  PRESETS: dict[str, () -> ModelConfig]   keyed by CLI name ("tiny", "gpt2-small", "llama3-8b", ...)
  get_config(name, **overrides) -> ModelConfig    JaxmemError on unknown names/fields; a name
                                   ending in .json is a Hugging Face config.json (from_config),
                                   ORG/NAME[@REV] a Hub id (only its config.json fetched: hub.py)
  load_model(name, *, revision=None, **overrides) -> ModelConfig   the same, jaxmem.load_model
  from_config(path_or_dict, *, name=None) -> ModelConfig   Llama, Mistral, Qwen2, Qwen3, GPT-2,
                                   Mixtral, Qwen3-MoE and DeepSeek-V3 config.json files (hf.py);
                                   JaxmemError on anything else
  count_params(cfg) -> int         closed form, equals the built model's parameter count
  count_checkpoint_params(cfg)     and a multimodal checkpoint's vision tower, counted, not built
  count_active_params(cfg) -> int  parameters one token uses (MoE: k of E routed experts)
  Transformer(cfg, *, rngs, choices=None)   nnx.Module (choices: StepChoices; None: the defaults);
                                   __call__(tokens_bt, *, remat=None, constrain=None,
                                   attend=None, experts=None) -> float32 logits_btv
                                   (= logits(hidden(...)));
                                   hidden(tokens_bt, ...) -> final-normed x_btd;
                                   logits(x_btd, *, constrain=None) -> float32 logits_btv;
                                   loss(tokens_bt, targets_bt, *, remat, constrain, attend,
                                   vocab_tiles=1) -> mean cross entropy (vocabulary-tiled if > 1);
                                   cached(tokens_bt, cache, *, pos=0, constrain=None, weights=None,
                                   last_only=True, attend=None) -> (logits, KVCache): prefill and
                                   decode (attend: prefill at pos=0 only)
  Family, FAMILIES, family_of(cfg) what a model family adds to the decoder (family.py): its
                                   positions, blocks, layers' own inputs and KV sharing; one module
                                   each (gpt2.py, mla.py, gemma4.py), listed in families.py
  cross_entropy(x_btd, targets_bt, logits_fn, *, vocab_tiles=1, constrain=...)  (loss.py)
  KVCache(k_lbksh, v_lbksh)        the KV cache, [layers, batch, kv_heads, context, head_dim] each;
                                   CACHE_AXES its logical axes; kv_cache_bytes(cfg, batch=, context=)
  MLACache(latent_lbsc, rope_k_lbsr)   multi-head latent attention's cache (mla.py); MLA_CACHE_AXES;
                                   mla_cache_bytes; cache_class(cfg) / cache_bytes(cfg, ...) pick
                                   the cache kind a config needs
  AttendFn, dot_attend, chunked_attend   how attention is computed (see attention_ops.py)
  IMPLEMENTATIONS, ATTENTION_NAMES, AttentionImpl, AttentionShapes, AttentionChoice,
  choose_attention(requested, *, platform, shapes, mesh=None, axes=None, deviceless=True, ...)
                                   the attention registry and the per-target "auto" choice
                                   (attention_registry.py, with the scores' dtype and context
                                   strategy it takes; kernels in attention_kernels.py)
  get_attention(name) -> AttentionImpl   one entry (platforms, fused, kernel_flops, constraints);
                                   JaxmemError listing the valid names otherwise
  attention_help() -> str          --attention's help, from the registry
  ExpertsFn, dropless_experts, capacity_experts, expert_capacity
                                   how an MoE layer's routed experts are computed (see moe.py)
  sharded_dropless(mesh, axes, matmul=)   dropless experts per device under shard_map,
                                   tokens exchanged over the expert axis (moe_parallel.py)
  MOE_KERNELS, GroupedMatmul, grouped_matmul(name), choose_moe_kernel(requested, platform)
                                   the grouped matmul dropless experts run: ragged_dot or
                                   megablox's gmm, "auto" per target (moe_kernels.py)
  MeshAxes                         which mesh axes split the batch, sequence, heads, experts,
                                   MLP width and layers inside every shard_map here, for one mesh
                                   (mesh_axes.py); built from the sharding rules by
                                   jaxmem.program.sharding.mesh_axes(mesh), required by every
                                   kernel given a mesh (no default axis names)
  Pipeline, bubble_fraction        the layer stacks pipelined over the stage mesh axis (GPipe and
                                   MaxText's circular schedule; pipeline.py): Transformer.loss(...,
                                   pipeline=Pipeline(mesh=, axes=, microbatches=, repeats=))
  LOGICAL_AXES, ACTIVATION_AXES, CHECKPOINT_NAMES   the name vocabularies below
  DENSE_/MOE_/MLA_CHECKPOINT_NAMES the names each kind of layer tags

Mixture of experts (moe.py) and multi-head latent attention (mla.py) are ModelConfig fields
(``num_experts`` > 0, ``kv_lora_rank`` > 0): the first ``first_dense_layers`` layers are the
``blocks`` stack, the MoE layers after them the ``moe_blocks`` stack, each scanned.

Logical axes (``LOGICAL_AXES``; ``nnx.get_partition_spec`` of the model state gives one per
parameter dimension):

  vocab      token-embedding rows, unembedding columns
  embed      d_model, on every weight that reads from or writes to the residual stream
  heads      query heads (q and output projections)
  kv_heads   key/value heads (== heads for GPT-2)
  head_dim   per-head width
  mlp        MLP hidden width d_ff
  layers     leading axis of every stacked block parameter
  pos        rows of GPT-2's learned position table
  norm       norm scale and bias vectors
  exp        routed experts (leading axis of expert weights)
  exp_scores the router's expert column and selection bias (never sharded: each token needs all E scores)
  q_lora     MLA's query latent (q_lora_rank)
  kv_lora    MLA's key/value latent (kv_lora_rank, + the RoPE key in its down-projection)

``constrain(x, axes)`` is called with ``ACTIVATION_AXES`` ("batch", "seq") followed by the
names above: embeddings and residual stream ("batch", "seq", "embed"); q ("batch", "seq",
"heads", "head_dim"); k and v ("batch", "seq", "kv_heads", "head_dim"); attention context
("batch", "seq", "heads", "head_dim"); MLP hidden ("batch", "seq", "mlp"); attention and MLP
outputs ("batch", "seq", "embed"); logits ("batch", "seq", "vocab"). MoE: router logits
("batch", "seq", None); the capacity path's dispatched tokens (None, "batch", None, "embed")
then ("exp", "batch", None, "embed"), expert hidden ("exp", "batch", None, "mlp") and expert
output ("exp", "batch", None, "embed") then (None, "batch", None, "embed"): mapping "exp" to a
mesh axis that also splits "batch" makes the two layout changes all-to-alls. MLA: latents
("batch", "seq", "q_lora") and ("batch", "seq", "kv_lora").

Checkpoint names (``CHECKPOINT_NAMES``; ``jax.ad_checkpoint.checkpoint_name`` tags inside
each block, MaxText's vocabulary, usable with ``jax.checkpoint_policies.save_only_these_names``
and friends; B batch, T seq, N heads, K kv heads, H head_dim, D d_model, F d_ff; all in the
compute dtype):

  query_proj   [B, T, N, H]  query projection (+ bias for GPT-2 and Qwen2), before q/k norm
                             (Qwen3) and RoPE
  key_proj     [B, T, K, H]  key projection (+ bias likewise), before q/k norm and RoPE
  value_proj   [B, T, K, H]  value projection
  context      [B, T, N, H]  softmax(q k^T) v: attention output before the output projection
  out_proj     [B, T, D]     attention output projection (+ bias), before the residual add
  mlpwi        [B, T, F]     MLP hidden after the input projection(s) and the activation:
                             gelu(x W_in + b) for GPT-2, silu(x W_gate) * (x W_up) for Llama
  mlpwi_0      [B, T, F]     the first MLP input projection, before the activation: SwiGLU's gate
                             x W_gate (Llama), GPT-2's x W_in + b (its only one)
  mlpwi_1      [B, T, F]     SwiGLU's up projection x W_up (Llama only)
  mlpwo        [B, T, D]     MLP output projection (+ bias), before the residual add
                             (MoE layers' shared experts tag mlpwi and mlpwo too)

Every layer of the scanned stack (``LAYER_CHECKPOINT_NAMES``):

  decoder_layer_input [B, T, D]  the layer's input, the residual stream the scan carries
                                 (MaxText's name); ``full_offloaded`` moves it to host memory

MoE layers (MaxText's names for the expert MLP; E experts, k per token, C capacity slots):

  router_logits  [B, T, E] float32   x W_router, before softmax/sigmoid
  moe_mlpwi_0    dropless [B*T*k, F], capacity [E, B, C, F]: the experts' gate projection
  moe_mlpwi_1    the same shapes: the experts' up projection
  moe_mlpwo      dropless [B*T*k, D], capacity [E, B, C, D]: the experts' down projection

MLA layers (MaxText's names; they also tag query_proj, key_proj, value_proj, context, out_proj
on the assembled q, k [B, T, N, qk_nope + qk_rope], v [B, T, N, v_head_dim]):

  query_wa_proj  [B, T, q_lora]      x W^DQ, before its RMSNorm
  mla_q          [B, T, q_lora]      after the RMSNorm
  kv_wa_proj     [B, T, kv_lora + qk_rope]   x [W^DKV; W^KR], before the norm and RoPE
  mla_kv         [B, T, kv_lora]     the normalised latent, what the inference cache holds

Remat: ``remat=None`` applies no ``jax.checkpoint`` at all; a policy wraps the scanned block
body in ``jax.checkpoint(body, policy=remat, prevent_cse=False)``. Remat never changes the
math, only what is saved for the backward pass.
"""

from .attention_ops import AttendFn, chunked_attend, dot_attend
from .attention_registry import (
  ATTENTION_NAMES,
  IMPLEMENTATIONS,
  AttentionChoice,
  AttentionImpl,
  AttentionShapes,
  attention_help,
  choose_attention,
  get_attention,
)
from .cache import CACHE_AXES, KVCache, LocalKVCache, kv_cache_bytes
from .config import (
  AttentionSpec,
  CoreSpec,
  FeedForwardSpec,
  Gemma4Spec,
  MLASpec,
  ModelConfig,
  NormSpec,
  RecordedSpec,
  StepChoices,
  WindowSpec,
)
from .families import FAMILIES, family_of
from .family import Family
from .counting import count_active_params, count_checkpoint_params, count_params
from .hf import from_config
from .layers import Constrain
from .loss import cross_entropy
from .mla import MLA_CACHE_AXES, MLACache, cache_bytes, cache_class, mla_cache_bytes
from .moe import ExpertsFn, capacity_experts, dropless_experts, expert_capacity
from .mesh_axes import MeshAxes
from .moe_kernels import MOE_KERNELS, GroupedMatmul, choose_moe_kernel, grouped_matmul
from .moe_parallel import sharded_dropless
from .names import (
  ACTIVATION_AXES,
  CHECKPOINT_NAMES,
  DENSE_CHECKPOINT_NAMES,
  LAYER_CHECKPOINT_NAMES,
  LOGICAL_AXES,
  MLA_CHECKPOINT_NAMES,
  MOE_CHECKPOINT_NAMES,
)
from .pipeline import Pipeline, bubble_fraction
from .presets import PRESETS, get_config, load_model
from .transformer import RematPolicy, Transformer, WeightHook

__all__ = [
  "Pipeline",
  "bubble_fraction",
  "ACTIVATION_AXES",
  "DENSE_CHECKPOINT_NAMES",
  "LAYER_CHECKPOINT_NAMES",
  "MeshAxes",
  "ExpertsFn",
  "MLACache",
  "MLA_CACHE_AXES",
  "MLA_CHECKPOINT_NAMES",
  "MOE_CHECKPOINT_NAMES",
  "cache_bytes",
  "cache_class",
  "capacity_experts",
  "count_active_params",
  "dropless_experts",
  "expert_capacity",
  "mla_cache_bytes",
  "sharded_dropless",
  "MOE_KERNELS",
  "GroupedMatmul",
  "choose_moe_kernel",
  "grouped_matmul",
  "ATTENTION_NAMES",
  "AttendFn",
  "AttentionChoice",
  "AttentionImpl",
  "AttentionShapes",
  "IMPLEMENTATIONS",
  "attention_help",
  "choose_attention",
  "get_attention",
  "chunked_attend",
  "cross_entropy",
  "dot_attend",
  "CACHE_AXES",
  "KVCache",
  "LocalKVCache",
  "WeightHook",
  "kv_cache_bytes",
  "CHECKPOINT_NAMES",
  "Constrain",
  "LOGICAL_AXES",
  "ModelConfig",
  "StepChoices",
  "AttentionSpec",
  "CoreSpec",
  "FeedForwardSpec",
  "Gemma4Spec",
  "MLASpec",
  "NormSpec",
  "RecordedSpec",
  "WindowSpec",
  "FAMILIES",
  "Family",
  "family_of",
  "PRESETS",
  "RematPolicy",
  "Transformer",
  "count_checkpoint_params",
  "count_params",
  "from_config",
  "get_config",
  "load_model",
]

"""The vocabularies that code outside the model keys on.

Two kinds of names leave this package, and both are plain strings so that callers can write
rules for them without importing model internals:

* Logical axis names. Every parameter carries one per dimension (``nnx.with_partitioning``),
  and every sharding-constraint hook call (``constrain(x, axes)``) names each activation
  dimension. A caller maps them to mesh axes (e.g. ``("mlp", "model")``), the same scheme as
  MaxText's ``logical_axis_rules`` and ``flax.linen.partitioning``.
* Checkpoint names (``jax.ad_checkpoint.checkpoint_name``) on intermediates inside a block,
  so that name-based remat policies such as ``save_only_these_names("query_proj")`` can pick
  which activations to keep. The vocabulary follows MaxText's (``layers/attentions.py``,
  ``layers/linears.py``) so that policies written for MaxText carry over.
"""

from __future__ import annotations

# Parameter axes. Stacked (scanned) block parameters get "layers" prepended by nnx.vmap.
VOCAB = "vocab"  # rows of the token embedding, columns of the unembedding
EMBED = "embed"  # model width d_model
HEADS = "heads"  # query heads
KV_HEADS = "kv_heads"  # key/value heads (== heads for multi-head attention)
HEAD_DIM = "head_dim"  # per-head width
MLP = "mlp"  # MLP hidden width d_ff
LAYERS = "layers"  # leading axis of the stacked blocks
POS = "pos"  # rows of the learned position table (GPT-2 only)
NORM = "norm"  # norm scale/bias vectors: separate from "embed" so rules can replicate them
# Mixture of experts and multi-head latent attention. "exp" is MaxText's name.
EXPERT = "exp"  # routed experts: leading axis of the expert weights, of dispatched activations
# The router's expert column (its weight's E outputs, the selection bias): every device needs all
# E scores of its tokens for the top-k, so no rule shards it, as MaxText's gate kernel is
# ("embed", None) (layers/moe.py, GateLogit kernel_axes) while its expert weights are "exp".
EXPERT_SCORES = "exp_scores"
Q_LORA = "q_lora"  # MLA's query latent c^Q (q_lora_rank)
KV_LORA = "kv_lora"  # MLA's key/value latent c^KV (kv_lora_rank; + the RoPE key in its down-projection)

LOGICAL_AXES: tuple[str, ...] = (
  VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP, LAYERS, POS, NORM, EXPERT, EXPERT_SCORES, Q_LORA, KV_LORA,
)

# Activation-only axes: never on a parameter, used only in `constrain` calls, together with
# EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP and VOCAB above.
BATCH = "batch"
SEQ = "seq"
# The sequence of the residual stream and what is elementwise on it (the norms, the dropouts, the
# residual adds): MaxText's "activation_norm_length". The rules split it as "seq" is split, and,
# with Megatron's sequence parallelism (Korthikanti et al. 2022, section 4.2.2), over the tensor
# axis too; "seq" marks the activations a column-parallel matmul takes in (gathered there).
NORM_SEQ = "norm_seq"
ACTIVATION_AXES: tuple[str, ...] = (BATCH, SEQ, NORM_SEQ)

# Checkpoint names; shapes and meaning are documented in the package docstring.
QUERY_PROJ = "query_proj"
KEY_PROJ = "key_proj"
VALUE_PROJ = "value_proj"
CONTEXT = "context"
OUT_PROJ = "out_proj"
MLPWI = "mlpwi"
# SwiGLU's two input projections before the activation, MaxText's names (layers/linears.py):
# "mlpwi_0" the gate x W_gate, "mlpwi_1" the up projection x W_up. Its "minimal" remat policy
# saves these two, not the product after the activation ("mlpwi" here).
MLPWI_0 = "mlpwi_0"
MLPWI_1 = "mlpwi_1"
MLPWO = "mlpwo"

# Every model tags these (MLA models too: their q, k, v, context and output carry the same names).
DENSE_CHECKPOINT_NAMES: tuple[str, ...] = (
  QUERY_PROJ,
  KEY_PROJ,
  VALUE_PROJ,
  CONTEXT,
  OUT_PROJ,
  MLPWI,
  MLPWI_0,
  MLPWI_1,
  MLPWO,
)

# MoE layers (models/moe.py). The expert MLP's names are MaxText's (layers/moe.py tags its
# gate and up projections and its output projection moe_mlpwi_0, moe_mlpwi_1, moe_mlpwo);
# MaxText names no router output, so "router_logits" is ours (Hugging Face's word for them).
ROUTER_LOGITS = "router_logits"  # [B, T, E] float32, before softmax/sigmoid
MOE_MLPWI_0 = "moe_mlpwi_0"  # routed experts' gate projection, per routed token copy
MOE_MLPWI_1 = "moe_mlpwi_1"  # routed experts' up projection
MOE_MLPWO = "moe_mlpwo"  # routed experts' down projection, before the weighted combine
MOE_CHECKPOINT_NAMES: tuple[str, ...] = (ROUTER_LOGITS, MOE_MLPWI_0, MOE_MLPWI_1, MOE_MLPWO)

# Multi-head latent attention (models/mla.py), MaxText's names (layers/attention_mla.py).
QUERY_WA_PROJ = "query_wa_proj"  # [B, T, q_lora] query down-projection, before its RMSNorm
MLA_Q = "mla_q"  # the same after the RMSNorm
KV_WA_PROJ = "kv_wa_proj"  # [B, T, kv_lora + rope] key/value down-projection and RoPE key, before the norm
MLA_KV = "mla_kv"  # [B, T, kv_lora] the latent after its RMSNorm: what the inference cache holds
MLA_CHECKPOINT_NAMES: tuple[str, ...] = (QUERY_WA_PROJ, MLA_Q, KV_WA_PROJ, MLA_KV)

# The scanned stack (models/transformer.py) tags each layer's input, the residual stream the scan
# carries into the layer, MaxText's name (layers/decoders.py and its decoder layers:
# checkpoint_name(inputs, "decoder_layer_input")). Under jax.checkpoint it is what every policy
# keeps for the layer's recomputation; naming it lets a policy move it to host memory
# (``full_offloaded``), which is what dominates a long sequence once everything else is recomputed.
DECODER_LAYER_INPUT = "decoder_layer_input"  # [B, T, D]
LAYER_CHECKPOINT_NAMES: tuple[str, ...] = (DECODER_LAYER_INPUT,)

CHECKPOINT_NAMES: tuple[str, ...] = (
  DENSE_CHECKPOINT_NAMES + MOE_CHECKPOINT_NAMES + MLA_CHECKPOINT_NAMES + LAYER_CHECKPOINT_NAMES
)

# The pipeline (models/pipeline.py), MaxText's name (layers/pipeline.py): the stage input of one
# pipeline iteration, [S, mb, T, D], which the iteration scan keeps for every iteration (GPipe's
# stash). PIPELINE_WEIGHTS tags a circular pipeline's weights of the current repeat, gathered per
# iteration, so the iteration's remat policy can decline to keep a copy of them per iteration.
ITERATION_INPUT = "iteration_input"
PIPELINE_WEIGHTS = "pipeline_weights"

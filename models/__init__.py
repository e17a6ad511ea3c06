"""Flax NNX decoder-only Transformers (installed as ``jaxmem.models``).

GPT-2 and Llama 3 families at their published sizes, built so that XLA's memory figures for a
train step look like those of a production model: scanned layers, mixed precision (float32
parameters, bfloat16 compute, float32 logits; attention scores in the compute dtype unless
float32 is asked for, as in MaxText), logical axis names on every
parameter and sharding-constraint hooks on the main activations.

Public interface::

  ModelConfig                      frozen, keyword-only dataclass; presets as classmethods
  PRESETS: dict[str, () -> ModelConfig]   keyed by CLI name ("tiny", "gpt2-small", "llama3-8b", ...)
  get_config(name, **overrides) -> ModelConfig    JaxmemError on unknown names/fields
  count_params(cfg) -> int         closed form, equals the built model's parameter count
  Transformer(cfg, *, rngs)        nnx.Module; __call__(tokens_bt, *, remat=None, constrain=None,
                                   attend=None) -> float32 logits_btv (= logits(hidden(...)));
                                   hidden(tokens_bt, ...) -> final-normed x_btd;
                                   logits(x_btd, *, constrain=None) -> float32 logits_btv;
                                   loss(tokens_bt, targets_bt, *, remat, constrain, attend,
                                   vocab_tiles=1) -> mean cross entropy (vocabulary-tiled if > 1);
                                   cached(tokens_bt, cache, *, pos=0, constrain=None, weights=None,
                                   last_only=True, attend=None) -> (logits, KVCache): prefill and
                                   decode (attend: prefill at pos=0 only)
  cross_entropy(x_btd, targets_bt, logits_fn, *, vocab_tiles=1, constrain=...)  (loss.py)
  KVCache(k_lbksh, v_lbksh)        the KV cache, [layers, batch, kv_heads, context, head_dim] each;
                                   CACHE_AXES its logical axes; kv_cache_bytes(cfg, batch=, context=)
  AttendFn, dot_attend, chunked_attend   how attention is computed (see attention_ops.py)
  IMPLEMENTATIONS, ATTENTION_NAMES, AttentionImpl, AttentionShapes, AttentionChoice,
  choose_attention(requested, *, platform, shapes, mesh=None, qk_dtype=None, deviceless=True)
                                   the attention registry and the per-target "auto" choice
                                   (attention_registry.py; kernels in attention_kernels.py)
  LOGICAL_AXES, ACTIVATION_AXES, CHECKPOINT_NAMES   the name vocabularies below

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

``constrain(x, axes)`` is called with ``ACTIVATION_AXES`` ("batch", "seq") followed by the
names above: embeddings and residual stream ("batch", "seq", "embed"); q ("batch", "seq",
"heads", "head_dim"); k and v ("batch", "seq", "kv_heads", "head_dim"); attention context
("batch", "seq", "heads", "head_dim"); MLP hidden ("batch", "seq", "mlp"); attention and MLP
outputs ("batch", "seq", "embed"); logits ("batch", "seq", "vocab").

Checkpoint names (``CHECKPOINT_NAMES``; ``jax.ad_checkpoint.checkpoint_name`` tags inside
each block, MaxText's vocabulary, usable with ``jax.checkpoint_policies.save_only_these_names``
and friends; B batch, T seq, N heads, K kv heads, H head_dim, D d_model, F d_ff; all in the
compute dtype):

  query_proj   [B, T, N, H]  query projection (+ bias for GPT-2), before RoPE
  key_proj     [B, T, K, H]  key projection, before RoPE
  value_proj   [B, T, K, H]  value projection
  context      [B, T, N, H]  softmax(q k^T) v: attention output before the output projection
  out_proj     [B, T, D]     attention output projection (+ bias), before the residual add
  mlpwi        [B, T, F]     MLP hidden after the input projection(s) and the activation:
                             gelu(x W_in + b) for GPT-2, silu(x W_gate) * (x W_up) for Llama
  mlpwi_0      [B, T, F]     SwiGLU's gate projection x W_gate, before the activation (Llama only)
  mlpwi_1      [B, T, F]     SwiGLU's up projection x W_up (Llama only)
  mlpwo        [B, T, D]     MLP output projection (+ bias), before the residual add

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
  choose_attention,
)
from .cache import CACHE_AXES, KVCache, kv_cache_bytes
from .config import PRESETS, ModelConfig, get_config
from .counting import count_params
from .layers import Constrain
from .loss import cross_entropy
from .names import ACTIVATION_AXES, CHECKPOINT_NAMES, LOGICAL_AXES
from .transformer import RematPolicy, Transformer, WeightHook

__all__ = [
  "ACTIVATION_AXES",
  "ATTENTION_NAMES",
  "AttendFn",
  "AttentionChoice",
  "AttentionImpl",
  "AttentionShapes",
  "IMPLEMENTATIONS",
  "choose_attention",
  "chunked_attend",
  "cross_entropy",
  "dot_attend",
  "CACHE_AXES",
  "KVCache",
  "WeightHook",
  "kv_cache_bytes",
  "CHECKPOINT_NAMES",
  "Constrain",
  "LOGICAL_AXES",
  "ModelConfig",
  "PRESETS",
  "RematPolicy",
  "Transformer",
  "count_params",
  "get_config",
]

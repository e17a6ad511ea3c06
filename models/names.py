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

LOGICAL_AXES: tuple[str, ...] = (VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP, LAYERS, POS, NORM)

# Activation-only axes: never on a parameter, used only in `constrain` calls, together with
# EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP and VOCAB above.
BATCH = "batch"
SEQ = "seq"
ACTIVATION_AXES: tuple[str, ...] = (BATCH, SEQ)

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

CHECKPOINT_NAMES: tuple[str, ...] = (
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

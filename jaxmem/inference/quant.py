"""Weight formats for inference: bf16, fp16, fp8 (e4m3), int8 and int4, stored as the compiler sees them.

``bf16`` and ``fp16`` store every parameter in that float type. ``fp8``, ``int8`` and ``int4``
store each matmul weight (attention and MLP projections, routed experts, multi-head latent
attention's projections, the embedding and the unembedding; not an MoE router) quantized, symmetric, with one float32 scale per *output channel* (per-channel absmax
quantization, as in LLM.int8's vector-wise scheme, Dettmers et al. 2022, eq. 1, without its
outlier decomposition):

  scale_c = max_i |W_ic| / qmax,   W_q = round(W / scale) (int) or cast(W / scale) (fp8),
  W ~= W_q * scale

with qmax 127 (int8), 7 (int4) and 448 (float8_e4m3fn's largest finite value, Micikevicius
et al. 2022, table 1). Norm scales, biases and GPT-2's position table stay in bfloat16: they are
a rounding error of the total and are used elementwise, not in a matmul.

Quantized weights live in the parameter tree as :class:`QTensor` (values and scales);
:func:`weight_hook` dequantizes them where the model uses them (inside the scanned layer body:
see ``jaxmem.models.Transformer.cached``), so the compiler sees the stored bytes as arguments
and the dequantized copy, if it materialises at all, as a temporary of one layer.

int4 is stored as ``jnp.int4``; XLA packs it two to a byte on TPU and GPU (argument bytes are
half of int8's), which :func:`stored_bytes` counts with the dtype's bit width, not numpy's
one-byte itemsize.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jaxmem.records import Record
from jaxmem.registry import Registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightFormat(Record):
  """How parameters are stored: ``dtype``, and ``qmax`` when matmul weights carry scales."""

  name: str
  dtype: str
  qmax: float | None = None  # None: a plain cast, no scales
  integer: bool = False
  description: str = ""

  @property
  def quantized(self) -> bool:
    return self.qmax is not None

  @property
  def bits(self) -> int:
    return jax.dtypes.itemsize_bits(jnp.dtype(self.dtype))


WEIGHT_FORMATS: Registry[WeightFormat] = Registry("weight format", {
  "bf16": WeightFormat(name="bf16", dtype="bfloat16", description="bfloat16, no scales"),
  "fp16": WeightFormat(name="fp16", dtype="float16", description="float16, no scales (cast to the compute dtype at use)"),
  "fp8": WeightFormat(name="fp8", dtype="float8_e4m3fn", qmax=448.0, description="float8 e4m3, per-output-channel float32 scales"),
  "int8": WeightFormat(name="int8", dtype="int8", qmax=127.0, integer=True, description="int8, per-output-channel float32 scales"),
  "int4": WeightFormat(name="int4", dtype="int4", qmax=7.0, integer=True, description="int4 (two per byte), per-output-channel float32 scales"),
}, field="weights")
SCALE_DTYPE = jnp.float32
# The dtype of parameters a quantized format leaves unquantized (norms, biases, positions).
UNQUANTIZED_DTYPE = "bfloat16"

# Matmul weights by parameter name -> the axes their matmul contracts (of the unstacked
# parameter); a scale is kept for every other axis (the output channels).
CONTRACTED_AXES: dict[str, tuple[int, ...]] = {
  "w_q_dnh": (0,), "w_k_dkh": (0,), "w_v_dkh": (0,), "w_o_nhd": (0, 1),
  "w_in_df": (0,), "w_out_fd": (0,), "w_gate_df": (0,), "w_up_df": (0,), "w_down_fd": (0,),
  "unembed_dv": (0,),
  # The embedding is gathered by row and, when tied, contracts over embed: one scale per row.
  "table_vd": (1,),
  # Gemma 4's per-layer embeddings (models/transformer.py): the table gathered by row like the
  # embedding (E2B's 2.35B of its 4.63B parameters), its projection and each layer's gate and
  # projection back to d_model.
  "ple_table_vq": (1,), "ple_proj_dq": (0,), "ple_gate_dq": (0,), "ple_proj_qd": (0,),
  # Routed experts (models/moe.py): a scale per expert and output channel.
  "w_gate_edf": (1,), "w_up_edf": (1,), "w_down_efd": (1,),
  # Multi-head latent attention (models/mla.py). W^UK contracts its latent axis in the naive
  # form (prefill) and its head_dim axis in the absorbed one (decode): one scale per head
  # serves both. (w_q_dnh, MLA without a query latent, is above.)
  "w_q_a_dq": (0,), "w_q_b_qnh": (0,), "w_kv_a_dx": (0,), "w_k_b_cnh": (0, 2), "w_v_b_cnv": (0,),
  "w_o_nvd": (0, 1),
  # Left out, so kept in bfloat16: the router (w_router_de), whose scores pick the experts, as
  # DeepSeek-V3's FP8 recipe keeps "MoE gating modules" in their original precision
  # (arXiv 2412.19437, sec. 3.3.1).
}
# Stacked block parameters carry a leading "layers" axis: the dense stack and the MoE stack, and
# a patterned model's stacks blocks_{segment}_{position} (models/transformer.py).
_STACKED = ("blocks", "moe_blocks")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QTensor:
  """A quantized weight: ``q`` (stored values) and ``scale`` (float32, 1 on contracted axes)."""

  q: Any
  scale: Any


def is_qtensor(x: Any) -> bool:
  return isinstance(x, QTensor)


def stored_bytes(shape: tuple[int, ...], dtype: Any) -> float:
  """Bytes of an array counted by bit width (int4: half a byte per element)."""
  return math.prod(shape) * jax.dtypes.itemsize_bits(jnp.dtype(dtype)) / 8


def scale_shape(shape: tuple[int, ...], contracted: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(1 if i in contracted else d for i, d in enumerate(shape))


def _param_name(path) -> tuple[str | None, bool]:
  """(parameter name, stacked) from a tree path into an nnx.State."""
  keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
  name = next((k for k in reversed(keys) if k in CONTRACTED_AXES or k.startswith(("w_", "b_", "scale", "bias", "pos", "table", "unembed"))), None)
  return name, any(k in _STACKED or k.startswith("blocks_") for k in keys)


def contracted_for(path, ndim: int) -> tuple[int, ...] | None:
  """The contracted axes (in the stored, possibly stacked, array) of a matmul weight, else None."""
  name, stacked = _param_name(path)
  if name not in CONTRACTED_AXES:
    return None
  off = 1 if stacked else 0
  axes = tuple(a + off for a in CONTRACTED_AXES[name])
  return axes if max(axes) < ndim else None


def quantize(w: jax.Array, fmt: WeightFormat, contracted: tuple[int, ...]) -> QTensor:
  """Per-output-channel symmetric quantization (module docstring); ``w`` concrete or traced."""
  w32 = w.astype(jnp.float32)
  absmax = jnp.max(jnp.abs(w32), axis=contracted, keepdims=True)
  # An all-zero channel gets scale 1 rather than a division by zero.
  scale = jnp.where(absmax > 0, absmax / fmt.qmax, 1.0).astype(SCALE_DTYPE)
  x = w32 / scale
  if fmt.integer:
    x = jnp.clip(jnp.round(x), -fmt.qmax, fmt.qmax)
  return QTensor(x.astype(fmt.dtype), scale)


def dequantize(v: Any, dtype: Any) -> jax.Array:
  """A stored value as an array of ``dtype``: QTensor values times scales, or a plain cast."""
  if isinstance(v, QTensor):
    return v.q.astype(dtype) * v.scale.astype(dtype)
  # Plain arrays (bf16, fp16) are cast where the model uses them, as in training.
  return v


def weight_hook(dtype: Any):
  """The model's ``weights`` hook: dequantizes every QTensor in a tree to ``dtype`` (the
  compute dtype); plain arrays pass unchanged."""

  def hook(tree: Any) -> Any:
    return jax.tree.map(lambda v: dequantize(v, dtype), tree, is_leaf=is_qtensor)

  return hook


def quantize_params(params: Any, fmt: WeightFormat) -> Any:
  """Concrete (or abstract, under ``jax.eval_shape``) parameters stored in ``fmt``."""

  def one(path, w):
    contracted = contracted_for(path, w.ndim)
    if fmt.quantized and contracted is not None:
      return quantize(w, fmt, contracted)
    return w.astype(UNQUANTIZED_DTYPE if fmt.quantized else fmt.dtype)

  return jax.tree_util.tree_map_with_path(one, params)


def abstract_quantized(params: Any, shardings: Any, fmt: WeightFormat) -> tuple[Any, Any]:
  """(abstract stored params, their shardings) for ``fmt``, from abstract float params and
  their NamedShardings. Quantized values shard like the weight; a scale like the weight with
  its contracted (size-1) axes unsharded."""

  def one(path, a, s):
    contracted = contracted_for(path, len(a.shape))
    if not (fmt.quantized and contracted is not None):
      dt = UNQUANTIZED_DTYPE if fmt.quantized else fmt.dtype
      return jax.ShapeDtypeStruct(a.shape, dt, sharding=s), s
    spec = tuple(s.spec) + (None,) * (len(a.shape) - len(s.spec))
    s_scale = NamedSharding(s.mesh, PartitionSpec(*(None if i in contracted else e for i, e in enumerate(spec))))
    q = jax.ShapeDtypeStruct(a.shape, fmt.dtype, sharding=s)
    sc = jax.ShapeDtypeStruct(scale_shape(a.shape, contracted), SCALE_DTYPE, sharding=s_scale)
    return QTensor(q, sc), QTensor(s, s_scale)

  pairs = jax.tree_util.tree_map_with_path(one, params, shardings)
  is_pair = lambda x: isinstance(x, tuple) and len(x) == 2 and not isinstance(x, QTensor)  # noqa: E731
  return jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair), jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)


def tree_stored_bytes(tree: Any) -> tuple[float, float]:
  """(values, scales) bytes of a stored tree, whole model, by bit width."""
  values = scales = 0.0
  for leaf in jax.tree.leaves(tree, is_leaf=is_qtensor):
    if isinstance(leaf, QTensor):
      values += stored_bytes(leaf.q.shape, leaf.q.dtype)
      scales += stored_bytes(leaf.scale.shape, leaf.scale.dtype)
    else:
      values += stored_bytes(leaf.shape, leaf.dtype)
  return values, scales


def tree_stored_bytes_per_device(tree: Any, shardings: Any) -> float:
  """Bytes one device holds: each leaf's shard shape at its bit width."""
  total = 0.0
  for leaf, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True):
    total += stored_bytes(s.shard_shape(leaf.shape), leaf.dtype)
  return total

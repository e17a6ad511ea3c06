"""Closed-form memory figures (the rules of thumb), and the same figures held against the compiler.

Sources, one per formula:

* Parameter count: :func:`jaxmem.models.count_params` (exact for the presets; formula in
  ``models/counting.py``).
* Model state per parameter: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
  Training Trillion Parameter Models", section 3.1: mixed-precision Adam keeps fp16 parameters
  and gradients (2 + 2 bytes) and K = 12 bytes of optimizer state (fp32 master weights,
  momentum and variance), 16 bytes per parameter in all ("2Ψ + 2Ψ + KΨ").
* The same from the dtypes of a train step (``param_dtype``, ``master_dtype``,
  ``moments_dtype``, ``grad_reduce_dtype``, as :mod:`jaxmem.program.precision` builds it):
  parameters and gradients at their dtypes' widths, optimizer state = master copy + moments x
  the moments' width; bf16 parameters with a float32 master and float32 Adam moments are ZeRO's
  2 + 2 + 12. Megatron-LM's distributed optimizer (docs, "Distributed Optimizer": "bf16 param,
  fp32 grads: 6 + 12/d" bytes per parameter over d data-parallel ranks) keeps parameters and
  gradients whole and shards the optimizer state: p + g + o/d.
* Activations per layer: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", section 4 and table 2 (s sequence, b micro-batch, h hidden, a heads,
  t tensor-parallel size, 16-bit activations, dropout included):
  no parallelism ``sbh(34 + 5as/h)`` (eq. 2); tensor parallel ``sbh(10 + 24/t + 5as/(ht))``
  (eq. 3); tensor + sequence parallel ``sbh/t (34 + 5as/h)`` (eq. 4); selective recompute
  with tensor parallel ``sbh(10 + 24/t)``; with both ``34 sbh/t`` (eq. 6); full recompute
  ``2sbh`` (only each layer's input is kept).
* KV cache: ``2 * layers * kv_heads * head_dim * context * batch * bytes`` (keys and values,
  per kv head: grouped-query attention, Ainslie et al. 2023); for multi-head latent attention
  ``layers * (kv_lora_rank + qk_rope_head_dim) * context * batch * bytes`` (DeepSeek-V2, arXiv
  2405.04434, table 1: (d_c + d_h^R) l elements per token; the latent and the decoupled RoPE key).
* Mixture of experts: total and active parameters from ``count_params`` and
  ``count_active_params`` (``models/counting.py``); expert parameters are the routed experts'
  weights, L_moe * E * 3 * D * F_e, and their state (parameters, gradients, optimizer state) is
  what an ``expert`` mesh axis divides. Dispatch buffers of one MoE layer for N tokens (B
  sequences of T), k experts per token, in the compute dtype:
  dropless ``N*k*D + 3*N*k*F_e + N*k*D`` (the N*k token copies sorted by expert, the grouped
  matmuls' gate, up and gated hidden, the experts' output before the weighted sum: MaxText's
  megablox path, layers/moe.py ``permute``/``gmm``/``unpermute``; DeepSeek-V3, arXiv 2412.19437,
  sec. 3.2.2, dispatches each token to its k = 8 routed experts);
  capacity ``2*B*T*E*C + E*B*C*(2*D + 3*F_e)`` with C = ceil(capacity_factor * T * k / E) slots
  (GShard, Lepikhin et al. 2020, sec. 2.2 and Algorithm 1: the dispatch mask and combine weights
  [B, T, E, C], and the dispatched tokens and expert outputs [E, B, C, D] with the expert
  hidden [E, B, C, F]).
* Weights for inference: parameters x bytes per parameter of the format (bf16/fp16 2, fp8 1,
  int4 0.5), the arithmetic of Hugging Face's Llama 3.1 deployment guide (checkpoint only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jaxmem.errors import BadValue, JaxmemError
from jaxmem.inputs import Number, Switch, Text, Whole, optional
from jaxmem.models import (
    ModelConfig, StepChoices, cache_bytes, count_active_params, count_params, expert_capacity, get_config,
)
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import MOMENTS_DTYPE_OPTIMIZERS, OPTIMIZERS
from jaxmem.program.precision import Precision, check_dtype, itemsize
from jaxmem.records import Composed, Record, composed

SOURCES = {
    "params": "count_params(cfg) (models/counting.py)",
    "model_state": "Rajbhandari et al. 2020 (ZeRO), sec. 3.1: 2 + 2 + K bytes per parameter, K = 12 for mixed-precision Adam",
    "distributed_optimizer": "Megatron-LM distributed optimizer: p + g + o/d bytes per parameter over d data-parallel ranks (bf16 params, fp32 grads: 6 + 12/d)",
    "activations": "Korthikanti et al. 2022, table 2 / eqs. 2-6: sbh(34 + 5as/h) per layer and its parallel and recompute variants",
    "kv_cache": "2 * layers * kv_heads * head_dim * context * batch * bytes; MLA: layers * (kv_lora_rank + qk_rope_head_dim) * context * batch * bytes (DeepSeek-V2, table 1)",
    "moe_params": "count_params / count_active_params (models/counting.py); expert parameters L_moe * E * 3 * D * F_e",
    "dispatch_dropless": "per MoE layer N*k*D + 3*N*k*F_e + N*k*D (MaxText megablox permute/gmm/unpermute; DeepSeek-V3 sec. 3.2.2: k copies per token)",
    "dispatch_capacity": "per MoE layer 2*B*T*E*C + E*B*C*(2*D + 3*F_e), C = ceil(capacity_factor*T*k/E) (GShard sec. 2.2, Algorithm 1)",
    "weights": "parameters x bytes per parameter of the format (Hugging Face Llama 3.1 guide: checkpoint only)",
}

# (param, gradient, optimizer state) bytes per parameter, by precision, for Adam-family
# optimizers; other optimizers scale the state by their number of moments (below).
PRECISIONS: dict[str, tuple[float, float, float]] = {
    # ZeRO sec. 3.1: fp16 params and grads; fp32 master copy + momentum + variance (K = 12).
    "mixed": (2, 2, 12),
    # jaxmem's own train step: float32 params and grads, float32 moments (4 + 4 + 8).
    "fp32": (4, 4, 8),
    # Everything in bf16 (no master copy): 2 + 2 + 4.
    "bf16": (2, 2, 4),
}


def state_moments(optimizer: str) -> float:
  """The parameter-sized arrays of state ``optimizer`` keeps per parameter (Adam: m and v), as
  it declares them in the registry (:class:`jaxmem.program.optimizers.Optimizer`); one line
  where it is unknown or declares none, never a guess."""
  opt = OPTIMIZERS.get(optimizer)
  if opt.state_moments is None:
    raise JaxmemError(f"the closed form has no optimizer state for {optimizer}: it declares no `state_moments` in the registry")
  return opt.state_moments


# The dtypes of each precision preset: (params, gradients, master copy, moments).
PRESET_DTYPES: dict[str, tuple[str, str, str | None, str]] = {
    "mixed": ("bfloat16", "bfloat16", "float32", "float32"),
    "fp32": ("float32", "float32", None, "float32"),
    "bf16": ("bfloat16", "bfloat16", None, "bfloat16"),
}
RECOMPUTE = ("none", "selective", "full")
# How a step runs a model where the estimate is not told (the capacity factor, the experts'
# implementation): every model's default step choices.
DEFAULT_CHOICES = StepChoices()
WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
H100_80GB = 80e9  # the seeds' "H100 SXM has 80 GB of HBM3" (decimal GB, as NVIDIA quotes it)


def bytes_per_param(optimizer: str = "adamw", precision: str = "mixed") -> tuple[float, float, float]:
  """(parameter, gradient, optimizer state) bytes per parameter (ZeRO sec. 3.1).

  Mixed-precision Adam: (2, 2, 12), 16 in all. Optimizers with fewer moments keep fewer
  state bytes: the master copy (mixed precision only: 4 bytes) plus 4 bytes per moment
  (2 in ``bf16`` precision)."""
  if precision not in PRECISIONS:
    raise JaxmemError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
  moments = state_moments(optimizer)
  p, g, _ = PRECISIONS[precision]
  moment = 2 if precision == "bf16" else itemsize(OPTIMIZERS[optimizer].state_dtype or "float32")
  master = 4 if precision == "mixed" else 0
  return p, g, master + moment * moments


def layout_bytes_per_param(
    optimizer: str = "adamw", *, param_dtype: str | None = None, master_dtype: str | None = None,
    moments_dtype: str | None = None, grad_reduce_dtype: str | None = None,
) -> tuple[float, float, float]:
  """(parameter, gradient, optimizer state) bytes per parameter of a train step with these
  dtypes, defaulted as jaxmem's step defaults them (:mod:`jaxmem.program.precision`): params
  float32, gradients in the parameters' dtype, moments in the master copy's else the
  parameters'. bf16 params + float32 master + float32 Adam moments: ZeRO's (2, 2, 12)."""
  moments = state_moments(optimizer)
  params = param_dtype or "float32"
  check_dtype("param_dtype", params)
  prec = Precision(master_dtype=master_dtype, moments_dtype=moments_dtype, grad_reduce_dtype=grad_reduce_dtype)
  prec.check(params)
  if moments_dtype is not None and optimizer not in MOMENTS_DTYPE_OPTIMIZERS:
    raise JaxmemError(f"`moments_dtype` applies to {', '.join(MOMENTS_DTYPE_OPTIMIZERS)}; not to {optimizer}")
  width = itemsize
  moment = width(OPTIMIZERS[optimizer].state_dtype or moments_dtype or prec.update_dtype(params))
  master = width(master_dtype) if master_dtype else 0
  return width(params), width(prec.reduce_dtype(params)), master + moment * moments


def activation_bytes_per_layer(
    cfg: ModelConfig, *, batch: int, seq: int, tensor: int = 1, sequence_parallel: bool = False, recompute: str = "none"
) -> float:
  """Korthikanti et al. 2022, table 2: bytes of activations one layer keeps for backward."""
  s, b, h, a, t = seq, batch, cfg.d_model, cfg.num_heads, tensor
  if recompute not in RECOMPUTE:
    raise JaxmemError(f"unknown recompute {recompute!r}; valid: {', '.join(RECOMPUTE)}")
  if recompute == "full":
    return 2 * s * b * h  # only the layer's 16-bit input
  attn_scores = 5 * a * s / h  # the softmax input/output and dropout mask: the s^2 terms
  if recompute == "selective":
    attn_scores = 0.0  # recomputed (sec. 4.2)
  if sequence_parallel:
    return s * b * h / t * (34 + attn_scores)  # eq. 4 / eq. 6
  return s * b * h * (10 + 24 / t + attn_scores / t)  # eq. 3 (t = 1: eq. 2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EstimateWorkload(Record):
  """What an estimate is for: the model and its parameter count, the optimizer, the precision (a
  preset: mixed, fp32, bf16; or ``dtypes`` where the dtypes were given), the workload, the tensor
  parallelism, and whether sequence parallelism and which recompute the activations assume."""

  model: str
  params: int
  optimizer: str
  precision: str
  batch: int
  seq: int
  tensor: int
  sequence_parallel: bool
  recompute: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingMemory(Record):
  """The training step's closed forms, whole model: bytes per parameter, the parameters, gradients
  and optimizer state and their sum (``model_state_bytes``), and the activations (per layer and
  in all)."""

  bytes_per_param: float
  param_bytes: float
  gradient_bytes: float
  optimizer_state_bytes: float
  model_state_bytes: float
  activation_bytes_per_layer: float
  activation_bytes: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingMemory(Record):
  """Inference's closed forms, whole model: the KV cache at ``kv_context`` x ``kv_batch`` (and
  per token of one sequence: what one more token of context adds), the weights in three formats,
  and the model state in H100 80 GB equivalents."""

  kv_context: int
  kv_batch: int
  kv_cache_bytes: float
  weight_bytes_bf16: float
  weight_bytes_fp8: float
  weight_bytes_int4: float
  h100_80gb_equivalents: float
  kv_cache_bytes_per_token: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertMemory(Record):
  """A mixture of experts' closed forms (equal to the totals, and 0 or None, for a dense model):
  active and routed parameters, the routed experts' state (parameters + gradients + optimizer
  state) and the rest's, and the dispatch buffers per MoE layer and over every MoE layer."""

  active_params: int = 0
  expert_params: int = 0
  expert_state_bytes: float = 0.0
  non_expert_state_bytes: float = 0.0
  capacity_factor: float | None = None
  dispatch_bytes_dropless_per_layer: float | None = None
  dispatch_bytes_capacity_per_layer: float | None = None
  dispatch_bytes_dropless: float | None = None
  dispatch_bytes_capacity: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StateLayout(Record):
  """The layout's dtypes (the preset's, or as given) and Megatron's distributed optimizer over
  ``data`` ranks: parameters and gradients whole, the optimizer state divided (per rank); and the
  sources of the formulas."""

  param_dtype: str | None = None
  gradient_dtype: str | None = None
  master_dtype: str | None = None
  moments_dtype: str | None = None
  data: int = 1
  distributed_bytes_per_param: float = 0.0
  distributed_model_state_bytes: float = 0.0
  sources: tuple[str, ...] = tuple(f"{k}: {v}" for k, v in SOURCES.items())

  def words(self, *, no_master: str = "no master, ") -> str:
    """The layout's dtypes in words: parameters, gradients, master copy (``no_master`` where
    none) and moments."""
    return (f"{self.param_dtype} params, {self.gradient_dtype} gradients, "
            + (f"{self.master_dtype} master, " if self.master_dtype else no_master)
            + f"{self.moments_dtype or 'no'} moments")


@composed
class Estimate(Composed):
  """Closed-form figures for one model and workload, whole model (not per device) unless named
  ``*_per_device``: the workload, the training memory, the serving memory, the experts' and the
  state's layout, each its own record, flat in ``as_dict()`` and attribute access
  (``e.model_state_bytes``: params + gradients + optimizer state)."""

  workload: EstimateWorkload
  training: TrainingMemory
  serving: ServingMemory
  experts: ExpertMemory = dataclasses.field(default_factory=ExpertMemory)
  layout: StateLayout = dataclasses.field(default_factory=StateLayout)


def kv_cache_bytes(cfg: ModelConfig, *, context: int, batch: int, bytes_per_element: float = 2) -> float:
  """2 * layers * kv_heads * head_dim * context * batch * bytes; for MLA, layers *
  (kv_lora_rank + qk_rope_head_dim) * context * batch * bytes (module docstring)."""
  return float(cache_bytes(cfg, batch=batch, context=context, bytes_per_element=bytes_per_element))


def expert_params(cfg: ModelConfig) -> int:
  """The routed experts' parameters: L_moe * E * 3 * D * F_e (0 for a dense model)."""
  return cfg.num_moe_layers * cfg.num_experts * 3 * cfg.d_model * cfg.expert_d_ff


def dispatch_bytes(
    cfg: ModelConfig, *, batch: int, seq: int, capacity_factor: float | None = None, bytes_per_element: float = 2
) -> tuple[float, float] | tuple[None, None]:
  """(dropless, capacity) dispatch-buffer bytes of one MoE layer for ``batch`` sequences of
  ``seq`` tokens (module docstring); (None, None) for a dense model."""
  if not cfg.is_moe:
    return None, None
  n, k, e, d, f = batch * seq, cfg.experts_per_token, cfg.num_experts, cfg.d_model, cfg.expert_d_ff
  factor = DEFAULT_CHOICES.capacity_factor if capacity_factor is None else capacity_factor
  c = expert_capacity(seq, k, e, factor)
  dropless = n * k * d + 3 * n * k * f + n * k * d
  capacity = 2 * batch * seq * e * c + e * batch * c * (2 * d + 3 * f)
  return dropless * bytes_per_element, capacity * bytes_per_element


def weight_bytes(cfg: ModelConfig, fmt: str) -> float:
  """Parameters x bytes per parameter of ``fmt`` (checkpoint only, no scales)."""
  if fmt not in WEIGHT_BYTES:
    raise JaxmemError(f"unknown weight format {fmt!r}; valid: {', '.join(WEIGHT_BYTES)}")
  return count_params(cfg) * WEIGHT_BYTES[fmt]


def estimate(
    *,
    model: str | ModelConfig = "gpt2-small",
    optimizer: str = "adamw",
    precision: str | None = None,
    batch: int = 8,
    seq: int = 1024,
    tensor: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    context: int | None = None,
    kv_batch: int | None = None,
    capacity_factor: float | None = None,
    param_dtype: str | None = None,
    master_dtype: str | None = None,
    moments_dtype: str | None = None,
    grad_reduce_dtype: str | None = None,
    data: int = 1,
) -> Estimate:
  """Every closed-form figure for one configuration (module docstring for the sources).
  ``precision`` a preset (default ``mixed``); or the train step's dtypes (``param_dtype``,
  ``master_dtype``, ``moments_dtype``, ``grad_reduce_dtype``: :func:`layout_bytes_per_param`),
  not both. ``data``: the ranks Megatron's distributed optimizer shards the state over."""
  batch, seq, tensor, data = (Whole()(v, f"`{k}`") for k, v in (("batch", batch), ("seq", seq), ("tensor", tensor), ("data", data)))
  context, kv_batch = (optional(Whole(), v, f"`{k}`") for k, v in (("context", context), ("kv_batch", kv_batch)))
  capacity_factor = optional(Number(above=0.0), capacity_factor, "`capacity_factor`")
  sequence_parallel = Switch()(sequence_parallel, "`sequence_parallel`")
  optimizer, recompute = Text()(optimizer, "`optimizer`"), Text()(recompute, "`recompute`")
  precision, param_dtype, master_dtype, moments_dtype, grad_reduce_dtype = (
      optional(Text(), v, f"`{k}`") for k, v in (("precision", precision), ("param_dtype", param_dtype),
                                                  ("master_dtype", master_dtype), ("moments_dtype", moments_dtype),
                                                  ("grad_reduce_dtype", grad_reduce_dtype)))
  if not isinstance(model, (str, ModelConfig)):
    raise BadValue("`model`", "a model's name, config.json path or Hub id, or a ModelConfig", model)
  cfg = get_config(model) if isinstance(model, str) else model
  if batch < 1 or seq < 1 or tensor < 1 or data < 1:
    raise JaxmemError(f"batch, seq, tensor and data must be at least 1 (got {batch}, {seq}, {tensor}, {data})")
  if capacity_factor is not None and not capacity_factor > 0:
    raise JaxmemError(f"`capacity_factor` must be > 0 (got {capacity_factor:g})")
  if capacity_factor is not None and not cfg.is_moe:
    raise JaxmemError(f"`capacity_factor` applies to mixture-of-experts models; {cfg.name} has no experts (drop it)")
  if sequence_parallel and tensor == 1:
    raise JaxmemError("`sequence_parallel` splits the activations over the tensor-parallel ranks: give `tensor` above 1")
  n = count_params(cfg)
  dtypes = dict(param_dtype=param_dtype, master_dtype=master_dtype, moments_dtype=moments_dtype, grad_reduce_dtype=grad_reduce_dtype)
  if any(v is not None for v in dtypes.values()):
    if precision is not None:
      raise JaxmemError("give `precision` (a preset) or the dtypes (`param_dtype`, `master_dtype`, ...), not both")
    p, g, o = layout_bytes_per_param(optimizer, **dtypes)
    precision = "dtypes"
    pd = param_dtype or "float32"
    layout = (pd, grad_reduce_dtype or pd, master_dtype, OPTIMIZERS[optimizer].state_dtype or moments_dtype or master_dtype or pd)
  else:
    precision = precision or "mixed"
    p, g, o = bytes_per_param(optimizer, precision)
    layout = PRESET_DTYPES[precision]
  if state_moments(optimizer) == 0:
    layout = (*layout[:3], None)
  per_layer = activation_bytes_per_layer(cfg, batch=batch, seq=seq, tensor=tensor, sequence_parallel=sequence_parallel, recompute=recompute)
  state = n * (p + g + o)
  ctx, kb = context or seq, kv_batch or batch
  experts = expert_params(cfg)
  dropless, capacity = dispatch_bytes(cfg, batch=batch, seq=seq, capacity_factor=capacity_factor)
  moe = dict(
      active_params=count_active_params(cfg), expert_params=experts, expert_state_bytes=experts * (p + g + o),
      non_expert_state_bytes=(n - experts) * (p + g + o), kv_cache_bytes_per_token=kv_cache_bytes(cfg, context=1, batch=1),
      capacity_factor=(DEFAULT_CHOICES.capacity_factor if capacity_factor is None else capacity_factor)
      if cfg.is_moe else None,
      dispatch_bytes_dropless_per_layer=dropless, dispatch_bytes_capacity_per_layer=capacity,
      dispatch_bytes_dropless=None if dropless is None else dropless * cfg.num_moe_layers,
      dispatch_bytes_capacity=None if capacity is None else capacity * cfg.num_moe_layers,
  )
  return Estimate(
      model=cfg.name, params=n, optimizer=optimizer, precision=precision, batch=batch, seq=seq, tensor=tensor,
      sequence_parallel=sequence_parallel, recompute=recompute, bytes_per_param=p + g + o,
      param_bytes=n * p, gradient_bytes=n * g, optimizer_state_bytes=n * o, model_state_bytes=state,
      activation_bytes_per_layer=per_layer, activation_bytes=per_layer * cfg.num_layers,
      kv_context=ctx, kv_batch=kb, kv_cache_bytes=kv_cache_bytes(cfg, context=ctx, batch=kb),
      weight_bytes_bf16=weight_bytes(cfg, "bf16"), weight_bytes_fp8=weight_bytes(cfg, "fp8"),
      weight_bytes_int4=weight_bytes(cfg, "int4"), h100_80gb_equivalents=state / H100_80GB,
      param_dtype=layout[0], gradient_dtype=layout[1], master_dtype=layout[2], moments_dtype=layout[3], data=data,
      distributed_bytes_per_param=p + g + o / data, distributed_model_state_bytes=n * (p + g + o / data), **moe,
  )


# --- estimate against the compiler ----------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison(Record):
  """One component, per device: the closed form, the compiler's figure, compiler/estimate."""

  component: str
  estimate_bytes: float | None
  compiler_bytes: float | None
  ratio: float | None
  note: str = ""
  source: str = ""  # the closed form and the dtypes it was given


_REMAT_TO_RECOMPUTE = {"none": "none", "full": "full", "nothing_saveable": "full"}


def _why(component: str, cfg: ModelConfig, remat: str, platform: str) -> str:
  reasons = []
  if component in ("temp", "total") and cfg.is_moe:
    reasons.append(
        "mixture of experts: the formula's MLP term is a dense MLP of d_ff; the dispatch buffers' closed form is added, "
        "the router's float32 scores and sort indices are not"
    )
  if component in ("temp", "total"):
    if cfg.style == "llama3":
      reasons.append("SwiGLU keeps three d_ff-wide tensors where the formula's GELU MLP keeps two of 4h")
      if cfg.num_kv_heads < cfg.num_heads:
        reasons.append("GQA projects k and v to kv_heads, not heads")
      reasons.append("no dropout masks (the formula counts them)")
    reasons.append("the temp also holds float32 intermediates (the loss's softmax, gradient casts) the formula leaves out")
    reasons.append("fusion and the compiler's scheduling change what is materialised at once")
    if platform == "cpu":
      reasons.append("XLA:CPU fuses and reuses less than an accelerator")
    if remat == "none":
      reasons.append("no flash attention here: the s x s scores are materialised, as the formula assumes")
  return "; ".join(reasons)


def estimate_vs_compiler(row: Any, *, precision: str | None = None, cfg: ModelConfig | None = None) -> list[Comparison]:
  """Estimate and compiler side by side, per device, for one compiled train step
  (a :class:`jaxmem.planning.sweep.Row`). The closed form takes the row's own dtypes
  (``param_dtype``, ``master_dtype``, ``moments_dtype``, ``grad_reduce_dtype``: ZeRO's
  2 + 2 + 12 for bf16 parameters with a float32 master); ``precision`` (a preset) instead where
  given, or where the row has no dtypes (``fp32``: jaxmem's step). A note is given wherever they
  differ by more than 20%. ``cfg``: the row's model (else looked up by the row's name, which a
  config.json model is not)."""
  cfg = cfg or get_config(row.model)
  mesh = shd.parse_mesh(row.mesh)
  axes = dict(mesh)
  dp = shd.data_parallel_size(mesh)
  t = axes.get("tensor", 1)
  weight_shards = axes.get("fsdp", 1) * t  # ZeRO-3 over fsdp, Megatron over tensor
  opt = row.optimizer
  recompute = _REMAT_TO_RECOMPUTE.get(row.remat, "selective")
  est = estimate(
      model=cfg, optimizer=opt, batch=max(1, row.batch // dp), seq=row.seq, tensor=t, recompute=recompute,
      sequence_parallel=bool(getattr(row, "sequence_parallel", False)),
      capacity_factor=getattr(row, "capacity_factor", None), **_row_layout(row, opt, precision),
  )
  # The routed experts' weights are also divided over expert (exp -> expert in the rules).
  expert_share = est.expert_params / est.params

  def per_device(whole: float) -> float:
    return whole * (1 - expert_share) / weight_shards + whole * expert_share / (weight_shards * axes.get("expert", 1))

  params, state, grads = (per_device(b) for b in (est.param_bytes, est.optimizer_state_bytes, est.gradient_bytes))
  acts = est.activation_bytes
  if cfg.is_moe:
    # The dispatch buffers of every MoE layer are saved for the backward pass; with full
    # recompute, one layer's exist at a time.
    impl = getattr(row, "moe_impl", None) or DEFAULT_CHOICES.moe_impl
    dispatch = est.dispatch_bytes_dropless_per_layer if impl == "dropless" else est.dispatch_bytes_capacity_per_layer
    acts += dispatch * (1 if recompute == "full" else cfg.num_moe_layers)
  # Logits: float32 [b, s, vocab] and their gradient, outside the per-layer formula.
  logits = 2 * 4 * est.batch * row.seq * cfg.vocab_size / t
  platform = row.target.split(":")[0]
  layout = f"{est.precision}: {est.layout.words(no_master='')}"
  pairs = [
      ("params", params, row.param_bytes, f"count_params x {est.param_dtype} ({layout})"),
      ("gradients", grads, None, f"count_params x {est.gradient_dtype}; the compiler's are in temp with the activations"),
      ("optimizer state", state, row.optimizer_state_bytes, f"ZeRO sec. 3: master copy + moments ({layout})"),
      ("argument", params + state, row.argument_size_in_bytes, "params + optimizer state"),
      ("temp", acts + grads + logits, row.temp_size_in_bytes, "gradients + Korthikanti activations + float32 logits"),
      ("total", params + state + acts + grads + logits, row.total_bytes, "argument + temp"),
  ]
  out = []
  for name, e, c, source in pairs:
    ratio = None if (c is None or not e) else c / e
    note = ""
    if ratio is not None and abs(ratio - 1) > 0.2:
      note = _why(name, cfg, row.remat, platform) or "differs by more than 20%"
    out.append(Comparison(component=name, estimate_bytes=e, compiler_bytes=c, ratio=ratio, note=note, source=source))
  return out


def _row_layout(row: Any, optimizer: str, precision: str | None) -> dict[str, Any]:
  """The estimate's precision arguments for ``row``: ``precision`` where given, else the row's
  dtypes (a row without precision fields has float32 parameters and no others: the ``fp32`` layout)."""
  if precision is not None:
    return dict(precision=precision)
  moments = getattr(row, "moments_dtype", None) if optimizer in MOMENTS_DTYPE_OPTIMIZERS else None
  return dict(param_dtype=row.param_dtype, master_dtype=getattr(row, "master_dtype", None), moments_dtype=moments,
              grad_reduce_dtype=getattr(row, "grad_reduce_dtype", None))


def seed_figures(model: str = "llama3-405b") -> dict[str, float]:
  """The seeds' figures computed from the preset: weights in bf16/fp8/int4, model state at
  16 B/param (mixed-precision Adam) and its H100-80GB equivalents."""
  cfg = get_config(model)
  e = estimate(model=cfg, optimizer="adamw", precision="mixed")
  return dict(
      params=e.params,
      weight_bytes_bf16=e.weight_bytes_bf16,
      weight_bytes_fp8=e.weight_bytes_fp8,
      weight_bytes_int4=e.weight_bytes_int4,
      model_state_bytes=e.model_state_bytes,
      h100_80gb_equivalents=e.h100_80gb_equivalents,
  )


def estimates(models: Sequence[str], **kwargs: Any) -> list[Estimate]:
  """:func:`estimate` per model; a capacity factor reaches the mixtures of experts among them,
  and is refused where there is none."""
  cfgs = [get_config(m) if isinstance(m, str) else m for m in models]
  if kwargs.get("capacity_factor") is not None and not any(c.is_moe for c in cfgs):
    names = ", ".join(c.name for c in cfgs)
    raise JaxmemError(f"`capacity_factor` applies to mixture-of-experts models; {names}: no experts (drop it)")
  return [estimate(model=c, **{**kwargs, "capacity_factor": kwargs.get("capacity_factor") if c.is_moe else None})
          for c in cfgs]

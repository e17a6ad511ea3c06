"""Inference memory from the compiler: prefill and decode steps with a KV cache, per weight format.

Prefill runs a prompt of ``prompt`` tokens through the model and writes its keys and values
into a KV cache of ``prompt`` positions; decode runs one token against a cache of ``context``
positions (:meth:`jaxmem.models.Transformer.cached`). Both take the cache as an argument and
return it, donated, so XLA updates it in place as a serving loop would. Parameters are stored
in the chosen format (:mod:`jaxmem.inference.quant`) and dequantized inside the scanned layer body, so the
compiler's argument bytes are the stored bytes, and its temporaries show where (and whether) a
dequantized copy materialises.

Attention: prefill computes the prompt's attention over its own keys with the implementation
``attention`` names (``auto``: the target's production kernel, as in training; see
:func:`jaxmem.models.choose_attention`). Decode attends one token to the cache with einsums
whatever is asked (no T x T scores exist there), and its rows say so.

Sharding: weights as for training (``embed`` over ``fsdp``; heads, MLP and vocabulary over
``tensor``); the cache's batch over ``data`` and ``fsdp`` and its kv heads over ``tensor`` (left
whole, with a note, when the tensor axis does not divide them, as servers replicate kv heads
when the tensor-parallel degree exceeds them).

>>> rows = infer(model="tiny", weights="bf16,int8", context=[64, 128], prompt=32)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxmem._quiet import quiet
from jaxmem.compiler.analysis import compile_timed
from jaxmem.compiler.flops import KERNEL_FLOPS_NOTE, jaxpr_flops
from jaxmem.compiler.report import Refusal, read_compiled
from jaxmem.compiler.startup import start_jax
from jaxmem.compiler.targets import Target
from jaxmem.errors import JaxmemError
from jaxmem.inference import quant
from jaxmem.models import CACHE_AXES, MLA_CACHE_AXES, AttentionChoice, ModelConfig, cache_bytes, cache_class, get_attention, get_config
from jaxmem.planning.plan import (
    moe_config, moe_variants, plan, resolve_meshes, resolve_model, resolve_step_axes, resolve_target,
)
from jaxmem.planning.sweep import moe_fields, run_config
from jaxmem.program import sharding as shd
from jaxmem.program.train import abstract_model, pick_attention
from jaxmem.records import CompilerFigures, Placement
from jaxmem.render.units import GiB
from jaxmem.versions import compiler_versions
from jaxmem.workload import Workload, names

PHASES = ("prefill", "decode")
DEFAULT_PROMPT = 1024
DEFAULT_CONTEXT = (2048,)


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferWorkload(Workload):
  """An inference workload: the shared fields (``model``, ``batch``, ``target``, ``slices``,
  ``mesh``, ``dtype``; the others are a train step's and unused here) and inference's own:
  weight formats, phases, the prefill prompt length and the decode contexts (KV cache
  lengths), each a comma-separated string or a sequence. Stored weights start from bf16."""

  batch: int = 1
  weights: tuple[str, ...] = ("bf16",)
  phase: tuple[str, ...] = PHASES
  # ``attention`` (the shared field) is a sweep axis of prefill rows; decode keeps einsums.
  prompt: int = DEFAULT_PROMPT
  context: tuple[str | int, ...] = DEFAULT_CONTEXT

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "weights", names(self.weights))
    object.__setattr__(self, "phase", names(self.phase))
    context = self.context if isinstance(self.context, (str, list, tuple)) else (self.context,)
    object.__setattr__(self, "context", names([str(c) for c in ([context] if isinstance(context, str) else context)]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferRow(CompilerFigures, Placement):
  """One inference step's figures. Compiler fields and ``*_per_device`` are per device;
  ``weight_bytes`` and ``kv_cache_bytes`` are the whole model's (unsharded, scales included).

  ``context`` is the KV cache's length in positions: the prompt for prefill, the cache a
  decode step reads for decode. ``required_bytes`` and ``fits`` as in
  :class:`jaxmem.planning.sweep.Row`. ``kv_cache_bytes_per_token``: what one position of one
  sequence holds in the whole model's cache (keys and values per kv head, or for multi-head
  latent attention the latent and the decoupled RoPE key; ``attention_kind`` says which).
  ``moe_impl`` and ``capacity_factor`` as in :class:`jaxmem.records.Configuration`.
  """

  phase: str
  weights: str
  context: int
  prompt: int | None
  attention: str | None = None  # the implementation used: prefill's kernel; "dot" for decode
  attention_kind: str = "GQA"  # MLA, MHA or GQA: what the KV cache holds per token
  moe_impl: str | None = None
  capacity_factor: float | None = None
  weight_bytes: int | None = None
  weight_scale_bytes: int | None = None
  kv_cache_bytes: int | None = None
  kv_cache_bytes_per_token: int | None = None
  weight_bytes_per_device: int | None = None
  kv_cache_bytes_per_device: int | None = None
  capacity_bytes: int | None = None
  required_bytes: int | None = None
  fits: bool | None = None
  verdict: str | None = None  # yes, at risk or NO (jaxmem.compiler.margin)
  margin_bytes: int | None = None  # capacity_bytes - required_bytes
  risk_bytes: int | None = None  # what the runtime may hold beside the program (jaxmem.compiler.margin)
  error: str | None = None
  notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferProgram:
  step: Any
  args: tuple[Any, ...]
  weight_bytes: int
  weight_scale_bytes: int
  weight_bytes_per_device: int
  kv_cache_bytes: int
  kv_cache_bytes_per_device: int
  notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class InferPlan:
  """A validated set of inference configurations."""

  cfg: ModelConfig
  target: Target
  meshes: tuple[shd.MeshSpec, ...]
  formats: tuple[quant.WeightFormat, ...]
  phases: tuple[str, ...]
  prompt: int
  contexts: tuple[int, ...]
  batch: int
  attentions: tuple[str, ...] = ("auto",)  # prefill's implementations, as asked
  qk_dtype: str = "bfloat16"  # dot attention's scores in prefill
  # MoE variants as in jaxmem.planning.plan.Plan, each a (config, notes) to compile with.
  moe: tuple[tuple[ModelConfig, tuple[str, ...]], ...] = ()

  def configs(self) -> list[tuple[shd.MeshSpec, quant.WeightFormat, str, int, str, tuple[ModelConfig, tuple[str, ...]]]]:
    """(mesh, weights, phase, context, attention, MoE variant): prefill once per attention name,
    decode once (it attends with einsums, so its attention is the first name, recorded as dot)."""
    out = []
    for variant in self.moe or ((self.cfg, ()),):
      for mesh, fmt, phase in itertools.product(self.meshes, self.formats, self.phases):
        for ctx in (self.prompt,) if phase == "prefill" else self.contexts:
          for attention in self.attentions if phase == "prefill" else self.attentions[:1]:
            out.append((mesh, fmt, phase, ctx, attention, variant))
    return out


def _ints(v: Sequence[int | str], what: str) -> tuple[int, ...]:
  out = []
  for x in v:
    try:
      n = int(str(x).strip())
    except ValueError:
      raise JaxmemError(f"--{what} must be whole numbers separated by commas, got {','.join(map(str, v))!r}") from None
    if n < 1:
      raise JaxmemError(f"--{what} must be at least 1 (got {n})")
    out.append(n)
  if not out:
    raise JaxmemError(f"--{what} is empty")
  return tuple(dict.fromkeys(out))


def plan_infer(workload: InferWorkload | None = None, /, **fields: Any) -> InferPlan:
  """Resolves and checks everything before a compile; :class:`JaxmemError` on bad input."""
  w = InferWorkload.of(workload, **fields)
  start_jax()
  # Stored weights are bf16 before any quantization: the checkpoint's precision.
  cfg = resolve_model(w.model, param_dtype="bfloat16", dtype=w.dtype)
  tgt = resolve_target(w)
  formats = quant.WEIGHT_FORMATS.parse(w.weights)
  phases = w.phase
  for p in phases:
    if p not in PHASES:
      raise JaxmemError(f"unknown phase {p!r}; valid: {', '.join(PHASES)}")
  if not phases:
    raise JaxmemError(f"--phase is empty; valid: {', '.join(PHASES)}")
  (prompt,) = _ints([w.prompt], "prompt")
  contexts = _ints(w.context, "context")
  (batch,) = _ints([w.batch], "batch")
  meshes = resolve_meshes(w, tgt)
  attentions, _ = resolve_step_axes(w)
  variants = tuple(moe_config(cfg, w.replace(moe_impl=i, capacity_factor=f), tgt.platform) for i, f in moe_variants(w))
  cfg = variants[0][0]
  for m in meshes:
    shd.check_experts(m, cfg.num_experts, cfg.name)
    if "prefill" in phases:
      for name in attentions:  # refused here, before a compile, if the target cannot take it
        pick_attention(name, cfg, batch=batch, seq=prompt, target=tgt, mesh=dict(m), qk_dtype=w.qk_dtype)
    ways = shd.data_parallel_size(m)
    if batch % ways:
      raise JaxmemError(
          f"batch {batch} is not divisible by the data axes of mesh {shd.format_mesh(m)} ({ways} ways); "
          f"use a multiple of {ways}, or shard the model with tensor={tgt.num_devices} for small batches"
      )
  if cfg.style == "gpt2":
    longest = max((prompt,) * ("prefill" in phases) + contexts * ("decode" in phases))
    if longest > cfg.max_seq_len:
      raise JaxmemError(f"{cfg.name} has {cfg.max_seq_len} learned positions; prompt and context must not exceed it (got {longest})")
  return InferPlan(cfg, tgt, meshes, formats, phases, prompt, contexts, batch, attentions, w.qk_dtype, moe=variants)


def _lenient_spec(logical: Sequence[str | None], shape: Sequence[int], jmesh) -> tuple[PartitionSpec, list[str]]:
  """Activation rules, leaving a dimension whole (with a note) where its axes do not divide it."""
  spec, left = shd.lenient_spec(logical, shape, jmesh)
  notes = [f"{name}={dim} is not divisible by {'x'.join(axes)}={ways}: the KV cache is replicated over it"
           for name, dim, axes, ways in left]
  return spec, notes


def abstract_cache(cfg: ModelConfig, *, batch: int, context: int, jmesh) -> tuple[Any, Any, list[str]]:
  """(abstract cache, its tree of shardings, notes) for the model's kind of attention: a KVCache
  (keys and values per kv head) or, for multi-head latent attention, an MLACache (the latent and
  the RoPE key; ``models.cache_class``), each array sharded by its logical axes."""
  kind = cache_class(cfg)
  if cfg.is_mla:
    shapes, axes = kind.shapes(cfg, batch=batch, context=context), MLA_CACHE_AXES
  else:
    shape = kind.shape(cfg, batch=batch, context=context)
    shapes, axes = (shape, shape), (CACHE_AXES, CACHE_AXES)
  specs = [_lenient_spec(a, shp, jmesh) for a, shp in zip(axes, shapes, strict=True)]
  shardings = [NamedSharding(jmesh, spec) for spec, _ in specs]
  dtype = cfg.compute_jnp_dtype
  cache = kind(*(jax.ShapeDtypeStruct(shp, dtype, sharding=sh) for shp, sh in zip(shapes, shardings, strict=True)))
  return cache, kind(*shardings), list(dict.fromkeys(n for _, ns in specs for n in ns))


def build_infer_program(
    cfg: ModelConfig,
    *,
    phase: str,
    fmt: quant.WeightFormat,
    batch: int,
    context: int,
    target: Target,
    mesh: shd.MeshSpec,
    attention: AttentionChoice | None = None,
) -> InferProgram:
  """The sharded, cache-donating prefill (``context`` = prompt length) or decode step; prefill
  attends through ``attention`` (None: einsums over the cache, as decode does)."""
  jmesh = target.make_mesh(mesh)
  graphdef, params, logical = abstract_model(cfg)
  param_sh = shd.param_shardings(params, logical, jmesh)
  stored, stored_sh = quant.abstract_quantized(params, param_sh, fmt)
  cache, cache_tree_sh, notes = abstract_cache(cfg, batch=batch, context=context, jmesh=jmesh)
  t = context if phase == "prefill" else 1
  tok_sh = NamedSharding(jmesh, _lenient_spec(("batch", "seq"), (batch, t), jmesh)[0])
  logits_sh = NamedSharding(jmesh, _lenient_spec(("batch", "seq", "vocab"), (batch, 1, cfg.vocab_size), jmesh)[0])
  replicated = NamedSharding(jmesh, PartitionSpec())
  constrain = shd.activation_constrainer(jmesh)
  hook = quant.weight_hook(cfg.compute_jnp_dtype)

  attend = None if attention is None or phase != "prefill" else attention.attend

  def step(p, kv, tokens_bt, pos):
    model = nnx.merge(graphdef, p)
    if attend is not None:  # prefill starts at position 0: a Python 0, as attend requires
      return model.cached(tokens_bt, kv, pos=0, constrain=constrain, weights=hook, attend=attend)
    return model.cached(tokens_bt, kv, pos=pos, constrain=constrain, weights=hook)

  jitted = jax.jit(
      step,
      in_shardings=(stored_sh, cache_tree_sh, tok_sh, replicated),
      out_shardings=(logits_sh, cache_tree_sh),
      donate_argnums=(1,),
  )
  args = (
      stored,
      cache,
      jax.ShapeDtypeStruct((batch, t), jnp.int32, sharding=tok_sh),
      jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
  )
  values, scales = quant.tree_stored_bytes(stored)
  kv_dev = sum(
      quant.stored_bytes(sh.shard_shape(a.shape), a.dtype) for a, sh in zip(jax.tree.leaves(cache), jax.tree.leaves(cache_tree_sh), strict=True)
  )
  return InferProgram(
      step=jitted,
      args=args,
      weight_bytes=int(values + scales),
      weight_scale_bytes=int(scales),
      weight_bytes_per_device=int(quant.tree_stored_bytes_per_device(stored, stored_sh)),
      kv_cache_bytes=cache_bytes(cfg, batch=batch, context=context),
      kv_cache_bytes_per_device=int(kv_dev),
      notes=tuple(f"kv cache: {n}" for n in notes),
  )


def run_infer_config(
    p: InferPlan,
    mesh: shd.MeshSpec,
    fmt: quant.WeightFormat,
    phase: str,
    context: int,
    attention: str | None = None,
    variant: tuple[ModelConfig, tuple[str, ...]] | None = None,
) -> InferRow:
  """Compiles one configuration; a compile the backend refuses becomes a row with ``error``.
  ``attention`` (prefill; the plan's first unless given) names the implementation, ``variant``
  the MoE choice's config and notes (else the plan's)."""
  cfg, moe_notes = variant or (p.cfg, ())
  attention = p.attentions[0] if attention is None else attention
  choice = None
  notes: list[str] = []
  if phase == "prefill":
    choice = pick_attention(
        attention, cfg, batch=p.batch, seq=context, target=p.target, mesh=p.target.make_mesh(mesh),
        qk_dtype=p.qk_dtype,
    )
    notes += choice.notes
    if get_attention(choice.name).fused:
      notes.append(KERNEL_FLOPS_NOTE)
  elif attention != "dot":
    notes.append(
        "attention: decode attends one token to the KV cache with einsums (no T x T scores); "
        f"--attention {attention} applies to prefill"
    )
  base = dict(
      model=cfg.name,
      target=p.target.name,
      mesh=shd.format_mesh(mesh),
      phase=phase,
      weights=fmt.name,
      context=context,
      prompt=p.prompt if phase == "prefill" else None,
      attention=choice.name if choice is not None else "dot",
      batch=p.batch,
      num_devices=p.target.num_devices,
      capacity_bytes=p.target.capacity_bytes,
      attention_kind=_attention_kind(cfg),
      kv_cache_bytes_per_token=cache_bytes(cfg, batch=1, context=1),
      **moe_fields(cfg),
  )
  program = build_infer_program(
      cfg, phase=phase, fmt=fmt, batch=p.batch, context=context, target=p.target, mesh=mesh, attention=choice
  )
  base.update(
      weight_bytes=program.weight_bytes,
      weight_scale_bytes=program.weight_scale_bytes,
      weight_bytes_per_device=program.weight_bytes_per_device,
      kv_cache_bytes=program.kv_cache_bytes,
      kv_cache_bytes_per_device=program.kv_cache_bytes_per_device,
  )
  # The architecture's unmodelled parts first, then how the MoE variant and attention were chosen.
  notes = list(cfg.notes) + list(moe_notes) + list(program.notes) + notes
  if p.target.capacity_note is not None:
    notes.append(f"capacity_bytes: {p.target.capacity_note}")
  traced = program.step.trace(*program.args)
  program_flops = jaxpr_flops(traced.jaxpr.jaxpr)
  try:
    with quiet(), (choice.lowering() if choice is not None else contextlib.nullcontext()):
      compiled, seconds = compile_timed(traced.lower())
  except jax.errors.JaxRuntimeError as e:
    return InferRow(
        **base, **Refusal.of(e).as_dict(), flops=program_flops / p.target.num_devices,
        versions=compiler_versions(p.target.platform), notes=tuple(notes),
    )
  report = read_compiled(compiled, compile_seconds=seconds, jaxpr=traced.jaxpr.jaxpr)
  return InferRow(
      **base,
      **report.figures(),
      required_bytes=report.required_bytes,
      **report.judge(p.target.capacity_bytes).as_dict(),  # fits, verdict, margin_bytes, risk_bytes
      notes=tuple(notes) + report.notes,
  )


def infer(
    workload: InferWorkload | None = None, /, *, on_row: Callable[[InferRow], None] | None = None,
    on_plan: Callable[[InferPlan], None] | None = None, **fields: Any
) -> list[InferRow]:
  """Compiles every (mesh, weight format, phase, context) of ``workload`` (``fields`` replaced);
  ``on_plan`` is called with the validated plan before the first compile."""
  p = plan_infer(workload, **fields)
  if on_plan is not None:
    on_plan(p)
  rows = []
  for config in p.configs():
    row = run_infer_config(p, *config)
    rows.append(row)
    if on_row is not None:
      on_row(row)
  return rows


# --- the KV cache from its formula -------------------------------------------------------------


def _attention_kind(cfg: ModelConfig) -> str:
  """MLA (latent cache), MHA (a kv head per query head) or GQA."""
  if cfg.is_mla:
    return "MLA"
  return "MHA" if cfg.num_kv_heads == cfg.num_heads else "GQA"


def kv_cache_table(
    model: str | ModelConfig, *, contexts: Sequence[int], batches: Sequence[int], bytes_per_element: float = 2
) -> list[dict[str, Any]]:
  """Whole-model KV cache bytes for every (batch, context), from
  ``2 * layers * kv_heads * head_dim * context * batch * bytes`` (bf16: 2 bytes), or for
  multi-head latent attention ``layers * (kv_lora_rank + qk_rope_head_dim) * context * batch *
  bytes`` (``kv_heads`` is then None: every head reads the one latent)."""
  cfg = get_config(model) if isinstance(model, str) else model
  return [
      dict(
          model=cfg.name,
          batch=b,
          context=c,
          kv_heads=None if cfg.is_mla else cfg.num_kv_heads,
          kv_cache_bytes=cache_bytes(cfg, batch=b, context=c, bytes_per_element=bytes_per_element),
      )
      for b in batches
      for c in contexts
  ]


def plot(rows: Sequence[InferRow], path: str, *, kv_rows: Sequence[dict[str, Any]] = ()) -> str:
  """Writes a figure: per-device required bytes against context, one line per weight format
  (decode rows), with the device's capacity; and the formula's KV cache against context per
  batch when ``kv_rows`` are given. Returns ``path``."""
  # matplotlib is slow to import and needs its file-only backend chosen before pyplot.
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  gib = GiB
  panels = 2 if kv_rows else 1
  fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
  ax = axes[0][0]
  decode = [r for r in rows if r.phase == "decode" and r.required_bytes is not None]
  for fmt in dict.fromkeys(r.weights for r in decode):
    pts = sorted((r.context, r.required_bytes / gib) for r in decode if r.weights == fmt)
    ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=f"decode, {fmt} weights")
  caps = {r.capacity_bytes for r in rows if r.capacity_bytes}
  for cap in caps:
    ax.axhline(cap / gib, color="red", linestyle="--", label="capacity")
  if decode:
    r0 = decode[0]
    ax.set_title(f"{r0.model} on {r0.target} ({r0.mesh}), batch {r0.batch}")
  ax.set_xlabel("context (KV cache positions)")
  ax.set_ylabel("GiB per device (compiler)")
  ax.legend(fontsize=8)
  if kv_rows:
    ax2 = axes[0][1]
    for b in dict.fromkeys(r["batch"] for r in kv_rows):
      pts = sorted((r["context"], r["kv_cache_bytes"] / gib) for r in kv_rows if r["batch"] == b)
      ax2.plot([c for c, _ in pts], [v for _, v in pts], marker=".", label=f"batch {b}")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log", base=2)
    ax2.set_xlabel("context")
    ax2.set_ylabel("KV cache, whole model, GiB")
    ax2.set_title(f"{kv_rows[0]['model']}: 2·L·K·H·S·B·2 bytes")
    ax2.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


# --- training against inference ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Side(Placement):
  """One side of training-vs-inference: per-device figures and their sum over the devices."""

  workload: str  # "train" or "decode"
  detail: str  # optimizer and remat, or weights and context
  argument_size_in_bytes: int | None
  temp_size_in_bytes: int | None
  required_bytes: int | None
  all_devices_required_bytes: int | None
  capacity_bytes: int | None
  fits: bool | None
  verdict: str
  error: str | None = None


def _verdict(kind: str, fits: bool | None) -> str:
  if fits is None:
    return "no capacity on this target"
  if kind == "train":
    return "can be trained here" if fits else "cannot be trained here"
  return "fits for inference" if fits else "does not fit for inference"


def training_vs_inference(
    workload: Workload | None = None,
    /,
    *,
    weights: str = "bf16",
    context: int | None = None,
    infer_batch: int | None = None,
    train_row: Any = None,
    **fields: Any,
) -> list[Side]:
  """The train step of ``workload`` (``fields`` replaced; its last remat policy, ``full``
  unless named) and a decode step for the same model, target and mesh, side by side.
  ``context`` defaults to the workload's ``seq``, ``infer_batch`` to its ``batch``. Pass
  ``train_row`` (a :class:`jaxmem.planning.sweep.Row`) to reuse a compiled training row, with
  ``model=`` its :class:`ModelConfig` where the row's name is no preset (a config.json model)."""
  w = Workload.of(workload, {"remat": "full"}, **fields)
  if train_row is None:
    p = plan(w)
    (cfg_t,) = [c for c in p.configs() if c[2].name == w.remat[-1]] or [p.configs()[0]]
    train_row = run_config(p, *cfg_t)
  ip = plan_infer(
      model=w.model if isinstance(w.model, ModelConfig) else train_row.model,
      weights=weights,
      phase="decode",
      context=context or train_row.seq,
      batch=infer_batch or train_row.batch,
      target=w.target,
      slices=w.slices,
      mesh=train_row.mesh,
  )
  (cfg_i,) = ip.configs()
  irow = run_infer_config(ip, *cfg_i)
  n = train_row.num_devices
  return [
      _side("train", train_row, f"{train_row.optimizer}, remat {train_row.remat}, seq {train_row.seq}", n),
      _side("decode", irow, f"{irow.weights} weights, context {irow.context}", n),
  ]


def _side(kind: str, row: Any, detail: str, n: int) -> Side:
  """One side of training vs inference from its row (a train Row or an InferRow)."""
  total = lambda v: None if v is None else v * n  # noqa: E731
  return Side(
      workload=kind,
      model=row.model,
      target=row.target,
      mesh=row.mesh,
      detail=detail,
      batch=row.batch,
      num_devices=n,
      argument_size_in_bytes=row.argument_size_in_bytes,
      temp_size_in_bytes=row.temp_size_in_bytes,
      required_bytes=row.required_bytes,
      all_devices_required_bytes=total(row.required_bytes),
      capacity_bytes=row.capacity_bytes,
      fits=row.fits,
      verdict=_verdict(kind, row.fits),
      error=row.error,
  )

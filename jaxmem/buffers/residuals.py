"""What each remat policy saves for the backward pass, per layer, from JAX's own residual listing.

``jax.ad_checkpoint.print_saved_residuals`` (its data form, ``saved_residuals``) lists every
value the VJP of a function keeps: its abstract value and where it comes from (an argument, a
primitive with its source line, or a ``checkpoint_name``). jaxmem runs it on one Transformer
block (the scan body; every layer saves the same) under each policy, so a policy's name turns
into a list of tensors and bytes. This is the jaxpr-level view, before XLA: it says what JAX asks
to be saved, not how XLA lays it out (the compiled figures are in ``compare`` and ``explain``).

Sizes are for one layer of the whole (global) batch on one device, unsharded; under data or
FSDP parallelism each device saves its share (batch / data-parallel ways). For a mixture of
experts the layer listed is an MoE layer (router, routed and shared experts, with the model's
``moe_impl``), and the total adds its ``first_dense_layers`` dense layers at their own size.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals  # the data behind print_saved_residuals

from jaxmem.axes import AXES, Setting, check_names, check_setting, one_each, one_value_each
from jaxmem.hardware.startup import start_jax
from jaxmem.hardware.targets import cpu_devices_needed, get_target
from jaxmem.errors import JaxmemError
from jaxmem.models import AttendFn, AttentionChoice, ModelConfig, StepChoices, family_of
from jaxmem.resolve import default_seq, resolve_model
from jaxmem.program.remat import RematPolicy, parse_remat
from jaxmem.program.sharding import default_mesh, format_mesh
from jaxmem.program.train import check_attention_options, key_shapes, keyed, layer_attend, moe_choice, pick_attention
from jaxmem.records import Record
from jaxmem.workload import DEFAULT_BATCH, Workload


@dataclasses.dataclass(frozen=True, kw_only=True)
class Residual(Record):
  """One value a layer saves for its backward pass."""

  name: str  # the checkpoint_name, or the primitive that made it, or the argument
  shape: tuple[int, ...]
  dtype: str
  bytes: int
  source: str  # JAX's description: "from the argument ...", "output of dot_general from file:line", ...
  is_input: bool  # the block's input activation (saved by every policy that recomputes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyResiduals(Record):
  """A remat policy's saved residuals: per layer, and for all layers."""

  remat: str
  model: str
  batch: int
  seq: int
  num_layers: int
  residuals: tuple[Residual, ...]
  per_layer_bytes: int
  total_bytes: int  # per_layer_bytes x num_layers (MoE: + the dense layers at their own size)
  attention: str | None = None  # the attention implementation the block ran (None: dot, unnamed)

  def rows(self) -> list[dict[str, Any]]:
    """One flat record per residual (for tables), with the policy's totals repeated."""
    return [
        dict(remat=self.remat, attention=self.attention, residual=r.name, shape=list(r.shape), dtype=r.dtype, bytes=r.bytes,
             per_layer_bytes=self.per_layer_bytes, total_bytes=self.total_bytes, source=r.source)
        for r in self.residuals
    ]


def _block_fn(
    cfg: ModelConfig, rp: RematPolicy, attend: AttendFn | None = None, *, batch: int, seq: int, moe: bool = False,
    choices: StepChoices = StepChoices(),
) -> tuple[Any, Any, tuple[Any, ...]]:
  """One layer of ``cfg`` (its family's block, run as ``choices`` say) under ``rp`` as a function
  of its parameters and inputs, its abstract parameters, and its abstract inputs for a
  [batch, seq] step: the residual stream, the RoPE tables (None without), the PRNG key (where
  the step draws random masks)."""
  family = family_of(cfg)
  block = nnx.eval_shape(lambda: family.block(cfg, moe=moe, choices=choices, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(block)
  attend = rp.attend(attend)  # selective: the attention core under its own checkpoint

  def layer(layer_state, x_btd, rope_sin_tk, rope_cos_tk, key=None):
    # Where the step draws random masks, one layer's key (an argument: what it keeps is the masks).
    return nnx.merge(graphdef, layer_state)(
        x_btd, rope=(rope_sin_tk, rope_cos_tk), constrain=lambda x, _: x, attend=attend,
        **keyed(choices, key),
    )

  fn = layer if rp.policy is None else jax.checkpoint(layer, policy=rp.policy, prevent_cse=False)
  x = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), cfg.compute_jnp_dtype)
  dims = family.rope_dims(cfg)  # MLA rotates only its RoPE part; GPT-2 has no RoPE
  rope = None if dims is None else jax.ShapeDtypeStruct((seq, dims[0] // 2), jnp.float32)
  return fn, state, (x, rope, rope, *key_shapes(choices))


def _name(aval, description: str) -> tuple[str, bool]:
  d = description.strip()
  if d.startswith("from the argument"):
    arg = d.removeprefix("from the argument").strip()
    return (arg or "argument"), arg.startswith("x_btd")
  if "named '" in d:  # "named 'query_proj' from ..."
    return d.split("named '", 1)[1].split("'", 1)[0], False
  if d.startswith("output of "):
    return d.removeprefix("output of ").split(" ", 1)[0], False
  return d.split(" ", 1)[0] or str(aval), False


def saved_residuals_for(
    cfg: ModelConfig, rp: RematPolicy, *, batch: int, seq: int, attention: AttentionChoice | None = None,
    choices: StepChoices = StepChoices(),
) -> PolicyResiduals:
  """The residuals one layer of ``cfg`` saves under ``rp`` for a [batch, seq] input, attention
  computed by ``attention`` (None: dot), the step run as ``choices`` say; an MoE layer for a
  mixture of experts (the total counts every layer at its own kind's size)."""
  attend = layer_attend(attention, choices)
  out = _listing(cfg, rp, batch=batch, seq=seq, attend=attend, moe=cfg.is_moe, choices=choices)
  out.sort(key=lambda r: -r.bytes)
  per_layer = sum(r.bytes for r in out)
  total = per_layer * (cfg.num_moe_layers if cfg.is_moe else cfg.num_layers)
  if cfg.is_moe and cfg.num_dense_layers:
    dense = _listing(cfg, rp, batch=batch, seq=seq, attend=attend, moe=False, choices=choices)
    total += sum(r.bytes for r in dense) * cfg.num_dense_layers
  return PolicyResiduals(
      remat=rp.name, model=cfg.name, batch=batch, seq=seq, num_layers=cfg.num_layers,
      residuals=tuple(out), per_layer_bytes=per_layer, total_bytes=total,
      attention=None if attention is None else attention.name,
  )


def _listing(
    cfg: ModelConfig, rp: RematPolicy, *, batch: int, seq: int, attend: AttendFn | None, moe: bool,
    choices: StepChoices = StepChoices(),
) -> list[Residual]:
  fn, state, args = _block_fn(cfg, rp, attend, batch=batch, seq=seq, moe=moe, choices=choices)
  listing = saved_residuals(fn, state, *args)
  out = []
  for aval, description in listing:
    name, is_input = _name(aval, description)
    if description.strip().startswith("from the argument") and not is_input:
      # The layer's parameters (and RoPE tables) are held for the whole step anyway: a
      # residual that only points at them costs nothing extra.
      continue
    if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key):
      continue  # a PRNG key folded in: two words, from which the masks are drawn again
    shape = tuple(int(s) for s in getattr(aval, "shape", ()))
    dtype = jnp.dtype(aval.dtype)
    out.append(
        Residual(
            name=name,
            shape=shape,
            dtype=str(dtype),
            bytes=math.prod(shape) * dtype.itemsize,
            source=description.strip(),
            is_input=is_input,
        )
    )
  return out


def saved_residuals_by_policy(workload: Workload | None = None, /, **fields: Any) -> list[PolicyResiduals]:
  """For each attention implementation and remat policy of ``workload`` (``fields`` replaced;
  ``none`` first), what one layer saves for the backward pass, for the workload's batch (one
  microbatch of it) and sequence on one device, unsharded. The attention implementations are
  those the target would use (``auto`` resolved for its platform, one device).

  Nothing is compiled or allocated: JAX traces the block's VJP with abstract inputs.
  """
  w = Workload.of(workload, **fields)
  start_jax(cpu_devices_needed([w.target]) if isinstance(w.target, str) else 1)
  unlisted(w)
  # It lists each remat policy and attention implementation for one layer, unsharded, before the
  # optimizer: every other axis takes one value.
  one_value_each(w, "`residuals`", skip=("remat", "attention"))
  check_names(w)
  options = one_each(w)
  cfg, choices = resolve_model(w.model, options)
  w = w.replace(batch=DEFAULT_BATCH if w.batch is None else w.batch, seq=default_seq(cfg) if w.seq is None else w.seq)
  if w.batch < 1 or w.seq < 1:
    raise JaxmemError(f"batch and seq must be at least 1 (got {w.batch} and {w.seq})")
  tgt = get_target(w.target, slices=w.slices, mem_fraction=w.mem_fraction) if isinstance(w.target, str) else w.target
  batch = max(1, w.batch // options["microbatches"])
  # The CPU's choice: the listing is JAX's, before any compiler (--moe-impl chooses another).
  choices, _ = moe_choice(cfg, choices, "cpu", options)
  # Listing residuals compiles nothing, so host-offload policies are listed too.
  policies = parse_remat(w.remat, host_memory=True)
  # The axes' own checks (the experts' options on a dense model...), on the one device it lists.
  check_setting(Setting(values={**options, "mesh": format_mesh(default_mesh(1))}, cfg=cfg, platform=tgt.platform))
  chosen = [pick_attention(name, cfg, batch=batch, seq=w.seq, target=tgt, mesh=None, options=options)
            for name in dict.fromkeys(w.attention)]
  check_attention_options(chosen, options)
  out = []
  for choice in chosen:
    out += [saved_residuals_for(cfg, rp, batch=batch, seq=w.seq, attention=choice, choices=choices) for rp in policies]
  return out


# Where it runs, beside the axes (Axis.layer says which of those a layer's listing depends on):
# nothing of it changes what one layer saves on one device, unsharded, uncompiled, but the
# target's platform (its attention kernel).
_PLACEMENT = ("slices", "resident", "mem_fraction", "always_compile")


def unlisted(w: Workload) -> None:
  """A one-line error for a field of ``w`` given (not its default) that what residuals list does
  not depend on: an axis not declared ``layer``, or where it runs but the target."""
  default = Workload()
  names = [*(a.name for a in AXES.values() if not a.layer and hasattr(w, a.name)), *_PLACEMENT]
  for name in names:
    if getattr(w, name) != getattr(default, name):
      raise JaxmemError(
          f"`{name}` changes nothing `residuals` lists (what one layer saves for the backward pass, on one device, "
          "unsharded, before the optimizer, compiling nothing); drop it"
      )


def layer_step_flops(
    cfg: ModelConfig, rp: RematPolicy, *, batch: int, seq: int, attention: AttentionChoice | None = None,
    moe: bool = False, choices: StepChoices = StepChoices(),
) -> float:
  """FLOPs of one layer's forward and backward pass under ``rp`` (its recomputation included),
  for a [batch, seq] input, counted from the jaxpr of the block's VJP
  (:func:`jaxmem.compiler.flops.jaxpr_flops`): the step as written, before XLA. A policy's
  recompute per layer is this minus the same under ``none``."""
  from jaxmem.compiler.flops import jaxpr_flops  # the FLOP counter, needed here only

  fn, state, args = _block_fn(cfg, rp, layer_attend(attention, choices), batch=batch, seq=seq, moe=moe, choices=choices)

  def step(layer_state, x_btd, sin, cos, *key):
    out, vjp = jax.vjp(lambda s, x: fn(s, x, sin, cos, *key), layer_state, x_btd)
    return vjp(out)

  return jaxpr_flops(jax.make_jaxpr(step)(state, *args).jaxpr)

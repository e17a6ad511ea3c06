"""An inference workload and its plan: what ``infer`` compiles, resolved and checked before a compile.

:class:`InferWorkload` holds the fields every workload has (:class:`jaxmem.workload.BaseWorkload`)
and inference's own; a train step's (remat, optimizer, microbatches, a step of your own) are not
there. :func:`plan_infer` turns one into an :class:`InferPlan`, one configuration per (MoE
variant, mesh, weight format, phase, context, attention).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from jaxmem.axes import (
    AXES, Setting, check_applies, check_names, check_setting, combinations, configured, inner_axes, names,
)
from jaxmem.hardware.startup import start_jax
from jaxmem.hardware.targets import Target
from jaxmem.errors import JaxmemError
from jaxmem.events import notice
from jaxmem.inference import quant
from jaxmem.inference.kv import KvCacheDtype, kv_cache_dtype
from jaxmem.models import ModelConfig, StepChoices
from jaxmem.resolve import one_of_each, outer_values, resolve_meshes, resolve_model, resolve_target, within_positions
from jaxmem.program import sharding as shd
from jaxmem.program.train import moe_choice, pick_attention
from jaxmem.workload import BaseWorkload

PHASES = ("prefill", "decode")
# Where none is given: these, or the model's learned positions where it has fewer (GPT-2's 1024),
# and a batch of 1, or the smallest the meshes' data axes divide (plan_infer says which it chose).
DEFAULT_PROMPT = 1024
DEFAULT_CONTEXT = (2048,)
DEFAULT_BATCH = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferWorkload(BaseWorkload):
  """An inference workload: the shared fields (``model``, ``batch``, ``target``, ``slices``,
  ``mesh``, ``dtype``, ``attention``, the MoE variant, the axes taken as given: the attention
  scores' dtype) and inference's own: weight
  formats, phases, the prefill prompt length and the decode contexts (KV cache lengths), each a
  comma-separated string or a sequence, and the KV cache's dtype (one; the compute dtype unless
  named). Stored weights start from bf16. ``attention`` is a sweep
  axis of prefill rows; decode attends with einsums. ``batch``, ``prompt`` and ``context`` not
  given (None, empty) are chosen by the plan (:data:`DEFAULT_BATCH`, :data:`DEFAULT_PROMPT`,
  :data:`DEFAULT_CONTEXT`, or the nearest that fit the model and the meshes)."""

  WHAT: ClassVar[str] = "an inference workload"

  batch: int | None = None
  weights: tuple[str, ...] = ("bf16",)
  phase: tuple[str, ...] = PHASES
  prompt: int | None = None
  context: tuple[str | int, ...] = ()
  # How the KV cache stores keys and values (jaxmem.inference.kv.KV_CACHE_DTYPES); None: the
  # compute dtype, as vLLM's "auto" is the model's dtype.
  kv_cache_dtype: str | None = None

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "weights", names(self.weights))
    object.__setattr__(self, "phase", names(self.phase))
    context = self.context if isinstance(self.context, (str, list, tuple)) else (self.context,)
    object.__setattr__(self, "context", names([str(c) for c in ([context] if isinstance(context, str) else context)]))


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
  # The MoE variants (each combination of the MoE axes), each the step's choices to compile the
  # model with (jaxmem.models.StepChoices: the experts' implementation) and notes on them.
  moe: tuple[tuple[StepChoices, tuple[str, ...]], ...] = ()
  # The other sweep axes (those a record carries by their own name, Axis.summary): each (name,
  # values). They reach prefill's attention; decode forms no scores, so it sweeps none (its rows
  # record none).
  others: tuple[tuple[str, tuple[Any, ...]], ...] = ()
  always_compile: bool = False  # the workload's: compile even where the arguments alone are over the capacity
  kv: KvCacheDtype | None = None  # the KV cache's storage (None: the compute dtype)

  def variants(self) -> tuple[tuple[StepChoices, tuple[str, ...]], ...]:
    """The MoE variants, or the default choices alone (a plan made without any)."""
    return self.moe or ((StepChoices(), ()),)

  def options(self) -> dict[str, Any]:
    """The first value of each of the other axes, by name (:meth:`jaxmem.resolve.Plan.options`)."""
    return {name: values[0] for name, values in self.others}

  def configs(self) -> list[tuple[shd.MeshSpec, quant.WeightFormat, str, int, str, tuple[StepChoices, tuple[str, ...]],
                                  dict[str, Any]]]:
    """(mesh, weights, phase, context, attention, MoE variant, options): prefill once per
    attention name and combination of the axes taken as given (``options``, by name), decode
    once (it attends with einsums, so its attention is the first name, recorded as dot, and it
    forms no scores, so its options are the first values, which its rows do not record)."""
    names = [n for n, _ in self.others]
    combos = [dict(zip(names, values, strict=True)) for values in itertools.product(*(vs for _, vs in self.others))]
    out = []
    for variant in self.variants():
      for mesh, fmt, phase in itertools.product(self.meshes, self.formats, self.phases):
        prefill = phase == "prefill"
        for ctx in (self.prompt,) if prefill else self.contexts:
          for attention, options in itertools.product(*((self.attentions, combos) if prefill else
                                                        (self.attentions[:1], combos[:1]))):
            out.append((mesh, fmt, phase, ctx, attention, variant, options))
    return out


def _ints(v: Sequence[int | str], what: str) -> tuple[int, ...]:
  out = []
  for x in v:
    try:
      n = int(str(x).strip())
    except ValueError:
      raise JaxmemError(f"`{what}` must be whole numbers separated by commas, got {','.join(map(str, v))!r}") from None
    if n < 1:
      raise JaxmemError(f"`{what}` must be at least 1 (got {n})")
    out.append(n)
  if not out:
    raise JaxmemError(f"`{what}` is empty")
  return tuple(dict.fromkeys(out))


def divided_batch(meshes: Sequence[shd.MeshSpec]) -> int:
  """:data:`DEFAULT_BATCH`, or the smallest batch every mesh's data axes divide, said in a notice."""
  ways = {shd.format_mesh(m): shd.data_parallel_size(m) for m in meshes}
  batch = -(-DEFAULT_BATCH // math.lcm(*ways.values())) * math.lcm(*ways.values())
  if batch != DEFAULT_BATCH:
    why = ", ".join(f"mesh {m}'s {n} data-parallel ways" for m, n in ways.items() if n > 1)
    notice(f"batch {batch}: {why} (default {DEFAULT_BATCH})")
  return batch


def check_phase_fields(w: InferWorkload, *, prompt: bool = True) -> None:
  """One-line errors for a field given that only a phase not asked reads: prefill's attention and
  the axes it sweeps (decode attends to its cache with einsums and forms no scores), and with
  ``prompt`` (infer's, not a serving fit's, whose sizes are its contexts) the prompt (prefill's)
  and the contexts (decode's)."""
  if "prefill" not in w.phase:
    given = [a.name for a in inner_axes(w) if a.name == "attention" or (a.summary and a.name != "mesh")]
    given = [n for n in given if getattr(w, n) != AXES[n].unset] + ["prompt"] * (prompt and w.prompt is not None)
    if given:
      raise JaxmemError(f"`{given[0]}` is prefill's (decode attends to its KV cache with einsums); add prefill to "
                        f"`phase` or drop it")
  if prompt and "decode" not in w.phase and w.context:
    raise JaxmemError("`context` is decode's KV cache length (prefill's length is `prompt`); add decode to `phase` "
                      "or drop it")


def _sweep(w: InferWorkload, cfg: ModelConfig, choices: StepChoices, platform: str) -> tuple[tuple[str, ...], tuple, tuple]:
  """What an inference workload sweeps beside its meshes: prefill's attention implementations,
  the other axes its rows carry by their own name (each (name, values)), and the MoE variants
  (the axes that name the experts' choice, combined as a train step's are: each the step's
  choices, :func:`jaxmem.axes.configured`, and notes on them). Names checked against the models'."""
  check_names(w)
  inner = [a for a in inner_axes(w) if a.name != "mesh"]
  others = tuple((a.name, tuple(dict.fromkeys(a.values(w)))) for a in inner if a.summary)
  mine = {a.name: tuple(dict.fromkeys(a.values(w))) for a in inner if not a.summary}
  attentions = mine.pop("attention")
  variants, ones = [], []
  for combo in combinations(mine):
    one = {n: v[0] if v else None for n, v in combo.items()}
    check_setting(Setting(values=one, cfg=cfg, platform=platform))
    variants.append(moe_choice(cfg, configured(cfg, choices, one)[1], platform, one))
    ones.append(one)
  check_applies(w, ones)
  return attentions, tuple(others), tuple(dict.fromkeys(variants))


def plan_infer(workload: InferWorkload | None = None, /, **fields: Any) -> InferPlan:
  """Resolves and checks everything before a compile; :class:`JaxmemError` on bad input."""
  w = InferWorkload.of(workload, **fields)
  one_of_each(w, "infer")  # the compute dtype: one per run (a train step's sweep takes several)
  start_jax()
  # Stored weights are bf16 before any quantization: the checkpoint's precision.
  cfg, choices = resolve_model(w.model, {**outer_values(w), "param_dtype": "bfloat16"})
  tgt = resolve_target(w)
  formats = quant.WEIGHT_FORMATS.parse(w.weights)
  phases = w.phase
  for p in phases:
    if p not in PHASES:
      raise JaxmemError(f"unknown phase {p!r}; valid: {', '.join(PHASES)}")
  if not phases:
    raise JaxmemError(f"`phase` is empty; valid: {', '.join(PHASES)}")
  # Not given: the defaults, within the model's positions (a default no phase reads is not said).
  (prompt,) = (_ints([w.prompt], "prompt") if w.prompt is not None
               else (within_positions(cfg, DEFAULT_PROMPT, "prompt", say="prefill" in phases),))
  contexts = (_ints(w.context, "context") if w.context
              else (within_positions(cfg, DEFAULT_CONTEXT[0], "context", say="decode" in phases),))
  meshes = resolve_meshes(w, tgt)
  (batch,) = _ints([w.batch], "batch") if w.batch is not None else (divided_batch(meshes),)
  attentions, others, variants = _sweep(w, cfg, choices, tgt.platform)
  for m in meshes:
    shd.check_experts(m, cfg.num_experts, cfg.name)
    if dict(m).get("stage", 1) > 1:  # the cached layer scan is not pipelined (jaxmem.models.pipeline: train steps)
      raise JaxmemError(
          f"mesh {shd.format_mesh(m)}: infer does not pipeline over a stage axis (train steps do); "
          "use data, fsdp or tensor"
      )
    if "prefill" in phases:
      for name in attentions:  # refused here, before a compile, if the target cannot take it
        pick_attention(name, cfg, batch=batch, seq=prompt, target=tgt, mesh=dict(m),
                       options={n: vs[0] for n, vs in others})
    ways = shd.data_parallel_size(m)
    if batch % ways:
      raise JaxmemError(
          f"batch {batch} is not divisible by the data axes of mesh {shd.format_mesh(m)} ({ways} ways); "
          f"use a multiple of {ways}, or shard the model with tensor={tgt.num_devices} for small batches"
      )
  if cfg.position_limit is not None:
    longest = max((prompt,) * ("prefill" in phases) + contexts * ("decode" in phases))
    if longest > cfg.position_limit:
      raise JaxmemError(f"{cfg.name} has {cfg.position_limit} learned positions; prompt and context must not exceed it (got {longest})")
  return InferPlan(cfg, tgt, meshes, formats, phases, prompt, contexts, batch, attentions, moe=variants, others=others,
                   always_compile=w.always_compile, kv=kv_cache_dtype(w.kv_cache_dtype, cfg))



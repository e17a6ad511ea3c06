"""``infer``: each inference configuration compiled into a row.

Attention: prefill computes the prompt's attention over its own keys with the implementation
``attention`` names (``auto``: the target's production kernel, as in training; see
:func:`jaxmem.models.choose_attention`). Decode attends one token to the cache with einsums
whatever is asked (no T x T scores exist there), and its rows say so. Every row comes from
:func:`jaxmem.compiler.figures.compile_figures`, as compare's do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxmem.axes import declared, with_optional_fields
from jaxmem.compiler.figures import compile_figures
from jaxmem.compiler.flops import KERNEL_FLOPS_NOTE
from jaxmem.events import Compiling, emit
from jaxmem.steptime import Work
from jaxmem.inference import quant
from jaxmem.inference.kv import attention_kind
from jaxmem.inference.program import build_infer_program
from jaxmem.inference.workload import InferPlan, InferWorkload, check_phase_fields, plan_infer
from jaxmem.models import StepChoices, cache_bytes, get_attention
from jaxmem.models.model_flops import inference_flops, weight_flops
from jaxmem.options import RunOptions
from jaxmem.program import sharding as shd
from jaxmem.program.train import moe_fields, pick_attention
from jaxmem.records import (
    Communication, CompilerFigures, Composed, Judgement, Placement, Record, RuntimeAccount, StepTime, composed,
)


# The axes an inference row carries by their own name beside those it names itself (the mesh, the
# attention and the MoE choice: Axis.summary False): prefill's options, such as its scores' dtype.
OPTIONS = tuple(a for a in declared(training=False) if not a.outer and a.summary and a.record is not None)


@dataclasses.dataclass(frozen=True, kw_only=True)
@with_optional_fields(OPTIONS, after="attention_kind")
class InferSetup(Record):
  """What an inference step is, beside its placement: the phase, the weight format, the KV
  cache's length in positions (``context``: the prompt for prefill, the cache a decode step reads
  for decode), the prompt, how the cache stores keys and values (``kv_cache_dtype``: a name of
  :data:`jaxmem.inference.kv.KV_CACHE_DTYPES`, the compute dtype's unless one was asked), the
  attention implementation used (prefill's kernel; ``dot`` for decode) and what the KV cache
  holds per token (``attention_kind``: MLA, MHA or GQA), then each of prefill's options
  (:data:`OPTIONS`: dot attention's scores' dtype) as prefill asked it (``None`` for decode,
  which forms no scores), and ``moe_impl`` and ``capacity_factor`` as in
  :class:`jaxmem.records.Configuration`."""

  phase: str
  weights: str
  context: int
  prompt: int | None
  kv_cache_dtype: str | None = None
  attention: str | None = None
  attention_kind: str = "GQA"
  # (the axes taken as given, after attention_kind: with_optional_fields)
  moe_impl: str | None = None
  capacity_factor: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferSizes(Record):
  """The weights' and KV cache's bytes: ``weight_bytes`` and ``kv_cache_bytes`` the whole
  model's (unsharded, scales included), ``*_per_device`` per device; ``kv_cache_bytes_per_token``
  what one position of one sequence holds in the whole model's cache (keys and values per kv
  head, or for multi-head latent attention the latent and the decoupled RoPE key).
  ``time_per_output_token_s``: decode's step time, one output token per sequence, so a lower
  bound as the step's is; ``None`` for prefill (its step time is the prompt's)."""

  weight_bytes: int | None = None
  weight_scale_bytes: int | None = None
  kv_cache_bytes: int | None = None
  kv_cache_bytes_per_token: int | None = None
  weight_bytes_per_device: int | None = None
  kv_cache_bytes_per_device: int | None = None
  time_per_output_token_s: float | None = None


@composed
class InferRow(Composed):
  """One inference step's figures: its placement and setup, the compiler's figures, the
  step-time estimate, the judgement against the device and the weights' and KV cache's sizes,
  flat in ``as_dict()`` and attribute access as :class:`jaxmem.planning.sweep.Row`'s. Compiler
  fields and ``*_per_device`` are per device. ``comm_*_bytes``: the collectives' bytes, as
  compare's rows have them (:class:`jaxmem.records.Communication`); ``program_flops`` the whole
  step's FLOPs; ``required_bytes`` and ``fits`` as in :class:`jaxmem.planning.sweep.Row`."""

  placement: Placement
  compiled: CompilerFigures = dataclasses.field(default_factory=CompilerFigures)
  timing: StepTime = dataclasses.field(default_factory=StepTime)
  judgement: Judgement = dataclasses.field(default_factory=Judgement)
  setup: InferSetup
  sizes: InferSizes = dataclasses.field(default_factory=InferSizes)
  runtime: RuntimeAccount = dataclasses.field(default_factory=RuntimeAccount)

  def communication(self) -> Communication:
    return self.compiled.communication()

  def step_time(self) -> StepTime:
    return self.timing


def run_infer_config(
    p: InferPlan,
    mesh: shd.MeshSpec,
    fmt: quant.WeightFormat,
    phase: str,
    context: int,
    attention: str | None = None,
    variant: tuple[StepChoices, tuple[str, ...]] | None = None,
    options: Mapping[str, Any] | None = None,
) -> InferRow:
  """Compiles one configuration (:func:`jaxmem.compiler.figures.compile_figures`); a compile
  the backend refuses, or arguments alone over the device's capacity, become a row with ``error``.
  ``attention`` (prefill; the plan's first unless given) names the implementation, ``variant``
  the MoE choice's step choices and notes (else the plan's first), ``options`` prefill's values of the axes
  taken as given, by name (the plan's first of each that it does not name)."""
  cfg, (choices, moe_notes) = p.cfg, variant or p.variants()[0]
  options = {**p.options(), **(options or {})}
  attention = p.attentions[0] if attention is None else attention
  choice = None
  notes: list[str] = []
  if phase == "prefill":
    choice = pick_attention(
        attention, cfg, batch=p.batch, seq=context, target=p.target, mesh=p.target.make_mesh(mesh), options=options,
    )
    notes += choice.notes
    if get_attention(choice.name).fused:  # its FLOPs are counted from its shapes
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
      kv_cache_dtype=None if p.kv is None else p.kv.name,
      attention=choice.name if choice is not None else "dot",
      **{a.name: options.get(a.name) if phase == "prefill" else None for a in OPTIONS},
      batch=p.batch,
      num_devices=p.target.num_devices,
      attention_kind=attention_kind(cfg),
      kv_cache_bytes_per_token=cache_bytes(cfg, batch=1, context=1,
                                           bytes_per_element=None if p.kv is None else p.kv.bytes_per_element),
      **moe_fields(cfg, choices),
  )
  program = build_infer_program(
      cfg, choices=choices, phase=phase, fmt=fmt, batch=p.batch, context=context, target=p.target, mesh=mesh,
      attention=choice, kv=p.kv,
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
  tokens = p.batch * (context if phase == "prefill" else 1)
  outcome = compile_figures(
      program.step.trace(*program.args), p.target, args=None if p.always_compile else program.args,
      notes=notes,
      lowering_context=None if choice is None else choice.lowering(),
      work=Work(tokens=tokens, model_flops=inference_flops(cfg, tokens=tokens, context=context, causal=phase == "prefill"),
                floor_flops=weight_flops(cfg, tokens=tokens, training=False)),
  )
  fields = outcome.row_fields()
  if phase == "decode":
    fields["time_per_output_token_s"] = fields.get("step_time_s")
  return InferRow(**base, **fields)


def config_label(mesh: shd.MeshSpec, fmt: quant.WeightFormat, phase: str, context: int, attention: str | None,
                 *rest: Any) -> str:
  """One configuration of :meth:`InferPlan.configs` in a few words, as a compile's progress
  names it: its mesh, phase, weights, attention (prefill's) and context."""
  words = [shd.format_mesh(mesh), phase, f"{fmt.name} weights"]
  words += [f"attention {attention}"] if phase == "prefill" and attention else []
  return " ".join([*words, f"context {context}"])


def infer(workload: InferWorkload | None = None, /, *, run: RunOptions | None = None, **fields: Any) -> list[InferRow]:
  """Compiles every (mesh, weight format, phase, context) of ``workload`` (``fields`` replaced),
  one after another in this process. ``run`` (or its fields as keywords,
  :class:`jaxmem.options.RunOptions`): ``on_start`` is told the number of configurations before
  the first compile, ``on_row`` each row; ``jobs``, ``scheduler`` and ``cache`` are refused.
  Listeners (:func:`jaxmem.events.listen`) hear a :class:`~jaxmem.events.Compiling` event before
  each configuration compiles, counted as compare's are."""
  run = RunOptions.of(run, fields)
  run.refuse("infer", "it compiles in this process, one configuration after another, with no row cache",
             "jobs", "scheduler", "cache")
  w = InferWorkload.of(workload, **fields)
  check_phase_fields(w)
  p = plan_infer(w)
  configs = p.configs()
  run.start(len(configs), p.cfg)
  rows = []
  for i, config in enumerate(configs, 1):
    emit(Compiling(index=i, total=len(configs), label=config_label(*config)))
    row = run_infer_config(p, *config)
    rows.append(row)
    run.row(row)
  return rows



"""A validated sweep (:class:`Plan`) and its configurations as portable tasks (:class:`Task`).

:func:`plan` resolves a :class:`~jaxmem.workload.Workload`'s names (model, target, remat
policies, optimizers, meshes, attention implementations) and checks every mesh, the batch
(against the data axes times the microbatches) and every attention name on every mesh before
anything compiles, so
bad input is one :class:`JaxmemError` without wasted work. A :class:`Task` is one configuration
of the plan as a workload of single values (the model as a resolved config, the target by name),
so it can be pickled to another process or machine and hashed for the row cache.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from jaxmem.axes import AXES, Axis, declared, one_value_each, outer_axes
from jaxmem.hardware.targets import Target, cpu_devices_needed, resolved_target
from jaxmem.errors import JaxmemError
from jaxmem.models import ATTENTION_NAMES, MOE_KERNELS, ModelConfig, StepChoices, choose_moe_kernel, get_config
from jaxmem.models.config import MOE_IMPLS
from jaxmem.cache import key
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS, Optimizer
from jaxmem.program.pipelining import PipelineOptions
from jaxmem.program.precision import Precision
from jaxmem.program.remat import RematPolicy, parse_remat
from jaxmem.program.step import OWN, load_step, step_fingerprint, step_label
from jaxmem.program.train import (
    TrainProgram, build_train_program, check_batch, check_step_options, pick_attention,
)
from jaxmem.workload import PRECISION_AXES, BaseWorkload, Workload


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
  """One configuration: a workload with one mesh, remat policy and optimizer, the model as its
  resolved :class:`ModelConfig` and the target by name (another process rebuilds it)."""

  workload: Workload
  cpu_devices: int = 1  # simulated CPU devices the worker must start JAX with

  @property
  def mesh(self) -> shd.MeshSpec:
    return shd.parse_mesh(self.workload.mesh[0])

  @property
  def target(self) -> str:
    return self.workload.target_name

  def __getattr__(self, name: str) -> Any:
    # A sweep axis's one value (task.remat, task.microbatches...): jaxmem.axes declares them.
    if name in AXES and name != "mesh":
      return AXES[name].first(self.__dict__["workload"])
    raise AttributeError(name)

  def replace(self, **fields: Any) -> Task:
    """The same task with workload fields replaced (``batch=``, ``seq=``...)."""
    return dataclasses.replace(self, workload=self.workload.replace(**fields))

  def cache_key(self) -> str | None:
    """Everything that changes the compiled program: the whole workload (the model's full
    config included) and, in :func:`jaxmem.cache.key`, jaxmem's code fingerprint and the
    installed versions. A
    step's adds a hash of its source; ``None`` (not cached) where it has none to hash."""
    parts = self.workload.as_dict()
    if self.workload.step:
      parts["step_source"] = step_fingerprint(self.workload.step)
      if parts["step_source"] is None:
        return None
    return key(parts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
  """A validated sweep: every name resolved and every mesh checked before anything compiles.

  ``workload`` is what was asked (target by name); the other fields are what it resolved to.
  ``batch`` and ``seq`` are the workload's, kept here so a search can replace them."""

  workload: Workload
  cfg: ModelConfig | None  # None for a step (workload.step): its model is its own
  target: Target
  meshes: tuple[shd.MeshSpec, ...]
  optimizers: tuple[Optimizer, ...]
  remats: tuple[RematPolicy, ...]
  batch: int
  seq: int
  # The step's own sweep axes: attention names as asked (auto or an implementation)
  # and microbatch counts.
  attentions: tuple[str, ...] = ("auto",)
  microbatches: tuple[int, ...] = (1,)
  vocab_tiles: tuple[int, ...] = (1,)
  # The MoE sweep (moe_variants): each entry the (moe_impl, capacity_factor) a task's workload
  # holds; ``choices`` the first's, and ``moe_notes`` say how the first was chosen.
  moe: tuple[MoeVariant, ...] = (((), ()),)
  moe_notes: tuple[str, ...] = ()
  # How the step runs the model (its dropout, its experts' implementation and capacity: the
  # first MoE variant's), which the model is built with beside ``cfg``.
  choices: StepChoices = StepChoices()
  model: ModelConfig | None = None  # the model before the MoE choice, which tasks carry
  # Master copy, moments and gradient-reduction dtypes: every combination the workload sweeps.
  precisions: tuple[Precision, ...] = (Precision(),)
  pipeline: PipelineOptions = PipelineOptions()  # on the meshes with a stage axis (one per sweep)
  # How attention crosses a context-sharded sequence, swept on meshes with a context axis.
  context_strategies: tuple[str, ...] = ("all_gather",)
  # The sweep axes the planner takes as given (declared in jaxmem.axes, checked by their parsers,
  # used by the program code, not resolved here): each (name, values), a task per value.
  others: tuple[tuple[str, tuple[Any, ...]], ...] = ()
  # A sweep over the outer axes (jaxmem.axes: the model's config, the
  # step's layout): one plan per combination, each of one value per axis; this plan is then the
  # first's, with the workload as asked. Empty for one combination.
  variants: tuple[Plan, ...] = ()

  @property
  def precision(self) -> Precision:
    """The first precision of the sweep (a task's plan, :func:`for_task`, has only its own)."""
    return self.precisions[0]

  def step_options(self) -> dict[str, Any]:
    """The first value of each axis the planner takes as given (:func:`given_axes`), by name:
    what the program code reads them from (:func:`jaxmem.program.train.build_train_program`'s
    ``options``); a task's plan (:func:`for_task`) has only its own."""
    return {name: values[0] for name, values in self.others}

  def strategies(self, mesh: shd.MeshSpec) -> tuple[str, ...]:
    """The context strategies a mesh sweeps: all of them over a context axis, else the first
    (it changes nothing there, and its rows say ``context_strategy`` None)."""
    return self.context_strategies if "context" in shd.mesh_axes(mesh).seq else self.context_strategies[:1]

  def configs(self) -> list[tuple[shd.MeshSpec, Optimizer, RematPolicy]]:
    return list(itertools.product(self.meshes, self.optimizers, self.remats))

  def grid(self) -> list[tuple[shd.MeshSpec, Optimizer, str, int, RematPolicy]]:
    """Every configuration as (mesh, optimizer, attention, microbatches, remat): ``configs()``
    with the step's axes, the remat policy innermost so each group starts with its baseline."""
    return list(itertools.product(self.meshes, self.optimizers, self.attentions, self.microbatches, self.remats))

  def tasks(self) -> list[Task]:
    """The configurations as picklable, cacheable tasks, in ``grid()`` order for each MoE
    variant, precision, value of each axis taken as given (``others``) and vocabulary tiling
    (:func:`for_task` specialises the plan to one)."""
    if self.variants:
      return [t for v in self.variants for t in v.tasks()]
    cpu = cpu_devices_needed([self.workload.target_name])
    # The model before the MoE choice, so a task's cache key does not depend on the sweep's first variant.
    one = self.workload.replace(model=self.model or self.cfg or self.workload.model, batch=self.batch, seq=self.seq)
    others = [dict(zip((n for n, _ in self.others), values, strict=True))
              for values in itertools.product(*((tuple((v,) for v in vs)) for _, vs in self.others))]
    return [
        Task(
            workload=one.replace(
                mesh=shd.format_mesh(mesh), remat=rp.name, optimizer=opt.name, attention=attention, microbatches=mb,
                vocab_tiles=tiles, moe_impl=impl, capacity_factor=factor, context_strategy=strategy,
                **precision_axes(prec), **other,
            ),
            cpu_devices=cpu,
        )
        for impl, factor in self.moe
        for prec in self.precisions
        for other in others
        for tiles in self.vocab_tiles
        for mesh, opt, attention, mb, rp in self.grid()
        for strategy in self.strategies(mesh)
    ]


def for_task(p: Plan, task: Task) -> tuple[Plan, shd.MeshSpec, Optimizer, RematPolicy]:
  """One of ``p``'s tasks without planning it again: ``p`` with the task's workload (its batch and
  sequence, which a search or a scale grid replaces, its vocabulary tiling and MoE variant, with
  that variant's config and notes), and the task's mesh, optimizer and remat policy as ``p``
  resolved them. What differs from ``p`` (the batch) is checked again where the program is built."""
  p = variant_of(p, task)
  w = task.workload
  choices, notes = p.choices, p.moe_notes
  if p.cfg is not None and (w.moe_impl, w.capacity_factor) != p.moe[0]:
    choices, notes = moe_config(p.cfg, w, p.target.platform, p.choices)
  one = dataclasses.replace(
      p, workload=w, choices=choices, moe_notes=notes, batch=w.batch, seq=w.seq, attentions=w.attention,
      microbatches=w.microbatches, vocab_tiles=w.vocab_tiles, context_strategies=w.context_strategy,
      precisions=(task_precision(w),), others=tuple((n, getattr(w, n)) for n, _ in p.others),
  )
  opt = next(o for o in p.optimizers if o.name == task.optimizer)
  rp = next(r for r in p.remats if r.name == task.remat)
  return one, task.mesh, opt, rp


def build_program(p: Plan, mesh: shd.MeshSpec, opt: Optimizer, rp: RematPolicy, **given: Any) -> TrainProgram:
  """The train program of one of ``p``'s configurations: its mesh, optimizer and policy, the
  plan's model, batch and sequence, and its first value of each of the step's options, each
  unless ``given`` (``cfg``, ``choices``, ``batch``, ``seq`` or an option of
  :func:`jaxmem.program.train.build_train_program`; ``options`` replaces the values of the axes
  taken as given that it names, :meth:`Plan.step_options` the rest)."""
  options = dict(
      cfg=p.cfg, choices=p.choices, batch=p.batch, seq=p.seq, attention=p.attentions[0],
      microbatches=p.microbatches[0], vocab_tiles=p.vocab_tiles[0], precision=p.precision, pipeline=p.pipeline,
      sequence_parallel=p.workload.sequence_parallel, context_strategy=p.context_strategies[0],
  ) | given
  options["options"] = {**p.step_options(), **given.get("options", {})}
  return build_train_program(options.pop("cfg"), remat=rp, optimizer=opt, target=p.target, mesh=mesh, **options)


def variant_of(p: Plan, task: Task) -> Plan:
  """The plan of ``p``'s sweep over the outer axes that ``task`` belongs to (``p`` without one)."""
  if not p.variants:
    return p
  for v in p.variants:
    if all(getattr(v.workload, k) == getattr(task.workload, k) for k in outer_axes()):
      return v
  raise ValueError("task is not one of the plan's")  # a programming error, not bad input


def one_of_each(w: Workload, what: str) -> None:
  """A one-line error where ``w`` gives several values of an outer axis to ``what``, which
  takes one configuration."""
  one_value_each(w, what, only=outer_axes())


def outer_variants(w: Workload) -> list[Workload]:
  """``w`` once per combination of its outer axes' values (itself where each has one)."""
  names = outer_axes()
  values = [AXES[k].values(w) for k in names]
  return [w.replace(**dict(zip(names, combo, strict=True))) for combo in itertools.product(*values)]


# The inner axes the planner resolves itself (the mesh against the target, remat and optimizer
# names, the step's, MoE variants and precisions, each checked); every other is taken as given.
RESOLVED = ("mesh", "remat", "optimizer", "attention", "microbatches", "vocab_tiles", "moe_impl",
            "capacity_factor", *PRECISION_AXES, "context_strategy")


def given_axes(*, training: bool | None = None, recorded: bool = False) -> tuple[Axis, ...]:
  """The inner axes the planner takes as given, in their declared order: their parsers check
  them as the workload is made, a plan makes a task per value, and the program code reads each
  task's one value from its options (:meth:`Plan.step_options`). ``training`` False: those every
  workload has (inference's too); ``recorded``: only those a result records under their name."""
  return tuple(a for a in declared(training=training) if not a.outer and a.name not in RESOLVED
               and not (recorded and a.record is None))


def workload_options(w: BaseWorkload) -> dict[str, Any]:
  """A workload of one configuration's value of each axis taken as given that it has, by name
  (the options :func:`jaxmem.program.train.pick_attention` takes)."""
  return {a.name: a.first(w) for a in given_axes() if hasattr(w, a.name)}


def recorded_options(options: Mapping[str, Any]) -> dict[str, Any]:
  """Of ``options`` (axes taken as given, by name), those a result records under their name."""
  return {k: v for k, v in options.items() if AXES[k].record is not None}


def resolve_others(w: Workload) -> tuple[tuple[str, tuple[Any, ...]], ...]:
  """The values, each once, of the inner axes the planner takes as given (their declarations
  check them as the workload is made); an empty one is an error."""
  out = []
  for axis in given_axes():
    if not hasattr(w, axis.name):
      continue
    values = axis.values(w)
    if not values:
      raise JaxmemError(f"`{axis.name}` is empty; give values separated by commas")
    out.append((axis.name, tuple(dict.fromkeys(values))))
  return tuple(out)


def precision_axes(prec: Precision) -> dict[str, tuple[str | None]]:
  """A task's workload fields for one precision (each axis one value)."""
  return {name: (getattr(prec, name),) for name in PRECISION_AXES}


def task_precision(w: Workload) -> Precision:
  """The precision of a task's workload (one value per axis)."""
  return Precision(**{name: getattr(w, name)[0] for name in PRECISION_AXES})


def resolve_model(model: str | ModelConfig, **overrides: str | None) -> ModelConfig:
  """A preset by name (or a config as given) with the dtype overrides that are not ``None``."""
  overrides = {k: v for k, v in overrides.items() if v is not None}
  if isinstance(model, ModelConfig):
    return dataclasses.replace(model, **overrides)
  return get_config(model, **overrides)


def resolve_target(w: BaseWorkload) -> Target:
  """The workload's target with its capacity, less the bytes ``w.resident`` another program holds
  on each device (:func:`jaxmem.hardware.targets.resolved_target`, as the API's entry points)."""
  return resolved_target(w.target, slices=w.slices, resident=w.resident, mem_fraction=w.mem_fraction)


def resolve_meshes(w: BaseWorkload, tgt: Target) -> tuple[shd.MeshSpec, ...]:
  """The workload's meshes (FSDP over every device when none), each checked against the target."""
  meshes = tuple(shd.parse_mesh(m) for m in w.mesh) or (shd.default_mesh(tgt.num_devices),)
  for m in meshes:
    if shd.mesh_size(m) != tgt.num_devices:
      raise JaxmemError(
          f"mesh {shd.format_mesh(m)} has {shd.mesh_size(m)} devices but target {tgt.name} has "
          f"{tgt.num_devices}; make the axis sizes multiply to {tgt.num_devices}"
      )
  return meshes


# One MoE configuration as a task's workload holds it: (moe_impl, capacity_factor), each empty
# (the default) or one value.
MoeVariant = tuple[tuple[str, ...], tuple[float, ...]]

# Why capacity is the default on GPU targets, and what dropless costs there (benchmarks/moe_layer.py).
_GPU_RAGGED_DOT = (
    "XLA's GPU compiler expands jax.lax.ragged_dot (the dropless path's grouped matmul) into a dense "
    "matmul over all E experts, so its temporaries hold E times the routed copies a grouped matmul "
    "would (qwen3-30b-a3b, one layer, 4096 tokens, gpu:h100: 48.85 GiB dropless against 0.90-1.66 "
    "capacity, benchmarks/moe_layer.py)"
)


def moe_variants(w: BaseWorkload) -> tuple[MoeVariant, ...]:
  """The MoE configurations a workload sweeps: every ``moe_impl`` (capacity once per capacity
  factor), or the default alone; capacity factors without ``moe_impl`` imply capacity."""
  impls = w.moe_impl or (("capacity",) if w.capacity_factor else ())
  for impl in impls:
    if impl not in MOE_IMPLS:
      raise JaxmemError(f"unknown `moe_impl` {impl!r}; valid: {', '.join(MOE_IMPLS)}")
  if w.capacity_factor and "capacity" not in impls:
    raise JaxmemError("`capacity_factor` applies to `moe_impl` capacity; add capacity to `moe_impl`")
  for f in w.capacity_factor:
    if not f > 0:
      raise JaxmemError(f"`capacity_factor` must be > 0 (got {f:g})")
  if not impls:
    return (((), ()),)
  out: list[MoeVariant] = []
  for impl in impls:
    factors = w.capacity_factor if impl == "capacity" else ()
    out += [((impl,), (f,)) for f in factors] or [((impl,), ())]
  return tuple(dict.fromkeys(out))


def moe_config(
    cfg: ModelConfig, w: BaseWorkload, platform: str, choices: StepChoices = StepChoices()
) -> tuple[StepChoices, tuple[str, ...]]:
  """The step ``choices`` with the MoE choice of a one-variant workload for the model ``cfg``, and
  notes on it. A dense model with MoE choices is an error: they would change nothing, and
  silently so.

  The default on GPU targets is ``capacity``: XLA's GPU compiler expands ``ragged_dot``, so the
  dropless figure there describes a program GPU MoE training does not run (MaxText's GPU
  recipes set sparse_matmul=False, its dense capacity path; its megablox kernel is TPU-only)."""
  if not cfg.is_moe:
    if w.moe_impl or w.capacity_factor:
      raise JaxmemError(
          f"`moe_impl` and `capacity_factor` apply to mixture-of-experts models; {cfg.name} has no experts (drop them)"
      )
    return choices, ()
  notes: list[str] = []
  if w.moe_impl:
    impl = w.moe_impl[0]
  elif w.capacity_factor:
    impl = "capacity"
  elif platform == "gpu" and choices.moe_impl == "dropless":
    impl = "capacity"
    notes.append(f"moe_impl: capacity, the default on GPU targets: {_GPU_RAGGED_DOT}; --moe-impl dropless compiles it anyway")
  else:
    impl = choices.moe_impl
  if impl == "dropless" and platform == "gpu" and not notes:
    notes.append(f"moe_impl dropless on GPU: {_GPU_RAGGED_DOT}; --moe-impl capacity is what GPU MoE training runs")
  factor = w.capacity_factor[0] if w.capacity_factor else choices.capacity_factor
  return dataclasses.replace(choices, moe_impl=impl, capacity_factor=factor), tuple(notes)


def check_moe_kernel(w: Workload, cfg: ModelConfig, variants: tuple[MoeVariant, ...], platform: str) -> None:
  """A one-line error where the workload names a grouped-matmul kernel (``moe_kernel`` other
  than ``auto``) that would change nothing, and silently so (a dense model; no dropless variant
  on this target), or that the target cannot compile (``gmm`` off TPU)."""
  if not w.moe_kernel:
    raise JaxmemError(f"`moe_kernel` is empty; give names separated by commas from {', '.join(MOE_KERNELS)}")
  for name in w.moe_kernel:
    if name not in MOE_KERNELS:
      raise JaxmemError(f"unknown `moe_kernel` {name!r}; valid: {', '.join(MOE_KERNELS)}")
  if w.moe_kernel == AXES["moe_kernel"].normalise(AXES["moe_kernel"].default):
    return
  if not cfg.is_moe:
    raise JaxmemError(f"`moe_kernel` applies to mixture-of-experts models; {cfg.name} has no experts (drop it)")
  impls = {moe_config(cfg, w.replace(moe_impl=i, capacity_factor=f), platform)[0].moe_impl for i, f in variants}
  if "dropless" not in impls:
    raise JaxmemError(
        f"`moe_kernel` applies to `moe_impl` dropless, and {cfg.name} runs capacity here; add dropless to `moe_impl`"
    )
  for name in w.moe_kernel:
    choose_moe_kernel(name, platform)


def plan(workload: Workload | None = None, /, **fields: Any) -> Plan:
  """Resolves and checks a sweep: ``workload`` (or the default one) with ``fields`` replaced.
  Raises :class:`JaxmemError` on any bad input."""
  w = Workload.of(workload, **fields)
  if w.step:
    return plan_step(w)
  combos = outer_variants(w)
  if len(combos) > 1:  # every combination planned (and so checked) before anything compiles
    subs = tuple(plan(v) for v in combos)
    return dataclasses.replace(subs[0], workload=w.replace(target=w.target_name), variants=subs)
  dropout = resolve_dropout(w)
  cfg = resolve_model(w.model, param_dtype=w.param_dtype, dtype=w.dtype)
  tgt = resolve_target(w)
  remats = parse_remat(w.remat, host_memory=tgt.has_host_memory)
  optimizers = OPTIMIZERS.parse(w.optimizer)
  meshes = resolve_meshes(w, tgt)
  attentions, microbatches = resolve_step_axes(w)
  vocab_tiles = resolve_vocab_tiles(w)
  strategies = resolve_context_strategies(w)
  precisions = resolve_precisions(w, cfg, optimizers)
  others = resolve_others(w)
  pipeline = resolve_pipeline(w, meshes)
  variants = moe_variants(w)
  impl, factor = variants[0]
  model = cfg
  choices, moe_notes = moe_config(
      cfg, w.replace(moe_impl=impl, capacity_factor=factor), tgt.platform, StepChoices(dropout=dropout)
  )
  check_moe_kernel(w, model, variants, tgt.platform)
  for m in meshes:
    for mb, tiles in itertools.product(microbatches, vocab_tiles):
      check_batch(w.batch, w.seq, m, cfg, microbatches=mb, vocab_tiles=tiles, pipeline=pipeline, choices=choices)
    check_step_options(cfg, m, w.seq, sequence_parallel=w.sequence_parallel)
    if choices.dropout and pipeline.schedule(m):
      raise JaxmemError(
          f"`dropout` with a stage axis (mesh {shd.format_mesh(m)}) is not built: the pipeline's iterations carry no "
          "dropout keys; set dropout 0 or drop the stage axis"
      )
    for name, strategy in itertools.product(attentions, strategies if "context" in shd.mesh_axes(m).seq else (None,)):
      # A name the target or mesh cannot take is refused here, before the first compile.
      pick_attention(name, cfg, batch=w.batch, seq=w.seq, target=tgt, mesh=dict(m), context_strategy=strategy,
                     options={n: vs[0] for n, vs in others})
  w = w.replace(target=w.target_name)
  return Plan(
      workload=w, cfg=cfg, target=tgt, meshes=meshes, optimizers=optimizers, remats=tuple(remats),
      batch=w.batch, seq=w.seq, attentions=attentions, microbatches=microbatches, vocab_tiles=vocab_tiles, moe=variants,
      moe_notes=moe_notes, choices=choices, model=model, precisions=precisions, pipeline=pipeline,
      context_strategies=strategies, others=others,
  )


def resolve_pipeline(w: Workload, meshes: tuple[shd.MeshSpec, ...]) -> PipelineOptions:
  """The workload's pipeline options, checked; given without a mesh that has a stage axis, an
  error (they would change nothing, and silently so)."""
  options = PipelineOptions(microbatches=w.pipeline_microbatches, repeats=w.pipeline_repeats)
  options.check()
  if options.given and not any(options.schedule(m) for m in meshes):
    raise JaxmemError(
        "`pipeline_microbatches` and `pipeline_repeats` apply to meshes with a stage axis (e.g. stage=4,fsdp=2); "
        "no mesh here has one"
    )
  return options


def resolve_dropout(w: Workload) -> float:
  """The workload's dropout rate for the step (:attr:`StepChoices.dropout`), checked."""
  d = w.dropout
  if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
    raise JaxmemError(f"`dropout` must be a probability in [0, 1), got {d!r}")
  if not isinstance(w.sequence_parallel, bool):
    raise JaxmemError(f"`sequence_parallel` is true or false, got {w.sequence_parallel!r}")
  return float(d)


def resolve_precisions(w: Workload, cfg: ModelConfig, optimizers: tuple[Optimizer, ...]) -> tuple[Precision, ...]:
  """Every combination of the workload's precision axes (master copy outermost), each checked
  against the model's parameter dtype and every optimizer of the sweep (``moments_dtype`` on an
  optimizer that cannot take one is refused here)."""
  for name in PRECISION_AXES:
    if not getattr(w, name):
      raise JaxmemError(f"`{name}` is empty; give dtypes separated by commas (none for the default)")
  out = []
  for values in itertools.product(*(getattr(w, name) for name in PRECISION_AXES)):
    precision = Precision(**dict(zip(PRECISION_AXES, values, strict=True)))
    precision.check(cfg.param_dtype)
    if precision.moments_dtype is not None:
      for opt in optimizers:
        opt.transformation(1e-3, moments_dtype=precision.moments_dtype)  # builds nothing; refuses in one line
    out.append(precision)
  return tuple(out)


# The optimizer column of a step's rows: the step brings its own.
STEP_OPTIMIZER = Optimizer(name=OWN, build=lambda lr: None, description="the step's own")

# Step sources that resolve their own sweep, by their factory's import path (a workload's
# ``step``): MaxText's (jaxmem.maxtext.plan registers it; jaxmem imports that module).
STEP_PLANNERS: dict[str, Callable[[Workload], Plan]] = {}


def plan_step(w: Workload) -> Plan:
  """A sweep over a user's step (``w.step``): the target, remat policies and meshes as for the
  model's, the factory imported and checked before anything compiles."""
  if w.step in STEP_PLANNERS:
    return STEP_PLANNERS[w.step](w)
  load_step(w.step)
  for axis in declared():
    if not axis.step and getattr(w, axis.name) != axis.normalise(axis.default):
      # it changes how jaxmem builds its models' step; a user's step is built by its factory
      raise JaxmemError(f"`{axis.name}` applies to jaxmem's own models (`model`), not `step`; set it in your step factory")
  tgt = resolve_target(w)
  remats = step_remats(w, parse_remat(w.remat, host_memory=tgt.has_host_memory))
  for name, v in (("batch", w.batch), ("seq", w.seq)):
    if v < 1:
      raise JaxmemError(f"{name} must be at least 1 (got {v})")
  w = w.replace(model=step_label(w.step), target=w.target_name, optimizer=OWN, param_dtype=None, dtype=None)
  return Plan(
      workload=w, cfg=None, target=tgt, meshes=resolve_meshes(w, tgt), optimizers=(STEP_OPTIMIZER,),
      remats=tuple(remats), batch=w.batch, seq=w.seq,
  )


def step_remats(w: Workload, remats: list[RematPolicy]) -> list[RematPolicy]:
  """The policies a step's factory can act on. A factory receives a ``jax.checkpoint`` policy;
  one that changes how jaxmem's own models are built instead (``selective``: their attention core
  under its own checkpoint) would reach it as no policy at all. Named, it is refused; under
  ``all`` it is left out."""
  named = {n.strip() for part in ((w.remat,) if isinstance(w.remat, str) else w.remat) for n in part.split(",")}
  for rp in remats:
    if rp.attention_core and rp.name in named:
      raise JaxmemError(
          f"`remat` {rp.name} rebuilds jaxmem's own models (their attention core under its own jax.checkpoint); "
          "a step factory receives a jax.checkpoint policy and there is none for it: checkpoint your attention "
          "core inside the step (jax.checkpoint(attend, policy=jax.checkpoint_policies.nothing_saveable)) and "
          "compare it with `remat` none"
      )
  return [rp for rp in remats if not rp.attention_core]


def resolve_step_axes(w: Workload) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """The workload's attention names and microbatch counts, each once, checked."""
  attentions = resolve_attention(w)
  if not w.microbatches:
    raise JaxmemError("`microbatches` is empty; give whole numbers separated by commas, e.g. 1,4")
  for mb in w.microbatches:
    if not isinstance(mb, int) or isinstance(mb, bool) or mb < 1:
      raise JaxmemError(f"`microbatches` must be whole numbers of at least 1 (got {mb!r})")
  return attentions, tuple(dict.fromkeys(w.microbatches))


def resolve_attention(w: BaseWorkload) -> tuple[str, ...]:
  """The workload's attention names, each once, checked."""
  if not w.attention:
    raise JaxmemError(f"`attention` is empty; give names separated by commas from {', '.join(ATTENTION_NAMES)}")
  for name in w.attention:
    if name not in ATTENTION_NAMES:
      raise JaxmemError(f"unknown attention {name!r}; valid: {', '.join(ATTENTION_NAMES)}")
  return tuple(dict.fromkeys(w.attention))


def resolve_vocab_tiles(w: Workload) -> tuple[int, ...]:
  """The workload's vocabulary tilings, each once, checked (each must also divide the sequence:
  :func:`jaxmem.program.train.check_batch`)."""
  if not w.vocab_tiles:
    raise JaxmemError("`vocab_tiles` is empty; give whole numbers separated by commas, e.g. 1,8")
  for tiles in w.vocab_tiles:
    if not isinstance(tiles, int) or isinstance(tiles, bool) or tiles < 1:
      raise JaxmemError(f"`vocab_tiles` must be whole numbers of at least 1 (got {tiles!r})")
  return tuple(dict.fromkeys(w.vocab_tiles))


def resolve_context_strategies(w: Workload) -> tuple[str, ...]:
  """The workload's context strategies, each once, checked (they apply on meshes with a context axis)."""
  from jaxmem.models.context_attention import STRATEGIES

  if not w.context_strategy:
    raise JaxmemError(f"`context_strategy` is empty; give names separated by commas from {', '.join(STRATEGIES)}")
  for name in w.context_strategy:
    if name not in STRATEGIES:
      raise JaxmemError(f"unknown `context_strategy` {name!r}; valid: {', '.join(STRATEGIES)}")
  return tuple(dict.fromkeys(w.context_strategy))

"""A validated sweep (:class:`Plan`) and its configurations as portable tasks (:class:`Task`).

:func:`plan` resolves a :class:`~jaxmem.workload.Workload`'s names (model, target, remat
policies, optimizers, meshes) and checks every configuration of the sweep as it would be built
(each axis's declared checks, :mod:`jaxmem.axes`, and the program's own,
:func:`jaxmem.program.train.check_configuration`) before anything compiles, so bad input is one
:class:`JaxmemError` without wasted work. Every sweep axis takes the same path: the workload holds
its values, a plan makes a task per combination of the inner axes' values (each axis where it
applies), a task's workload holds one value of each, and the program reads them by name
(:func:`jaxmem.axes.one_each`). A :class:`Task` is one configuration of the plan as a workload of
single values (the model as a resolved config, the target by name), so it can be pickled to
another process or machine and hashed for the row cache; :func:`configuration` is the one place a
configuration's record is made.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

from jaxmem.axes import (
    AXES, Setting, as_configured, check_applies, check_names, check_setting, combinations, configured, declared,
    inner_axes, one_each, one_value_each, outer_axes, recorded,
)
from jaxmem.hardware.targets import Target, cpu_devices_needed, resolved_target
from jaxmem.errors import JaxmemError
from jaxmem.events import notice
from jaxmem.models import ModelConfig, StepChoices, get_config
from jaxmem import compilers
from jaxmem.cache import key
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS, Optimizer
from jaxmem.program.remat import RematPolicy, parse_remat
from jaxmem.program.step import OWN, load_step, step_fingerprint, step_label
from jaxmem.program.train import (
    TrainProgram, batch_multiple, build_train_program, check_configuration, moe_choice, moe_fields,
)
from jaxmem.workload import DEFAULT_BATCH, DEFAULT_SEQ, BaseWorkload, Workload


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
  """One configuration: a workload with one value of every sweep axis (the mesh, remat policy and
  optimizer among them), the model as its resolved :class:`ModelConfig` and the target by name
  (another process rebuilds it)."""

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
    return key(parts, compilers=self.release_versions())

  def release_versions(self) -> dict[str, str] | None:
    """The compiler versions of the release the task is compiled under (``compiler``), which key
    its row in place of this process's; ``None`` for this process's own compiler."""
    spec = getattr(self, "compiler", None)
    return compilers.versions_of(spec) if spec else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
  """A validated sweep: every name resolved and every configuration checked before anything
  compiles.

  ``workload`` is what was asked (target by name; a task's plan, :func:`for_task`, holds the
  task's); it holds every sweep axis's values. The mesh, optimizer and remat policy, the axes
  whose names resolve to what the program is built from, are also here as resolved (``meshes``:
  the default mesh where none was asked; ``remats``: ``none`` first). ``cfg`` is the model and
  ``choices`` how the step runs it (:class:`jaxmem.models.StepChoices`), each with
  the outer axes' values (:func:`jaxmem.axes.configured`); a configuration's own values are
  applied to both where its program is built (:meth:`built`). ``batch`` and ``seq`` are the
  workload's, kept here so a search can replace them."""

  workload: Workload
  cfg: ModelConfig | None  # None for a step (workload.step): its model is its own
  target: Target
  meshes: tuple[shd.MeshSpec, ...]
  optimizers: tuple[Optimizer, ...]
  remats: tuple[RematPolicy, ...]
  batch: int
  seq: int
  choices: StepChoices = StepChoices()
  # A sweep over the outer axes (jaxmem.axes: the model's config, the
  # step's layout): one plan per combination, each of one value per axis; this plan is then the
  # first's, with the workload as asked. Empty for one combination.
  variants: tuple[Plan, ...] = ()

  def options(self) -> dict[str, Any]:
    """The first value of every sweep axis, by name (``None`` where none is given, or where the
    axis does not apply): one configuration's options, as the program reads them (a task's plan,
    :func:`for_task`, has only its own)."""
    return one_each(self.workload)

  def built(self, options: Mapping[str, Any] | None = None) -> tuple[ModelConfig, StepChoices]:
    """What one configuration's model is built with (its values: :meth:`options`, with
    ``options`` replacing those it names): the model's config and how the step runs it, each
    with the values (:func:`jaxmem.axes.configured`), the MoE choice resolved for the target as
    the program resolves it (:func:`jaxmem.program.train.moe_choice`)."""
    values = {**self.options(), **(options or {})}
    cfg, choices = configured(self.cfg, self.choices, values)
    return cfg, moe_choice(cfg, choices, self.target.platform, values)[0]

  def sweep(self) -> dict[str, tuple[Any, ...]]:
    """Each inner axis's values, in their nesting order, each once: the mesh, optimizer and remat
    policy as resolved (by name), the others as the workload gives them."""
    resolved = {"mesh": tuple(shd.format_mesh(m) for m in self.meshes), "optimizer": tuple(o.name for o in self.optimizers),
                "remat": tuple(r.name for r in self.remats)}
    return {a.name: resolved.get(a.name, tuple(dict.fromkeys(a.values(self.workload)))) for a in inner_axes(self.workload)}

  def configurations(self) -> list[dict[str, Any]]:
    """Every configuration of the sweep (this plan's; its variants' are their own) as a task's
    workload holds it (:func:`jaxmem.axes.combinations`), in task order."""
    w = self.workload
    return combinations(self.sweep(), {a.name: getattr(w, a.name) for a in AXES.values() if a.outer and hasattr(w, a.name)})

  def configs(self) -> list[tuple[shd.MeshSpec, Optimizer, RematPolicy]]:
    return list(itertools.product(self.meshes, self.optimizers, self.remats))

  def tasks(self) -> list[Task]:
    """The configurations as picklable, cacheable tasks, each a workload of one value of every
    axis (:meth:`configurations`), in the sweep's nesting order (the remat policy innermost but
    for the axes that apply to some meshes, so each group starts with its baseline)."""
    if self.variants:
      return [t for v in self.variants for t in v.tasks()]
    cpu = cpu_devices_needed([self.workload.target_name])
    one = self.workload.replace(model=self.cfg or self.workload.model, batch=self.batch, seq=self.seq)
    return [Task(workload=one.replace(**c), cpu_devices=cpu) for c in self.configurations()]


def for_task(p: Plan, task: Task) -> tuple[Plan, shd.MeshSpec, Optimizer, RematPolicy]:
  """One of ``p``'s tasks without planning it again: ``p`` (the variant of its sweep over the outer
  axes the task belongs to) with the task's workload (one value of every axis; its batch and
  sequence, which a search or a scale grid replaces), and the task's mesh, optimizer and remat
  policy as ``p`` resolved them. What differs from ``p`` (the batch) is checked again where the
  program is built."""
  p = variant_of(p, task)
  w = task.workload
  one = dataclasses.replace(p, workload=w, batch=w.batch, seq=w.seq)
  opt = next(o for o in p.optimizers if o.name == task.optimizer)
  rp = next(r for r in p.remats if r.name == task.remat)
  return one, task.mesh, opt, rp


def build_program(
    p: Plan, mesh: shd.MeshSpec, opt: Optimizer, rp: RematPolicy, *, options: Mapping[str, Any] | None = None,
) -> TrainProgram:
  """The train program of one of ``p``'s configurations: its mesh, optimizer and policy, the
  plan's model, step choices, batch and sequence, and the configuration's value of every axis as
  the program's options (:meth:`Plan.options`, with ``options`` replacing those it names), which
  the program applies to the model and its choices (:func:`jaxmem.axes.configured`)."""
  values = {**p.options(), **(options or {})}
  return build_train_program(p.cfg, choices=p.choices, remat=rp, optimizer=opt, target=p.target, mesh=mesh,
                             batch=p.batch, seq=p.seq, options=values)


def configuration(
    p: Plan, mesh: shd.MeshSpec, opt: Optimizer | None, rp: RematPolicy, program: TrainProgram | None = None,
) -> dict[str, Any]:
  """One configuration's record (the fields of :class:`jaxmem.records.Configuration`), made
  here alone: its placement, and every recorded axis as the configuration asks it (``p``'s
  workload, a task's: :func:`for_task`; ``None`` where the axis does not apply, and for a user's
  step where jaxmem chose nothing), then the values its model's config and step choices hold
  (the axes that configure or choose them) and what ``program`` resolved
  (:attr:`TrainProgram.recorded`: the implementation ``auto`` became, the MoE choice, the
  moments' dtype, the pipeline's schedule); without a program, the MoE choice as it would make it."""
  asked = one_each(p.workload)
  out = {a.name: asked.get(a.name) if p.cfg is not None or a.step else None for a in recorded()}
  out.update(
      model=p.cfg.name if p.cfg is not None else p.workload.model_name, target=p.target.name,
      mesh=shd.format_mesh(mesh), batch=p.batch, seq=p.seq, num_devices=p.target.num_devices,
      remat=rp.name, optimizer=None if opt is None else opt.name,
  )
  if program is not None:
    out.update(as_configured(program.cfg, program.choices), **program.recorded)
  elif p.cfg is not None:
    cfg, choices = p.built()
    out.update(as_configured(cfg, choices), **moe_fields(cfg, choices))
  return out


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


def outer_values(w: BaseWorkload) -> dict[str, Any]:
  """A workload's one value of each outer axis, by name (the model's config and the step's
  layout: what :func:`jaxmem.axes.configured` applies to the model once per plan)."""
  return {n: v for n, v in one_each(w).items() if AXES[n].outer}


def resolve_model(model: str | ModelConfig, values: Mapping[str, Any] | None = None) -> tuple[ModelConfig, StepChoices]:
  """A preset by name (or a config as given) and how a step runs it (every model's default
  :class:`~jaxmem.models.StepChoices`), with the values of the axes that configure or choose them
  (:func:`jaxmem.axes.configured`)."""
  cfg = model if isinstance(model, ModelConfig) else get_config(model)
  return configured(cfg, StepChoices(), values or {})


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
  check_names(w)
  cfg, choices = resolve_model(w.model, outer_values(w))
  tgt = resolve_target(w)
  p = Plan(
      workload=w.replace(target=w.target_name), cfg=cfg, choices=choices, target=tgt, meshes=resolve_meshes(w, tgt),
      optimizers=OPTIMIZERS.parse(w.optimizer), remats=tuple(parse_remat(w.remat, host_memory=tgt.has_host_memory)),
      batch=DEFAULT_BATCH if w.batch is None else w.batch, seq=default_seq(cfg) if w.seq is None else w.seq,
  )
  p = fitted_batch(p) if w.batch is None else p
  check_plan(p)
  return p


def default_seq(cfg: ModelConfig) -> int:
  """The sequence a train step of ``cfg`` takes where none is given: :data:`DEFAULT_SEQ`, or
  fewer where the model takes fewer (:func:`within_positions`)."""
  return within_positions(cfg, DEFAULT_SEQ, "seq")


def within_positions(cfg: ModelConfig, default: int, name: str, *, say: bool = True) -> int:
  """``default`` for the length ``name`` (a train step's sequence, a prompt, a KV cache), or the
  model's :attr:`~jaxmem.models.ModelConfig.position_limit` where it is shorter (GPT-2's 1024
  learned positions); the change said in a notice where ``say``."""
  limit = cfg.position_limit
  if limit is None or limit >= default:
    return default
  if say:
    notice(f"{name} {limit}: {cfg.name}'s {limit} learned positions (default {default})")
  return limit


def fitted_batch(p: Plan) -> Plan:
  """``p`` at the batch it takes where none is given: :data:`DEFAULT_BATCH`, or the smallest
  multiple above it of what every configuration's batch must divide (its data axes x its
  microbatches x its pipeline microbatches: :func:`jaxmem.program.train.batch_multiple`); the
  change said in a notice."""
  meshes = {shd.format_mesh(m): m for m in p.meshes}
  needs = {}
  for values in p.configurations():
    one = one_each(p.workload.replace(**values))
    needs.setdefault(batch_multiple(meshes[one["mesh"]], one), one)
  multiple = math.lcm(*needs)
  if p.batch % multiple == 0:
    return p
  batch = -(-p.batch // multiple) * multiple
  if len(needs) == 1:
    (one,) = needs.values()
    mesh = meshes[one["mesh"]]
    ways, micro = shd.data_parallel_size(mesh), one["microbatches"] or 1
    piped = multiple // (ways * micro)
    split = [f"{micro} microbatches"] * (micro > 1) + [f"{piped} pipeline microbatches"] * (piped > 1)
    why = " x ".join([*split, f"mesh {one['mesh']}'s {ways} data-parallel ways"])
  else:
    why = f"a multiple of {multiple}, what every configuration's data-parallel ways x microbatches divide"
  notice(f"batch {batch}: {why} (default {DEFAULT_BATCH})")
  return dataclasses.replace(p, batch=batch)


def check_plan(p: Plan) -> None:
  """Every configuration of ``p`` checked as it would be built, before anything compiles: a value
  given to an axis that applies to none of them (:func:`jaxmem.axes.check_applies`), each axis's
  own check of its value there (:func:`jaxmem.axes.check_setting`), and what the program would
  refuse (:func:`jaxmem.program.train.check_configuration`), each in one line."""
  configurations = [one_each(p.workload.replace(**c)) for c in p.configurations()]
  check_applies(p.workload, configurations)
  optimizers = {o.name: o for o in p.optimizers}
  meshes = {shd.format_mesh(m): m for m in p.meshes}
  seen = set()
  for values in configurations:
    cfg, _ = configured(p.cfg, p.choices, values)
    check_setting(Setting(values=values, cfg=cfg, platform=p.target.platform, optimizer=optimizers[values["optimizer"]]))
    # The program's checks do not depend on the remat policy: once for the policies of a configuration.
    same = tuple((k, v) for k, v in values.items() if k != "remat")
    if same not in seen:
      seen.add(same)
      check_configuration(p.cfg, choices=p.choices, target=p.target, mesh=meshes[values["mesh"]], batch=p.batch,
                          seq=p.seq, options=values)


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
    if not axis.step and getattr(w, axis.name) != axis.unset:
      # it changes how jaxmem builds its models' step; a user's step is built by its factory
      raise JaxmemError(f"`{axis.name}` applies to jaxmem's own models (`model`), not `step`; set it in your step factory")
  tgt = resolve_target(w)
  remats = step_remats(w, parse_remat(w.remat, host_memory=tgt.has_host_memory))
  # A step's model is its factory's: the defaults as they are (its factory shards the batch).
  w = w.replace(batch=DEFAULT_BATCH if w.batch is None else w.batch, seq=DEFAULT_SEQ if w.seq is None else w.seq)
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

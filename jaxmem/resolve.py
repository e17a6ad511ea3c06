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
from collections.abc import Mapping
from typing import Any

from jaxmem.axes import (
    AXES, Setting, as_configured, check_applies, check_names, check_setting, combinations, configured, declared,
    inner_axes, one_each, one_value_each, outer_axes, recorded,
)
from jaxmem.hardware.targets import Target, cpu_devices_needed, get_target, with_capacity, with_resident
from jaxmem.errors import JaxmemError
from jaxmem.models import ModelConfig, get_config
from jaxmem.cache import key
from jaxmem.program import maxtext as mx
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS, Optimizer
from jaxmem.program.remat import RematPolicy, parse_remat
from jaxmem.program.step import OWN, load_step, step_fingerprint, step_label
from jaxmem.program.train import TrainProgram, build_train_program, check_configuration
from jaxmem.workload import BaseWorkload, Workload


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
    return key(parts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
  """A validated sweep: every name resolved and every configuration checked before anything
  compiles.

  ``workload`` is what was asked (target by name; a task's plan, :func:`for_task`, holds the
  task's); it holds every sweep axis's values. The mesh, optimizer and remat policy, the axes
  whose names resolve to what the program is built from, are also here as resolved (``meshes``:
  the default mesh where none was asked; ``remats``: ``none`` first). ``cfg`` is the model with
  the outer axes' values (:func:`jaxmem.axes.configured`). ``batch`` and ``seq`` are the
  workload's, kept here so a search can replace them."""

  workload: Workload
  cfg: ModelConfig | None  # None for a step (workload.step): its model is its own
  target: Target
  meshes: tuple[shd.MeshSpec, ...]
  optimizers: tuple[Optimizer, ...]
  remats: tuple[RematPolicy, ...]
  batch: int
  seq: int
  # A sweep over the outer axes (jaxmem.axes: the model's config, the
  # step's layout): one plan per combination, each of one value per axis; this plan is then the
  # first's, with the workload as asked. Empty for one combination.
  variants: tuple[Plan, ...] = ()

  def options(self) -> dict[str, Any]:
    """The first value of every sweep axis, by name (``None`` where none is given, or where the
    axis does not apply): one configuration's options, as the program reads them (a task's plan,
    :func:`for_task`, has only its own)."""
    return one_each(self.workload)

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
  plan's batch and sequence, its model with the configuration's values
  (:func:`jaxmem.axes.configured`) and the configuration's value of every axis as the program's
  options (:meth:`Plan.options`, with ``options`` replacing those it names)."""
  values = {**p.options(), **(options or {})}
  return build_train_program(configured(p.cfg, values), remat=rp, optimizer=opt, target=p.target, mesh=mesh,
                             batch=p.batch, seq=p.seq, options=values)


def configuration(
    p: Plan, mesh: shd.MeshSpec, opt: Optimizer | None, rp: RematPolicy, program: TrainProgram | None = None,
) -> dict[str, Any]:
  """One configuration's record (the fields of :class:`jaxmem.records.Configuration`), made
  here alone: its placement, and every recorded axis as the configuration asks it (``p``'s
  workload, a task's: :func:`for_task`; ``None`` where the axis does not apply, and for a user's
  step where jaxmem chose nothing), then the values its model's config holds (the axes that
  configure it) and what ``program`` resolved (:attr:`TrainProgram.recorded`: the implementation
  ``auto`` became, the moments' dtype, the pipeline's schedule)."""
  asked = one_each(p.workload)
  out = {a.name: asked.get(a.name) if p.cfg is not None or a.step else None for a in recorded()}
  out.update(
      model=p.cfg.name if p.cfg is not None else p.workload.model_name, target=p.target.name,
      mesh=shd.format_mesh(mesh), batch=p.batch, seq=p.seq, num_devices=p.target.num_devices,
      remat=rp.name, optimizer=None if opt is None else opt.name,
  )
  if program is not None:
    out.update(as_configured(program.cfg), **program.recorded)
  elif p.cfg is not None:
    out.update(as_configured(p.cfg))
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


def resolve_model(model: str | ModelConfig, values: Mapping[str, Any] | None = None) -> ModelConfig:
  """A preset by name (or a config as given) with the values of the axes that configure it
  (:func:`jaxmem.axes.configured`)."""
  cfg = model if isinstance(model, ModelConfig) else get_config(model)
  return configured(cfg, values or {})


def resolve_target(w: BaseWorkload) -> Target:
  """The workload's target with its capacity (a TPU target's costs a quick probe compile), less
  the bytes ``w.resident`` another program holds on each device."""
  tgt = get_target(w.target, slices=w.slices, mem_fraction=w.mem_fraction) if isinstance(w.target, str) else w.target
  if w.resident and tgt.resident_bytes and tgt.resident_bytes != w.resident:
    raise JaxmemError(f"`resident` is {w.resident:,} bytes but the target given already holds {tgt.resident_bytes:,}")
  return with_resident(with_capacity(tgt), 0 if tgt.resident_bytes else w.resident)


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
  cfg = resolve_model(w.model, outer_values(w))
  tgt = resolve_target(w)
  p = Plan(
      workload=w.replace(target=w.target_name), cfg=cfg, target=tgt, meshes=resolve_meshes(w, tgt),
      optimizers=OPTIMIZERS.parse(w.optimizer), remats=tuple(parse_remat(w.remat, host_memory=tgt.has_host_memory)),
      batch=w.batch, seq=w.seq,
  )
  check_plan(p)
  return p


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
    cfg = configured(p.cfg, values)
    check_setting(Setting(values=values, cfg=cfg, platform=p.target.platform, optimizer=optimizers[values["optimizer"]]))
    # The program's checks do not depend on the remat policy: once for the policies of a configuration.
    same = tuple((k, v) for k, v in values.items() if k != "remat")
    if same not in seen:
      seen.add(same)
      check_configuration(cfg, target=p.target, mesh=meshes[values["mesh"]], batch=p.batch, seq=p.seq, options=values)


# The optimizer column of a step's rows: the step brings its own.
STEP_OPTIMIZER = Optimizer(name=OWN, build=lambda lr: None, description="the step's own")


def plan_step(w: Workload) -> Plan:
  """A sweep over a user's step (``w.step``): the target, remat policies and meshes as for the
  model's, the factory imported and checked before anything compiles."""
  if w.maxtext or w.step == mx.SPEC:
    return plan_maxtext(w)
  load_step(w.step)
  for axis in declared():
    if not axis.step and getattr(w, axis.name) != axis.unset:
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


def plan_maxtext(w: Workload) -> Plan:
  """A sweep over MaxText's own step (``w.maxtext``, :mod:`jaxmem.program.maxtext`): MaxText's
  config read once with what the workload gives mapped onto its options, so a value MaxText or
  the mapping refuses is one line before anything compiles. What the workload does not give
  (its batch and sequence None, the other axes at their defaults) is MaxText's own: the batch,
  sequence, microbatches, remat policy, attention and mesh its config says (and, in the rows,
  shows). A value given both ways must agree (a task, planned again in
  a worker process, gives them all)."""
  if not w.maxtext:
    raise JaxmemError(f"step {mx.SPEC} is MaxText's; give its config with `maxtext` (base.yml key=value ...)")
  mx.require()
  tgt = resolve_target(w)
  name, slices = mx.topology(tgt)
  user = mx.overrides(w.maxtext)
  args = (*w.maxtext, *(f"{k}={v}" for k, v in maxtext_fixed(w, user).items()))
  micro = maxtext_microbatches(w, user)
  given: dict[str, str] = {}
  if w.batch is not None:  # a batch jaxmem was given (or a search set) replaces MaxText's
    per_device = [_agree(user, "batch", "per_device_batch_size", mx.per_device_batch(w.batch, tgt.num_devices, mb))
                  for mb in micro or (_accumulation(args),)]
    given["per_device_batch_size"] = per_device[0]
  if w.seq is not None:
    given["max_target_length"] = _agree(user, "seq", "max_target_length", str(w.seq))
  if micro:
    given["gradient_accumulation_steps"] = str(micro[0])
  own = mx.resolve(args, dict(compile_topology=name, compile_topology_num_slices=str(slices), **given), tgt)
  meshes = resolve_meshes(w, tgt) if w.mesh else (own.mesh,)
  for m in meshes if w.mesh else ():
    if slices > 1 and m != own.mesh:
      raise JaxmemError(
          f"`mesh` {shd.format_mesh(m)} over several slices has no MaxText mapping (MaxText's own is "
          f"{shd.format_mesh(own.mesh)}); set MaxText's ici_* and dcn_* in the overrides"
      )
    for key_, value in mx.mesh_overrides(m).items() if slices == 1 else ():
      _agree(user, "mesh", key_, value)
  remats = maxtext_remats(w, user, own, tgt)
  if w.attention != AXES["attention"].normalise(AXES["attention"].default):
    for a in w.attention:
      _agree(user, "attention", "attention", mx.attention(a, own.attention))
  attentions = tuple(dict.fromkeys(mx.attention(a, own.attention) for a in w.attention))
  # The one-valued axes now in MaxText's overrides (args) go back to their defaults, the step's own.
  unset = {a: AXES[a].normalise(AXES[a].default) for a in mx.KEYS}
  unset.update(optimizer=OWN, param_dtype=None, dtype=None)
  w = w.replace(model=mx.label(w.maxtext), maxtext=args, target=w.target_name, batch=own.batch, seq=own.seq,
                attention=attentions, microbatches=micro or (own.microbatches,), **unset)
  return Plan(workload=w, cfg=None, target=tgt, meshes=meshes, optimizers=(STEP_OPTIMIZER,), remats=remats,
              batch=own.batch, seq=own.seq)


def maxtext_microbatches(w: Workload, user: dict[str, str]) -> tuple[int, ...]:
  """The workload's microbatch counts as MaxText's gradient_accumulation_steps, each checked
  against the overrides; () where none is given (MaxText's own)."""
  if w.microbatches == AXES["microbatches"].normalise(AXES["microbatches"].default):
    return ()
  micro = w.microbatches
  for mb in micro:
    _agree(user, "microbatches", "gradient_accumulation_steps", str(mb))
  return micro


def _accumulation(args: tuple[str, ...]) -> int:
  """MaxText's gradient_accumulation_steps in ``args`` (1 where not set): its global batch is
  per_device_batch_size x devices x these (configs/types.py, calculate_global_batch_sizes)."""
  value = mx.overrides(args).get("gradient_accumulation_steps", "1")
  try:
    return max(1, int(value))
  except ValueError:
    raise JaxmemError(f"MaxText's gradient_accumulation_steps is a whole number (got {value!r})") from None


def maxtext_fixed(w: Workload, user: dict[str, str]) -> dict[str, str]:
  """The MaxText options the workload's one-valued axes set (:data:`jaxmem.program.maxtext.KEYS`);
  an axis with no mapping, several values, or set in the overrides to another value is one line."""
  out: dict[str, str] = {}
  for axis in declared():
    if axis.name in mx.TASK_AXES or getattr(w, axis.name) == axis.normalise(axis.default):
      continue
    if axis.name not in mx.KEYS:
      raise JaxmemError(f"`{axis.name}` has no MaxText mapping; set MaxText's own option in the `maxtext` overrides")
    values = axis.values(w)
    if len(values) > 1:
      raise JaxmemError(f"`{axis.name}` takes one value with `maxtext` (got {', '.join(map(str, values))})")
    value = values[0]
    if axis.name == "optimizer" and value not in mx.OPTIMIZERS:
      raise JaxmemError(f"`optimizer` {value} has no MaxText mapping; MaxText's opt_type takes {', '.join(mx.OPTIMIZERS)}")
    out[mx.KEYS[axis.name]] = _agree(user, axis.name, mx.KEYS[axis.name], str(value))
  return out


def maxtext_remats(w: Workload, user: dict[str, str], own: Any, tgt: Target) -> tuple[RematPolicy, ...]:
  """The workload's policies as MaxText's ``remat_policy`` names (the default list: MaxText's own)."""
  # `none`, jaxmem's baseline in every list, has no MaxText program (every decoder layer is
  # checkpointed): left out, as the rows' note says. The default list, or none alone, is MaxText's own.
  chosen = tuple(dict.fromkeys(n for part in w.remat for n in (mx.ALL_REMATS if part == "all" else (part,))
                               if n != "none"))
  if w.remat == AXES["remat"].normalise(AXES["remat"].default) or not chosen:
    chosen = (own.remat_policy,)
  out = []
  for n in chosen:
    _agree(user, "remat", "remat_policy", mx.remat_policy(n))
    if n in mx.OFFLOADING and not tgt.has_host_memory:
      raise JaxmemError(f"remat {n} offloads to host memory, and target {tgt.name} has no host memory space")
    out.append(RematPolicy(name=n, policy=None, description=f"MaxText's remat_policy {n}",
                           needs_host_memory=n in mx.OFFLOADING))
  return tuple(out)


def _agree(user: dict[str, str], field: str, key_: str, value: str) -> str:
  """``value`` for MaxText's ``key_``; one line where a MaxText override sets it to another."""
  if key_ in user and not _same(user[key_], value):
    raise JaxmemError(f"`{field}` gives {key_}={value} but the MaxText override says {key_}={user[key_]}; give one")
  return value


def _same(a: str, b: str) -> bool:
  try:
    return float(a) == float(b)
  except ValueError:
    return a.strip().strip("'\"") == b.strip().strip("'\"")

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
from typing import Any

from jaxmem.compiler.startup import start_jax
from jaxmem.compiler.targets import Target, cpu_devices_needed, get_target, with_capacity
from jaxmem.errors import JaxmemError
from jaxmem.models import ATTENTION_NAMES, ModelConfig, get_config
from jaxmem.planning.cache import key
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS, Optimizer
from jaxmem.program.remat import RematPolicy, parse_remat
from jaxmem.program.step import OWN, load_step, step_fingerprint, step_label
from jaxmem.program.train import check_batch, check_qk_dtype, pick_attention
from jaxmem.workload import Workload


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
  def remat(self) -> str:
    return self.workload.remat[0]

  @property
  def optimizer(self) -> str:
    return self.workload.optimizer[0]

  @property
  def target(self) -> str:
    return self.workload.target_name

  @property
  def attention(self) -> str:
    return self.workload.attention[0]

  @property
  def microbatches(self) -> int:
    return self.workload.microbatches[0]

  def replace(self, **fields: Any) -> Task:
    """The same task with workload fields replaced (``batch=``, ``seq=``...)."""
    return dataclasses.replace(self, workload=self.workload.replace(**fields))

  def cache_key(self) -> str | None:
    """Everything that changes the compiled program: the whole workload (the model's full
    config included) and, in :func:`jaxmem.planning.cache.key`, the installed versions. A
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
  # The step's own sweep axes (issue 9): attention names as asked (auto or an implementation)
  # and microbatch counts.
  attentions: tuple[str, ...] = ("auto",)
  microbatches: tuple[int, ...] = (1,)

  def configs(self) -> list[tuple[shd.MeshSpec, Optimizer, RematPolicy]]:
    return list(itertools.product(self.meshes, self.optimizers, self.remats))

  def grid(self) -> list[tuple[shd.MeshSpec, Optimizer, str, int, RematPolicy]]:
    """Every configuration as (mesh, optimizer, attention, microbatches, remat): ``configs()``
    with the step's axes, the remat policy innermost so each group starts with its baseline."""
    return list(itertools.product(self.meshes, self.optimizers, self.attentions, self.microbatches, self.remats))

  def tasks(self) -> list[Task]:
    """The configurations as picklable, cacheable tasks, in ``grid()`` order."""
    cpu = cpu_devices_needed([self.workload.target_name])
    one = self.workload.replace(model=self.cfg or self.workload.model, batch=self.batch, seq=self.seq)
    return [
        Task(
            workload=one.replace(
                mesh=shd.format_mesh(mesh), remat=rp.name, optimizer=opt.name, attention=attention, microbatches=mb
            ),
            cpu_devices=cpu,
        )
        for mesh, opt, attention, mb, rp in self.grid()
    ]


def resolve_model(model: str | ModelConfig, **overrides: str | None) -> ModelConfig:
  """A preset by name (or a config as given) with the dtype overrides that are not ``None``."""
  overrides = {k: v for k, v in overrides.items() if v is not None}
  if isinstance(model, ModelConfig):
    return dataclasses.replace(model, **overrides)
  return get_config(model, **overrides)


def resolve_target(w: Workload) -> Target:
  """The workload's target with its capacity (a TPU target's costs a quick probe compile)."""
  tgt = get_target(w.target, slices=w.slices) if isinstance(w.target, str) else w.target
  return with_capacity(tgt)


def resolve_meshes(w: Workload, tgt: Target) -> tuple[shd.MeshSpec, ...]:
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
  start_jax(cpu_devices_needed([w.target]) if isinstance(w.target, str) else 1)
  if w.step:
    return plan_step(w)
  cfg = resolve_model(w.model, param_dtype=w.param_dtype, dtype=w.dtype)
  tgt = resolve_target(w)
  remats = parse_remat(w.remat, host_memory=tgt.has_host_memory)
  optimizers = OPTIMIZERS.parse(w.optimizer)
  meshes = resolve_meshes(w, tgt)
  attentions, microbatches = resolve_step_axes(w)
  for m in meshes:
    for mb in microbatches:
      check_batch(w.batch, w.seq, m, cfg, microbatches=mb, vocab_tiles=w.vocab_tiles)
    for name in attentions:
      # A name the target or mesh cannot take is refused here, before the first compile.
      pick_attention(name, cfg, batch=w.batch, seq=w.seq, target=tgt, mesh=dict(m), qk_dtype=w.qk_dtype)
  w = w.replace(target=w.target_name)
  return Plan(
      workload=w, cfg=cfg, target=tgt, meshes=meshes, optimizers=optimizers, remats=tuple(remats),
      batch=w.batch, seq=w.seq, attentions=attentions, microbatches=microbatches,
  )


# The optimizer column of a step's rows: the step brings its own.
STEP_OPTIMIZER = Optimizer(name=OWN, build=lambda lr: None, description="the step's own")


def plan_step(w: Workload) -> Plan:
  """A sweep over a user's step (``w.step``): the target, remat policies and meshes as for the
  model's, the factory imported and checked before anything compiles."""
  load_step(w.step)
  for flag, v, default in (("--attention", w.attention, ("auto",)), ("--microbatches", w.microbatches, (1,)),
                           ("--vocab-tiles", w.vocab_tiles, 1), ("--qk-dtype", w.qk_dtype, "bfloat16")):
    if v != default:  # they change how jaxmem builds its models' step; a user's step is built by its factory
      raise JaxmemError(f"{flag} applies to jaxmem's own models (--model), not --step; set it in your step factory")
  tgt = resolve_target(w)
  remats = parse_remat(w.remat, host_memory=tgt.has_host_memory)
  for name, v in (("batch", w.batch), ("seq", w.seq)):
    if v < 1:
      raise JaxmemError(f"{name} must be at least 1 (got {v})")
  w = w.replace(model=step_label(w.step), target=w.target_name, optimizer=OWN, param_dtype=None, dtype=None)
  return Plan(
      workload=w, cfg=None, target=tgt, meshes=resolve_meshes(w, tgt), optimizers=(STEP_OPTIMIZER,),
      remats=tuple(remats), batch=w.batch, seq=w.seq,
  )


def resolve_step_axes(w: Workload) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """The workload's attention names and microbatch counts, each once, checked."""
  if not w.attention:
    raise JaxmemError(f"--attention is empty; give names separated by commas from {', '.join(ATTENTION_NAMES)}")
  for name in w.attention:
    if name not in ATTENTION_NAMES:
      raise JaxmemError(f"unknown attention {name!r}; valid: {', '.join(ATTENTION_NAMES)}")
  if not w.microbatches:
    raise JaxmemError("--microbatches is empty; give whole numbers separated by commas, e.g. 1,4")
  for mb in w.microbatches:
    if not isinstance(mb, int) or isinstance(mb, bool) or mb < 1:
      raise JaxmemError(f"--microbatches must be whole numbers of at least 1 (got {mb!r})")
  check_qk_dtype(w.qk_dtype)
  return tuple(dict.fromkeys(w.attention)), tuple(dict.fromkeys(w.microbatches))

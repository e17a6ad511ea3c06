"""A sweep over MaxText's own step (``--maxtext``, ``maxtext=``) resolved into a
:class:`~jaxmem.resolve.Plan`, with jaxmem's options spelt through the one table
(:mod:`jaxmem.maxtext.table`).

MaxText's config is read once with what the workload gives spelt onto its options, so a value
MaxText or the table refuses is one line before anything compiles. The table's rows a sweep sets
once go into the workload's overrides; those it sets per configuration (the mesh, remat policy,
attention, microbatches and, where they apply, the context strategy and pipeline schedule) are
checked here for every configuration and set by the step's factory
(:func:`jaxmem.maxtext.step.task_settings`). What the workload does not give (its batch and
sequence None, an axis at its default) is MaxText's own: the batch, sequence, microbatches,
remat policy, attention and mesh its config says (and the rows show). A value given both ways,
through jaxmem and in MaxText's overrides, must agree (a task, planned again in a worker
process, gives them all).

This module registers :func:`plan_maxtext` with :data:`jaxmem.resolve.STEP_PLANNERS` for
MaxText's step factory when it is imported (``jaxmem`` imports it).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from jaxmem.axes import AXES, declared
from jaxmem.errors import JaxmemError
from jaxmem.hardware.targets import Target
from jaxmem.maxtext import step as mx
from jaxmem.maxtext.table import ALL_REMATS, ROWS, At, OverrideDisagrees, attention, maxtext_remat, offloads, row, text
from jaxmem.mesh import MeshSpec
from jaxmem.program.pipelining import PipelineOptions
from jaxmem.program.remat import RematPolicy
from jaxmem.program.step import OWN
from jaxmem.resolve import STEP_OPTIMIZER, STEP_PLANNERS, Plan, resolve_meshes, resolve_target
from jaxmem.workload import Workload


def plan_maxtext(w: Workload) -> Plan:
  """A sweep over MaxText's own step (``w.maxtext``; see the module docstring)."""
  if not w.maxtext:
    raise JaxmemError(f"step {mx.SPEC} is MaxText's; give its config with `maxtext` (base.yml key=value ...)")
  mx.require()
  tgt = resolve_target(w)
  name, slices = mx.topology(tgt)
  user = mx.overrides(w.maxtext)
  args = (*w.maxtext, *(f"{k}={text(v)}" for k, v in once(w, user).items()))
  micro = microbatches(w, user)
  own = mx.resolve(args, dict(compile_topology=name, compile_topology_num_slices=str(slices),
                              **sizes(w, user, args, micro, tgt.num_devices)), tgt)
  if own.experts == 1 and (w.moe_impl or w.capacity_factor):
    raise JaxmemError(f"`moe_impl` and `capacity_factor` apply to mixture-of-experts models; {mx.label(w.maxtext)} "
                      "has no experts (drop them)")
  meshes = resolve_meshes(w, tgt) if w.mesh else (own.mesh,)
  remats = maxtext_remats(w, user, own, tgt)
  attentions = tuple(dict.fromkeys(attention(a) or own.attention for a in w.attention))
  if w.attention != _default("attention"):
    for a in attentions:
      agree(user, "attention", {"attention": a})
  check_tasks(w, user, meshes, attentions, given_mesh=bool(w.mesh), at=At(devices=tgt.num_devices, slices=slices))
  # The axes set once are now in MaxText's overrides (args): back to their defaults, the step's own.
  unset = {a.name: a.normalise(a.default) for a in declared() if not row(a.name).per_task}
  unset.update(optimizer=OWN, param_dtype=None, dtype=None)
  # The per-task axes' values as MaxText spells them (the attention by its name, its own where not
  # given), each a task's; the others given where they apply (task_settings), else MaxText's own.
  w = w.replace(model=mx.label(w.maxtext), maxtext=args, target=w.target_name, batch=own.batch, seq=own.seq,
                attention=attentions, microbatches=micro or (own.microbatches,), **unset)
  return Plan(workload=w, cfg=None, target=tgt, meshes=meshes, optimizers=(STEP_OPTIMIZER,), remats=remats,
              batch=own.batch, seq=own.seq)


def sizes(w: Workload, user: Mapping[str, str], args: tuple[str, ...], micro: tuple[int, ...],
          devices: int) -> dict[str, str]:
  """The batch, sequence and microbatches jaxmem gives (a search sets them too), as MaxText's
  options, each agreeing with the overrides; what is not given is MaxText's own."""
  out: dict[str, str] = {}
  if w.batch is not None:
    per_device = [agree(user, "batch", row("batch").write(w.batch, At(devices=devices, microbatches=mb)))
                  for mb in micro or (_accumulation(args),)]
    out["per_device_batch_size"] = text(per_device[0]["per_device_batch_size"])
  if w.seq is not None:
    out["max_target_length"] = text(agree(user, "seq", row("seq").write(w.seq, At()))["max_target_length"])
  if micro:
    out["gradient_accumulation_steps"] = str(micro[0])
  return out


def _default(name: str) -> Any:
  return AXES[name].normalise(AXES[name].default)


def once(w: Workload, user: Mapping[str, str]) -> dict[str, Any]:
  """The MaxText options the workload's axes set once for the sweep (the table's rows that are
  not per task), each given away from its default: one value each, agreeing with the overrides;
  an axis the table refuses is one line in its words (:class:`NoMaxTextMapping`)."""
  # A workload this planner made (planned again in a worker process) holds the step's own
  # optimizer, which sets nothing.
  given = {a.name: a for a in declared() if not row(a.name).per_task and getattr(w, a.name) != a.normalise(a.default)
           and not (a.name == "optimizer" and getattr(w, a.name) == (OWN,))}
  out: dict[str, Any] = {}
  at = At(param_dtype=AXES["param_dtype"].first(w), optimizer=AXES["optimizer"].first(w),
          capacity_factor=AXES["capacity_factor"].first(w))
  for name, axis in given.items():
    values = axis.values(w)
    if len(values) > 1:
      raise JaxmemError(f"`{name}` takes one value with `maxtext` (got {', '.join(map(str, values))})")
    r = row(name)
    if r.name != name and r.name in given:  # spelt with its row's axis (capacity_factor with moe_impl)
      continue
    value = values[0] if r.name == name else ("capacity" if AXES[r.name].first(w) is None else AXES[r.name].first(w))
    out.update(agree(user, r.name, r.write(value, at)))
  return out


def microbatches(w: Workload, user: Mapping[str, str]) -> tuple[int, ...]:
  """The workload's microbatch counts as MaxText's gradient_accumulation_steps, each checked
  against the overrides; () where none is given (MaxText's own)."""
  if w.microbatches == _default("microbatches"):
    return ()
  if not w.microbatches:
    raise JaxmemError("`microbatches` is empty; give whole numbers separated by commas, e.g. 1,4")
  for mb in w.microbatches:
    if not isinstance(mb, int) or isinstance(mb, bool) or mb < 1:
      raise JaxmemError(f"`microbatches` must be whole numbers of at least 1 (got {mb!r})")
  micro = tuple(dict.fromkeys(w.microbatches))
  for mb in micro:
    agree(user, "microbatches", row("microbatches").write(mb, At()))
  return micro


def _accumulation(args: tuple[str, ...]) -> int:
  """MaxText's gradient_accumulation_steps in ``args`` (1 where not set): its global batch is
  per_device_batch_size x devices x these (configs/types.py, calculate_global_batch_sizes)."""
  value = mx.overrides(args).get("gradient_accumulation_steps", "1")
  try:
    return max(1, int(value))
  except ValueError:
    raise JaxmemError(f"MaxText's gradient_accumulation_steps is a whole number (got {value!r})") from None


def maxtext_remats(w: Workload, user: Mapping[str, str], own: Any, tgt: Target) -> tuple[RematPolicy, ...]:
  """The workload's policies, MaxText's names as they are and jaxmem's spelt through the table
  (the default list: MaxText's own)."""
  # `none`, jaxmem's baseline in every list (and explain's and scale's default alone), has no
  # MaxText program (every decoder layer is checkpointed; the table refuses it): left out, as the
  # rows' note says. The default list, or none alone, is MaxText's own.
  chosen = tuple(dict.fromkeys(n for part in w.remat for n in (ALL_REMATS if part == "all" else (part,))
                               if n != "none"))
  if w.remat == _default("remat") or not chosen:
    chosen = (own.remat_policy,)
  out = []
  for n in chosen:
    settings = agree(user, "remat", maxtext_remat(n))
    if offloads(settings) and not tgt.has_host_memory:
      raise JaxmemError(f"remat {n} offloads to host memory, and target {tgt.name} has no host memory space")
    out.append(RematPolicy(name=n, policy=None, description=f"MaxText's remat_policy {settings['remat_policy']}",
                           needs_host_memory=offloads(settings)))
  return tuple(out)


def check_tasks(w: Workload, user: Mapping[str, str], meshes: tuple[MeshSpec, ...], attentions: tuple[str, ...], *,
                given_mesh: bool, at: At) -> None:
  """Every configuration's per-task settings, before anything compiles: the meshes given (their
  ``ici_*`` and ``dcn_*``), and the options set only where given (:attr:`Row.when_given`: the
  context strategy with each kernel, the pipeline schedule, refused where no mesh has a stage
  axis), each agreeing with the overrides."""
  given = {r.name: given_values(w, r.name) for r in ROWS.values() if r.when_given}
  options = PipelineOptions(microbatches=mx.given_value(w, "pipeline_microbatches"),
                            repeats=mx.given_value(w, "pipeline_repeats") or 1)
  options.check()
  if options.given and not any(options.schedule(m) for m in meshes):
    raise JaxmemError("`pipeline_microbatches` and `pipeline_repeats` apply to meshes with a stage axis (e.g. "
                      "stage=4,fsdp=2); no mesh here has one")
  for mesh, kernel in itertools.product(meshes, attentions):
    here = At(mesh=mesh, devices=at.devices, slices=at.slices, attention=kernel)
    if given_mesh:
      agree(user, "mesh", row("mesh").write(mesh, here))
    for name, values in given.items():  # the layers per stage are MaxText's config's: the factory writes them
      for value in values:
        agree(user, name, row(name).write(value, here))


def given_values(w: Workload, name: str) -> tuple[Any, ...]:
  """The axis ``name``'s values as given, ``(None,)`` at its default (MaxText's own); an outer
  axis (one plan per value for jaxmem's models) takes one value here."""
  axis = AXES[name]
  if getattr(w, name) == _default(name):
    return (None,)
  values = axis.values(w)
  if axis.outer and len(values) > 1:
    raise JaxmemError(f"`{name}` takes one value with `maxtext` (got {', '.join(map(str, values))})")
  return values


def agree(user: Mapping[str, str], field: str, settings: Mapping[str, Any]) -> dict[str, Any]:
  """``settings`` for MaxText; one line where a MaxText override sets one of them to another value."""
  for key, value in settings.items():
    if key in user and not _same(user[key], text(value)):
      raise OverrideDisagrees(f"`{field}` gives {key}={text(value)} but the MaxText override says {key}={user[key]}; "
                              "give one")
  return dict(settings)


def _same(a: str, b: str) -> bool:
  try:
    return float(a) == float(b)
  except ValueError:
    return a.strip().strip("'\"").lower() == b.strip().strip("'\"").lower()


STEP_PLANNERS[mx.SPEC] = plan_maxtext

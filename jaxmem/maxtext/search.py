"""``plan`` through MaxText's own step (``plan --maxtext``, ``jaxmem.plan(maxtext=...)``).

The same search as :mod:`jaxmem.planning.search` (its candidates ordered by a closed form,
compiled in that order within the budget, skipped where dominated, reordered by the compiler's
figures, ranked by the simulated step time), over what maps onto MaxText's options
(:mod:`jaxmem.maxtext.table`, the rows ``--maxtext`` reads):

- meshes: every factorization of the devices over ``data``, ``fsdp``, ``tensor`` (and ``expert``
  for a model with routed experts) as MaxText's ``ici_*_parallelism``; one slice only (a
  multi-slice target's DCN split is MaxText's own config's);
- remat: the ladder's rungs, each one of MaxText's ``remat_policy`` names (``minimal`` to
  ``full``);
- microbatches (1, 2, 4, 8 dividing the batch) as ``gradient_accumulation_steps``;
- attention: ``dot_product`` and ``flash``.

The closed form needs a model: a Llama-shaped jaxmem model of MaxText's dimensions
(:func:`jaxmem.maxtext.step.model_config`), and the arguments' bytes from its parameter count
(weights and the optimizer's state, as many parameters' worth as jaxmem's optimizer of the same
name declares, sharded over ``fsdp`` x ``tensor``). It only orders the compiles; every figure in
the answer is the compiler's, of MaxText's program.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from jaxmem.compiler.report import fits as fits_in
from jaxmem.errors import (
    BatchDoesNotDivide, DoesNotDivide, ExpertsDoNotDivide, HeadsDoNotDivide, JaxmemError, TraceFailed,
)
from jaxmem.launch import Emitter
from jaxmem.maxtext import step as mx
from jaxmem.maxtext.emit import maxtext_overrides
from jaxmem.maxtext.plan import plan_maxtext
from jaxmem.maxtext.table import (
    MESH_KEYS, REMATS, At, NoMaxTextMapping, jaxmem_attention, per_device_batch, state_moments,
)
from jaxmem.models import count_params
from jaxmem.options import RunOptions
from jaxmem.planning import search as s
from jaxmem.planning import steps
from jaxmem.program import sharding as shd
from jaxmem.resolve import Plan, for_task
from jaxmem.workload import Workload

# The mesh axes searched: those MaxText's ICI parallelism maps (no stage: a pipeline needs
# MaxText's layers-per-stage and microbatch options; no context: its strategies are MaxText's own).
AXES = ("data", "fsdp", "tensor", "expert")
# MaxText's attention kernels tried, by MaxText's name (TPU targets only: compile_topology).
ATTENTIONS = ("dot_product", "flash")
# MaxText's options the search sets: given in the overrides, they are refused (say them with
# compare --maxtext instead, or leave them to the search).
SEARCHED = ("remat_policy", "attention", "gradient_accumulation_steps", *MESH_KEYS.values())

LEFT_OUT = (
    "maxtext: searched MaxText's meshes over data, fsdp, tensor (and expert for routed experts), remat_policy "
    "minimal to full, gradient_accumulation_steps 1 to 8 and attention dot_product and flash; left out: remat "
    "none (MaxText checkpoints every decoder layer), pipeline (stage) and context meshes, MaxText's other "
    "policies and kernels (compare them with compare --maxtext --remat ... --attention ...)"
)
ORDER_NOTE = (
    "order of compiles: a closed-form estimate of a Llama-shaped model of MaxText's dimensions (emb_dim, mlp_dim, "
    "heads, kv heads, head_dim, layers, vocab); every figure is the compiler's, of MaxText's program"
)


def plan(w: Workload, *, budget: int, run: RunOptions) -> s.PlanResult:
  """The fastest configuration of MaxText's step that fits, from at most ``budget`` compiles."""
  user = mx.overrides(w.maxtext)
  given = [k for k in SEARCHED if k in user]
  if given:
    raise JaxmemError(f"plan searches MaxText's {', '.join(given)}: leave {given[0]} out of the `maxtext` overrides "
                      "(or compare one setting of it)")
  base = plan_maxtext(w.replace(remat=_rungs(), attention=(ATTENTIONS[0],), mesh=()))
  if base.target.capacity_bytes is None:
    raise JaxmemError(f"plan needs a target with a memory capacity; {base.target.name} has none")
  if base.target.slices > 1:
    raise JaxmemError("plan searches one slice's mesh of MaxText's step; over several slices, compare MaxText's own "
                      "ici_* and dcn_* settings instead")
  config = mx.initialise(base.workload.maxtext, mx.task_settings(
      base.tasks()[0].workload, base.target, batch=base.batch, seq=base.seq, mesh=base.meshes[0]))
  cfg = mx.model_config(config)
  pruned: Counter = Counter()
  cands = s.order(candidates(base, cfg, config, pruned, traceable_kernels(base)), base.target.capacity_bytes)
  run.start(min(budget, len(cands)), None)
  rows, compiled, skipped, unreached = s.compile_in_order(base, cands, budget=budget, run=run)
  pruned.update(skipped)
  est = {s.candidate_key(c.mesh, c.remat, c.microbatches, c.attention): c.estimated_step_time_s for c in compiled}
  ranked = s.rank_rows(rows)
  return s.PlanResult(
      model=base.workload.model_name, target=base.target.name, batch=base.batch, seq=base.seq, budget=budget,
      candidates=len(cands) + sum(v for k, v in pruned.items() if k not in skipped), compiles=len(rows),
      cache_hits=0 if run.cache is None else run.cache.hits, pruned=tuple(sorted(pruned.items())),
      not_compiled=len(cands) - len(compiled) - sum(skipped.values()), rows=tuple(ranked),
      estimates=tuple(est.items()), notes=s.search_notes(unreached, order=(ORDER_NOTE, LEFT_OUT)),
      why=s.why(ranked), maxtext=tuple(w.maxtext),
  )


def _rungs() -> tuple[str, ...]:
  return tuple(r.name for r in s.REMAT_LADDER if r.name in REMATS)


def traceable_kernels(p: Plan) -> dict[str, str | None]:
  """Each kernel of :data:`ATTENTIONS` -> None where MaxText's step traces with it at the plan's
  first configuration, else why not (a kernel's own limits, such as flash's block sizes against
  the sequence, end the trace): each traced once, ahead of the search."""
  out: dict[str, str | None] = {}
  for kernel in ATTENTIONS:
    task = p.tasks()[0].replace(attention=(kernel,))
    one, mesh, _, rp = for_task(p, task)
    try:
      steps.lower_step(one, mesh, rp)
    except (TraceFailed, mx.MaxTextRefused) as e:
      out[kernel] = f"attention {kernel}: MaxText's step fails to trace ({e.cause})"
      continue
    out[kernel] = None
  return out


def candidates(p: Plan, cfg: Any, config: Any, pruned: Counter, kernels: dict[str, str | None]) -> list[s.Candidate]:
  """Every valid candidate with its closed-form estimate (``kernels``: those of
  :func:`traceable_kernels` with no reason); what was dropped counted by reason."""
  rungs = [r for r in s.REMAT_LADDER if r.name in REMATS]
  micro = [2**i for i in range(s.MAX_MICROBATCHES.bit_length()) if 2**i <= s.MAX_MICROBATCHES]
  axes = tuple(a for a in AXES if a != "expert" or mx.experts(config) > 1)
  n, params = p.target.num_devices, count_params(cfg)
  # opt_type is MaxText's OptimizerType, a str enum: its value is the name.
  per_param = _itemsize(cfg.param_dtype) * (1 + state_moments(getattr(config.opt_type, "value", config.opt_type)))
  out: list[s.Candidate] = []
  for mesh, mb in itertools.product(s.factorizations(n, axes), micro):
    why = mesh_reason(mesh, cfg, config, p.batch, mb, n)
    m = dict(mesh)
    args = int(params * per_param / (m.get("fsdp", 1) * m.get("tensor", 1) * m.get("expert", 1)))
    if why is None and not fits_in(args, p.target.capacity_bytes):
      why = "arguments alone over capacity (not compiled)"
    if why is not None:
      pruned[why] += len(rungs) * len(kernels)
      continue
    for refused in filter(None, kernels.values()):
      pruned[refused] += len(rungs)
    for kernel, rung in itertools.product([k for k, why in kernels.items() if why is None], rungs):
      req, secs = s.analytic(cfg, mesh=mesh, rung=rung, microbatches=mb, batch=p.batch, seq=p.seq, argument_bytes=args,
                             param_count=params, target=p.target, fused=jaxmem_attention(kernel) != "dot")
      out.append(s.Candidate(
          mesh=shd.format_mesh(mesh), remat=rung.name, microbatches=mb, attention=kernel, level=rungs.index(rung),
          argument_bytes=args, estimated_required_bytes=req, estimated_step_time_s=secs,
      ))
  return out


def mesh_reason(mesh: shd.MeshSpec, cfg: Any, config: Any, batch: int, microbatches: int, devices: int) -> str | None:
  """Why MaxText's step cannot take ``mesh`` at ``microbatches`` (the reason counted for the
  kind of refusal, :data:`jaxmem.planning.search.REASONS`), or None."""
  try:
    check_mesh(mesh, cfg, config, batch, microbatches, devices)
  except DoesNotDivide as e:
    return s.REASONS[type(e)]
  return None


def check_mesh(mesh: shd.MeshSpec, cfg: Any, config: Any, batch: int, microbatches: int, devices: int) -> None:
  """A typed refusal (:class:`~jaxmem.errors.DoesNotDivide`) where MaxText's step cannot take
  ``mesh`` at ``microbatches``: the heads over ``tensor``, the routed experts over ``expert``, the
  batch over the data axes x microbatches, or a batch MaxText's ``per_device_batch_size`` cannot
  give back (the table's :func:`~jaxmem.maxtext.table.per_device_batch`)."""
  m = dict(mesh)
  t = m.get("tensor", 1)
  if cfg.num_heads % t or cfg.num_kv_heads % t:
    raise HeadsDoNotDivide(f"`mesh` tensor={t} does not divide the {cfg.num_heads} heads and "
                           f"{cfg.num_kv_heads} kv heads")
  if mx.experts(config) % m.get("expert", 1):
    raise ExpertsDoNotDivide(f"`mesh` expert={m['expert']} does not divide the {mx.experts(config)} experts")
  ways = m.get("data", 1) * m.get("fsdp", 1) * m.get("expert", 1)
  if batch % microbatches or (batch // microbatches) % ways:
    raise BatchDoesNotDivide(f"`batch` {batch} over {ways} data ways x {microbatches} microbatches")
  try:
    per_device_batch(batch, At(devices=devices, microbatches=microbatches))
  except NoMaxTextMapping as e:
    raise BatchDoesNotDivide(str(e)) from None


def _itemsize(dtype: str) -> int:
  import jax.numpy as jnp

  return jnp.dtype(dtype).itemsize



# ``plan --emit maxtext``: a plan's recommendation as MaxText's overrides, in the one --emit
# registry (jaxmem.launch.emitters) beside the serving engines'.
EMITTER = Emitter(name="maxtext", help="MaxText's key=value overrides for the recommendation", takes=s.PlanResult,
                  what="a plan's recommendation (`plan`)", write=maxtext_overrides)

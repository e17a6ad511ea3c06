"""A user's step as one configuration of a sweep: the factory called at the workload, compiled
for the target, read into the fields of a :class:`jaxmem.planning.sweep.Row`.

The step's own arguments fill the parameter columns by name, as optax code names them: the
argument called ``params`` gives ``param_bytes`` (and ``param_bytes_global``), the one called
``opt_state`` gives ``optimizer_state_bytes``; without them those are ``None`` with a note.

A step's row is cached under what it traced (:func:`step_key`): the workload, the abstract
signature of its arguments (tree, shapes, dtypes, shardings), the jit options the factory
returned, and a hash of the lowered program's StableHLO. A factory that reads its model's size
from an environment variable or a file therefore gets new rows when that changes. Tracing and
lowering take seconds; the compile the key saves takes minutes; the trace taken for the key is
the one compiled (:func:`step_row`), not traced again.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from typing import Any

import jax

from jaxmem.compiler.analysis import Lowering, lower_for_target
from jaxmem.compiler.flops import jaxpr_flops
from jaxmem.compiler.report import Refusal
from jaxmem.hardware import runtime
from jaxmem.steptime import Work
from jaxmem.errors import JaxmemError, TraceFailed
from jaxmem.cache import key
from jaxmem.resolve import Plan, Task, configuration, for_task
from jaxmem.program import sharding as shd
from jaxmem.program.remat import RematPolicy
from jaxmem.maxtext import step as mx
from jaxmem.maxtext.table import TASK_AXES
from jaxmem.program.step import call_step, is_local, step_notes

# A user's step is a function, not a model jaxmem knows: its step time is estimated from the
# compiled program as any row's, but there is no 6·N·T to form MFU against.
USER_STEP_MFU_NOTE = "mfu: a user's step has no model FLOPs formula (jaxmem does not know its model), so no MFU"

PARAMS, OPT_STATE = "params", "opt_state"


# The trace :func:`step_key` took, for the run that follows it in this process (one entry: a
# sweep in this process takes each key just before its run; jaxmem.planning.runner.run_tasks).
_TRACED: dict[tuple, Lowering] = {}


def lower_step(p: Plan, mesh: shd.MeshSpec, rp: RematPolicy, *, batch: int | None = None, seq: int | None = None) -> Lowering:
  """The plan's step at one mesh and remat policy (and the plan's workload unless given),
  traced and lowered for the target. A step that fails to trace is one line."""
  return _trace(p, mesh, rp, batch=batch or p.batch, seq=seq or p.seq)[0]


def _trace(p: Plan, mesh: shd.MeshSpec, rp: RematPolicy, *, batch: int, seq: int) -> tuple[Lowering, dict[str, Any]]:
  jmesh = p.target.make_mesh(mesh)
  fn, args, jit_kwargs = call_step(
      p.workload.step, batch=batch, seq=seq, remat=rp.policy, mesh=jmesh, target=p.target, workload=p.workload
  )
  try:
    return lower_for_target(fn, *args, target=p.target, **jit_kwargs), jit_kwargs
  except JaxmemError:
    raise
  except Exception as e:  # the user's code failed while JAX traced it (not a compile): one line
    cause = f"{type(e).__name__}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}"
    raise TraceFailed(
        f"step {p.workload.model_name} failed to trace at batch {batch}, seq {seq}, remat {rp.name}: {cause}",
        cause=cause,
    ) from e


def _traced_as(p: Plan, mesh: shd.MeshSpec, rp: RematPolicy) -> tuple:
  return (p.workload.step, p.batch, p.seq, rp.name, shd.format_mesh(mesh), p.target.name)


def step_key(p: Plan, task: Task) -> str | None:
  """The row cache's key of a step's task: the workload and what the factory traced at it
  (see the module docstring); None (never cached) for a factory only this process can run."""
  if is_local(task.workload.step):
    return None
  one, mesh, _, rp = for_task(p, task)
  lowering, jit_kwargs = _trace(one, mesh, rp, batch=one.batch, seq=one.seq)
  _TRACED.clear()
  _TRACED[_traced_as(one, mesh, rp)] = lowering
  return key({**task.workload.as_dict(), "step_trace": trace_fingerprint(lowering, jit_kwargs)},
             compilers=task.release_versions())


def trace_fingerprint(lowering: Lowering, jit_kwargs: dict[str, Any]) -> str:
  """A hash of what a step traced: its arguments' tree, shapes, dtypes and shardings, the jit
  options (object addresses left out of their text), and the lowered program's StableHLO."""
  digest = hashlib.sha256()
  leaves, tree = jax.tree_util.tree_flatten(lowering.args)
  digest.update(str(tree).encode())
  for leaf in leaves:
    digest.update(f"{getattr(leaf, 'shape', '')}{getattr(leaf, 'dtype', '')}{getattr(leaf, 'sharding', '')}".encode())
  options = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(sorted(jit_kwargs.items(), key=lambda kv: kv[0])))
  digest.update(options.encode())
  digest.update(lowering.lowered.as_text().encode())
  return digest.hexdigest()[:32]


def step_row(p: Plan, mesh: shd.MeshSpec, rp: RematPolicy) -> dict[str, Any]:
  """One configuration of a step as a row's fields. A compile the backend refuses is a row with
  ``error`` set, as for the model's steps."""
  # What jaxmem did not choose is None (shown as -): the step's optimizer, its dtypes, how it
  # accumulates and tiles, its attention scores' dtype are the user's code's business.
  base = configuration(p, mesh, None, rp)
  lowering = _TRACED.pop(_traced_as(p, mesh, rp), None) or lower_step(p, mesh, rp)
  maxtext = p.workload.maxtext is not None
  notes: list[str] = step_notes(lowering.traced, rp)
  if maxtext:  # MaxText's step: what it varies per task (its attention by MaxText's name), and what built it
    options = p.options()
    base.update({name: options[name] for name in TASK_AXES if name in base})
    notes.append(mx.note(p.workload.maxtext))
  # from the shapes: a refused step has them too
  named = mx.global_params(lowering.traced) if maxtext else _named_arguments(lowering, notes)
  outcome = lowering.figures(notes=notes, work=Work(tokens=p.batch * p.seq, note=USER_STEP_MFU_NOTE),
                             always_compile=p.workload.always_compile, kernel_named=maxtext)
  if not isinstance(outcome, Refusal) and maxtext:
    named.update(mx.state_bytes(outcome.report.argument_leaf_bytes))
    job, moved = mx.loop_terms(outcome.report.argument_bytes)
    outcome = outcome.with_account(runtime.with_job(outcome.runtime, job, from_arguments=moved))
  elif not isinstance(outcome, Refusal):
    by_name = outcome.report.argument_bytes
    named.update(param_bytes=by_name.get(PARAMS), optimizer_state_bytes=by_name.get(OPT_STATE))
  return {**base, **named, **outcome.row_fields()}


def _named_arguments(lowering: Lowering, notes: list[str]) -> dict[str, Any]:
  """``param_bytes_global`` and ``param_dtype`` from the argument called ``params`` (from its
  shapes); a note where the step has no ``params`` or ``opt_state``."""
  names = lowering.argument_names
  out: dict[str, Any] = {}
  if PARAMS in names:
    leaves = jax.tree_util.tree_leaves(lowering.traced.args_info[0][names.index(PARAMS)])
    out["param_bytes_global"] = sum(-(-math.prod(a.shape) * jax.dtypes.itemsize_bits(a.dtype) // 8) for a in leaves)
    elements: Counter[str] = Counter()
    for a in leaves:
      elements[str(a.dtype)] += math.prod(a.shape)
    out["param_dtype"] = elements.most_common(1)[0][0] if elements else None  # most parameters
  missing = [n for n in (PARAMS, OPT_STATE) if n not in names]
  if missing:
    notes.append(
        f"{' and '.join(missing)}: no argument of the step is named so (it takes {', '.join(names) or 'none'}); "
        "name them params and opt_state to fill the parameter and optimizer state columns"
    )
  return out


def step_flops(p: Plan, mesh: shd.MeshSpec, rp: RematPolicy, *, batch: int, seq: int) -> float:
  """The whole program's FLOPs of the step at a workload and remat policy: traced, not compiled."""
  return jaxpr_flops(lower_step(p, mesh, rp, batch=batch, seq=seq).traced.jaxpr.jaxpr)

"""The sweep behind ``compare``: the train step under each remat policy, optimizer and mesh, one row each.

>>> rows = compare(model="tiny", remat="dots_saveable", batch=2, seq=16)  # doctest: +SKIP
>>> [r.remat for r in rows]  # doctest: +SKIP
['none', 'dots_saveable']
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from jaxmem.axes import baseline_fields, key
from jaxmem.compiler.figures import compile_figures
from jaxmem.compiler.flops import GMM_FLOPS_NOTE, KERNEL_FLOPS_NOTE, jaxpr_flops
from jaxmem.hardware.startup import start_jax
from jaxmem.steptime import Work
from jaxmem.models import get_attention
from jaxmem.models.model_flops import training_flops, weight_flops
from jaxmem.options import RunOptions
from jaxmem.planning import steps
from jaxmem.cache import RowCache
from jaxmem.resolve import Plan, Task, build_program, configuration, for_task, plan
from jaxmem.planning.runner import Counting, release, run_tasks
from jaxmem.program import sharding as shd
from jaxmem.hlo.stash import per_iteration_bytes
from jaxmem.program.optimizers import Optimizer
from jaxmem.program.pipelining import ONE_F_ONE_B_NOTE, one_f_one_b
from jaxmem.program.remat import RematPolicy, get_remat
from jaxmem.records import (
    Communication, CompilerFigures, Composed, Configuration, Judgement, Record, RuntimeAccount, StepTime,
    composed,
)
from jaxmem.workload import Workload


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainFigures(Record):
  """What a training row adds to the compiler's figures: the parameters' and optimizer state's
  bytes per device (``param_bytes_global``: the parameters summed over the whole model,
  unsharded), the recompute overhead against the no-remat row, and a pipelined row's stage
  activation and 1F1B estimate."""

  param_bytes: int | None = None
  param_bytes_global: int | None = None
  optimizer_state_bytes: int | None = None
  recompute_overhead_pct: float | None = None
  # A pipelined row's (stages > 1): the bytes per device the pipeline's iteration scan keeps per
  # iteration, read from the compiled program (one microbatch's stage input and what the remat
  # policy saves inside the stage: jaxmem.hlo.stash), and the 1F1B estimate built on it
  # (jaxmem.program.pipelining.one_f_one_b; an estimate, labelled so in the notes).
  stage_activation_bytes: int | None = None
  required_1f1b_bytes: int | None = None
  cached: bool = False  # read from the row cache, not compiled in this run


@composed
class Row(Composed):
  """One configuration's per-device figures: its configuration, the compiler's figures, the
  step-time estimate, the judgement against the device and the training figures, each its own
  record, flat in ``as_dict()`` (and JSON, CSV, the cache) and in attribute access
  (``row.total_bytes``). Byte fields are per device; ``None`` means the figure cannot be had on
  this target, and ``notes`` says why.

  ``required_bytes`` is what must fit in ``capacity_bytes``: the compiler's peak where the
  backend gives one, else ``total_bytes``; for a compile refused for lack of memory, the
  figure from the compiler's message. ``fits`` compares the two (``None`` without a capacity).
  ``comm_*_bytes`` are the bytes one device sends per step in each kind of collective
  (:class:`jaxmem.records.Communication`), a lower bound, not a total, where ``comm_lower_bound``.
  ``program_flops`` is the whole step's FLOPs counted from its jaxpr (every device, every
  layer): the step as written, before XLA's own rematerialization, which the GPU compiler adds
  to a program over the device's memory. ``recompute_overhead_pct`` compares it with the no-remat
  row's, so a baseline XLA rematerialized does not make a policy look cheaper than none.
  """

  config: Configuration
  compiled: CompilerFigures = dataclasses.field(default_factory=CompilerFigures)
  timing: StepTime = dataclasses.field(default_factory=StepTime)
  judgement: Judgement = dataclasses.field(default_factory=Judgement)
  train: TrainFigures = dataclasses.field(default_factory=TrainFigures)
  runtime: RuntimeAccount = dataclasses.field(default_factory=RuntimeAccount)

  def communication(self) -> Communication:
    return self.compiled.communication()

  def step_time(self) -> StepTime:
    return self.timing


def run_config(p: Plan, mesh: shd.MeshSpec, opt: Optimizer, rp: RematPolicy) -> Row:
  """Compiles one configuration (the plan's first value of every other axis: a task's plan,
  :func:`jaxmem.resolve.for_task`, has one) through
  :func:`jaxmem.compiler.figures.compile_figures`. A compile the backend refuses
  (out of memory, an unsupported feature), or arguments alone over the device's capacity,
  become a row with ``error`` set rather than an exception, so a sweep goes on."""
  if p.workload.step:  # a user's own step (jaxmem.planning.steps)
    return Row(**steps.step_row(p, mesh, rp))
  program = build_program(p, mesh, opt, rp)
  cfg = program.cfg  # the model as this configuration builds it (its MoE choice)
  base = configuration(p, mesh, opt, rp, program) | dict(
      param_bytes=program.param_bytes,
      param_bytes_global=program.param_bytes_global,
      optimizer_state_bytes=program.optimizer_state_bytes,
  )
  notes = list(cfg.notes)  # what the figures do not model about the architecture (config.json)
  notes += program.notes
  if get_attention(program.attention.name).fused:  # its FLOPs are counted from its shapes
    notes.append(KERNEL_FLOPS_NOTE)
  if program.moe_kernel == "gmm":
    notes.append(GMM_FLOPS_NOTE)
  if dict(mesh).get("expert", 1) > 1 and not cfg.is_moe:
    notes.append(f"mesh axis expert: {cfg.name} has no experts, so it only splits the batch (data parallelism)")
  outcome = compile_figures(
      program.trace(), p.target, args=None if p.workload.always_compile else program.args, notes=notes, lowering_context=program.lowering_context(),
      work=Work(tokens=p.batch * p.seq, model_flops=training_flops(cfg, batch=p.batch, seq=p.seq),
                floor_flops=weight_flops(cfg, tokens=p.batch * p.seq, training=True)),
  )
  fields = outcome.row_fields()
  if program.pipeline is not None:
    fields.update(pipeline_figures(program.pipeline, outcome, fields))
  return Row(**base, **fields)


def pipeline_figures(pipe: Any, outcome: Any, fields: dict[str, Any]) -> dict[str, Any]:
  """A pipelined row's compiled stage activation per iteration and the 1F1B estimate from it,
  with the notes saying what each is (None for a refused compile)."""
  if getattr(outcome, "report", None) is None:
    return {}
  s, m, r = pipe.stages, pipe.microbatches, pipe.repeats
  per = per_iteration_bytes(outcome.compiled.as_text(), pipe.iterations)
  notes = list(fields["notes"])
  if per is None:
    notes.append(f"stage_activation_bytes: no loop of {pipe.iterations} iterations stacks anything in the compiled program")
  else:
    notes.append(
        f"stage_activation_bytes: what the compiled pipeline loop ({pipe.iterations} = M·R + S - 1 iterations) "
        "keeps per iteration for the backward pass: one microbatch's stage input and what the remat policy saves "
        "inside the stage; GPipe keeps it for every iteration"
    )
    notes.append(ONE_F_ONE_B_NOTE)
  # per_device_flops takes the share from the optimized HLO's matrix FLOPs with trip counts, so a
  # stage's layers, the bubble iterations and the head each device runs are all in it (tiny, 4
  # layers, stage=2,fsdp=2 on tpu:v5e-4: 1.03x the program's FLOPs over the 4 devices, where the
  # loop-once share of cost analysis gave 1.22x).
  notes.append(
      "flops: a pipelined step's per-device figure is what one device's program runs (the optimized HLO's "
      "matrix FLOPs with loop trip counts), the bubble iterations' work included; program_flops (the whole "
      "program, bubble iterations included) is exact"
  )
  return dict(
      stage_activation_bytes=per, required_1f1b_bytes=one_f_one_b(fields.get("required_bytes"), per, s, m, r),
      notes=tuple(notes),
  )


def run_task(task: Task) -> dict[str, Any]:
  """Compiles one task and returns its row as a dict (picklable, JSON-able): the run function
  :func:`jaxmem.planning.runner.run_tasks` is given in a worker process (or on a Dask worker),
  where the task is planned again (a plan holds devices, which do not travel)."""
  start_jax(task.cpu_devices)
  return run_planned(plan(task.workload), task)


def run_planned(p: Plan, task: Task) -> dict[str, Any]:
  """:func:`run_task` with the sweep's own plan ``p`` (in this process: nothing planned again)."""
  one, mesh, opt, rp = for_task(p, task)
  return run_config(one, mesh, opt, rp).as_dict()


def runner(p: Plan, *, jobs: int = 1, scheduler: str | None = None, workers: bool = False) -> Callable[[Task], dict[str, Any]]:
  """The run function for ``p``'s tasks: in this process the plan is reused; tasks sent to
  worker processes or a cluster (``workers``: a compiler release's) are planned there
  (:func:`run_task`)."""
  return run_task if jobs > 1 or scheduler or workers else functools.partial(run_planned, p)


def with_overheads(rows: list[Row]) -> list[Row]:
  """Fills ``recompute_overhead_pct``: FLOPs over the ``none`` row of the same target, mesh,
  optimizer, attention, MoE variant and workload (rows without one keep ``None``)."""
  key = baseline_key
  base = {key(r): r for r in rows if r.remat == "none" and r.flops}
  out = []
  for r in rows:
    b = base.get(key(r))
    pct = None
    if b is not None and r.program_flops and b.program_flops:  # the steps as written
      pct = 100.0 * (r.program_flops - b.program_flops) / b.program_flops
    elif b is not None and r.flops is not None:  # a user's step, or rows from an older cache
      pct = 100.0 * (r.flops - b.flops) / b.flops
    out.append(dataclasses.replace(r, recompute_overhead_pct=pct))
  return out


def baseline_key(r: Any) -> tuple:
  """What a row shares with the no-remat row it is compared with: everything but the policy
  (:func:`jaxmem.axes.baseline_fields`)."""
  return key(r, baseline_fields())


def compare(workload: Workload | None = None, /, *, run: RunOptions | None = None, **fields: Any) -> list[Row]:
  """Compiles the train step for every (mesh, optimizer, attention, microbatches, vocab tiling,
  remat) of ``workload`` (with ``fields`` replaced: ``compare(model="tiny", batch=2)`` works)
  and returns one row each.

  ``none`` (no remat) is always included as the baseline. Everything is validated before the
  first compile, so bad input raises :class:`JaxmemError` without wasting work. ``run`` (or its
  fields as keywords: ``jobs=2``) says how to compile and whom to tell
  (:class:`jaxmem.options.RunOptions`): ``on_start`` hears the number of configurations,
  ``on_row`` each row as it finishes, in completion order (for progress and for saving partial
  results). The sweep is planned once: in this process no configuration is planned again.
  """
  run = RunOptions.of(run, fields)
  return compare_plan(plan(workload, **fields), run)


def compare_plan(p: Plan, run: RunOptions) -> list[Row]:
  """:func:`compare` of a plan already made: every task of ``p``, one row each."""
  run.start(len(p.tasks()), p.cfg)
  return with_overheads(run_rows(p, p.tasks(), jobs=run.jobs, scheduler=run.scheduler, cache=run.cache,
                                 on_row=run.on_row))


def run_rows(
    p: Plan, tasks: list[Task], *, jobs: int = 1, scheduler: str | None = None, cache: RowCache | None = None,
    on_row: Callable[[Row], None] | None = None, counting: Counting | None = None,
) -> list[Row]:
  """Rows for ``tasks`` (configurations of ``p``), in task order; ``on_row`` as each finishes;
  ``counting``: where the tasks stand in the whole run (:class:`jaxmem.planning.runner.Counting`).
  A row is made once from its dict (the form the cache and worker processes hold)."""
  rows: dict[int, Row] = {}

  def done(i: int, d: dict[str, Any], cached: bool) -> None:
    rows[i] = row_from_dict({**d, "cached": cached})
    if on_row is not None:
      on_row(rows[i])

  key = functools.partial(steps.step_key, p) if p.workload.step else None
  workers = any(release(t) for t in tasks)
  run_tasks(tasks, runner(p, jobs=jobs, scheduler=scheduler, workers=workers), jobs=jobs, scheduler=scheduler, cache=cache, on_row=done,
            key=key, check=is_row, counting=counting)
  return [rows[i] for i in range(len(tasks))]


def row_from_dict(d: dict[str, Any]) -> Row:
  """A row back from its ``as_dict()`` (from a worker process or the cache)."""
  return Row(**{**d, "notes": tuple(d.get("notes") or ())})


def is_row(d: dict[str, Any]) -> bool:
  """Whether ``d`` (a cache entry) reads back as a :class:`Row`."""
  try:
    row_from_dict(d)
  except (TypeError, ValueError):  # a field the row does not have, or one missing
    return False
  return True


def baseline_flops(p: Plan, row: Row, task: Task) -> float | None:
  """FLOPs per device of the no-remat program at ``row``'s workload: its program's count
  (traced, not compiled) times the share of the program one device ran in ``row`` (``row.flops``
  over its own program's count), so the recompute overhead compares like with like. ``task``:
  the configuration of ``p`` that ``row`` was compiled for (its batch and sequence the row's)."""
  if row.remat == "none" or row.flops is None:
    return row.flops
  if p.workload.maxtext:  # MaxText checkpoints every layer: it has no no-remat program
    return None
  task = task.replace(batch=row.batch, seq=row.seq)
  # The row's own count was taken when it compiled; a step's row (or one from an older cache)
  # has none, and its program is traced again.
  base, own = program_flops(p, task, "none"), row.program_flops or program_flops(p, task, row.remat)
  return None if not own else row.flops * base / own


def program_flops(p: Plan, task: Task, remat: str) -> float:
  """The whole program's FLOPs of one of ``p``'s configurations (``task``), under ``remat``."""
  one, mesh, opt, _ = for_task(p, task)
  rp = get_remat(remat)
  if one.workload.step:
    return steps.step_flops(one, mesh, rp, batch=one.batch, seq=one.seq)
  return jaxpr_flops(build_program(one, mesh, opt, rp).trace().jaxpr.jaxpr)

"""The largest batch (or sequence) that fits, from few compiles.

For each (mesh, optimizer, remat) a :class:`~jaxmem.planning.boundary.Boundary` keeps a bracket
(largest workload known to fit, smallest known not to) and narrows it with the line the
compiler's own figures draw: what a step needs is close to affine in the batch (arguments and a
gradient fixed, activations linear), so after the smallest batch one compile predicts the
boundary, a secant refines it, and a compile at the prediction and one at its neighbour close
the bracket; bisection takes over where the line misses (MaxText's ``estimator.py`` bisects).
With ``depth_probe`` each probe is predicted from two compiles at small depths and only the
answer and its neighbour are compiled at full depth (:mod:`jaxmem.planning.depth`). Workloads move in steps that
keep the global batch divisible by the data axes times the microbatches (``--over batch``: the search is over the global batch at the given gradient
accumulation) or the sequence by 128 times the sequence axis and by the vocabulary tiles
(``--over seq``). All searches advance in lockstep, so each round's compiles run in parallel
(``jobs``) and every compile lands in the row cache: a repeated search is answered from disk.

With a fixed workload instead (:func:`rank`), every configuration is compiled once and ranked:
those that fit first, cheapest recompute first; the first is the recommendation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from jaxmem.axes import AXES, combinations, inner_axes, one_each, values_of, with_fields
from jaxmem.hardware.margin import AT_RISK
from jaxmem.errors import JaxmemError
from jaxmem.events import notice
from jaxmem.planning.boundary import Boundary, row_probe
from jaxmem.planning.runner import Counting
from jaxmem.cache import RowCache
from jaxmem.planning.depth import depth_plan, depth_task, probe_depths
from jaxmem.planning.depth import predict as predict_at_depth
from jaxmem.resolve import Plan, Task, outer_variants, plan, resolve_meshes, resolve_target, variant_of
from jaxmem.program.train import moe_summary
from jaxmem.options import RunOptions
from jaxmem.planning.sweep import Row, baseline_flops, compare_plan, run_rows, with_overheads
from jaxmem.program import sharding as shd
from jaxmem.program.train import batch_multiple, seq_multiple
from jaxmem.records import SWEPT_FIELDS
from jaxmem.workload import Workload

SEQ_QUANTUM = 128  # sequence steps: a multiple of TPU lane width keeps layouts unpadded
MAX_STEPS = 1 << 16  # search ceiling, in units of the step


@dataclasses.dataclass(frozen=True, kw_only=True)
@with_fields("summary")
class FitResult:
  """The largest fitting workload for one (mesh, optimizer, attention, microbatches, remat) and
  its figures. ``attention`` is the implementation the largest fitting row used (else the name
  asked for)."""

  over: str  # "batch" or "seq"
  mesh: str
  optimizer: str
  remat: str
  max_batch: int | None
  max_seq: int | None
  compiles: int  # compiles the search made (or read from the cache), at every depth it probed
  row: Row | None  # the largest fitting configuration; None if even the smallest does not fit
  note: str | None = None
  attention: str | None = None
  microbatches: int = 1
  moe: str | None = None  # an MoE model's experts: "dropless", "capacity 1.25" (None: dense; program.train.moe_summary)
  # With a depth probe (fit --depth-probe): the two num_layers each probe was predicted from,
  # whether the answer compiled at full depth agreed, and the prediction's error there (percent
  # of the compiled required bytes). None without one.
  predicted_from_depths: tuple[int, int] | None = None
  confirmed_full_depth: bool | None = None
  depth_prediction_error_pct: float | None = None
  # (the configuration's swept fields, jaxmem.records.SWEPT_FIELDS: its largest fitting row's,
  # else as asked, None where a row would resolve them)

  def as_dict(self) -> dict[str, Any]:
    d = {} if self.row is None else self.row.as_dict()
    d.update(
        over=self.over,
        mesh=self.mesh,
        optimizer=self.optimizer,
        remat=self.remat,
        attention=self.attention,
        microbatches=self.microbatches,
        max_batch=self.max_batch,
        max_seq=self.max_seq,
        compiles=self.compiles,
        fit_note=self.note,
        moe=self.moe,
        **{k: getattr(self, k) for k in SWEPT_FIELDS},
        predicted_from_depths=None if self.predicted_from_depths is None else list(self.predicted_from_depths),
        confirmed_full_depth=self.confirmed_full_depth,
        depth_prediction_error_pct=self.depth_prediction_error_pct,
    )
    return d


@dataclasses.dataclass
class _Search:
  """One configuration's search: a :class:`~jaxmem.planning.boundary.Boundary` over workload
  steps and the rows behind it. With a depth probe (:mod:`jaxmem.planning.depth`) it moves
  through phases: ``depth`` (each probe predicted from two compiles at small depths), ``confirm``
  (the predicted answer compiled at full depth), then ``done``, or ``full`` (compiles at full
  depth only, from the start or where the confirmation contradicted the prediction)."""

  task: Task  # template; batch/seq replaced per probe
  step: int
  bound: Boundary
  depths: tuple[int, int] | None = None  # the depth probe's num_layers, None without one
  full_depth: int | None = None
  phase: str = "full"
  best: Row | None = None
  last: Row | None = None  # the latest row, fitting or not
  compiles: int = 0  # every compile of the search, at any depth
  confirmed: bool | None = None  # the depth probe's answer compiled at full depth and agreed
  depth_error_pct: float | None = None  # predicted over compiled required bytes at the answer, - 1
  predicted: dict[int, int | None] = dataclasses.field(default_factory=dict)
  full_rows: dict[int, Row] = dataclasses.field(default_factory=dict)  # the confirmation's compiles
  confirm_k: int = 0

  def __post_init__(self) -> None:
    if self.depths is not None:
      self.phase = "depth"

  def next_probe(self) -> int | None:
    if self.phase == "done":
      return None
    if self.phase == "confirm":
      return self.confirm_k
    k = self.bound.next_probe()
    if k is None and self.phase == "depth":
      self.phase, self.confirm_k = "confirm", max(self.bound.lo, 1)
      return self.confirm_k
    return k

  def layers(self) -> tuple[int | None, ...]:
    """The depths this round's probe compiles at (None: the model's own)."""
    return self.depths if self.phase == "depth" else (None,)

  def record(self, k: int, rows: list[Row]) -> None:
    self.compiles += len(rows)
    self.last = rows[-1]
    if self.phase == "depth":
      probe = predict_at_depth((rows[0], rows[1]), self.depths, self.full_depth, self.bound.capacity)
      self.predicted[k] = probe.required
      self.bound.record(k, probe)
      return
    (row,) = rows
    if self.phase == "confirm":
      self._confirm(k, row)
      return
    self.bound.record(k, row_probe(row))
    if row.fits and k >= self.bound.lo:
      self.best = row

  def _confirm(self, k: int, row: Row) -> None:
    """The predicted answer, then its neighbour, compiled at full depth: where both agree with the
    prediction (the answer fits, the next does not; or the smallest does not fit, as predicted)
    the search ends; else it goes on at full depth from what the full depth said. The neighbour
    is compiled too because near the capacity the TPU compiler squeezes a deep stack below the
    line (llama3-1b, docs/examples.md): a prediction may be pessimistic, and only a compile says."""
    self.full_rows[k] = row
    pred = self.predicted.get(k)
    if k == max(self.bound.lo, 1) and pred is not None and row.required_bytes:
      self.depth_error_pct = round(100.0 * (pred - row.required_bytes) / row.required_bytes, 2)
    if row.fits:  # the confirmation compiles upward: a later fitting row is the larger
      self.best = row
    agrees = bool(row.fits) == (k <= self.bound.lo)
    if agrees and row.fits and self.bound.hi == k + 1:
      self.confirm_k = k + 1  # the neighbour, predicted not to fit
      return
    if agrees:
      self.confirmed, self.phase = True, "done"
      return
    self.confirmed, self.phase = False, "full"
    self.bound = Boundary(cap=self.bound.cap, capacity=self.bound.capacity)
    for kk, r in sorted(self.full_rows.items()):
      self.bound.record(kk, row_probe(r))


def seq_step(mesh: shd.MeshSpec, options: dict[str, Any], platform: str) -> int:
  """The sequence step of a ``--over seq`` search for one configuration (``options``: its value of
  every axis): 128 per sequence shard, and a multiple of what its program needs of the sequence
  (:func:`jaxmem.program.train.seq_multiple`); with sequence parallelism, of the residual
  stream's split over tensor too."""
  step = math.lcm(SEQ_QUANTUM * shd.mesh_axes(mesh).ways("seq"), seq_multiple(mesh, options, platform))
  if options.get("sequence_parallel"):
    step = math.lcm(step, SEQ_QUANTUM * shd.mesh_axes(mesh).ways("seq") * dict(mesh).get("tensor", 1))
  return step


def check_over(over: str) -> None:
  if over not in ("batch", "seq"):
    raise JaxmemError(f"`over` must be batch or seq (got {over!r})")


def require_capacity(p: Plan) -> None:
  if p.target.capacity_bytes is None:
    raise JaxmemError(
        f"fit needs a target with a memory capacity; {p.target.name} has none (use a TPU or GPU "
        "`target`, e.g. tpu:v5e-8 or gpu:h100, or attached)"
    )


def search(
    p: Plan,
    *,
    over: str = "batch",
    jobs: int = 1,
    scheduler: str | None = None,
    cache: RowCache | None = None,
    on_round: Callable[[int, int], None] | None = None,
    on_row: Callable[[Row], None] | None = None,
    depth_probe: bool = False,
    strategy: str = "affine",
    recompute: bool = False,
) -> list[FitResult]:
  """Largest batch (``over="batch"``) or sequence (``over="seq"``) that fits, per configuration;
  ``on_row`` is called with each compile's row as it finishes, ``on_round(round, compiles)`` after
  each round. ``depth_probe``: predict each probe from two compiles at small depths and compile
  only the answer and its neighbour at full depth (:mod:`jaxmem.planning.depth`; models deeper than
  its probes).
  ``strategy``: ``affine`` (the default) or ``bisect`` (:mod:`jaxmem.planning.boundary`).
  ``recompute``: each answer's recompute overhead against the no-remat program at its workload
  (traced, not compiled: :func:`with_recompute`)."""
  require_capacity(p)
  check_over(over)
  depths = probe_depths(p.cfg) if depth_probe and not p.workload.step else None
  plans = {None: p} | ({} if depths is None else {d: depth_plan(p, d) for d in depths})
  searches = [_new_search(p, t, over, strategy, depths) for t in p.tasks()]
  notice(expected_compiles_line(len(searches), strategy, depths is not None), progress=True)
  unused = depth_probe and depths is None
  why = "a user's step, whose depth jaxmem cannot change" if p.workload.step else "the stack is no deeper than the probes"
  rounds = asked = 0
  while True:
    probes = [(s, k) for s in searches if (k := s.next_probe()) is not None]
    if not probes:
      break
    asks = [(i, d, _probe_task(s, k, over, d)) for i, (s, k) in enumerate(probes) for d in s.layers()]
    rows: dict[tuple[int, int | None], Row] = {}
    for d, plan_d in plans.items():
      group = [(i, t) for i, dd, t in asks if dd == d]
      if group:
        # Numbered within the whole search, whose number of compiles is known only at its end.
        got = run_rows(plan_d, [t for _, t in group], jobs=jobs, scheduler=scheduler, cache=cache, on_row=on_row,
                       counting=Counting(before=asked))
        asked += len(group)
        rows.update({(i, d): r for (i, _), r in zip(group, got, strict=True)})
    for i, (s, k) in enumerate(probes):
      s.record(k, [rows[i, d] for d in s.layers()])
    rounds += 1
    if on_round:
      on_round(rounds, len(asks))
  results = [_result(s, over, p) for s in searches]
  if recompute:
    results = [with_recompute(r, p, s.task) for r, s in zip(results, searches, strict=True)]
  if unused:  # asked for and not used: the rows say why
    results = [dataclasses.replace(r, note="; ".join(filter(None, [r.note, f"depth probe not used: {why}"]))) for r in results]
  return results


def expected_compiles_line(configurations: int, strategy: str, depth_probe: bool) -> str:
  """What a search expects to compile, for a line before it starts. The affine search usually
  closes a bracket in about four compiles per configuration, bisection in about ten
  (benchmarks/fit_compiles.py: 4.00 and 11.33 on its quick run); a depth probe compiles twice."""
  each = (4 if strategy == "affine" else 10) * (2 if depth_probe else 1)
  return (
      f"fit: searching {configurations} configuration{'s' * (configurations != 1)}; expect about "
      f"{each * configurations} compiles ({each} each, more where the compiler departs from a line near the capacity)"
  )


def _new_search(p: Plan, t: Task, over: str, strategy: str, depths: tuple[int, int] | None) -> _Search:
  """A configuration's search in steps that keep the workload valid on its mesh."""
  p = variant_of(p, t)  # its model, where the sweep has several
  options = one_each(t.workload)
  if over == "batch":
    step, cap = batch_multiple(t.mesh, options), MAX_STEPS
  else:
    step = seq_step(t.mesh, options, p.target.platform)
    limit = None if p.cfg is None else p.cfg.position_limit  # learned positions cap the sequence
    cap = MAX_STEPS if limit is None else max(1, limit // step)
  bound = Boundary(cap=cap, capacity=p.target.capacity_bytes, strategy=strategy)
  full = None if depths is None else p.cfg.num_layers
  return _Search(task=t, step=step, bound=bound, depths=depths, full_depth=full)


def _probe_task(s: _Search, k: int, over: str, layers: int | None) -> Task:
  task = s.task.replace(**{over: k * s.step})
  return task if layers is None else depth_task(task, layers)


def _result(s: _Search, over: str, p: Plan) -> FitResult:
  lo = s.bound.lo
  value = lo * s.step if lo else None
  notes = []
  if not lo:
    notes.append(f"the smallest {over} ({s.step}) does not fit")
  elif s.bound.hi is None:
    notes.append(f"search stopped at the ceiling ({value}); more may fit")
  if s.depths is not None:
    notes.append(_depth_note(s, over))
  return FitResult(
      over=over,
      mesh=shd.format_mesh(s.task.mesh),
      optimizer=s.task.optimizer,
      remat=s.task.remat,
      attention=s.best.attention if s.best is not None else s.task.attention,
      microbatches=s.task.microbatches,
      max_batch=value if over == "batch" else (p.batch if value else None),
      max_seq=value if over == "seq" else (p.seq if value else None),
      compiles=s.compiles,
      row=s.best,
      note="; ".join(notes) or None,
      moe=_moe_label(s),
      predicted_from_depths=s.depths,
      confirmed_full_depth=s.confirmed,
      depth_prediction_error_pct=s.depth_error_pct,
      **{k: getattr(s.best, k) if s.best is not None else _asked(s.task.workload, k) for k in SWEPT_FIELDS},
  )


def _asked(w: Workload, k: str) -> Any:
  """A swept field as the task's workload asks it (None where it does not apply), where no row
  records it."""
  return one_each(w)[k]


def _depth_note(s: _Search, over: str) -> str:
  a, b = s.depths
  if s.confirmed:
    hi = s.bound.hi
    beyond = "" if hi is None else f" and {over} {hi * s.step} compiled at the full {s.full_depth}"
    return f"predicted from {a} and {b} layers; the answer{beyond or ' compiled at the full ' + str(s.full_depth)}, as predicted"
  return f"the prediction from {a} and {b} layers missed at the full {s.full_depth}; searched at full depth"

def _moe_label(s: _Search) -> str | None:
  """The search's MoE variant: from a compiled row, else as its task names it."""
  row = s.best or s.last
  if row is not None:
    return moe_summary(row.moe_impl, row.capacity_factor, row.fsdp_shard_on_exp)
  w = s.task.workload
  return ",".join(w.moe_impl) + "".join(f" {f:g}" for f in w.capacity_factor) or None


def with_recompute(result: FitResult, p: Plan, task: Task) -> FitResult:
  """``result`` with its row's recompute overhead against the no-remat program at the same
  workload (``task``: the configuration of ``p`` that was searched)."""
  r = result.row
  if r is None or r.flops is None:
    return result
  base = baseline_flops(p, r, task)
  pct = None if not base else 100.0 * (r.flops - base) / base
  return dataclasses.replace(result, row=dataclasses.replace(r, recompute_overhead_pct=pct))


def rank(rows: list[Row]) -> list[Row]:
  """Fitting configurations first (those at risk at the edge after those that are not), cheapest
  recompute first, then least memory."""
  rows = with_overheads(rows)

  def order(r: Row):
    return (
        (0 if r.verdict != AT_RISK else 1) if r.fits else 2,
        r.recompute_overhead_pct if r.recompute_overhead_pct is not None else float("inf"),
        r.required_bytes if r.required_bytes is not None else float("inf"),
    )

  return sorted(rows, key=order)


def template(workload: Workload, over: str) -> Workload:
  """The workload a search starts from, one every mesh accepts: the searched dimension at its
  smallest step (the batch the data axes times the microbatches divide, or one sequence quantum
  the vocabulary tiles divide); the other as given."""
  check_over(over)
  tgt = resolve_target(workload)
  configurations = _configurations(workload, resolve_meshes(workload, tgt))
  if over == "batch":
    return workload.replace(batch=math.lcm(*(batch_multiple(m, values) for m, values in configurations)))
  return workload.replace(seq=math.lcm(SEQ_QUANTUM, *(seq_step(m, values, tgt.platform) for m, values in configurations)))


def _configurations(workload: Workload, meshes: tuple[shd.MeshSpec, ...]) -> list[tuple[shd.MeshSpec, dict[str, Any]]]:
  """Every configuration of ``workload`` on ``meshes``: each mesh and its one value of every axis."""
  by_name = {shd.format_mesh(m): m for m in meshes}
  out = []
  for w in outer_variants(workload):
    inner = {a.name: tuple(dict.fromkeys(a.values(w))) for a in inner_axes(w)} | {"mesh": tuple(by_name)}
    fixed = {a.name: getattr(w, a.name) for a in AXES.values() if a.outer}
    out += [(by_name[c["mesh"][0]], values_of(c, fixed)) for c in combinations(inner, fixed)]
  return out


def fit(
    workload: Workload | None = None,
    /,
    *,
    over: str = "batch",
    run: RunOptions | None = None,
    depth_probe: bool = False,
    strategy: str = "affine",
    **fields: Any,
) -> list[FitResult]:
  """The largest batch (``over="batch"``) or sequence (``over="seq"``) that fits, for every
  (mesh, optimizer, remat) of ``workload`` with ``fields`` replaced, with each result's
  recompute overhead against the no-remat program at the same workload. With ``over="seq"``,
  ``batch=None`` searches at the smallest batch every mesh accepts (else the workload's; a
  MaxText step's: its config's).
  ``run`` (or its fields as keywords, :class:`jaxmem.options.RunOptions`): ``on_start`` is told
  before the first compile (no total: a search's count is known at its end), ``on_row`` each
  compiled (or cached) probe, ``on_round(round, compiles)`` each round of the search.
  ``depth_probe`` and ``strategy``: as :func:`search` takes them."""
  run = RunOptions.of(run, fields)
  w = Workload.of(workload, **fields)
  # A MaxText step given no batch searches the sequence at its config's batch.
  if over == "seq" and "batch" in fields and fields["batch"] is None and w.maxtext is None:
    w = template(w, "batch")
  p = plan(template(w, over))
  require_capacity(p)
  run.start(None, p.cfg)
  return search(
      p, over=over, jobs=run.jobs, scheduler=run.scheduler, cache=run.cache, on_round=run.on_round,
      on_row=run.on_row, depth_probe=depth_probe, strategy=strategy, recompute=True,
  )


def rank_configurations(workload: Workload | None = None, /, *, run: RunOptions | None = None, **fields: Any) -> list[Row]:
  """``fit`` at a fixed workload: every configuration of ``workload`` (``fields`` replaced)
  compiled once, as :func:`jaxmem.compare` does with ``run``, and ranked by :func:`rank`, the
  recommendation first. A target without a capacity is refused before compiling."""
  run = RunOptions.of(run, fields)
  p = plan(workload, **fields)
  require_capacity(p)
  return rank(compare_plan(p, run))

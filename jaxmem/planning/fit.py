"""The largest batch (or sequence) that fits, by bisection over compiles.

For each (mesh, optimizer, remat) the search keeps a bracket (largest workload known to fit,
smallest known not to) and narrows it with a secant on the compiler's required bytes, falling
back to doubling and bisection (MaxText's ``estimator.py`` bisects; memory is close to linear in
the batch, so the secant usually lands on the boundary in four compiles instead of ten or more).
Workloads move in steps that keep the global batch divisible by the data axes times the
microbatches (``--over batch``: the search is over the global batch at the given gradient
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

from jaxmem.compiler.margin import AT_RISK
from jaxmem.errors import JaxmemError
from jaxmem.models import context_attention as ctx
from jaxmem.models.attention_registry import AUTO, AUTO_PREFERENCE, FALLBACK
from jaxmem.planning.cache import RowCache
from jaxmem.planning.plan import Plan, Task, plan, resolve_meshes, resolve_target
from jaxmem.planning.sweep import Row, baseline_flops, compare, run_rows, with_overheads
from jaxmem.program import sharding as shd
from jaxmem.program.pipelining import PipelineOptions
from jaxmem.workload import Workload

SEQ_QUANTUM = 128  # sequence steps: a multiple of TPU lane width keeps layouts unpadded
MAX_STEPS = 1 << 16  # search ceiling, in units of the step


@dataclasses.dataclass(frozen=True, kw_only=True)
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
  compiles: int  # configurations compiled (or read from the cache) in the search
  row: Row | None  # the largest fitting configuration; None if even the smallest does not fit
  note: str | None = None
  attention: str | None = None
  microbatches: int = 1
  moe: str | None = None  # an MoE model's experts: "dropless", "capacity 1.25" (None: dense)
  context_strategy: str | None = None  # over a context axis: all_gather or ring (None: no context axis)

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
        context_strategy=self.context_strategy,
    )
    return d


@dataclasses.dataclass
class _Search:
  """A bracket [lo fits, hi does not] over workload steps, narrowed by a secant on the
  compiler's required bytes. Memory grows close to linearly in the batch (and, without
  attention scores materialised, in the sequence), so after two fitting probes the line
  through them predicts the boundary and one or two more compiles confirm it; bisection takes
  over whenever the prediction leaves the bracket, so the search always ends."""

  task: Task  # template; batch/seq replaced per probe
  step: int
  cap: int  # largest allowed number of steps
  lo: int = 0  # largest number of steps known to fit
  hi: int | None = None  # smallest number of steps known not to fit
  best: Row | None = None
  compiles: int = 0
  points: dict[int, int] = dataclasses.field(default_factory=dict)  # steps -> required bytes (fitting)
  capacity: int = 0
  secant_missed: bool = False
  last: Row | None = None  # the latest row, fitting or not

  def record(self, k: int, row: Row) -> None:
    self.compiles += 1
    self.last = row
    if row.required_bytes is not None:
      self.points[k] = row.required_bytes
    if row.fits:
      if k > self.lo:
        self.lo, self.best = k, row
    else:
      self.hi = k if self.hi is None else min(self.hi, k)

  def _predict(self) -> int | None:
    # The secant through the points nearest the boundary: the bracket's ends where both were
    # measured, else the two largest fitting ones.
    if self.hi in self.points and self.lo in self.points:
      (k1, r1), (k2, r2) = (self.lo, self.points[self.lo]), (self.hi, self.points[self.hi])
    else:
      below = sorted((k, r) for k, r in self.points.items() if k <= self.lo)
      if len(below) < 2:
        return None
      (k1, r1), (k2, r2) = below[-2:]
    slope = (r2 - r1) / (k2 - k1)
    if slope <= 0:
      return None
    return k1 + int((self.capacity - r1) // slope)

  def next_probe(self) -> int | None:
    if self.lo == 0:
      return None if self.hi is not None else 1
    upper = self.cap if self.hi is None else self.hi - 1
    if self.lo >= upper:
      return None
    guess = self._predict()
    if guess is None or (self.hi is not None and self.secant_missed):
      # Too few points, or the last prediction did not close the bracket: double, or bisect
      # (so a poor prediction costs at most every other probe).
      guess = self.lo * 2 if self.hi is None else (self.lo + self.hi) // 2
      self.secant_missed = False
    else:
      self.secant_missed = True  # cleared if this probe closes the bracket (search then ends)
    # Inside the open bracket; at the prediction's edge, confirm with the neighbour.
    return min(max(guess, self.lo + 1), upper)


def seq_step(mesh: shd.MeshSpec, attention: str, strategy: str, platform: str, vocab_tiles: int = 1) -> int:
  """The sequence step of a ``--over seq`` search: 128 per sequence shard, a multiple of the
  vocabulary tiles, and, over a context axis, of what the strategy's kernel needs (two
  load-balanced chunks per device, each whole 128-lane blocks for splash:
  :func:`jaxmem.models.context_attention.seq_multiple`)."""
  axes = shd.mesh_axes(mesh)
  step = math.lcm(SEQ_QUANTUM * axes.ways("seq"), vocab_tiles)
  if "context" not in axes.seq:
    return step
  kernel = attention
  if attention == AUTO:  # auto's kernel where the strategy can take it (the registry's choice)
    preferred = AUTO_PREFERENCE.get(platform, FALLBACK)
    kernel = preferred if ctx.strategy_problem(strategy, preferred) is None else FALLBACK
  return math.lcm(step, ctx.seq_multiple(strategy, kernel, axes.ways("seq")))


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
) -> list[FitResult]:
  """Largest batch (``over="batch"``) or sequence (``over="seq"``) that fits, per configuration;
  ``on_row`` is called with each probe's row as it finishes, ``on_round(round, probes)`` after each round."""
  require_capacity(p)
  check_over(over)
  searches = []
  for t in p.tasks():
    mesh = t.mesh
    if over == "batch":
      step, cap = shd.data_parallel_size(mesh) * t.microbatches * p.pipeline.ways(mesh), MAX_STEPS
    else:
      step = seq_step(mesh, t.attention, t.context_strategy, p.target.platform, t.vocab_tiles)
      if p.workload.sequence_parallel:  # the residual stream is split over tensor too
        step = math.lcm(step, SEQ_QUANTUM * shd.mesh_axes(mesh).ways("seq") * dict(mesh).get("tensor", 1))
      gpt2 = p.cfg is not None and p.cfg.style == "gpt2"  # learned positions cap the sequence
      cap = max(1, p.cfg.max_seq_len // step) if gpt2 else MAX_STEPS
    searches.append(_Search(task=t, step=step, cap=cap, capacity=p.target.capacity_bytes))
  rounds = 0
  while True:
    probes = [(s, k) for s in searches if (k := s.next_probe()) is not None]
    if not probes:
      break
    tasks = [s.task.replace(**{over: k * s.step}) for s, k in probes]
    rows = run_rows(p, tasks, jobs=jobs, scheduler=scheduler, cache=cache, on_row=on_row)
    for (s, k), row in zip(probes, rows, strict=True):
      s.record(k, row)
    rounds += 1
    if on_round:
      on_round(rounds, len(probes))
  return [_result(s, over, p) for s in searches]


def _result(s: _Search, over: str, p: Plan) -> FitResult:
  value = s.lo * s.step if s.lo else None
  note = None
  if not s.lo:
    note = f"the smallest {over} ({s.step}) does not fit"
  elif s.hi is None:
    note = f"search stopped at the ceiling ({value}); more may fit"
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
      note=note,
      moe=_moe_label(s),
      context_strategy=s.task.context_strategy if "context" in shd.mesh_axes(s.task.mesh).seq else None,
  )


def _moe_label(s: _Search) -> str | None:
  """The search's MoE variant: from a compiled row, else as its task names it."""
  row = s.best or s.last
  if row is not None:
    if not row.moe_impl:
      return None
    return row.moe_impl + ("" if row.capacity_factor is None else f" {row.capacity_factor:g}")
  w = s.task.workload
  return ",".join(w.moe_impl) + "".join(f" {f:g}" for f in w.capacity_factor) or None


def with_recompute(results: list[FitResult], p: Plan, baseline_flops: Callable[[Row], float | None]) -> list[FitResult]:
  """Fills each result's recompute overhead against the no-remat program at the same workload."""
  out = []
  for r in results:
    if r.row is None or r.row.flops is None:
      out.append(r)
      continue
    base = baseline_flops(r.row)
    pct = None if not base else 100.0 * (r.row.flops - base) / base
    out.append(dataclasses.replace(r, row=dataclasses.replace(r.row, recompute_overhead_pct=pct)))
  return out


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
  if over == "batch":
    meshes = resolve_meshes(workload, resolve_target(workload))
    micro = [m for m in workload.microbatches if isinstance(m, int) and m > 0] or [1]
    piped = PipelineOptions(microbatches=workload.pipeline_microbatches, repeats=workload.pipeline_repeats)
    return workload.replace(batch=math.lcm(*[shd.data_parallel_size(m) * n * piped.ways(m) for m in meshes for n in micro]))
  tiles = [t for t in workload.vocab_tiles if isinstance(t, int) and t > 0] or [1]
  tgt = resolve_target(workload)
  steps = [seq_step(m, a, s, tgt.platform) for m in resolve_meshes(workload, tgt) for a in workload.attention
           for s in workload.context_strategy or ("all_gather",)]
  return workload.replace(seq=math.lcm(SEQ_QUANTUM, *tiles, *steps))


def fit(
    workload: Workload | None = None,
    /,
    *,
    over: str = "batch",
    jobs: int = 1,
    scheduler: str | None = None,
    cache: RowCache | None = None,
    on_round: Callable[[int, int], None] | None = None,
    on_row: Callable[[Row], None] | None = None,
    on_plan: Callable[[Plan], None] | None = None,
    **fields: Any,
) -> list[FitResult]:
  """The largest batch (``over="batch"``) or sequence (``over="seq"``) that fits, for every
  (mesh, optimizer, remat) of ``workload`` with ``fields`` replaced, with each result's
  recompute overhead against the no-remat program at the same workload. With ``over="seq"``,
  ``batch=None`` searches at the smallest batch every mesh accepts (else the workload's).
  ``on_plan`` is called with the validated plan before the first compile; ``on_row`` with each
  compiled (or cached) probe; ``on_round(round, probes)`` after each round of the search."""
  w = Workload.of(workload, **fields)
  if over == "seq" and "batch" in fields and fields["batch"] is None:
    w = template(w, "batch")
  p = plan(template(w, over))
  require_capacity(p)
  if on_plan is not None:
    on_plan(p)
  results = search(p, over=over, jobs=jobs, scheduler=scheduler, cache=cache, on_round=on_round, on_row=on_row)
  return with_recompute(results, p, lambda row: baseline_flops(p, row))


def rank_configurations(
    workload: Workload | None = None, /, *, on_plan: Callable[[Plan], None] | None = None, **kwargs: Any
) -> list[Row]:
  """``fit`` at a fixed workload: every configuration of ``workload`` compiled once by
  :func:`jaxmem.compare` (``kwargs``: its options and workload fields) and ranked by
  :func:`rank`, the recommendation first. A target without a capacity is refused before compiling."""

  def planned(p: Plan) -> None:
    require_capacity(p)
    if on_plan is not None:
      on_plan(p)

  return rank(compare(workload, on_plan=planned, **kwargs))

"""Serving capacity: the most concurrent sequences at a context (or the longest context at a
concurrency) that fit, with the model's KV cache and weight format, by compiling the inference step.

The compiler is the oracle: every answer is a compiled prefill or decode step
(:func:`jaxmem.inference.run.run_infer_config`, the program ``infer`` compiles) that fits, and
the size one step above it is known not to. The search over sizes ``k`` (units of the step: the
data axes for the batch, :data:`CONTEXT_QUANTUM` positions for the context) keeps a bracket
(largest size compiled and fitting, smallest known not to fit) and narrows it:

1. From above, without compiling: the arguments (stored weights, the KV cache, the tokens) stay
   resident for the whole step, and their bytes per device are known exactly from shapes and
   shardings (:func:`jaxmem.compiler.figures.shape_argument_bytes`). The smallest size whose
   arguments alone exceed the capacity is the bracket's first upper end, found by building the
   program's abstract arguments only, so no impossible size is ever compiled.
2. With compiles: decode's first probe is the largest size the arguments allow (its temporaries
   are small beside its cache, so it often fits at once), prefill's the smallest (its
   activations grow with the prompt far past its arguments); then a secant on the compiler's
   required bytes (memory is close to affine in the batch and the context: the cache and the
   tokens grow linearly), with bisection whenever a secant step fails to halve the bracket, so
   the search ends within about twice bisection's compiles. With one measured point the slope is
   the arguments' own per step going down (the least the required bytes grow by), and going up
   the growth taken as proportional to the size, so either step lands at or below the boundary.

The answer's row carries infer's judgement (``fits``, ``verdict``, ``margin_bytes``), and
``next`` the row one step up: compiled and not fitting, or refused by its argument bytes alone
(``compiled`` False). ``compiles`` counts only the compiles the search ran (or read from the row
cache), never the argument checks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from jaxmem.axes import one_value_each, training_only
from jaxmem.compiler.figures import shape_argument_bytes
from jaxmem.hardware.startup import start_jax
from jaxmem.hardware.targets import get_target
from jaxmem.errors import JaxmemError
from jaxmem.inference import quant
from jaxmem.inference.program import build_infer_program
from jaxmem.inference.run import OPTIONS, InferRow, run_infer_config
from jaxmem.inference.workload import PHASES, InferPlan, InferWorkload, _ints, check_phase_fields, plan_infer
from jaxmem.models import ModelConfig, StepChoices
from jaxmem.cache import RowCache, key
from jaxmem.options import RunOptions
from jaxmem.program.train import moe_fields
from jaxmem.resolve import resolve_meshes
from jaxmem.program import sharding as shd
from jaxmem.records import Record

OVER = ("batch", "context")
# Context steps: a multiple of the TPU lane width keeps the cache's layout unpadded (as fit's
# sequence steps).
CONTEXT_QUANTUM = 128
MAX_STEPS = 1 << 16  # search ceiling, in units of the step
# A train step's options, which the inference step has none of (refused by name, one line): its
# own step, its sequence, its sweep axes (jaxmem.axes) and fit's depth probe.
TRAINING_ONLY = ("step", "maxtext", "seq", *training_only(), "depth_probe")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingFit(Record):
  """The largest concurrency (``over="batch"``: ``max_batch`` at ``context``) or the longest
  context (``over="context"``: ``max_context`` at ``batch``) that fits, for one (mesh, weight
  format, MoE variant) of a prefill or decode step. ``row``: the compiled step at the answer (None
  where even the smallest size does not fit); ``next``: the step one size up, which does not fit
  (compiled, or refused without a compile by its argument bytes; None where the search stopped at
  its ceiling). ``argument_limit``: the smallest size whose arguments alone exceed the capacity
  (never compiled; None below the ceiling). ``compiles``: compiles the search ran or read from
  the row cache."""

  phase: str
  over: str
  mesh: str
  weights: str
  max_batch: int | None
  max_context: int | None
  compiles: int
  argument_limit: int | None
  row: InferRow | None
  next: InferRow | None
  note: str | None = None

  def as_dict(self) -> dict[str, Any]:
    """The answer's row flattened (infer's fields), then the search's own, and ``next`` as the
    size, its judgement and whether it was compiled."""
    d = {} if self.row is None else self.row.as_dict()
    d.update(
        phase=self.phase, over=self.over, mesh=self.mesh, weights=self.weights, max_batch=self.max_batch,
        max_context=self.max_context, compiles=self.compiles, argument_limit=self.argument_limit, fit_note=self.note,
        next=None if self.next is None else next_fields(self.next),
    )
    return d


def next_fields(r: InferRow) -> dict[str, Any]:
  """What a result says about the size above its answer."""
  return dict(
      batch=r.batch, context=r.context, compiled=compiled(r), required_bytes=r.required_bytes, fits=r.fits,
      verdict=r.verdict, margin_bytes=r.margin_bytes, error=r.error,
  )


def compiled(r: InferRow) -> bool:
  """Whether ``r`` came from a compile (a refusal by argument bytes alone has no compile time
  and no compiler error)."""
  return r.compile_seconds is not None or (r.error is not None and not r.error.startswith("not compiled"))


@dataclasses.dataclass
class _Bracket:
  """[lo fits (compiled), hi does not fit (compiled, or by its arguments)] over sizes k >= 1;
  lo 0 is "nothing known to fit", hi the argument limit or the ceiling plus one."""

  capacity: int
  hi: int
  slope: float  # the arguments' bytes per step: the required bytes' least slope
  base: int  # the argument bytes that do not grow with k (the weights)
  from_top: bool  # the first probe: the largest size the arguments allow (else the smallest)
  lo: int = 0
  points: dict[int, int] = dataclasses.field(default_factory=dict)  # k -> required bytes
  rows: dict[int, InferRow] = dataclasses.field(default_factory=dict)
  bisect: bool = False  # the next probe bisects
  slow_steps: int = 0  # secant steps in a row that did not halve the bracket
  secant: bool = False  # the last probe was the secant's

  def record(self, k: int, row: InferRow) -> None:
    width = self.hi - self.lo
    self.rows[k] = row
    if row.required_bytes is not None:
      self.points[k] = row.required_bytes
    if row.fits:
      self.lo = max(self.lo, k)
    else:
      self.hi = min(self.hi, k)
    # Two secant steps in a row that each left more than half the bracket: bisect next, so the
    # search always ends (one is allowed: a secant landing just below the boundary is confirmed
    # by its neighbour next).
    slow = self.secant and 2 * (self.hi - self.lo) > width
    self.slow_steps = self.slow_steps + 1 if slow else 0
    self.bisect = self.slow_steps >= 2
    if self.bisect:
      self.slow_steps = 0

  def next_probe(self) -> int | None:
    if self.hi - self.lo <= 1:
      return None
    if not self.rows:
      self.secant = False
      return self.hi - 1 if self.from_top else 1
    guess = None if self.bisect else self._secant()
    self.secant = guess is not None
    if guess is None:
      guess = (self.lo + self.hi) // 2
    return min(max(guess, self.lo + 1), self.hi - 1)

  def _secant(self) -> int | None:
    if not self.points:
      return None
    # The two measured sizes nearest the bracket (its ends where both were compiled).
    near = sorted(self.points, key=lambda k: max(self.lo - k, k - self.hi, 0))[:2]
    if len(near) == 2:
      (k1, r1), (k2, r2) = sorted((k, self.points[k]) for k in near)
      slope = (r2 - r1) / (k2 - k1)
    else:
      # One point. Down from one that does not fit: the arguments' slope, the least the
      # required bytes grow by, so the step lands at or below the boundary. Up from one that
      # fits: what grows taken as proportional to k (required bytes less the arguments that do
      # not grow), which temporaries fixed in size make steeper, so again at or below.
      k1, r1 = near[0], self.points[near[0]]
      slope = self.slope if r1 > self.capacity else max(self.slope, (r1 - self.base) / k1)
    if slope <= 0:
      return None
    return k1 + math.floor((self.capacity - r1) / slope)


def check_serving(phase: str, over: str, fields: dict[str, Any]) -> None:
  """One-line errors for what a serving search cannot take, before anything is planned."""
  if phase not in PHASES:
    raise JaxmemError(f"`phase` must be one of {', '.join(PHASES)} for a serving fit (got {phase!r})")
  if over not in OVER:
    raise JaxmemError(f"`over` must be batch or context with `phase` {phase} (got {over!r})")
  for name in TRAINING_ONLY:
    if fields.get(name) is not None:
      raise JaxmemError(
          f"`{name}` is a train step's option; `phase` {phase} compiles the inference step, which has none"
      )
  if fields.get("prompt") is not None:
    raise JaxmemError(f"`prompt` is infer's; a serving fit takes the prompt length as `context` (`phase` {phase})")
  if fields.get(over) is not None:
    other = "context" if over == "batch" else "batch"
    raise JaxmemError(f"`{over}` is what `over` {over} searches; leave it out, or give it and search `over` {other}")


def check_kv_heads(cfg: ModelConfig, mesh: shd.MeshSpec) -> None:
  """The tensor axis must divide the kv heads: a serving answer with the cache replicated over
  the tensor axis would be a configuration no server runs by choice (MLA's latent has no heads)."""
  ways = dict(mesh).get("tensor", 1)
  if not cfg.is_mla and ways > 1 and cfg.num_kv_heads % ways:
    raise JaxmemError(
        f"`mesh` {shd.format_mesh(mesh)}: tensor={ways} does not divide {cfg.name}'s {cfg.num_kv_heads} kv heads, "
        f"so the KV cache would be replicated over it; use a tensor axis size that divides {cfg.num_kv_heads} "
        "(and data for the rest)"
    )


def fit_serving(
    workload: InferWorkload | None = None,
    /,
    *,
    phase: str = "decode",
    over: str = "batch",
    run: RunOptions | None = None,
    **fields: Any,
) -> list[ServingFit]:
  """The most concurrent sequences (``over="batch"``) at each ``context`` (the prompt for
  prefill, the KV cache's length for decode), or the longest context (``over="context"``) at
  ``batch``, that fit, per (MoE variant, mesh, weight format) of ``workload`` with ``fields``
  replaced: ``fit_serving(model="llama3-8b", weights="fp8", target="gpu:h100", context=8192)``.
  Every answer is compiled (see the module docstring). ``run`` (or its fields as keywords,
  :class:`jaxmem.options.RunOptions`): ``on_start`` is told before the first compile (no total:
  a search), ``on_row`` each compiled (or cached) probe; ``jobs`` and ``scheduler`` are refused."""
  run = RunOptions.of(run, fields)
  run.refuse("a serving fit", "it compiles one probe at a time, in this process", "jobs", "scheduler")
  check_serving(phase, over, fields)
  w = InferWorkload.of(workload, **fields).replace(phase=(phase,))
  p = _template_plan(w, over)
  # One search per configuration: prefill's options are not swept here.
  one_value_each(w, "a serving fit", only=[a.name for a in OPTIONS])
  check_phase_fields(w, prompt=False)  # its sizes are its contexts, the prompt's for prefill
  for mesh in p.meshes:
    check_kv_heads(p.cfg, mesh)
  if p.target.capacity_bytes is None:
    raise JaxmemError(
        f"a serving fit needs a target with a memory capacity; {p.target.name} has none (use a TPU or GPU "
        "`target`, e.g. tpu:v5e-8 or gpu:h100, or attached)"
    )
  run.start(None, p.cfg)
  contexts = p.contexts if over == "batch" else (None,)
  out = []
  for variant in p.variants():
    for mesh in p.meshes:
      for fmt in p.formats:
        for ctx in contexts:
          s = _Search(p, w, phase=phase, over=over, mesh=mesh, fmt=fmt, variant=variant,
                      fixed=None if ctx is None else int(ctx), cache=run.cache, on_row=run.on_row)
          out.append(s.run())
  return out


def _template_plan(w: InferWorkload, over: str) -> InferPlan:
  """The workload planned at the searched dimension's smallest step (the batch every mesh's data
  axes divide, or one context quantum), so plan_infer's checks apply to every size searched."""
  if over == "batch":
    start_jax()
    meshes = resolve_meshes(w, get_target(w.target, slices=w.slices, mem_fraction=w.mem_fraction) if isinstance(w.target, str) else w.target)
    w = w.replace(batch=math.lcm(*[shd.data_parallel_size(m) for m in meshes]))
    if not w.context:  # the default context, fitted to the model (plan_infer's)
      w = w.replace(context=plan_infer(w).contexts)
    (first, *_) = _ints(w.context, "context")  # checked here, so a bad one is named as the context
    return plan_infer(w, prompt=first if w.phase == ("prefill",) else None)
  return plan_infer(w, context=(CONTEXT_QUANTUM,), prompt=CONTEXT_QUANTUM)


class _Search:
  """One configuration's search: its sizes, the argument limit, the probes and the result."""

  def __init__(self, p: InferPlan, w: InferWorkload, *, phase: str, over: str, mesh: shd.MeshSpec,
               fmt: quant.WeightFormat, variant: tuple[StepChoices, tuple[str, ...]], fixed: int | None,
               cache: RowCache | None, on_row: Callable[[InferRow], None] | None):
    self.p, self.w, self.phase, self.over, self.mesh, self.fmt, self.variant = p, w, phase, over, mesh, fmt, variant
    self.cache, self.on_row = cache or RowCache(enabled=False), on_row
    cfg = p.cfg
    if over == "batch":
      self.step, self.fixed, self.ceiling = shd.data_parallel_size(mesh), fixed, MAX_STEPS
      if cfg.position_limit is not None and fixed > cfg.position_limit:
        raise JaxmemError(f"{cfg.name} has {cfg.position_limit} learned positions; `context` must not exceed it (got {fixed})")
    else:
      self.step, self.fixed = math.lcm(CONTEXT_QUANTUM, shd.mesh_axes(mesh).ways("seq")), p.batch
      # Learned positions cap the context (GPT-2).
      self.ceiling = MAX_STEPS if cfg.position_limit is None else max(1, cfg.position_limit // self.step)
    self.compiles = 0
    self._arguments: dict[int, int] = {}

  def size(self, k: int) -> tuple[int, int]:
    """(batch, context) at size k."""
    return (k * self.step, self.fixed) if self.over == "batch" else (self.fixed, k * self.step)

  def argument_bytes(self, k: int) -> int:
    """The bytes one device holds of the step's arguments at size k, from shapes and shardings
    (the program is built, not traced or compiled)."""
    if k not in self._arguments:
      batch, context = self.size(k)
      program = build_infer_program(self.p.cfg, choices=self.variant[0], phase=self.phase, fmt=self.fmt, batch=batch,
                                    context=context, target=self.p.target, mesh=self.mesh, kv=self.p.kv)
      self._arguments[k] = shape_argument_bytes(program.args, self.p.target.num_devices)
    return self._arguments[k]

  def argument_limit(self) -> int | None:
    """The smallest k whose arguments alone exceed the capacity (None: not up to the ceiling):
    doubling, then bisection, over argument bytes (monotone in k)."""
    cap = self.p.target.capacity_bytes
    lo, hi = 0, 1
    while self.argument_bytes(hi) <= cap:
      if hi == self.ceiling:
        return None
      lo, hi = hi, min(2 * hi, self.ceiling)
    while hi - lo > 1:
      mid = (lo + hi) // 2
      lo, hi = (mid, hi) if self.argument_bytes(mid) <= cap else (lo, mid)
    return hi

  def probe(self, k: int) -> InferRow:
    """The step compiled at size k (or its row from the cache)."""
    batch, context = self.size(k)
    pk = dataclasses.replace(self.p, batch=batch, prompt=context, contexts=(context,))
    parts = None if self.p.target.name == "attached" else self._key(batch, context)
    d = self.cache.get(parts)
    if d is not None:
      row = InferRow(**{**d, "notes": tuple(d.get("notes") or ())})
    else:
      row = run_infer_config(pk, self.mesh, self.fmt, self.phase, context, variant=self.variant)
      self.cache.put(parts, row.as_dict())
    return row

  def _key(self, batch: int, context: int) -> str:
    """Everything that changes the compiled step, as infer's workload holds it (the model's
    config resolved), and the target's capacity (an environment variable can change it)."""
    moe = moe_fields(self.p.cfg, self.variant[0])  # the variant's choices (none for a dense model)
    w = self.w.replace(model=self.p.cfg, mesh=(shd.format_mesh(self.mesh),), weights=(self.fmt.name,),
                       batch=batch, context=(str(context),), prompt=context, attention=self.p.attentions[:1],
                       moe_impl=tuple(v for v in (moe["moe_impl"],) if v),
                       capacity_factor=tuple(v for v in (moe["capacity_factor"],) if v))
    return key({"command": "infer", "workload": w.as_dict(), "capacity_bytes": self.p.target.capacity_bytes})

  def run(self) -> ServingFit:
    limit = self.argument_limit()
    # Decode's temporaries are small beside its cache, so the largest size the arguments allow
    # is the likeliest answer; prefill's activations grow with the prompt far past its arguments,
    # and a compile at the top can take minutes: it starts from the smallest.
    slope = self._slope(limit)
    b = _Bracket(capacity=self.p.target.capacity_bytes, hi=limit or self.ceiling + 1, slope=slope,
                 base=self.argument_bytes(1) - slope, from_top=self.phase == "decode")
    while (k := b.next_probe()) is not None:
      row = self.probe(k)
      self.compiles += 1
      b.record(k, row)
      if self.on_row is not None:
        self.on_row(row)
    nxt = b.rows.get(b.hi)
    if nxt is None and limit is not None:  # excluded by its arguments: the refusal, not compiled
      nxt = self.probe(b.hi)
    return self._result(b, limit, nxt)

  def _slope(self, limit: int | None) -> float:
    """The arguments' bytes per step near the top of the range."""
    top = max(2, min(limit or self.ceiling, self.ceiling))
    return self.argument_bytes(top) - self.argument_bytes(top - 1)

  def _result(self, b: _Bracket, limit: int | None, nxt: InferRow | None) -> ServingFit:
    best = b.rows.get(b.lo)
    value = b.lo * self.step if b.lo else None
    note = None
    if not b.lo:
      what = "batch" if self.over == "batch" else "context"
      note = f"the smallest {what} ({self.step}) does not fit"
    elif b.hi > self.ceiling:
      note = f"search stopped at the ceiling ({value}); more may fit"
    if nxt is not None and compiled(nxt) and nxt.fits is None:
      note = "; ".join(filter(None, [note, "the compiler refused the next size up, not for lack of memory (see next.error)"]))
    return ServingFit(
        phase=self.phase, over=self.over, mesh=shd.format_mesh(self.mesh), weights=self.fmt.name,
        max_batch=value if self.over == "batch" else (self.fixed if value else None),
        max_context=value if self.over == "context" else (self.fixed if value else None),
        compiles=self.compiles, argument_limit=None if limit is None else limit * self.step,
        row=best, next=nxt, note=note,
    )

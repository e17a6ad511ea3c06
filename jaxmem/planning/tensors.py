"""Per-tensor remat search (``fit --remat search``): each named checkpoint of the layer saved,
offloaded to host memory or recomputed, the least recompute that fits, from few compiles.

MaxText's ``estimator.py`` picks one of remat / offload / device per named tensor with the
compile's out-of-memory as its only oracle, one compile per try. Here the memory of every
assignment is predicted before anything compiles, and the compiler is asked only to calibrate
the prediction and to confirm the answer:

1. What each name weighs: the residuals one layer saves with every name saved, from JAX's own
   listing (:mod:`jaxmem.buffers.residuals`: bytes of the global microbatch, unsharded), times
   the layers.
2. Two compiles, the end points: ``full`` (nothing named saved, each layer's input kept) and
   every name saved on the device. Their required bytes draw the line
   ``required(A) = required(full) + share · Σ_saved bytes − share · [input offloaded] bytes(input)``,
   where ``share``, the per-device share of a listed byte, is the compiled difference over the
   listed one (about 1/data-parallel ways; the row says what it came out as). Offloaded names
   leave the device (pinned host memory) and count as host bytes, twice as transfer (out in the
   forward pass, back in the backward).
3. Recompute: the FLOPs of one layer's forward and backward under the assignment, from the
   jaxpr of its VJP (:func:`jaxmem.buffers.residuals.layer_step_flops`), minus the same under
   ``none``, times the layers and microbatches: the whole step's recomputed FLOPs, counted from
   shapes, before XLA. Every kept set (saved or offloaded: the FLOPs do not care where) is
   estimated from each name's marginal cost (what recomputing it alone adds to the all-saved
   step); the most promising are then counted exactly.
4. The kept sets with the least recompute whose predicted memory fits (below the capacity less
   ``margin``; offloading the largest kept names first where the device cannot hold them all)
   are compiled in that order until one fits; each compile is checked against its prediction.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from jaxmem.axes import one_value_each
from jaxmem.buffers.residuals import _listing, layer_step_flops
from jaxmem.errors import JaxmemError
from jaxmem.inputs import Number, Whole
from jaxmem.models import CHECKPOINT_NAMES
from jaxmem.models.names import DECODER_LAYER_INPUT
from jaxmem.cache import RowCache
from jaxmem.options import RunOptions
from jaxmem.resolve import Plan, plan
from jaxmem.planning.sweep import Row, baseline_flops, run_rows
from jaxmem.program import sharding as shd
from jaxmem.program.pipelining import PipelineOptions
from jaxmem.program.remat import REMAT_POLICIES, RematPolicy, assignment_name, get_remat
from jaxmem.program.train import layer_attend, pick_attention
from jaxmem.workload import Workload

MARGIN = 0.03  # the share of the capacity a prediction leaves free (the prediction's error, measured under 1%)
MAX_COMPILES = 6  # the two end points and at most four confirmations
EXACT = 16  # kept sets whose recompute is counted exactly (the rest: from the marginals)
MAX_NAMES = 18  # 2^18 kept sets enumerated at most


@dataclasses.dataclass(frozen=True, kw_only=True)
class NameCost:
  """One checkpoint name of the layer: what saving it costs, what recomputing it costs."""

  name: str
  bytes: int  # all layers, the global microbatch, unsharded (JAX's listing)
  device_bytes: int  # per device, predicted: bytes x the compiled share
  recompute_flops: float  # whole step: what recomputing it alone adds to the all-saved step


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tried:
  """One compiled assignment: its prediction against the compile."""

  remat: str
  predicted_required_bytes: int
  required_bytes: int | None
  fits: bool | None
  prediction_error_pct: float | None  # (predicted - compiled) / compiled
  recompute_flops: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorSearchResult:
  """The least-recompute assignment that fits (``row`` its compile; None if none fit), what
  the search predicted and compiled, and what it cost."""

  mesh: str
  remat: str | None  # the chosen assignment's name (names:save=...:offload=...)
  assignment: tuple[tuple[str, str], ...]  # name -> save | offload | recompute
  row: Row | None
  predicted_required_bytes: int | None
  prediction_error_pct: float | None
  recompute_flops: float | None  # whole step, every device: FLOPs beyond the no-remat step (jaxpr counts)
  host_bytes: int | None  # per device: what the offloaded names keep in host memory
  host_transfer_bytes: int | None  # per device and step: 2 x host_bytes (to host and back)
  per_device_share: float | None  # the compiled bytes per listed byte (step 2)
  compiles: int
  offload: bool  # whether offloading was searched (the target has a host memory space)
  names: tuple[NameCost, ...]
  tried: tuple[Tried, ...]
  end_points: tuple[Row, ...]
  notes: tuple[str, ...] = ()

  def as_dict(self) -> dict[str, Any]:
    d = {} if self.row is None else self.row.as_dict()
    d.update(
        mesh=self.mesh, remat=self.remat, assignment=dict(self.assignment),
        predicted_required_bytes=self.predicted_required_bytes, prediction_error_pct=self.prediction_error_pct,
        recompute_flops=self.recompute_flops, host_bytes=self.host_bytes, host_transfer_bytes=self.host_transfer_bytes,
        per_device_share=self.per_device_share, compiles=self.compiles, offload_searched=self.offload,
        names=[dataclasses.asdict(n) for n in self.names], tried=[dataclasses.asdict(t) for t in self.tried],
        search_notes=list(self.notes),
    )
    return d


def check_searchable(p: Plan) -> None:
  """One configuration per search: the assignment is chosen for one mesh, optimizer, kernel."""
  if p.workload.step:
    given, whose = ("maxtext", "MaxText's") if p.workload.maxtext else ("step", "a user's")
    raise JaxmemError(f"remat search needs jaxmem's own models (`model`), not `{given}`: {whose} step names its own checkpoints")
  one_value_each(p.workload, "remat search", skip=("remat",))
  if p.target.capacity_bytes is None:
    raise JaxmemError(f"remat search needs a target with a memory capacity; {p.target.name} has none")
  if PipelineOptions.of(p.options()).schedule(p.meshes[0]):
    raise JaxmemError("remat search does not take a stage axis yet (the pipeline's iterations keep their own stash)")


def layer_names(p: Plan) -> tuple[dict[str, int], Callable[[RematPolicy], float]]:
  """The checkpoint names the model's layers save when all are saved, with their bytes over
  all layers (the global microbatch, unsharded), and the step FLOPs of an assignment's layers."""
  (cfg, choices), options = p.built(), p.options()
  micro = options["microbatches"]
  batch = max(1, p.batch // micro)
  attention = pick_attention(options["attention"], cfg, batch=batch, seq=p.seq, target=p.target, mesh=None,
                             options=options)
  every = get_remat(assignment_name([n for n in CHECKPOINT_NAMES if n != DECODER_LAYER_INPUT]))
  kinds = [(True, cfg.num_moe_layers), (False, cfg.num_dense_layers)] if cfg.is_moe else [(False, cfg.num_layers)]
  kinds = [(moe, n) for moe, n in kinds if n]
  sizes: dict[str, int] = {}
  for moe, count in kinds:
    for r in _listing(cfg, every, batch=batch, seq=p.seq, attend=layer_attend(attention, choices), moe=moe,
                      choices=choices):
      if r.name in CHECKPOINT_NAMES and not r.is_input:
        sizes[r.name] = sizes.get(r.name, 0) + r.bytes * count
  # The layer input, [B, T, D] per layer (the block's listing names it x_btd: its argument).
  sizes[DECODER_LAYER_INPUT] = sum(count for _, count in kinds) * batch * p.seq * cfg.d_model * cfg.compute_jnp_dtype.itemsize

  def flops(rp: RematPolicy) -> float:
    return micro * sum(
        count * layer_step_flops(cfg, rp, batch=batch, seq=p.seq, attention=attention, moe=moe, choices=choices)
        for moe, count in kinds
    )

  return sizes, flops


@dataclasses.dataclass(frozen=True)
class _Line:
  """The prediction: ``base`` (``full``'s required bytes, moved by a missed compile of saved
  names only) + the saved names' device bytes + each offloaded name's ``residue`` x its bytes
  (what an offloaded value still keeps on the device: 0 until a compile that offloaded that name
  says otherwise). Per name, because the compiler's residue is: on TPU, q/k/v offload cleanly
  while the MLP's wide values and `context` (whose name splash's own residuals carry too) keep
  about a quarter of their bytes on the device, so one figure for all mispredicts the next try."""

  base: int
  residues: tuple[tuple[str, float], ...] = ()  # (name, residue), for the names a miss taught

  def residue(self, name: str) -> float:
    return dict(self.residues).get(name, 0.0)

  @property
  def offload_residue(self) -> float:
    """The largest residue learned (0: none yet), for the search's note."""
    return max((r for _, r in self.residues), default=0.0)

  def missed(self, o: _Option, row: Row, costs: dict[str, NameCost]) -> _Line:
    """The line moved by a compile that did not fit: the miss laid on the bytes it offloaded
    (each of those names' residue grows by the miss over them), else on the base."""
    if row.required_bytes is None or row.required_bytes <= o.predicted:
      return self  # nothing to learn from: the search goes on to the next option
    miss = row.required_bytes - o.predicted
    moved = sum(costs[n].device_bytes * (1 - self.residue(n)) for n in o.offloads)
    if moved:
      learned = dict(self.residues)
      for n in o.offloads:
        learned[n] = min(1.0, self.residue(n) + (1 - self.residue(n)) * miss / moved)
      return dataclasses.replace(self, residues=tuple(sorted(learned.items())))
    return dataclasses.replace(self, base=self.base + miss)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Option:
  """An assignment before compiling: kept names (saved or offloaded), offloaded ones, its figures."""

  kept: frozenset[str]
  offloads: frozenset[str]
  recompute: float  # estimated, then exact
  predicted: int
  host: int

  @property
  def remat(self) -> str:
    return assignment_name(sorted(self.kept - self.offloads), sorted(self.offloads))


def _place(kept: frozenset[str], costs: dict[str, NameCost], line: _Line, limit: int, offload: bool) -> tuple[frozenset[str], int] | None:
  """The offloaded names that bring ``kept`` under ``limit`` with the fewest host bytes (greedy:
  the smallest single name that closes the gap, else the largest, again), and the prediction;
  None where nothing does. The layer input is kept by every assignment (the layer's argument)
  and can only be offloaded."""
  predicted = line.base + sum(costs[n].device_bytes for n in kept)
  freed = {n: round(costs[n].device_bytes * (1 - line.residue(n))) for n in kept | {DECODER_LAYER_INPUT}}
  off: set[str] = set()
  movable = sorted(freed if offload else (), key=lambda n: -freed[n])
  while predicted > limit:
    left = [n for n in movable if n not in off and freed[n] > 0]
    if not left:
      return None
    gap = predicted - limit
    closing = [n for n in left if freed[n] >= gap]
    n = closing[-1] if closing else left[0]
    off.add(n)
    predicted -= freed[n]
  return frozenset(off), predicted


def _options(
    costs: dict[str, NameCost], line: _Line, limit: int, offload: bool, floor: float, host_limit: float | None = None,
) -> list[_Option]:
  """Every kept set with its estimated recompute (``floor``, the all-saved step's, plus each
  dropped name's marginal) and placement, those that fit (on the device, and their offloaded
  bytes under ``host_limit`` where the host's memory is known), least recompute first."""
  names = sorted(n for n in costs if n != DECODER_LAYER_INPUT)
  out = []
  for bits in itertools.product((False, True), repeat=len(names)):
    kept = frozenset(n for n, b in zip(names, bits, strict=True) if b)
    placed = _place(kept, costs, line, limit, offload)
    if placed is None:
      continue
    off, predicted = placed
    recompute = floor + sum(costs[n].recompute_flops for n in names if n not in kept)
    host = sum(costs[n].device_bytes for n in off)
    if host_limit is not None and host > host_limit:
      continue
    out.append(_Option(kept=kept, offloads=off, recompute=recompute, predicted=predicted, host=host))
  return sorted(out, key=lambda o: (o.recompute, o.host, o.predicted, o.remat))  # the name: ties broken the same every run


def search(
    workload: Workload | None = None,
    /,
    *,
    run: RunOptions | None = None,
    margin: float = MARGIN,
    max_compiles: int = MAX_COMPILES,
    **fields: Any,
) -> TensorSearchResult:
  """The per-tensor assignment with the least recompute that fits ``workload`` (``fields``
  replaced; its ``remat`` is ignored): the module's four steps, at most ``max_compiles``
  compiles (the row cache answers repeats). ``run`` (or its fields as keywords,
  :class:`jaxmem.options.RunOptions`): ``on_start`` is told before the first compile (no total:
  the count is known at the end), ``on_row`` each compiled (or cached) row."""
  margin = Number(least=0.0, below=1.0)(margin, "`margin`")
  max_compiles = Whole()(max_compiles, "`max_compiles`")
  run = RunOptions.of(run, fields)
  p = plan(Workload.of(workload, **fields).replace(remat=("full",)))
  check_searchable(p)
  run.start(None, p.cfg)
  return search_plan(p, jobs=run.jobs, scheduler=run.scheduler, cache=run.cache, on_row=run.on_row, margin=margin,
                     max_compiles=max_compiles)


def search_plan(
    p: Plan, *, jobs: int = 1, scheduler: str | None = None, cache: RowCache | None = None,
    on_row: Callable[[Row], None] | None = None, margin: float = MARGIN, max_compiles: int = MAX_COMPILES,
) -> TensorSearchResult:
  """:func:`search` of a plan already made (one configuration, checked by :func:`check_searchable`)."""
  check_searchable(p)
  offload = bool(p.target.has_host_memory)
  sizes, flops = layer_names(p)
  if len(sizes) > MAX_NAMES:
    raise JaxmemError(f"remat search: {p.cfg.name}'s layers tag {len(sizes)} names, more than the {MAX_NAMES} it enumerates")

  def compile_(names: list[str]) -> list[Row]:
    q = dataclasses.replace(p, remats=tuple(get_remat(n) for n in names))
    return run_rows(q, q.tasks(), jobs=jobs, scheduler=scheduler, cache=cache, on_row=on_row)

  every = assignment_name(n for n in sizes if n != DECODER_LAYER_INPUT)
  full_row, all_row = compile_(["full", every])
  notes = [] if offload else [f"{p.target.name} has no host memory space: searched save and recompute only, nothing offloaded"]
  share = _share(full_row, all_row, sizes, p, notes)
  if full_row.required_bytes is None:
    raise JaxmemError(f"remat search: the `full` end point gave no required bytes ({full_row.error or 'no figure'})")
  none_flops = flops(REMAT_POLICIES["none"])
  all_flops = flops(get_remat(every))
  costs = {n: NameCost(name=n, bytes=b, device_bytes=round(b * share), recompute_flops=0.0) for n, b in sizes.items()}
  for n in sizes:
    if n != DECODER_LAYER_INPUT:  # its save or recompute changes nothing (the layer's argument, kept)
      drop = assignment_name(m for m in sizes if m not in (n, DECODER_LAYER_INPUT))
      costs[n] = dataclasses.replace(costs[n], recompute_flops=max(0.0, flops(get_remat(drop)) - all_flops))
  limit = int(p.target.capacity_bytes * (1 - margin))
  # The host's share of RAM per device (jaxmem.hardware.hostmem), where published: an assignment
  # whose offloaded bytes exceed it cannot run either. `host_scale` is what a compile said of the
  # host bytes against their listing (the compiler's host temporaries carry more than the names).
  host_cap = p.target.host_capacity_bytes if offload else None
  host_scale = 1.0
  rows = {full_row.remat: full_row, all_row.remat: all_row}
  line = _Line(base=full_row.required_bytes)
  exact: dict[frozenset[str], float] = {}  # kept set -> its recompute, counted

  def counted(o: _Option) -> _Option:
    if o.kept not in exact:
      exact[o.kept] = flops(get_remat(assignment_name(o.kept))) - none_flops
    return dataclasses.replace(o, recompute=exact[o.kept])

  tried, chosen, compiles = [], None, len(rows)
  while compiles < max_compiles:
    host_limit = None if host_cap is None else host_cap * (1 - margin) / host_scale
    options = _options(costs, line, limit, offload, all_flops - none_flops, host_limit)
    best = sorted(map(counted, options[:EXACT]), key=lambda o: (round(o.recompute), o.host, o.predicted, o.remat))
    # Nothing kept is `full` under another name; an end point that fits is an answer already compiled.
    known = lambda o: rows.get("full" if o.remat == assignment_name(()) else o.remat)  # noqa: E731
    o = next((o for o in best if known(o) is None or _runs(known(o))), None)
    if o is None:
      break
    row = known(o)
    if row is None:
      row, compiles = compile_([o.remat])[0], compiles + 1
    rows[o.remat] = row
    tried.append(_tried(o, row))
    if _runs(row):
      chosen = (o, row)
      break
    if row.fits and o.host:  # fits the device, not the host: the host bytes were under-listed
      host_scale = max(host_scale, (row.host_total_bytes or 0) / o.host)
      continue
    line = line.missed(o, row, costs)
  else:
    notes.append(f"stopped at {max_compiles} compiles")
  if line.residues:
    kept = ", ".join(f"{n} {r:.2f}" for n, r in line.residues)
    notes.append(f"bytes an offloaded byte kept on the device in the compiles that missed, per name: {kept} "
                 "(the later predictions count them)")
  return _result(p, chosen, costs, share, offload, tried, (full_row, all_row), compiles, notes, none_flops)


def _runs(row: Row) -> bool:
  """Fits the device, and the host where its memory is known (``host_fits`` None: unknown or nothing offloaded)."""
  return bool(row.fits) and row.host_fits is not False


def _share(full_row: Row, all_row: Row, sizes: dict[str, int], p: Plan, notes: list[str]) -> float:
  """The compiled bytes per listed byte: the end points' difference over what the listing says
  the names weigh; 1 / data-parallel ways (each device saves its share of the batch) where the
  compiles give no difference to read."""
  listed = sum(b for n, b in sizes.items() if n != DECODER_LAYER_INPUT)
  nominal = 1.0 / shd.data_parallel_size(p.meshes[0])
  if full_row.required_bytes is None or all_row.required_bytes is None or listed <= 0:
    notes.append(f"per_device_share: 1/{round(1 / nominal)} (the batch's share), the all-saved end point gave no required bytes")
    return nominal
  share = (all_row.required_bytes - full_row.required_bytes) / listed
  if share <= 0:
    notes.append(f"per_device_share: 1/{round(1 / nominal)} (the batch's share): saving every name compiled no larger than full")
    return nominal
  return share


def _tried(o: _Option, row: Row) -> Tried:
  err = None
  if row.required_bytes:
    err = round(100.0 * (o.predicted - row.required_bytes) / row.required_bytes, 2)
  return Tried(remat=o.remat, predicted_required_bytes=o.predicted, required_bytes=row.required_bytes, fits=row.fits,
               prediction_error_pct=err, recompute_flops=o.recompute)


def _result(
    p: Plan, chosen: tuple[_Option, Row] | None, costs: dict[str, NameCost], share: float, offload: bool,
    tried: list[Tried], end_points: tuple[Row, Row], compiles: int, notes: list[str], none_flops: float,
) -> TensorSearchResult:
  mesh = shd.format_mesh(p.meshes[0])
  common = dict(mesh=mesh, per_device_share=share, compiles=compiles, offload=offload,
                names=tuple(sorted(costs.values(), key=lambda c: -c.bytes)), tried=tuple(tried),
                end_points=tuple(_with_overhead(p, r) for r in end_points))
  if chosen is None:
    notes.append("no assignment fits: even the least memory predicted or compiled is over the capacity")
    return TensorSearchResult(remat=None, assignment=(), row=None, predicted_required_bytes=None,
                              prediction_error_pct=None, recompute_flops=None, host_bytes=None,
                              host_transfer_bytes=None, notes=tuple(notes), **common)
  o, row = chosen
  assignment = tuple((n, "offload" if n in o.offloads else "save" if n in o.kept or n == DECODER_LAYER_INPUT else "recompute")
                     for n in sorted(costs))
  notes.append(
      "recompute_flops: the whole step's FLOPs beyond the no-remat step, counted from the jaxpr of one layer's VJP "
      "times the layers (before XLA); host_transfer_bytes: the offloaded bytes to host memory and back, per device"
  )
  return TensorSearchResult(
      remat=o.remat, assignment=assignment, row=_with_overhead(p, row), predicted_required_bytes=o.predicted,
      prediction_error_pct=tried[-1].prediction_error_pct, recompute_flops=o.recompute, host_bytes=o.host,
      host_transfer_bytes=2 * o.host, notes=tuple(notes), **common,
  )


def _with_overhead(p: Plan, row: Row) -> Row:
  """``row`` with its recompute overhead against the no-remat program (traced, not compiled)."""
  if row.flops is None:
    return row
  base = baseline_flops(p, row, p.tasks()[0])
  pct = None if not base else 100.0 * (row.flops - base) / base
  return dataclasses.replace(row, recompute_overhead_pct=pct)

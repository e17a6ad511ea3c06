"""``plan``: the fastest configuration that fits, from few compiles.

The search a performance engineer does by hand, in four steps:

1. Candidates: every factorization of the device count over the mesh axes the model can use
   (:data:`SEARCH_AXES`, those the sharding rules know; a ``stage`` axis of S stages at
   :data:`PIPELINE_FACTORS` x S pipeline microbatches), the remat ladder from ``none`` to
   ``full`` (:data:`REMAT_LADDER`, policies of :data:`jaxmem.program.remat.REMAT_POLICIES`),
   microbatch counts that divide the batch (powers of two up to :data:`MAX_MICROBATCHES`), the
   target's attention kernels (``auto`` and ``dot``, each once as the target resolves it) and,
   for a mixture-of-experts model whose experts run dropless, the target's MoE kernels (the
   ``moe_kernel`` names, each once as the target resolves it: ``auto`` (megablox's ``gmm`` on
   TPU) and ``ragged_dot``; :func:`_moe_kernels`). The experts' placement: the ``expert`` mesh
   axis, searched with the others for a model with experts, and on a mesh with an fsdp axis the
   experts' weights split on their expert dimension over it or not (``fsdp_shard_on_exp``, where
   the axes divide the experts; :func:`_moe_choices`).
2. Dropped before anything compiles: meshes the workload cannot take (the batch not divisible by
   the data axes times the microbatches, heads not divisible by ``tensor``, experts not by
   ``expert``: each with its reason counted), and every candidate whose arguments alone
   (parameters, optimizer state, tokens: exact from their shapes and shardings,
   :func:`jaxmem.compiler.figures.shape_argument_bytes`) exceed the device's capacity.
3. Ordered by a closed-form estimate (:func:`analytic`): those estimated to fit first, each
   group fastest first; compiled in that order (through the sweep's row path, the row cache,
   ``jobs``) until ``budget`` compiles. A candidate that needs at least as much memory as one
   compiled and found not to fit (same mesh and kernel, no fewer saved residuals, no more
   microbatches) is skipped. After each compile the rest are reordered with each rung's memory
   estimate scaled by what the compiler gave for that rung (:func:`calibration`), so a rung the
   closed form underestimates stops taking the budget with candidates that will not fit.
4. Ranked by the compiled row's ``step_time_s`` (its compiled schedule simulated,
   :mod:`jaxmem.steptime`): fitting candidates first (those at risk at the edge after
   those that are not), fastest first; the first is the recommendation, and :func:`why` says in
   one line what makes it faster than the runner-up (rows tie only where their simulated times
   are equal, and then keep the order they were compiled in), naming the MoE term that decides
   where one does (:func:`moe_decides`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

from jaxmem.compiler.figures import shape_argument_bytes
from jaxmem.hardware.margin import AT_RISK
from jaxmem.hardware.targets import target_peaks
from jaxmem.compiler.report import fits as fits_in
from jaxmem.errors import (
    BatchDoesNotDivide, DimensionDoesNotDivide, DoesNotDivide, ExpertsDoNotDivide, HeadsDoNotDivide, JaxmemError,
    SeqDoesNotDivide, StagesRefused,
)
from jaxmem.planning.estimate import activation_bytes_per_layer
from jaxmem.models import StepChoices, count_params
from jaxmem.models.model_flops import training_flops
from jaxmem.cache import RowCache
from jaxmem.options import RunOptions
from jaxmem.axes import Setting, check_setting, configured, one_each
from jaxmem.resolve import (
    Plan, Task, default_seq, one_of_each, outer_values, plan as plan_sweep, resolve_model, resolve_target,
)
from jaxmem.planning.sweep import Row, baseline_flops, run_rows
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS
from jaxmem.program.pipelining import PipelineOptions
from jaxmem.program.remat import REMAT_POLICIES
from jaxmem.program.train import build_train_program, check_batch, moe_choice, moe_kernel, pick_attention
from jaxmem.registry import published
from jaxmem.workload import DEFAULT_BATCH, Workload

# The mesh axes a plan factorizes the devices over, in the order a mesh names them; one the
# sharding rules of this version do not know (not in shd.MESH_AXES) is skipped. A mesh with a
# `stage` axis is tried at PIPELINE_FACTORS x its stages pipeline microbatches (GPipe's bubble,
# (S-1)/(M+S-1), shrinks as M grows; the closed form below charges it). `sequence` (activations
# only) is dominated by `context`.
SEARCH_AXES = ("data", "stage", "fsdp", "tensor", "expert", "context")
PIPELINE_FACTORS = (1, 2, 4)
MODEL_AXES = {"expert": "is_moe"}  # an axis only some models use: the config flag that says so
ATTENTIONS = ("auto", "dot")
MAX_MICROBATCHES = 8
DEFAULT_BUDGET = 12
ORDER_NOTE = "order of compiles: a closed-form estimate (Korthikanti et al. 2022 activations, 6NT + attention FLOPs)"


@dataclasses.dataclass(frozen=True)
class Rung:
  """One remat policy of the ladder and what the closed-form estimate assumes of it: ``keep``,
  the share of the no-remat activations it saves (Korthikanti et al. 2022, table 2: ``none``
  keeps all, ``full`` only each layer's input); ``recompute``, the share of the forward pass it
  runs again. Rough figures: they only order the compiles; the ranking is the compiler's."""

  name: str
  keep: float
  recompute: float


# From most saved to least (none to full). minimal saves every projection and recomputes the
# attention core and activations; save_dot_except_mlp recomputes the MLP (about two thirds of
# a Llama layer's matmul FLOPs); save_qkv_proj recomputes all but the q/k/v projections.
REMAT_LADDER = (
    Rung("none", 1.0, 0.0),
    Rung("minimal", 0.6, 0.1),
    Rung("save_dot_except_mlp", 0.3, 0.65),
    Rung("save_qkv_proj", 0.15, 0.85),
    Rung("full", 0.0, 1.0),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
  """One configuration of the search and its closed-form estimate (before compiling)."""

  mesh: str
  remat: str
  microbatches: int
  attention: str  # the implementation the target resolves it to
  level: int  # the rung's index on the ladder: higher saves less
  argument_bytes: int  # per device, exact from shapes and shardings
  estimated_required_bytes: int
  estimated_step_time_s: float | None
  pipeline_microbatches: int | None = None  # on a mesh with a stage axis; None without
  moe_kernel: str | None = None  # the experts' grouped matmul asked (dropless MoE); None: no experts to choose for
  fsdp_shard_on_exp: bool | None = None  # the experts' weights split on E over fsdp; None: not a choice here

  def same_program_family(self, other: Candidate) -> bool:
    return (self.mesh, self.attention, self.pipeline_microbatches, self.moe_kernel, self.fsdp_shard_on_exp) == (
        other.mesh, other.attention, other.pipeline_microbatches, other.moe_kernel, other.fsdp_shard_on_exp)

  @property
  def key(self) -> str:
    """Its configuration in a few words (:func:`candidate_key`, with its MoE choices)."""
    moe = [f"moe {self.moe_kernel}"] if self.moe_kernel else []
    moe += ["experts on fsdp"] if self.fsdp_shard_on_exp else []
    return " ".join([candidate_key(self.mesh, self.remat, self.microbatches, self.attention,
                                   self.pipeline_microbatches), *moe])


@dataclasses.dataclass(frozen=True)
class MoeChoice:
  """How a candidate runs a mixture of experts: the ``moe_kernel`` name asked and the kernel the
  target resolves it to, and whether the experts' weights are split on their expert dimension
  over fsdp (``fsdp_shard_on_exp``); ``None`` each where there is nothing to choose."""

  kernel: str | None = None
  resolved: str | None = None
  on_fsdp: bool | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanResult:
  """The search's answer: compiled candidates ranked (``rows``, the recommendation first where
  one fits), what it cost (``compiles``: candidates compiled or answered by the row cache,
  ``cache_hits`` of them) and what was left out before compiling (``pruned``: reason -> count)."""

  model: str
  target: str
  batch: int
  seq: int
  budget: int
  candidates: int  # generated, before pruning
  compiles: int
  cache_hits: int
  pruned: tuple[tuple[str, int], ...]
  not_compiled: int  # valid candidates left for lack of budget
  rows: tuple[Row, ...]
  estimates: tuple[tuple[str, float | None], ...] = ()  # row label -> closed-form step time (ordering)
  notes: tuple[str, ...] = ()
  why: str | None = None  # the recommendation against the runner-up, in one line (:func:`why`)
  maxtext: tuple[str, ...] | None = None  # MaxText's config and overrides, for a search of MaxText's step

  @property
  def recommended(self) -> Row | None:
    return self.rows[0] if self.rows and self.rows[0].fits else None

  def as_dict(self) -> dict[str, Any]:
    return dict(
        model=self.model, target=self.target, batch=self.batch, seq=self.seq, budget=self.budget,
        candidates=self.candidates, compiles=self.compiles, cache_hits=self.cache_hits, pruned=dict(self.pruned),
        not_compiled=self.not_compiled, notes=list(self.notes), why=self.why,
        recommended=None if self.recommended is None else self.recommended.as_dict(),
        estimated_step_time_s=dict(self.estimates), rows=[r.as_dict() for r in self.rows],
    ) | ({} if self.maxtext is None else {"maxtext_args": list(self.maxtext)})


def candidate_key(mesh: str, remat: str, microbatches: int, attention: str, pipeline: int | None = None) -> str:
  return f"{mesh} {remat} mb{microbatches} {attention}" + ("" if pipeline is None else f" pmb{pipeline}")


def factorizations(n: int, axes: tuple[str, ...]) -> list[shd.MeshSpec]:
  """Every mesh of ``n`` devices over ``axes`` (axes of size 1 left out), each once."""
  out: list[shd.MeshSpec] = []

  def go(i: int, left: int, acc: tuple) -> None:
    if i == len(axes):
      if left == 1:
        out.append(acc or ((axes[0], 1),))
      return
    for s in (d for d in range(1, left + 1) if left % d == 0):
      go(i + 1, left // s, acc + (((axes[i], s),) if s > 1 else ()))

  go(0, n, ())
  return out


def search_axes(cfg: Any) -> tuple[str, ...]:
  """The axes this model can use that this version's sharding rules know."""
  return tuple(a for a in SEARCH_AXES if a in shd.MESH_AXES and getattr(cfg, MODEL_AXES.get(a, "name"), True))


# The reason a candidate's mesh is counted under, by the kind of refusal (jaxmem.errors).
REASONS: dict[type[DoesNotDivide], str] = {
    HeadsDoNotDivide: "tensor does not divide the heads",
    BatchDoesNotDivide: "batch not divisible by the data axes x microbatches",
    ExpertsDoNotDivide: "expert does not divide the experts",
    StagesRefused: "the stage axis cannot pipeline this model's layers",
    SeqDoesNotDivide: "sequence not divisible by its mesh axes",
    DimensionDoesNotDivide: "a parameter's dimension not divisible by its mesh axes",
}


def mesh_reason(
    mesh: shd.MeshSpec, cfg: Any, batch: int, seq: int, microbatches: int, pipeline: int | None = None,
    values: dict[str, Any] | None = None, choices: StepChoices = StepChoices(),
) -> str | None:
  """Why the workload cannot run on ``mesh`` (a short reason, counted), or None. ``values``: the
  workload's one value of every axis (:func:`jaxmem.axes.one_each`), whose declared checks the
  mesh must pass too; ``choices``: how the step runs the model (its experts)."""
  t = dict(mesh).get("tensor", 1)
  if cfg.num_heads % t or cfg.num_kv_heads % t:
    return REASONS[HeadsDoNotDivide]
  stages = dict(mesh).get("stage", 1)
  # Counted by the kind of refusal (jaxmem.errors; a stage axis's by its own reason, as an axis's
  # check gives it); any other error is bad input on every mesh alike (a batch below 1, a sequence
  # past the model's positions) and is raised as it is.
  try:
    check_setting(Setting(values={**(values or {}), "mesh": shd.format_mesh(mesh)}, cfg=cfg))
    check_batch(batch, seq, mesh, cfg, microbatches=microbatches, pipeline=PipelineOptions(microbatches=pipeline),
                choices=choices)
  except DoesNotDivide as e:
    pipelined = stages > 1 and isinstance(e, BatchDoesNotDivide)
    why = e.reason if isinstance(e, StagesRefused) else REASONS[type(e)]
    return why + (" x pipeline microbatches" if pipelined else "")
  return None


def analytic(
    cfg: Any, *, mesh: shd.MeshSpec, rung: Rung, microbatches: int, batch: int, seq: int, argument_bytes: int,
    param_count: int, target: Any, fused: bool, pipeline_microbatches: int | None = None, moe_kernel: str | None = None,
) -> tuple[int, float | None]:
  """The closed-form (required bytes, step seconds) a candidate is ordered by.

  Memory: the arguments (exact) + one gradient copy + the layers' activations (Korthikanti et
  al. 2022, table 2, eq. 3, scaled by the rung's ``keep``; a fused kernel keeps no s^2 scores).
  Time: the larger of compute, 6·N·T + attention FLOPs (:func:`training_flops`) with the rung's
  recomputed forward (a third of them) over the peak, and communication over the link: FSDP
  gathers the 16-bit parameters twice per microbatch and reduce-scatters the gradients once,
  data all-reduces the gradients (2(d-1)/d), tensor all-reduces a layer's activations four
  times (Megatron-LM, Shoeybi et al. 2019, sec. 3), context gathers a layer's keys and values
  forward and backward, expert exchanges the tokens four times. A ``stage`` axis of S stages
  holds L/S layers per device, all of a microbatch's activations in flight (GPipe, Huang et
  al. 2019), runs (M + S - 1) / M of the work for M pipeline microbatches (the bubble) and
  passes each microbatch's stage output on, forward and backward. ``moe_kernel`` ``ragged_dot``
  (as resolved), which XLA's TPU and GPU compilers expand into a dense matmul over every expert a
  device holds (:mod:`jaxmem.models.moe_kernels`): each routed row times all ``E / expert`` local
  experts, so the routed experts' FLOPs (6 x tokens x k x the MoE layers x 3·D·F_e) times
  ``E / expert - 1`` more."""
  m = dict(mesh)
  n = shd.mesh_size(mesh)
  d, f, t, e, st = (m.get(a, 1) for a in ("data", "fsdp", "tensor", "expert", "stage"))
  micro = batch / shd.data_parallel_size(mesh) / microbatches
  per_layer = activation_bytes_per_layer(cfg, batch=1, seq=seq, tensor=t, recompute="selective" if fused else "none")
  floor = activation_bytes_per_layer(cfg, batch=1, seq=seq, tensor=t, recompute="full")
  acts = cfg.num_layers / st * micro * (floor + rung.keep * (per_layer - floor))
  grads = 2 * param_count / (f * t * st * (e if cfg.is_moe else 1))
  required = int(argument_bytes + grads + acts)
  peaks, _ = target_peaks(target)
  if peaks is None:
    return required, None
  bubble = 1.0 if st == 1 else (pipeline_microbatches + st - 1) / pipeline_microbatches
  flops = training_flops(cfg, batch=batch, seq=seq)
  if cfg.is_moe and moe_kernel == "ragged_dot" and target.platform in ("tpu", "gpu"):
    routed = 6 * batch * seq * cfg.experts_per_token * cfg.num_moe_layers * 3 * cfg.d_model * cfg.expert_d_ff
    flops += routed * (cfg.num_experts / e - 1)
  compute = flops / n * (1 + rung.recompute / 3) * bubble / peaks.peak_flops
  p16 = 2 * param_count / t / st
  comm = p16 * (2 * microbatches + 1) * (f - 1) / f + (2 * p16 / f * (d - 1) / d)
  tokens = batch * seq / shd.data_parallel_size(mesh)
  comm += 4 * cfg.num_layers / st * 2 * tokens * cfg.d_model * 2 * (t - 1) / t
  if st > 1:  # each iteration's stage output, one microbatch of [B, T, D] in bf16, both passes
    comm += 2 * bubble * tokens * cfg.d_model * 2 / t
  c = m.get("context", 1)
  if c > 1:  # each layer gathers the other shards' keys and values, forward and backward
    comm += 2 * cfg.num_layers / st * 2 * tokens * cfg.num_kv_heads * cfg.head_dim * 2 * (c - 1) / c
  if cfg.is_moe and e > 1:
    comm += 4 * cfg.num_layers / st * tokens * cfg.d_model * 2 * (e - 1) / e
  link = 0.0 if peaks.link_bandwidth is None else comm / peaks.link_bandwidth
  return required, max(compute, link)


def candidates(p: Plan, pruned: Counter) -> list[Candidate]:
  """Every valid candidate of ``p``'s model, target and workload, with its estimate; what was
  dropped counted in ``pruned`` by reason. Arguments are sized once per mesh, schedule and
  kernel (remat and microbatches do not change them)."""
  rungs = [r for r in REMAT_LADDER if r.name in REMAT_POLICIES]
  micro = [m for m in (2**i for i in range(MAX_MICROBATCHES.bit_length())) if m <= MAX_MICROBATCHES]
  moe, refused = _moe_kernels(p)
  per_kernel = len(rungs) * len(micro)
  out: list[Candidate] = []
  for mesh in factorizations(p.target.num_devices, search_axes(p.cfg)):
    stages = dict(mesh).get("stage", 1)
    for pm in [None] if stages == 1 else [k * stages for k in PIPELINE_FACTORS]:
      why = mesh_reason(mesh, p.cfg, p.batch, p.seq, 1, pm, p.options(), p.built()[1])
      if why is not None:  # more microbatches only make it worse
        pruned[why] += len(ATTENTIONS) * per_kernel * (len(moe) + refused)
        continue
      for kernel in _kernels(p, mesh, pruned, per_kernel * (len(moe) + refused)):
        if refused:
          pruned[MOE_KERNEL_REFUSED] += per_kernel * refused
        try:
          out += _schedule_candidates(p, mesh, kernel, pm, rungs, micro, pruned, _moe_choices(p, mesh, moe, pruned,
                                                                                               per_kernel))
        except DimensionDoesNotDivide:  # the mesh cannot shard the model's parameters (its vocabulary)
          pruned[REASONS[DimensionDoesNotDivide]] += per_kernel * len(moe)
  return out


EXPERTS_ON_FSDP_REFUSED = "fsdp_shard_on_exp: the axes that would split the experts do not divide them"


def _moe_choices(
    p: Plan, mesh: shd.MeshSpec, kernels: dict[str | None, str | None], pruned: Counter, per_choice: int,
) -> list[MoeChoice]:
  """Each MoE kernel (:func:`_moe_kernels`) with each placement of the experts' weights this mesh
  offers: on a mesh with an fsdp axis, split on d_model (the default) and on the expert dimension
  (``fsdp_shard_on_exp``, where the expert, fsdp and context axes divide the experts; else counted
  in ``pruned``, ``per_choice`` a kernel)."""
  placements: list[bool | None] = [None]
  if p.cfg.is_moe and dict(mesh).get("fsdp", 1) > 1:
    placements = [False]
    try:
      shd.check_experts(mesh, p.cfg.num_experts, p.cfg.name, on_fsdp=True)
      placements.append(True)
    except ExpertsDoNotDivide:
      pruned[EXPERTS_ON_FSDP_REFUSED] += per_choice * len(kernels)
  return [MoeChoice(kernel, resolved, on) for kernel, resolved in kernels.items() for on in placements]


MOE_KERNEL_REFUSED = "MoE kernel not available on this target"


def _moe_kernels(p: Plan) -> tuple[dict[str | None, str | None], int]:
  """The ``moe_kernel`` names a plan searches (name asked -> the kernel the target resolves it
  to), each implementation once, as :func:`_kernels` takes attention's (``auto`` where it
  resolves to ``gmm`` is ``auto``): on TPU ``auto`` (megablox's gmm) and ``ragged_dot``, elsewhere
  ``auto`` (ragged_dot); and how many names the target refuses (gmm off TPU). ``{None: None}``
  where there is no kernel to choose: a dense model, experts that run capacity (the default on
  GPU targets)."""
  cfg, choices = p.built()
  if moe_kernel(cfg, choices, p.target, {}) is None:
    return {None: None}, 0
  kept: dict[str, str] = {}  # resolved -> the first name asked for it
  refused = 0
  for name in published("MoE kernel"):
    try:
      kept.setdefault(moe_kernel(cfg, choices, p.target, {"moe_kernel": name}), name)
    except JaxmemError:
      refused += 1
  return {asked: resolved for resolved, asked in kept.items()}, refused


def _schedule_candidates(
    p: Plan, mesh: shd.MeshSpec, kernel: str, pm: int | None, rungs: list[Rung], micro: list[int], pruned: Counter,
    moe: list[MoeChoice],
) -> list[Candidate]:
  """One mesh, kernel and pipeline schedule's candidates over the microbatches, the ladder and the
  MoE choices ``moe`` (:func:`_moe_choices`; their arguments are the same bytes: one set of
  weights, however split)."""
  cfg, tgt, n = p.cfg, p.target, p.target.num_devices
  program = build_train_program(
      cfg, choices=p.choices, remat=REMAT_POLICIES["none"], optimizer=p.optimizers[0], batch=p.batch, seq=p.seq,
      target=tgt, mesh=mesh,
      options={**p.options(), "attention": kernel, "pipeline_microbatches": pm, "pipeline_repeats": None},
  )
  args = shape_argument_bytes(program.args, n)
  fused = program.attention.name != "dot"
  out: list[Candidate] = []
  for mb, rung, choice in itertools.product(micro, rungs, moe):
    why = mesh_reason(mesh, cfg, p.batch, p.seq, mb, pm, p.options(), p.built()[1])
    if why is None and tgt.capacity_bytes is not None and not fits_in(args, tgt.capacity_bytes):
      why = "arguments alone over capacity (not compiled)"
    if why is not None:
      pruned[why] += 1
      continue
    req, secs = analytic(cfg, mesh=mesh, rung=rung, microbatches=mb, batch=p.batch, seq=p.seq, argument_bytes=args,
                         param_count=count_params(cfg), target=tgt, fused=fused, pipeline_microbatches=pm,
                         moe_kernel=choice.resolved)
    out.append(Candidate(
        mesh=shd.format_mesh(mesh), remat=rung.name, microbatches=mb, attention=kernel, level=rungs.index(rung),
        argument_bytes=args, estimated_required_bytes=req, estimated_step_time_s=secs, pipeline_microbatches=pm,
        moe_kernel=choice.kernel, fsdp_shard_on_exp=choice.on_fsdp,
    ))
  return out


def _kernels(p: Plan, mesh: shd.MeshSpec, pruned: Counter, per_kernel: int) -> list[str]:
  """The attention names this mesh can take, each implementation once (``auto`` where it
  resolves to ``dot`` is ``dot``); a mesh with invalid batch or heads still yields one name, so
  its candidates are counted with their own reason."""
  names: dict[str, str] = {}
  for name in ATTENTIONS:
    try:
      choice = pick_attention(name, p.cfg, batch=p.batch, seq=p.seq, target=p.target, mesh=dict(mesh),
                              options=p.options())
    except JaxmemError:
      pruned["attention kernel not available on this target or mesh"] += per_kernel
      continue
    names.setdefault(choice.name, choice.name if name == "dot" else name)
  return list(names.values())


def order(cands: list[Candidate], capacity: int | None, scales: dict[str, float] | None = None) -> list[Candidate]:
  """Estimated to fit first, then fastest (closed form); ties: less memory first. ``scales``
  (rung name -> factor, from :func:`calibration`) corrects a rung's activation estimate by what
  the compiler said of that rung so far."""

  def key(c: Candidate) -> tuple:
    req = calibrated_required(c, scales or {})
    over = capacity is not None and req > capacity
    secs = c.estimated_step_time_s if c.estimated_step_time_s is not None else float("inf")
    return (over, secs, req)

  return sorted(cands, key=key)


def calibrated_required(c: Candidate, scales: dict[str, float]) -> int:
  """``c``'s closed-form required bytes with the part beyond its (exact) arguments scaled by its
  rung's factor: the closed form's activation figure is rough (Korthikanti's tensors, not XLA's
  buffers), while its error on one rung is much the same across meshes and microbatches."""
  scale = scales.get(c.remat)
  if scale is None:
    return c.estimated_required_bytes
  return int(c.argument_bytes + scale * max(0, c.estimated_required_bytes - c.argument_bytes))


def calibration(compiled: list[tuple[Candidate, Row]]) -> dict[str, float]:
  """Per rung, the largest ratio of the compiler's bytes beyond the arguments to the closed
  form's (the most pessimistic seen: it pushes back candidates that would not fit, it prunes
  nothing). A secant on the compiler's own figures, as fit's boundary search uses them."""
  scales: dict[str, float] = {}
  for c, r in compiled:
    est = c.estimated_required_bytes - c.argument_bytes
    if r.required_bytes is None or est <= 0:
      continue
    ratio = (r.required_bytes - c.argument_bytes) / est
    scales[c.remat] = max(ratio, scales.get(c.remat, ratio))
  return scales


def dominated(c: Candidate, failed: list[Candidate]) -> bool:
  """``c`` needs at least the memory of a compiled candidate that did not fit: same mesh and
  kernel, no more recomputed (a lower rung saves every residual a higher one does) and no more
  microbatches (a larger microbatch holds more activations)."""
  return any(c.same_program_family(f) and c.level <= f.level and c.microbatches <= f.microbatches for f in failed)


def rank_rows(rows: list[Row]) -> list[Row]:
  """Fitting first (at risk after those that are not), fastest estimated step first; then the
  rest by required memory."""

  def key(r: Row) -> tuple:
    group = (0 if r.verdict != AT_RISK else 1) if r.fits else 2
    secs = r.step_time_s if r.step_time_s is not None else float("inf")
    return (group, secs if r.fits else (r.required_bytes or float("inf")))

  return sorted(rows, key=key)


def plan(w: Workload, *, budget: int, run: RunOptions) -> PlanResult:
  """The fastest configuration of ``w`` (jaxmem's own model) that fits, from at most ``budget``
  compiles (the module docstring says how). :func:`jaxmem.planning.planner.plan` checks ``budget``
  and ``run`` and chooses between this search and MaxText's."""
  for name, v in (("batch", w.batch), ("seq", w.seq)):
    if v is not None and (not isinstance(v, int) or v < 1):
      raise JaxmemError(f"`{name}` must be a whole number of at least 1 (got {v!r})")
  if w.step:
    raise JaxmemError("plan searches jaxmem's own models (`model`) and MaxText's step (`maxtext`); a user's `step` "
                      "has no mesh or kernel to choose")
  one_of_each(w, "plan")
  tgt = resolve_target(w)
  if tgt.capacity_bytes is None:
    raise JaxmemError(f"plan needs a target with a memory capacity; {tgt.name} has none (use a TPU or GPU target)")
  cfg, _ = resolve_model(w.model, outer_values(w))
  # Not given: the defaults, the sequence no longer than the model's learned positions (the
  # search chooses the meshes that take the batch).
  w = w.replace(batch=DEFAULT_BATCH if w.batch is None else w.batch, seq=default_seq(cfg) if w.seq is None else w.seq)
  p = _base_plan(w, cfg, tgt)
  pruned: Counter = Counter()
  cands = order(candidates(p, pruned), tgt.capacity_bytes)
  run.start(min(budget, len(cands)), cfg)
  rows, compiled, skipped, unreached = compile_in_order(p, cands, budget=budget, run=run)
  pruned.update(skipped)
  base = p.tasks()[0]
  rows = [_with_recompute(p, r, _task(base, c)) for r, c in zip(rows, compiled, strict=True)]
  est = {c.key: c.estimated_step_time_s for c in compiled}
  ranked = rank_rows(rows)
  return PlanResult(
      model=cfg.name, target=tgt.name, batch=w.batch, seq=w.seq, budget=budget,
      candidates=len(cands) + sum(v for k, v in pruned.items() if k not in skipped), compiles=len(rows),
      cache_hits=0 if run.cache is None else run.cache.hits, pruned=tuple(sorted(pruned.items())),
      not_compiled=len(cands) - len(compiled) - sum(skipped.values()), rows=tuple(ranked),
      estimates=tuple(est.items()), notes=search_notes(unreached), why=why(ranked),
  )


def label(r: Row) -> str:
  """A row's configuration in a few words: mesh, remat, microbatches, attention, and the MoE
  kernel where its dropless experts ran one (``experts on fsdp`` where ``fsdp_shard_on_exp``)."""
  moe = [getattr(r, "moe_kernel", None) or "", "experts on fsdp" if getattr(r, "fsdp_shard_on_exp", None) else ""]
  return " ".join([f"{r.mesh} {r.remat} mb{r.microbatches} {r.attention or ''}".strip(), *(w for w in moe if w)])


# What a row's simulated step is made of (jaxmem.records.StepTime): the seconds each term bounds.
_PARTS = (("compute", "compute-bound time"), ("memory", "memory-bound time"), ("comm", "exposed communication"))


def why(ranked: list[Row]) -> str | None:
  """The first fitting row against the next fitting one in one line: how much faster, the MoE
  term that decides where one does (:func:`moe_decides`), and the terms of the simulated step
  that make the difference, largest first, each with what drives it (recomputation's FLOPs, the
  MoE kernel, HBM traffic, the collectives' bytes, a pipeline's bubble)."""
  fitting = [r for r in ranked if r.fits and r.step_time_s is not None]
  if not fitting:
    return None
  best = fitting[0]
  if len(fitting) == 1:
    return f"{label(best)} is the only compiled configuration that fits"
  second = fitting[1]
  gap = second.step_time_s - best.step_time_s
  if gap <= 0:
    return f"{label(best)} and {label(second)} tie at the simulated step time; the first compiled is listed first"
  parts = sorted(((_part(second, t) - _part(best, t), t, what) for t, what in _PARTS), reverse=True)
  decides = moe_decides(best, second)
  said = ([decides] if decides else []) + [
      f"{_ms(d)} less {what}{_driver(best, second, t)}" for d, t, what in parts if d > 0.05 * gap]
  head = f"{label(best)} is {_ms(gap)} ({gap / second.step_time_s:.1%}) faster per step than {label(second)}"
  return head + (": " + "; ".join(said) if said else "")


def moe_decides(best: Row, second: Row) -> str | None:
  """The MoE term that decides between two rows (``best`` the faster), in words, or None.

  A term decides where its difference between the rows' MoE times (``moe_time_s``, each term's
  time on the device's stream in the simulated step: :mod:`jaxmem.steptime.moe`) accounts for
  most of their step-time difference, more than half of it: what the runner-up spends on that
  term beyond what the recommendation does is more than everything else between them put
  together. Where a row has no MoE terms (a dense model; ``ragged_dot``, which XLA expands into
  a dense matmul the walk does not read as the experts' kernel) no term is named."""
  a, b = getattr(best, "moe_time_s", None), getattr(second, "moe_time_s", None)
  gap = second.step_time_s - best.step_time_s
  if not a or not b or gap <= 0:
    return None
  diffs = {t: b.get(t, 0.0) - a.get(t, 0.0) for t in dict.fromkeys([*b, *a])}
  term = max(diffs, key=lambda t: diffs[t])
  if diffs[term] <= gap / 2:
    return None
  return f"{term.replace('_', ' ')} decides: {_ms(b.get(term, 0.0))} vs {_ms(a.get(term, 0.0))}"


def _part(r: Row, term: str) -> float:
  share = getattr(r, f"{term}_bound_share", None)
  if share is None:  # no simulated shares: the roofline's term where it bounds the step
    return r.step_time_s if r.bound == term else 0.0
  return share * r.step_time_s


def _driver(best: Row, second: Row, term: str) -> str:
  """What in the programs makes ``term`` differ: FLOPs (recomputation), bytes, a bubble."""
  out = []
  if term == "compute" and best.flops and second.flops and second.flops > best.flops:
    more = second.flops / best.flops - 1
    out.append(f"the runner-up runs {more:.0%} more FLOPs a device{_flops_driver(best, second)}")
  if term == "memory" and best.bytes_accessed and second.bytes_accessed and second.bytes_accessed > best.bytes_accessed:
    out.append(f"the runner-up moves {second.bytes_accessed / best.bytes_accessed - 1:.0%} more HBM bytes")
  if term == "comm":
    kinds = [(getattr(second, f"comm_{k}_bytes", 0) or 0) - (getattr(best, f"comm_{k}_bytes", 0) or 0)
             for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute")]
    names = ("all-gathers", "reduce-scatters", "all-reduces", "all-to-alls", "collective-permutes")
    if max(kinds) > 0:
      out.append(f"the runner-up sends {(second.comm_bytes or 0) / 2**20:,.0f} MiB a device vs "
                 f"{(best.comm_bytes or 0) / 2**20:,.0f} MiB, most of the difference in {names[kinds.index(max(kinds))]}")
  bubbles = (getattr(best, "bubble_fraction", None) or 0.0, getattr(second, "bubble_fraction", None) or 0.0)
  if bubbles[1] > bubbles[0]:
    out.append(f"pipeline bubble {bubbles[1]:.0%} vs {bubbles[0]:.0%}")
  return f" ({', '.join(out)})" if out else ""


def _flops_driver(best: Row, second: Row) -> str:
  """What in the configurations differs to run more FLOPs: the remat policy, the MoE kernel."""
  kernels = (getattr(second, "moe_kernel", None), getattr(best, "moe_kernel", None))
  said = [f"remat {second.remat} vs {best.remat}"] if second.remat != best.remat or kernels[0] == kernels[1] else []
  if kernels[0] != kernels[1]:
    said.append(f"MoE kernel {kernels[0]} vs {kernels[1]}")
  return f" ({', '.join(said)})"


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:,.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:,.0f} us"


def search_notes(unreached: int = 0, *, order: tuple[str, ...] = (ORDER_NOTE,)) -> tuple[str, ...]:
  """A search's notes: what its step time is, ``order`` (how its compiles were ordered, and what
  a search of another step left out), and the candidates compiled ahead but never reached."""
  notes = (
      "step_time_s: each compiled row's schedule simulated (jaxmem.steptime), not a measurement; "
      "roofline_step_time_s is its lower bound",
      *order,
  )
  if unreached:  # compiled in parallel ahead of the search, which then stopped or skipped them
    notes += (f"{unreached} candidate(s) compiled in parallel ahead of the search were not reached by it and are "
              "left out, so the answer is the one-process search's (their rows are in the row cache where one is used)",)
  return notes


def _base_plan(w: Workload, cfg: Any, tgt: Any) -> Plan:
  """The validated sweep every candidate's task specialises: the ladder's policies, the first
  optimizer, on the first mesh the workload can take (each task names its own)."""
  values = one_each(w)
  choices = moe_choice(cfg, configured(cfg, StepChoices(), values)[1], tgt.platform, values)[0]
  meshes = [m for m in factorizations(tgt.num_devices, search_axes(cfg))
            if mesh_reason(m, cfg, w.batch, w.seq, 1, values=values, choices=choices) is None]
  meshes.sort(key=lambda m: dict(m).get("stage", 1) > 1)  # the base needs no pipeline schedule
  if not meshes:
    raise JaxmemError(
        f"no mesh of {tgt.num_devices} devices can take batch {w.batch} at seq {w.seq} for {cfg.name}; "
        f"use a batch that is a multiple of the device count"
    )
  rungs = [r.name for r in REMAT_LADDER if r.name in REMAT_POLICIES]
  return plan_sweep(w.replace(target=tgt, model=cfg, mesh=(shd.format_mesh(meshes[0]),), remat=tuple(rungs),
                              optimizer=(OPTIMIZERS.parse(w.optimizer)[0].name,), attention=("auto",), microbatches=(1,)))


def compile_in_order(
    p: Plan, cands: list[Candidate], *, budget: int, run: RunOptions,
) -> tuple[list[Row], list[Candidate], Counter, int]:
  """Compiles ``cands`` in order until ``budget``; skips those dominated by a compiled candidate
  that did not fit, and reorders the rest after each compile by the rungs' calibrated estimates
  (:func:`calibration`). Returns the rows, the candidates compiled, the skipped counts and the
  number of candidates compiled ahead but never reached.

  Each decision depends on the compiles before it, so ``run.jobs`` (or a scheduler) compiles
  ahead: the candidate due next and those after it in the current order, ``jobs`` at once
  (:func:`_compile_ahead`). Their rows are then taken one at a time, exactly as the search in
  one process takes them, so the rows, their order and the answer are the same for any
  ``jobs``; a candidate compiled ahead that the search never reaches is left out of the answer
  (its row stays in the row cache) and ``on_row`` hears of each row as it is taken."""
  base = p.tasks()[0]
  rows: list[Row] = []
  done: list[Candidate] = []
  failed: list[Candidate] = []
  skipped: Counter = Counter()
  ahead: dict[Candidate, Row] = {}
  queue = list(cands)
  while queue and len(rows) < budget:
    c = queue.pop(0)
    if dominated(c, failed):
      skipped["needs at least the memory of a compiled candidate that did not fit (not compiled)"] += 1
      continue
    if c not in ahead:
      room = min(run.jobs, budget - len(rows))
      nxt = [q for q in queue if q not in ahead and not dominated(q, failed)]
      ahead.update(_compile_ahead(p, base, [c, *nxt][:room], run))
    r = ahead.pop(c)
    run.row(r)
    rows.append(r)
    done.append(c)
    if r.fits is False:
      failed.append(c)
    # What the compiler said of each rung reorders what is left: a rung whose estimate was low
    # moves its candidates that would not fit behind those that would.
    queue = order(queue, p.target.capacity_bytes, calibration(list(zip(done, rows, strict=True))))
  return rows, done, skipped, len(ahead)


def _compile_ahead(p: Plan, base: Task, batch: list[Candidate], run: RunOptions) -> dict[Candidate, Row]:
  """Rows for ``batch`` (the candidate due next first), compiled ``run.jobs`` at once."""
  got = _run_candidates(p, base, batch, jobs=run.jobs, scheduler=run.scheduler, cache=run.cache, on_row=None)
  return dict(zip(batch, got, strict=True))


def _run_candidates(
    p: Plan, base: Task, batch: list[Candidate], *, jobs: int, cache: RowCache | None,
    on_row: Callable[[Row], None] | None, scheduler: str | None = None,
) -> list[Row]:
  """Rows for ``batch`` in its order (each candidate a task of ``p``'s, its pipeline schedule
  its own)."""
  return run_rows(p, [_task(base, c) for c in batch], jobs=jobs, scheduler=scheduler, cache=cache, on_row=on_row)


def _task(base: Task, c: Candidate) -> Task:
  moe = {} if c.moe_kernel is None else {"moe_kernel": (c.moe_kernel,)}
  if c.fsdp_shard_on_exp is not None:  # off is the workload's default: the same task (and cache key) as before
    moe["fsdp_shard_on_exp"] = (c.fsdp_shard_on_exp,)
  return base.replace(mesh=(c.mesh,), remat=(c.remat,), attention=(c.attention,), microbatches=(c.microbatches,),
                      pipeline_microbatches=c.pipeline_microbatches, **moe)


def _with_recompute(p: Plan, r: Row, task: Task) -> Row:
  """A fitting row's recompute against the no-remat program at its configuration (``task``;
  traced, not compiled: :func:`jaxmem.planning.sweep.baseline_flops`)."""
  if not r.fits or r.flops is None:
    return dataclasses.replace(r, recompute_overhead_pct=None)
  if r.remat == "none":
    return dataclasses.replace(r, recompute_overhead_pct=0.0)
  base = baseline_flops(p, r, task)
  return dataclasses.replace(r, recompute_overhead_pct=None if not base else 100.0 * (r.flops - base) / base)

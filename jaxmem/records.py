"""The shared shape of jaxmem's results: ``as_dict()`` in one place, and the fields every figure
is described by, declared once.

Results hold tuples (notes, shapes, nested records) so they stay immutable; their dict form uses
lists, as JSON does, so ``json.dumps(r.as_dict())`` and a comparison with a row read back from
JSON or the cache agree.

- :class:`Placement`: what a compiled figure is for: the model, target, mesh, global batch and
  device count (every compiled result, training or inference).
- :class:`Configuration`: a train step's whole configuration: a placement plus the remat policy,
  optimizer, sequence length and dtypes (compare's rows, explain, validate's measurements).
- :class:`Communication`: the bytes one device sends per step in collectives, by kind, read
  from the optimized HLO (declared once: the compiler's report and every row carry it).
- :class:`StepTime`: one step's time per device, estimated (the compiled schedule simulated, its
  roofline bound, each link's time, MFU), formed once from the compiled figures
  (:mod:`jaxmem.steptime`) and carried flat by every compiled row.
- :class:`CompilerFigures`: what the compiler says about one program, per device (XLA's memory
  fields, jaxmem's total, FLOPs, compile time, communication) and the compiler versions that said it.
- :class:`RuntimeAccount`: the device as the runtime will hold it beside the compiled figures
  (:mod:`jaxmem.hardware.runtime`): each term in bytes with its source, and its verdict.
"""

from __future__ import annotations

import dataclasses

from jaxmem.axes import swept_fields, with_fields
# Declared in a leaf of their own, which the models import too (one mechanism for rows and model
# configs); named here as well, where the records that use them are.
from jaxmem.composed import Composed, Record, composed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Placement(Record):
  """What a compiled figure is for. ``batch`` is global; ``num_devices`` the target's."""

  model: str
  target: str
  mesh: str
  batch: int
  num_devices: int


# The swept fields fit's and scale's summaries carry as a configuration records them (the model's
# dtypes, the precision dtypes, the step's layout...; jaxmem.axes declares them): rows differing
# only in one are different programs, each compared with its own baseline.
SWEPT_FIELDS = swept_fields()


@dataclasses.dataclass(frozen=True, kw_only=True)
@with_fields("record")
class Configuration(Placement):
  """A train step's configuration: the placement, the sequence length and every sweep axis as
  the compiled program resolved it (:mod:`jaxmem.axes`; each declaration's ``record.doc`` says
  what its field holds, ``attention`` the implementation ``auto`` became, say). Pipeline
  parallelism (:mod:`jaxmem.program.pipelining`): ``stages`` the mesh's ``stage`` axis (1: none),
  ``bubble_fraction`` the schedule's idle share, (S - 1) / (M·R + S - 1) (GPipe, Huang et al.
  2019; MaxText). A user's own step (``--step``) has ``None`` for what jaxmem did not choose: the
  optimizer, the compute dtype (and the parameters' where no argument is named ``params``), and
  every axis a step does not take (:attr:`jaxmem.axes.Axis.step`). One function makes it:
  :func:`jaxmem.resolve.configuration`."""

  seq: int
  stages: int = 1
  bubble_fraction: float | None = None
  # (the sweep axes as recorded, in their order among these: jaxmem.axes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Communication(Record):
  """Bytes one device sends per step in each kind of collective, read from the optimized HLO
  under ring-algorithm costs (:mod:`jaxmem.hlo.comms`); ``comm_bytes`` is their sum. ``None``:
  not compiled (a refused configuration), so not read.

  The fields keep their ``comm_`` prefix because records that carry them (rows, reports) are
  flat in ``as_dict()`` and JSON: a figure about communication (how exact it is, say) is one
  more field here, and every result that carries communication has it.
  """

  comm_bytes: int | None = None
  comm_all_gather_bytes: int | None = None
  comm_reduce_scatter_bytes: int | None = None
  comm_all_reduce_bytes: int | None = None
  comm_all_to_all_bytes: int | None = None
  comm_collective_permute_bytes: int | None = None
  # True when the figures are a lower bound, not a total: a loop that communicates has a trip
  # count neither the compiler recorded nor jaxmem could derive, so its body was counted once.
  comm_lower_bound: bool | None = None

  def communication(self) -> Communication:
    """These fields alone, as their own record (of a row or a report that carries them)."""
    return Communication(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Communication)})


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepTime(Record):
  """A step's time per device, ESTIMATED from the compiled program and the target's published
  figures (:mod:`jaxmem.steptime`; formulas in docs/fields.md). ``step_time_s`` is the compiled
  schedule simulated (:mod:`jaxmem.steptime.walk`: each op at its own roofline in the device's
  order, collectives on their links, asynchronous ones overlapping the work scheduled between
  their start and done), never below the roofline bound; where there is no schedule to walk it
  is the roofline bound (a note says so). Of the simulated step, ``exposed_comm_time_s`` is the
  communication nothing overlapped, and the ``*_bound_share`` fields the fractions bound by
  compute, memory and communication (they sum to 1). ``None``: the figure cannot be had (no
  published figure for the target, no compiled program); the row's notes say why.

  The ``roofline_*`` fields are the bound (:mod:`jaxmem.steptime.roofline`): each term is the
  time the step would take if that resource alone limited it at its peak rate, every byte sent
  at the fast link's whole rate, so each is a lower bound; ``roofline_step_time_s`` is their
  largest (perfect overlap of the others). The ``<link>_comm_time_s`` fields are the simulated
  transfer time on each link the target has, named by it (``None`` where it has no such link,
  or its bandwidth is not published): ``ici_`` inside a TPU slice and ``dcn_`` across slices;
  ``nvlink_`` inside a GPU host and ``network_`` across hosts (a collective whose group spans
  slices or hosts counted whole on the slower link, its inside rings included); ``host_`` host
  offload's transfers on a TPU's link to host memory (PCIe).

  ``bytes_accessed``: HBM bytes one device reads and writes per step, from the optimized HLO with
  loop trip counts (:mod:`jaxmem.hlo.traffic`). ``model_flops``: the step's model FLOPs per
  device by the 6·N·T + attention accounting (:mod:`jaxmem.models.model_flops`; 2·N·T + attention
  for inference), against which ``mfu`` is formed. ``bound``: ``compute``, ``memory`` or
  ``comm``, the term that bounds most of ``step_time_s``. ``arithmetic_intensity`` (FLOPs per HBM byte)
  against ``ridge_point`` (peak FLOP/s over HBM bandwidth) says the same of compute and memory:
  above the ridge, compute-bound. ``op_time_s``: each op of the walk at its own slowest term,
  the ops one after another (:mod:`jaxmem.steptime.ops`). ``moe_time_s``: a mixture-of-experts
  step's time by term (:mod:`jaxmem.steptime.moe`), term -> seconds, where the walk found the
  experts' grouped matmul kernels.

  The fields are flat on the rows that carry them (as :class:`Communication`'s), so JSON and CSV
  have ``step_time_s`` beside ``comm_bytes``; :meth:`step_time` gives them as their own record.
  """

  bytes_accessed: int | None = None
  model_flops: float | None = None
  roofline_compute_time_s: float | None = None
  roofline_memory_time_s: float | None = None
  roofline_comm_time_s: float | None = None
  step_time_s: float | None = None
  bound: str | None = None
  tokens_per_s_per_device: float | None = None
  mfu: float | None = None
  arithmetic_intensity: float | None = None
  ridge_point: float | None = None
  op_time_s: float | None = None
  roofline_step_time_s: float | None = None
  exposed_comm_time_s: float | None = None
  # Each link's simulated transfer time (jaxmem.hardware.machine.Link.field names them).
  ici_comm_time_s: float | None = None
  dcn_comm_time_s: float | None = None
  nvlink_comm_time_s: float | None = None
  network_comm_time_s: float | None = None
  # The simulated time of host offload's transfers on the device's link to host memory (a TPU's
  # PCIe); None where the target's host link has no published bandwidth or is not modelled.
  host_comm_time_s: float | None = None
  # Where a target spans slices or hosts (None otherwise): the simulated step with every
  # collective on the fast link (what the step would be as one slice or host).
  fast_link_step_time_s: float | None = None
  compute_bound_share: float | None = None
  memory_bound_share: float | None = None
  comm_bound_share: float | None = None
  # A mixture-of-experts step's time by term (jaxmem.steptime.moe.TERMS: grouped_matmul,
  # permutation, expert_activation, router, expert_weights, token_exchange -> its seconds on the
  # device's stream, a collective's exposed part), read off the same walk; None where the walk
  # found no grouped matmul kernel (a dense model, ragged_dot's expansion, no walk).
  moe_time_s: dict[str, float] | None = None

  def step_time(self) -> StepTime:
    """These fields alone, as their own record (of a row that carries them)."""
    return StepTime(**{f.name: getattr(self, f.name) for f in dataclasses.fields(StepTime)})


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompilerFigures(Communication):
  """The compiler's per-device figures for one program (see :mod:`jaxmem.compiler.report` for
  what each field means on each backend). ``None``: the figure cannot be had here (the row's
  notes say why). ``versions``: the jax, jaxlib and libtpu or CUDA plugin releases that compiled
  it (:mod:`jaxmem.versions`), since the figures move between compiler releases.
  ``program_flops``: the whole program's FLOPs counted from its jaxpr (every device; see
  :class:`jaxmem.planning.sweep.Row`), where the program was traced through jaxmem. The
  :class:`Communication` fields come with them: they too are read from the compiled program.
  A figure every row of every command should carry is declared here and filled in
  :func:`jaxmem.compiler.figures.compile_figures`."""

  argument_size_in_bytes: int | None = None
  output_size_in_bytes: int | None = None
  alias_size_in_bytes: int | None = None
  temp_size_in_bytes: int | None = None
  generated_code_size_in_bytes: int | None = None
  host_temp_size_in_bytes: int | None = None
  peak_memory_in_bytes: int | None = None
  total_bytes: int | None = None
  # The host memory space's twins of the device fields (remat offload's pinned host memory), and
  # their total as total_bytes is formed; never part of what must fit on the device.
  host_argument_size_in_bytes: int | None = None
  host_output_size_in_bytes: int | None = None
  host_alias_size_in_bytes: int | None = None
  host_generated_code_size_in_bytes: int | None = None
  host_total_bytes: int | None = None
  flops: float | None = None
  program_flops: float | None = None
  compiler_flops: float | None = None
  hlo_flops: float | None = None
  compile_seconds: float | None = None
  versions: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Judgement(Record):
  """Whether one compiled (or refused) program fits its device, per device, declared once for
  every row type (compare's, infer's). ``required_bytes`` is what must fit in
  ``capacity_bytes`` (:attr:`jaxmem.compiler.report.MemoryReport.required_bytes`; for a refusal,
  the figure it gives); ``fits`` compares the two, and ``verdict`` (``yes``, ``at risk``, ``NO``),
  ``margin_bytes`` (capacity - required) and ``risk_bytes`` (what the runtime may hold beside
  the program) say how closely (:mod:`jaxmem.hardware.margin`). ``error``: the compiler's refusal,
  or ``None``; ``notes``: why a figure is ``None``, what the figures leave out.

  The host's side, for a program that keeps bytes in host memory (remat offload:
  ``host_total_bytes``): ``host_capacity_bytes`` the host RAM per device
  (:mod:`jaxmem.hardware.hostmem`), ``host_fits`` whether ``host_total_bytes`` fits it and
  ``host_verdict`` (``yes``, ``NO``); all ``None`` for a program with no host bytes, or where
  the host's RAM is unknown (a note says why). They never enter ``fits``."""

  capacity_bytes: int | None = None
  required_bytes: int | None = None
  fits: bool | None = None
  verdict: str | None = None
  margin_bytes: int | None = None
  risk_bytes: int | None = None
  error: str | None = None
  notes: tuple[str, ...] = ()
  host_capacity_bytes: int | None = None
  host_fits: bool | None = None
  host_verdict: str | None = None
  # What the verdict judged (jaxmem.hardware.margin.Verdict): which figure required_bytes is, the
  # naive argument + output - alias + temp beside it, and the compiler's own capacity check.
  judged_figure: str | None = None
  naive_sum_bytes: int | None = None
  compiler_check: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeAccount(Record):
  """The device as its runtime will hold the program (:mod:`jaxmem.hardware.runtime`), per device,
  beside the compiler's figures. ``runtime_terms``: each term by name, ``{"bytes", "part",
  "source"}`` (``bytes`` ``None`` where no source gives a size); its ``part`` says where it sits:
  ``top`` (reserved at the top of memory, already out of ``capacity_bytes``), ``heap`` (buffers
  held while the step runs), ``step heap`` (heap buffers each step allocates anew and frees,
  which can leave holes), ``program`` (the program's one contiguous block), and on GPU ``outside
  pool`` (held outside the allocator's preallocated share) and ``room`` (the memory the pool
  leaves for them).

  TPU: ``runtime_heap_bytes`` and ``runtime_program_bytes`` sum their parts and
  ``runtime_available_bytes`` is what the capacity leaves once both are placed (the runtime's
  "Available after request"). GPU: ``runtime_available_bytes`` is what the memory outside the
  allocator's pool leaves once the ``outside pool`` terms are placed. ``runtime_verdict``
  (``yes``, ``at risk``, ``NO``) with ``runtime_term`` naming the term that decides it and
  ``runtime_remedy`` the change that restores room. All ``None`` where there is no account (the
  CPU, a refused program, a figure it needs unknown)."""

  runtime_top_reserved_bytes: int | None = None
  runtime_heap_bytes: int | None = None
  runtime_program_bytes: int | None = None
  runtime_available_bytes: int | None = None
  runtime_verdict: str | None = None
  runtime_term: str | None = None
  runtime_remedy: str | None = None
  runtime_terms: dict[str, dict] = dataclasses.field(default_factory=dict)

"""The one step from a traced program to its figures: checked against the device, lowered,
compiled, read; or refused.

:func:`compile_figures` is what every command's row comes from (compare, fit and scale through
:func:`jaxmem.planning.sweep.run_config`, a user's step, infer, explain, analyze, validate), so a
figure added here (and declared in :class:`jaxmem.records.CompilerFigures`) appears in all of
them, and a refusal reads the same everywhere:

1. The whole program's FLOPs are counted from its jaxpr (before any compile, so a refused
   configuration still has them).
2. What is known exactly from the shapes is checked first: the bytes one device holds of the
   arguments (parameters, optimizer state, tokens), from their shapes and shardings. Arguments
   stay resident for the whole step, so where they alone exceed the device's capacity the
   program cannot fit, and it is refused without compiling (a compile of a program many times
   the device's memory can take minutes and the host's memory).
3. The program is lowered (in ``lowering_context``: an attention kernel's, say) and compiled
   (:func:`jaxmem.xla.compile_timed`, with ``compiler_options`` for a dump), and the
   executable read (:func:`jaxmem.compiler.report.read_compiled`). A compile the backend refuses
   is a :class:`~jaxmem.compiler.report.Refusal`, not an exception, so a sweep goes on.
4. The step's time is estimated from those figures and the target's published figures
   (:func:`jaxmem.steptime.step_time`: the compiled schedule walked, its roofline bound, each
   link's time, MFU against the caller's ``work``), once, here, so every compiled row carries the
   same :class:`jaxmem.records.StepTime` fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import jax

from jaxmem.compiler.flops import jaxpr_flops
from jaxmem.hardware.hostmem import HostVerdict, judge_host
from jaxmem.hardware.margin import AT_RISK, JUDGED_ARGUMENTS, NO, Verdict, judged_note, with_runtime
from jaxmem.compiler.report import MemoryReport, Refusal, array_bytes, fits, no_triton_tiling, read_compiled
from jaxmem.hardware.targets import Target
from jaxmem.xla import compile_timed
from jaxmem.records import Record, RuntimeAccount, StepTime
from jaxmem.steptime import Work, step_time
from jaxmem.versions import compiler_versions

SPLIT_EVENLY = "flops: split evenly over the devices (the compile was refused)"
NOT_COMPILED = "flops: split evenly over the devices (nothing was compiled)"
HOST_MEMORY_KINDS = ("pinned_host",)  # on a CPU device "unpinned_host" is its own memory


@dataclasses.dataclass(frozen=True, kw_only=True)
class Figures(Record):
  """A compiled program's figures as a row takes them: the report (compiler, communication and
  FLOPs fields), the target's capacity, what must fit in it and the verdict (whether it does,
  with its margin and the runtime's risk terms: :mod:`jaxmem.hardware.margin`), the step-time
  estimate, and the notes (the caller's, the capacity's, the report's, the estimate's; the
  estimate's also in ``estimate_notes``, for a result that shows no step time)."""

  report: MemoryReport
  capacity_bytes: int | None
  required_bytes: int | None
  verdict: Verdict
  step_time: StepTime = dataclasses.field(default_factory=StepTime)  # the step-time estimate
  notes: tuple[str, ...] = ()
  host: HostVerdict = dataclasses.field(default_factory=HostVerdict)  # host bytes against the host's RAM
  estimate_notes: tuple[str, ...] = ()  # the step-time estimate's (in notes too)
  runtime: RuntimeAccount = dataclasses.field(default_factory=RuntimeAccount)  # the device as the runtime holds it

  @property
  def fits(self) -> bool | None:
    return self.verdict.fits

  @property
  def memory_notes(self) -> tuple[str, ...]:
    """``notes`` less the step-time estimate's: what a result without a step time says
    (``analyze``'s report, ``explain``'s explanation)."""
    return tuple(n for n in self.notes if n not in self.estimate_notes)

  @property
  def compiled(self) -> jax.stages.Compiled:
    return self.report.compiled

  def judged_report(self) -> MemoryReport:
    """The report as ``analyze`` gives it: with :attr:`memory_notes`, and, against a capacity,
    the verdict (``capacity_bytes``, ``fits``, ``verdict``, margins) and a note where it does not fit."""
    notes = self.memory_notes
    if self.capacity_bytes is None:
      return dataclasses.replace(self.report, notes=notes)
    if self.fits is False:
      notes += (f"fits: NO: the program needs {self.required_bytes:,} bytes per device, over the capacity of "
                f"{self.capacity_bytes:,}",)
    return dataclasses.replace(self.report, capacity_bytes=self.capacity_bytes, notes=notes, **self.verdict.as_dict())

  def with_account(self, account: RuntimeAccount) -> Figures:
    """These figures with the runtime account ``account`` (the step's, with what its job keeps
    beside it: :func:`jaxmem.hardware.runtime.with_job`), the verdict and notes following it."""
    notes = tuple(n for n in self.notes if n != runtime_note(self.runtime))
    extra = runtime_note(account)
    return dataclasses.replace(self, runtime=account, verdict=with_runtime(self.verdict, account.runtime_verdict),
                               notes=notes + ((extra,) if extra else ()))

  def row_fields(self) -> dict[str, Any]:
    """The fields every row type takes from a compile (splat into its constructor)."""
    return {**self.report.figures(), **self.step_time.as_dict(), **self.verdict.as_dict(), **self.host.as_dict(),
            **self.runtime.as_dict(), "capacity_bytes": self.capacity_bytes, "required_bytes": self.required_bytes, "error": None, "notes": self.notes}


def compile_figures(
    traced: jax.stages.Traced,
    target: Target | None,
    *,
    args: Sequence[Any] | None = None,
    argument_names: Sequence[str] | None = None,
    notes: Sequence[str] = (),
    lowering_context: AbstractContextManager | None = None,
    compiler_options: Mapping[str, Any] | None = None,
    lowered: jax.stages.Lowered | None = None,
    work: Work | None = None,
) -> Figures | Refusal:
  """``traced`` (``jax.jit(fn).trace(*args)``) compiled for ``target`` and read, or refused.

  ``args``: the abstract arguments it was traced with, for the check against the device before
  compiling (without them the check is skipped). ``argument_names`` name the top-level
  arguments in the report. ``notes`` (the caller's: how the program was chosen) come first in
  the result's. ``target`` ``None``: where ``jax.jit`` would compile it, without a capacity.
  ``lowered``: ``traced`` already lowered (by :func:`jaxmem.compiler.analysis.lower_for_target`,
  so that a function that fails to lower fails there, as one line).
  ``work``: the step's tokens and model FLOPs, for the step-time estimate's throughput and MFU
  (:mod:`jaxmem.steptime`; without it those two are ``None`` with a note).
  """
  jaxpr = traced.jaxpr.jaxpr
  program_flops = jaxpr_flops(jaxpr)
  n = 1 if target is None else target.num_devices
  capacity = None if target is None else target.capacity_bytes
  notes = list(notes) + ([] if target is None or target.capacity_note is None else [f"capacity_bytes: {target.capacity_note}"])
  platform = jax.default_backend() if target is None else target.platform
  refused = dict(
      flops=program_flops / n, program_flops=program_flops, versions=compiler_versions(platform), capacity_bytes=capacity
  )
  known = None if args is None else shape_argument_bytes(args, n)
  if known is not None and capacity is not None and not fits(known, capacity):
    return Refusal(
        required_bytes=known, fits=False, verdict=NO, margin_bytes=capacity - known, judged_figure=JUDGED_ARGUMENTS, **refused, notes=tuple(notes + [NOT_COMPILED] * (n > 1)),
        error=(f"not compiled: the arguments alone need {known:,} bytes per device (from their shapes and "
               f"shardings), over the capacity of {capacity:,}"),
    )
  try:
    if lowered is None:
      with lowering_context if lowering_context is not None else contextlib.nullcontext():
        lowered = traced.lower()
    # The target's own options (a TPU's HBM cap beside a resident program) under the caller's.
    options = {**(target.compiler_options if target is not None else {}), **(compiler_options or {})}
    compiled, seconds = _compile(lowered, options, target, notes)
  except jax.errors.JaxRuntimeError as e:  # out of memory, or a feature the backend lacks
    return Refusal.of(e, **refused, notes=tuple(notes + [SPLIT_EVENLY] * (n > 1)))
  report = read_compiled(
      compiled, compile_seconds=seconds, jaxpr=jaxpr, program_flops=program_flops, argument_names=argument_names
  )
  if work is not None and report.hlo_flops:
    # The per-device share came from the HLO's matrix FLOPs with trip counts, which the
    # compiler's own loops (collective matmuls) do not undercount: no floor is needed.
    work = dataclasses.replace(work, floor_flops=None)
  estimated = step_time(
      report.hlo_costs, target, flops=report.flops, comm_bytes=report.comm_bytes, num_devices=report.num_devices,
      bytes_accessed=None if report.traffic is None else report.traffic.bytes_accessed, coords=report.placement,
      work=work,
  )
  host = judge_host(report.host_total_bytes, None if target is None else target.host_capacity_bytes)
  host_notes = [target.host_capacity_note] if report.host_total_bytes and target and target.host_capacity_note else []
  verdict = report.judge(capacity, checked=target is not None and target.capacity_checked)
  account = RuntimeAccount() if target is None else target.kind.runtime_account(
      target, report, required=report.required_bytes, communicators=report.communicators, cudnn=report.calls_cudnn)
  verdict = with_runtime(verdict, account.runtime_verdict)
  judged = [n for n in [judged_note(verdict, capacity, report.required_bytes), runtime_note(account)] if n]
  return Figures(
      report=report, capacity_bytes=capacity, required_bytes=report.required_bytes, verdict=verdict,
      step_time=estimated.step, notes=tuple(notes) + report.notes + estimated.notes + tuple(host_notes) + tuple(judged),
      host=host, estimate_notes=tuple(n for n in estimated.notes if n not in notes and n not in report.notes),
      runtime=account,
  )


def runtime_note(account: RuntimeAccount) -> str | None:
  """Why the runtime account puts a program at risk (its term, its figures, the remedy); ``None``
  where it does not."""
  if account.runtime_verdict != AT_RISK:
    return None
  left = account.runtime_available_bytes
  return (f"runtime: at risk ({account.runtime_term}): with the device as the runtime holds it (runtime_terms), "
          f"{left:,} bytes are left once everything is placed, fewer than its terms need; {account.runtime_remedy}")


# The XLA option that leaves a GPU program's matmuls to cuBLAS instead of Triton GEMM fusions.
TRITON_GEMM = "xla_gpu_enable_triton_gemm"


def _compile(lowered: jax.stages.Lowered, options: dict[str, Any], target: Target | None,
             notes: list[str]) -> tuple[jax.stages.Compiled, float]:
  """``lowered`` compiled with ``options``. A GPU compile that fails because XLA found no Triton
  tile sizes for a matmul fusion (seen deviceless on jaxlib 0.10.2 for gpu:a100:
  :func:`jaxmem.compiler.report.no_triton_tiling`) is compiled again with Triton GEMMs off, the
  matmuls through cuBLAS, as MaxText's and NVIDIA's GPU recipes run (their XLA_FLAGS set
  ``--xla_gpu_enable_triton_gemm=false``); ``notes`` gets a line saying so. Any other failure,
  or the retry's, is the caller's."""
  try:
    return compile_timed(lowered, options)
  except jax.errors.JaxRuntimeError as e:
    why = no_triton_tiling(str(e))
    if why is None or target is None or target.platform != "gpu" or options.get(TRITON_GEMM) is False:
      raise
    compiled = compile_timed(lowered, {**options, TRITON_GEMM: False})
    notes.append(f"compiled with {TRITON_GEMM}=false (its matmuls through cuBLAS) after the first compile failed: {why}")
    return compiled


def shape_argument_bytes(args: Sequence[Any], num_devices: int) -> int:
  """The bytes one device holds of ``args``, from shapes and shardings alone: a lower bound on
  the compiler's argument size (layouts only pad up). A leaf without a sharding of its own
  (``jit``'s ``in_shardings`` may place it) counts as split over every device, the least it
  can be. Leaves placed in host memory (``memory_kind`` ``pinned_host``) are not counted."""
  total = 0
  for leaf in jax.tree_util.tree_leaves(args):
    if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
      continue
    sharding = getattr(leaf, "sharding", None)
    shape = tuple(leaf.shape)
    if getattr(sharding, "memory_kind", None) in HOST_MEMORY_KINDS:
      continue  # held in host memory, not the device's
    if isinstance(sharding, jax.sharding.Sharding):
      total += array_bytes(shape, leaf.dtype, elements=math.prod(sharding.shard_shape(shape)))
    else:
      total += array_bytes(shape, leaf.dtype) // max(1, num_devices)
  return total

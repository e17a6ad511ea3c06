"""What a runtime holds beyond the compiled program, and the verdict at the edge of capacity.

The compiler's peak is what one program needs. A running job's device also holds what the
runtime keeps beside it. :data:`RUNTIME_TERMS` lists each such term documented for the TPU and
GPU runtimes, with its source, and where jaxmem accounts for it (docs/backends.md renders the
same list):

- ``capacity``: already out of ``capacity_bytes`` (the TPU compiler's available HBM is net of the
  runtime's reserve; a GPU's capacity is the share JAX's allocator takes);
- ``risk``: jaxmem knows its size for the row but not whether the compiler's peak holds it, or
  the compiler itself sets it aside as a margin: it is the row's ``risk_bytes``;
- ``account``: a term of the row's runtime account (:mod:`jaxmem.hardware.runtime`): sized there
  from its source where one gives a size, and judged there;
- ``not modelled``: no size can be had without the device (and no source gives one).

:func:`judge` gives a row's verdict: ``NO`` when ``required_bytes`` exceeds the capacity,
``at risk`` when the margin (capacity - required) is below ``risk_bytes``, ``yes`` otherwise;
:func:`with_runtime` then makes a ``yes`` at risk where the runtime account
(:mod:`jaxmem.hardware.runtime`: the device as the runtime holds it, term by term) is.
No term is tuned to a case: each size is the row's own figure or the compiler's own constant.
"""

from __future__ import annotations

import dataclasses

from jaxmem.records import Record

YES, AT_RISK, NO = "yes", "at risk", "NO"

# XLA:GPU plans its schedule and rematerialization within this share of the memory left after
# the arguments and outputs, leaving the rest for what it does not model (GetSchedulerMemoryLimit
# in openxla/xla xla/service/gpu/gpu_hlo_schedule.cc; the default of xla_gpu_memory_limit_slop_factor
# in xla/debug_options_flags.cc).
GPU_SLOP_PERCENT = 95


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeTerm(Record):
  """One thing a runtime holds on the device beyond the compiled program."""

  name: str
  platforms: tuple[str, ...]
  what: str
  source: str
  accounted: str  # "capacity", "risk", "account" or "not modelled"


RUNTIME_TERMS = (
    RuntimeTerm(
        name="runtime reserve", platforms=("tpu",), accounted="capacity",
        what="HBM the TPU runtime reserves for itself (infeed buffers on older generations, system overhead); "
        "the compiler's available HBM (v5e: 15.75 of 16 GiB) is net of it",
        source="https://openxla.org/xla/errors/error_1000 (System overhead); the compiler's out-of-memory message",
    ),
    RuntimeTerm(
        name="loaded executable", platforms=("tpu",), accounted="risk",
        what="the compiled binary and its constants, loaded into HBM (generated_code_size_in_bytes); the TPU "
        "compiler checks it against HBM, but whether peak_memory_in_bytes includes it is not documented",
        source="https://openxla.org/xla/errors/error_1000 (Compiled binary, Constants); "
        "https://openxla.org/xla/errors/error_0101",
    ),
    RuntimeTerm(
        name="second program resident", platforms=("tpu",), accounted="not modelled",
        what="another loaded program (the initialisation step): the runtime evicts loaded programs before it "
        "fails a buffer allocation, so it costs a reload, not memory; its outputs still held by the caller do "
        "cost memory",
        source="https://openxla.org/xla/errors/error_0101; https://openxla.org/xla/errors/error_0100",
    ),
    RuntimeTerm(
        name="fragmentation", platforms=("tpu",), accounted="account",
        what="free HBM in no contiguous block large enough: a program's block must be contiguous, so it fails to "
        "load where the free total would hold it (pytorch/xla #3470: 6.78G free, 3.33G reservable, for 6.48G); the "
        "runtime account is at risk where what is left is under the buffers a step allocates anew",
        source="https://openxla.org/xla/errors/error_0100; https://github.com/pytorch/xla/issues/3470",
    ),
    RuntimeTerm(
        name="top-of-memory reserve", platforms=("tpu",), accounted="account",
        what="the top of HBM the runtime reserves for infeed, outfeed and continuations, as published "
        "out-of-memory reports print it per generation (v4: 1.25G); out of the capacity already",
        source="https://github.com/pytorch/xla/issues/1735 (Top-of-Memory reserved); "
        "https://github.com/erfanzar/EasyDeL/issues/166",
    ),
    RuntimeTerm(
        name="allocator share", platforms=("gpu",), accounted="capacity",
        what="JAX's BFC allocator preallocates XLA_PYTHON_CLIENT_MEM_FRACTION (0.75) of device memory; the CUDA "
        "context, cuBLAS/cuDNN handles and the loaded kernels (generated_code_size_in_bytes) live outside it",
        source="https://docs.jax.dev/en/latest/gpu_memory_allocation.html",
    ),
    RuntimeTerm(
        name="compiler slop", platforms=("gpu",), accounted="risk",
        what=f"XLA:GPU schedules within {GPU_SLOP_PERCENT}% of the memory left after arguments and outputs, the "
        f"rest for allocations it does not model; jaxmem takes that {100 - GPU_SLOP_PERCENT}% of "
        "capacity - (argument + output - alias) as the row's risk",
        source="openxla/xla xla/service/gpu/gpu_hlo_schedule.cc (GetSchedulerMemoryLimit); "
        "xla/debug_options_flags.cc (xla_gpu_memory_limit_slop_factor = 95)",
    ),
    RuntimeTerm(
        name="collective buffers", platforms=("gpu",), accounted="account",
        what="NCCL's communicator buffers (outside the allocator's pool by default; in it with "
        "--xla_gpu_enable_nccl_user_buffers, which also pins the pool at its initial size): NCCL_BUFFSIZE (4 MiB) x "
        "channels (at most 32) x 2 ring peers per communicator, one communicator per device group of the collectives",
        source="https://docs.jax.dev/en/latest/gpu_memory_allocation.html; "
        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html (NCCL_BUFFSIZE)",
    ),
    RuntimeTerm(
        name="cuBLAS workspace", platforms=("gpu",), accounted="account",
        what="the workspace cuBLAS allocates per handle, outside the allocator's pool: 32 MiB on Hopper, 4 MiB on "
        "earlier architectures",
        source="https://docs.nvidia.com/cuda/cublas/index.html#cublassetworkspace",
    ),
    RuntimeTerm(
        name="CUDA context", platforms=("gpu",), accounted="not modelled",
        what="the CUDA context and the loaded kernels, outside the allocator's pool; listed in the runtime account "
        "without a size, since NVIDIA publishes none",
        source="https://docs.jax.dev/en/latest/gpu_memory_allocation.html",
    ),
    RuntimeTerm(
        name="cuDNN workspace", platforms=("gpu",), accounted="not modelled",
        what="a deviceless compile sizes cuDNN attention's workspace at 0 (XLA sizes it only with a GPU attached), "
        "and cuDNN publishes no bound for its attention graphs'; rows whose program calls cuDNN list it in the "
        "runtime account without a size, and rows using cudnn carry a note",
        source="docs/backends.md (GPU, cuDNN attention); jaxmem's cuDNN note",
    ),
    RuntimeTerm(
        name="fragmentation", platforms=("gpu",), accounted="not modelled",
        what="the BFC allocator's free memory split between blocks; preallocation minimises it, "
        "XLA_PYTHON_CLIENT_PREALLOCATE=false makes it likelier",
        source="https://docs.jax.dev/en/latest/gpu_memory_allocation.html",
    ),
    RuntimeTerm(
        name="prefetched batch and held arrays", platforms=("tpu", "gpu"), accounted="account",
        what="arrays the training loop keeps beside the step: a next batch prefetched to the device, "
        "parameters not donated, or the previous state held by the caller; the runtime account has the step's "
        "outputs not donated, and for --maxtext the batch MaxText's loop puts anew each step (read from its source)",
        source="https://docs.jax.dev/en/latest/gpu_memory_allocation.html (Common causes of OOM failures); "
        "https://openxla.org/xla/errors/error_0100",
    ),
)


def risk_bytes(
    platform: str, *, capacity: int | None, argument: int | None = None, output: int | None = None,
    alias: int | None = None, generated_code: int | None = None,
) -> int | None:
  """The bytes of the ``risk`` terms of :data:`RUNTIME_TERMS` for one program: a fitting row
  whose margin is below them is at risk. ``None`` where a figure they need is unknown."""
  if platform == "tpu":
    return generated_code
  if platform == "gpu":
    if None in (capacity, argument, output, alias):
      return None
    return max(0, capacity - (argument + output - alias)) * (100 - GPU_SLOP_PERCENT) // 100
  return 0  # the CPU and an unknown platform: no runtime terms documented here


# Which figure a verdict judges (a row's ``judged_figure``): the compiler's peak, the total of
# every buffer (where the backend gives no peak, or its peak counts other memory spaces), the
# figure in the compiler's out-of-memory message, the arguments' bytes from their shapes
# (refused before compiling), or the TPU compiler's own capacity check (where the total, every
# buffer live at once, is over the capacity and the peak counts other memory spaces, so neither
# is the HBM the program needs, and the compiler, which knows it, accepted the program).
JUDGED_PEAK, JUDGED_TOTAL = "peak_memory_in_bytes", "total_bytes"
JUDGED_REFUSAL, JUDGED_ARGUMENTS = "compiler refusal", "argument bytes from shapes"
JUDGED_CHECK = "compiler check"
# The compiler's own capacity check (a row's ``compiler_check``): the TPU compiler checks the
# program's HBM against what is available and refuses it if over (error E1000); the GPU and CPU
# compilers check no capacity, so their rows carry None.
ACCEPTED, REFUSED = "accepted", "refused"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict(Record):
  """Whether a program fits a device: ``fits`` (required <= capacity), ``verdict`` (``yes``,
  ``at risk`` or ``NO``), ``margin_bytes`` (capacity - required) and the ``risk_bytes`` the
  margin is judged against. All ``None`` where required or capacity is unknown.

  What was judged: ``judged_figure`` names the figure ``required_bytes`` is (:data:`JUDGED_PEAK`
  and the others above); ``naive_sum_bytes`` is argument + output - alias + temp, every buffer
  counted as if live at once (MaxText's printed "Total memory size"), beside it; and
  ``compiler_check`` whether the compiler's own capacity check accepted or refused the program
  (TPU only; ``None`` where the backend makes none)."""

  fits: bool | None = None
  verdict: str | None = None
  margin_bytes: int | None = None
  risk_bytes: int | None = None
  judged_figure: str | None = None
  naive_sum_bytes: int | None = None
  compiler_check: str | None = None


def judge(required: int | None, capacity: int | None, risk: int | None) -> Verdict:
  """The verdict of ``required`` bytes on a device of ``capacity`` with ``risk`` bytes the
  runtime may hold beside them (:func:`risk_bytes`; ``None`` counts as none known)."""
  if required is None or capacity is None:
    return Verdict(risk_bytes=risk)
  margin = capacity - required
  verdict = NO if margin < 0 else (AT_RISK if margin < (risk or 0) else YES)
  return Verdict(fits=margin >= 0, verdict=verdict, margin_bytes=margin, risk_bytes=risk)


def with_runtime(v: Verdict, runtime_verdict: str | None) -> Verdict:
  """``v`` as the runtime account (:mod:`jaxmem.hardware.runtime`) leaves it: a program the
  compiler's figures say fits, with room to spare, is at risk where the account of the device as
  the runtime holds it is (its term named there); the account never makes a fitting program NO,
  nor a refused one fit."""
  if v.verdict == YES and runtime_verdict == AT_RISK:
    return dataclasses.replace(v, verdict=AT_RISK)
  return v


def judged_note(v: Verdict, capacity: int | None, required: int | None) -> str | None:
  """Why a program whose naive sum exceeds the capacity still fits: the buffers never live at
  once share memory, and (TPU) the compiler's own check accepted it. ``None`` otherwise."""
  naive = v.naive_sum_bytes
  if v.judged_figure == JUDGED_CHECK:
    return (
        f"verdict: judged by the TPU compiler's own capacity check, which accepted the program: total_bytes "
        f"(argument + output - alias + temp, every HBM buffer live at once: {naive:,}) exceeds the capacity of "
        f"{capacity:,}, and peak_memory_in_bytes also counts host memory and VMEM, so neither is the HBM the "
        "program needs; its margin is unknown (at risk)"
    )
  if not v.fits or capacity is None or naive is None or required is None or naive <= capacity:
    return None
  check = " and the TPU compiler's own capacity check accepted the program" if v.compiler_check == ACCEPTED else ""
  return (
      f"verdict: judged on {v.judged_figure} ({required:,} bytes): naive_sum_bytes (argument + output - alias + temp, "
      f"MaxText's printed total: {naive:,}) exceeds the capacity of {capacity:,}, but buffers that are never live "
      f"together share memory, so the peak fits{check}"
  )


def terms(platform: str) -> tuple[RuntimeTerm, ...]:
  return tuple(t for t in RUNTIME_TERMS if platform in t.platforms)

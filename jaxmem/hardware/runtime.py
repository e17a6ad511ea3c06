"""The device as its runtime will hold a program: a runtime account beside the compiler's figures.

The compiler's figures describe one program on an empty device. A running job's device holds more,
and holds it in a given shape. Each term below is a number of bytes per device (``None`` where no
source gives a size) with the source it comes from; :func:`tpu_account` and :func:`gpu_account`
add them up into a :class:`jaxmem.records.RuntimeAccount` and judge it. Nothing is tuned to a case:
every size is the row's own figure, a published default, or a figure a published report prints.

TPU (openxla/xla docs/errors/error_0100.md and error_0101.md; the runtime's own accounting as
pytorch/xla #1735 prints it: ``HBM capacity = Top-of-Memory reserved + Currently allocated +
Program requirement + Available after request``, to the byte):

- **top of memory**: the runtime reserves the top of HBM for infeed, outfeed and continuations
  ("reserved(Infeed/Outfeed/Continuations)"); the compiler's available HBM is already net of it.
  Its size per generation is the one published reports print (:data:`TOP_OF_MEMORY`).
- **heap**: every buffer is a heap allocation: the step's arguments, its outputs that do not
  reuse a donated argument, what another program keeps resident (``--resident``) and what the
  job keeps beside the step (for ``--maxtext``, read from MaxText's train loop:
  :func:`jaxmem.maxtext.step.loop_terms`).
- **program**: a loaded program reserves its memory (HLO temporaries, scoped, global, code) as
  one contiguous block at the bottom of memory; it fails to load when no contiguous block that
  large is free, even where the free total would hold it (fragmentation: pytorch/xla #3470, 6.78G
  free and 3.33G reservable for a 6.48G program). Its size is what the compiler's own check
  counts beside the arguments (:func:`tpu_terms` says why), and the code beside it.

The heap buffers a step allocates anew each time and frees after (its outputs not donated, the
batches it is fed) can leave holes the size of themselves between the heap and the program's
block. So the verdict: ``NO`` never (the compiler's own check has the last word on whether the
program fits); ``at risk`` where what the capacity leaves once heap and block are placed is
below those per-step buffers (the block fits only if the heap is unfragmented: term
``fragmentation``), or below zero (the block does not fit beside the heap: term ``program
block``); ``yes`` otherwise.

GPU (:func:`gpu_account`): JAX's allocator preallocates its share of device memory
(``XLA_PYTHON_CLIENT_MEM_FRACTION``); the CUDA context, cuBLAS's and cuDNN's workspaces and NCCL's
buffers live outside that pool. The account sets them against what the pool leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from jaxmem.hardware.margin import AT_RISK, YES
from jaxmem.records import RuntimeAccount

MiB, GiB = 1 << 20, 1 << 30

# Where a term sits (RuntimeAccount.runtime_terms' "part").
TOP, HEAP, STEP_HEAP, PROGRAM = "top", "heap", "step heap", "program"
OUTSIDE_POOL, ROOM = "outside pool", "room"
# Listed for the reader, not summed: the compiler's temp allocation, the programs a job loads besides the step.
ALLOCATION, PROGRAMS = "allocation", "other programs"
# The terms that decide an at-risk verdict (RuntimeAccount.runtime_term).
FRAGMENTATION, PROGRAM_BLOCK = "fragmentation", "program block"

ERROR_0100 = "openxla/xla docs/errors/error_0100.md (buffers are heap allocations)"
ERROR_0101 = ("openxla/xla docs/errors/error_0101.md (a loaded program reserves its instructions, static data and "
              "constants as one contiguous block at the bottom of memory)")


class Printed(NamedTuple):
  """A figure a published report prints: its bytes and where it is printed."""

  bytes: int
  source: str


# The top-of-memory reservation per TPU generation, as published out-of-memory reports print it
# ("Top-of-Memory reserved", or "reserved" under the compiler's "Total hbm usage"). The reports are
# kept in tests/data/oom_reports, and a test holds each figure here to its report. A generation
# no published report prints it for has none: the compiler's available HBM is net of it anyway.
TOP_OF_MEMORY: dict[str, Printed] = {
    "v2": Printed(554_696_704, "https://github.com/pytorch/xla/issues/1735 (Top-of-Memory reserved: 529.00M, "
                               "554,696,704 bytes, of 8.00G)"),
    "v3": Printed(530 * MiB, "https://github.com/LargeWorldModel/LWM/issues/60 (reserved 530.00M; v3-8, 15.48G "
                             "available)"),
    "v4": Printed(int(1.25 * GiB), "https://github.com/erfanzar/EasyDeL/issues/166 (reserved 1.25G; v4-32, 30.75G "
                                   "of 32 available)"),
}
NO_TOP_REPORT = "no published out-of-memory report prints it for this generation; the compiler's available HBM is net of it"


def term(part: str, size: int | None, source: str) -> dict:
  """One entry of ``RuntimeAccount.runtime_terms``."""
  return {"bytes": size, "part": part, "source": source}


def tpu_terms(
    *, generation: str, argument: int | None, output: int | None, alias: int | None, temp: int | None,
    code: int | None, required: int | None, resident: int = 0,
) -> dict[str, dict]:
  """The TPU account's terms for one compiled program (its memory_analysis() figures and
  ``required`` bytes, the peak the verdict judges), in bytes.

  The program's block is what the compiler's own check counts beside the arguments: out-of-memory
  reports print its check as "Used = program + arguments" against the capacity (tests/data/
  oom_reports: EasyDeL #142, #166), and it accepted this program at ``required`` bytes, so the
  block it plans is ``required`` less the heap it counts (arguments, outputs not donated). The
  compiled code comes beside it (error_1000.md lists the binary apart; no source says the peak
  holds it). The temp allocation (``temp_size_in_bytes``) is listed, not summed: the runtime does
  not reserve it whole beside every argument (deepseek2-16b on v5p-8 ran with argument 44.5 + temp
  55.9 GiB of 95.74 on its own stack: MaxText docs, understand_logs_and_metrics.md)."""
  top = TOP_OF_MEMORY.get(generation)
  undonated = None if None in (output, alias) else output - alias
  block = None if None in (required, argument, undonated) else max(0, required - argument - undonated)
  terms = {
      "top-of-memory reserved": term(TOP, None if top is None else top.bytes, NO_TOP_REPORT if top is None else top.source),
      "arguments": term(HEAP, argument, f"argument_size_in_bytes; {ERROR_0100}"),
      "outputs not donated": term(
          STEP_HEAP, undonated,
          "output_size_in_bytes - alias_size_in_bytes: allocated by each step, the previous step's freed; "
          "https://github.com/pytorch/xla/issues/1735 (output [may share some memory with arguments])"),
      "program (as the compiler checked it)": term(
          PROGRAM, block, "required_bytes - arguments - outputs not donated: the compiler checks program + arguments "
          f"against the capacity (Used = program + arguments: https://github.com/erfanzar/EasyDeL/issues/142) and "
          f"accepted this program at its peak; {ERROR_0101}"),
      "code": term(PROGRAM, code, f"generated_code_size_in_bytes; {ERROR_0101}; https://openxla.org/xla/errors/"
                   "error_1000 lists the compiled binary apart from the temporaries"),
      "temp allocation (not reserved whole)": term(
          ALLOCATION, temp, "temp_size_in_bytes, listed, not summed: deepseek2-16b ran on v5p-8 with argument 44.5 + "
          "temp 55.9 GiB of 95.74 on its own stack (MaxText docs, guides/monitoring_and_debugging/"
          "understand_logs_and_metrics.md), so the runtime does not reserve the whole allocation beside the arguments"),
  }
  if resident:
    terms["resident (--resident)"] = term(HEAP, resident, "another program's bytes, as given with --resident")
  return terms


def tpu_account(terms: Mapping[str, dict], capacity: int | None, *,
                cap_option: str = "xla_tpu_max_hbm_size_mib") -> RuntimeAccount:
  """The TPU account of ``terms`` (:func:`tpu_terms`, and any a job adds) against ``capacity``
  (the compiler's available HBM, before any ``--resident`` bytes: they are a heap term here)."""
  parts = {p: _sum(t for t in terms.values() if t["part"] == p) for p in (HEAP, STEP_HEAP, PROGRAM)}
  top = terms.get("top-of-memory reserved", {}).get("bytes")
  account = RuntimeAccount(runtime_top_reserved_bytes=top, runtime_terms=dict(terms))
  if capacity is None or None in parts.values():
    return account
  heap = parts[HEAP] + parts[STEP_HEAP]
  available = capacity - heap - parts[PROGRAM]
  account = dataclasses.replace(account, runtime_heap_bytes=heap, runtime_program_bytes=parts[PROGRAM],
                                runtime_available_bytes=available)
  if available >= parts[STEP_HEAP]:
    return dataclasses.replace(account, runtime_verdict=YES)
  decided = PROGRAM_BLOCK if available < 0 else FRAGMENTATION
  return dataclasses.replace(account, runtime_verdict=AT_RISK, runtime_term=decided,
                             runtime_remedy=_tpu_remedy(terms, capacity, parts, cap_option))


def _tpu_remedy(terms: Mapping[str, dict], capacity: int, parts: dict[str, int], cap_option: str) -> str:
  """The change that restores room, for an at-risk account: donation where the step's outputs do
  not reuse its arguments; a cap on the HBM the compiler plans for, leaving room for everything it
  does not count (its check is arguments + temporaries against the cap, so the rest of the heap,
  the code and one hole per per-step buffer come off: jaxmem's --resident sets the same cap); and
  fewer programs loaded beside the step."""
  undonated = terms.get("outputs not donated", {}).get("bytes") or 0
  arguments = terms.get("arguments", {}).get("bytes") or 0
  code = terms.get("code", {}).get("bytes") or 0
  beside = parts[HEAP] + parts[STEP_HEAP] - arguments + code + parts[STEP_HEAP]
  ways = []
  if undonated:
    ways.append(f"donate the arguments the step's outputs replace (jax.jit(..., donate_argnums=...)): {undonated:,} "
                "bytes of outputs reuse no argument (openxla/xla docs/errors/error_0101.md)")
  ways.append(f"cap the HBM the compiler plans for at --{cap_option}={max(capacity - beside, 0) // MiB} (jaxmem: "
              f"--resident {beside:,}), so it plans its temporaries around the rest of the heap, the code and a "
              "hole per per-step buffer")
  ways.append("load fewer programs beside the step (a program evicted for buffers needs a contiguous block again to "
              "reload: error_0101.md)")
  return "; ".join(ways)


def _sum(terms: Iterable[dict]) -> int | None:
  total = 0
  for t in terms:
    if t["bytes"] is None:
      return None
    total += t["bytes"]
  return total


# GPU: what lives outside JAX's allocator pool (https://docs.jax.dev/en/latest/gpu_memory_allocation.html:
# the allocator preallocates XLA_PYTHON_CLIENT_MEM_FRACTION of device memory; the rest is for what it
# does not allocate).
ALLOCATOR_SOURCE = "https://docs.jax.dev/en/latest/gpu_memory_allocation.html (the pool is XLA_PYTHON_CLIENT_MEM_FRACTION of device memory)"
# cuBLAS's recommended workspace per handle: 32 MiB on Hopper (compute capability 9), 4 MiB on earlier
# architectures (cuBLAS API reference, cublasSetWorkspace); cuBLAS allocates it itself, outside the pool.
CUBLAS_SOURCE = ("https://docs.nvidia.com/cuda/cublas/index.html#cublassetworkspace (recommended workspace: 32 MiB "
                 "on Hopper, 4 MiB on other architectures)")
# NCCL's buffer per peer and channel (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
# NCCL_BUFFSIZE: default 4194304), its channels at most MAXCHANNELS (32 in NVIDIA/nccl
# src/include/device.h; NCCL_MAX_NCHANNELS lowers it), and a ring's two peers (previous and next).
NCCL_BUFFSIZE_DEFAULT, NCCL_MAX_CHANNELS, NCCL_RING_PEERS = 4 * MiB, 32, 2
NCCL_SOURCE = ("NCCL_BUFFSIZE (default 4 MiB: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html) x "
               "channels (at most MAXCHANNELS, 32: NVIDIA/nccl src/include/device.h; NCCL_MAX_NCHANNELS) x 2 ring peers, "
               "per communicator: one for each distinct device group of the program's collectives")
CONTEXT_SOURCE = ("not published: NVIDIA documents no size for a CUDA context (it depends on the driver, the GPU and "
                  "the kernels loaded); read it on the device with nvidia-smi")
CUDNN_SOURCE = ("a deviceless compile sizes cuDNN attention's workspace at 0 (XLA sizes it from the cuDNN graph only "
                "with a GPU attached: xla/service/gpu/transforms/cudnn_workspace_rewriter.cc), and cuDNN publishes no "
                "bound for its attention graphs' workspace; it is part of the program's temporaries, inside the pool")


def nccl_bytes(communicators: int, env: Mapping[str, str]) -> int:
  """NCCL's buffers for ``communicators`` communicators: NCCL_BUFFSIZE x channels x ring peers each."""
  size = int(env.get("NCCL_BUFFSIZE") or NCCL_BUFFSIZE_DEFAULT)
  channels = min(int(env.get("NCCL_MAX_NCHANNELS") or NCCL_MAX_CHANNELS), NCCL_MAX_CHANNELS)
  return communicators * size * channels * NCCL_RING_PEERS


def gpu_terms(*, compute_capability: int, communicators: int, cudnn: bool, env: Mapping[str, str]) -> dict[str, dict]:
  """The GPU account's terms for one program: what lives outside the allocator's pool (and a
  cuDNN workspace inside it, where the program calls cuDNN)."""
  terms = {
      "CUDA context": term(OUTSIDE_POOL, None, CONTEXT_SOURCE),
      "cuBLAS workspace": term(OUTSIDE_POOL, (32 if compute_capability >= 9 else 4) * MiB, CUBLAS_SOURCE),
      "NCCL buffers": term(OUTSIDE_POOL, nccl_bytes(communicators, env), f"{NCCL_SOURCE} ({communicators} here)"),
  }
  if cudnn:
    terms["cuDNN workspace"] = term(PROGRAM, None, CUDNN_SOURCE)
  return terms


def gpu_account(terms: Mapping[str, dict], *, memory: int | None, pool: int | None) -> RuntimeAccount:
  """The GPU account of ``terms`` (:func:`gpu_terms`): what lives outside the allocator's pool,
  against what the pool leaves of ``memory``. ``runtime_available_bytes`` counts only the terms
  with a size (the CUDA context has none published): at risk where even they do not fit."""
  terms = dict(terms)
  if memory is None or pool is None:
    return RuntimeAccount(runtime_terms=terms)
  outside = memory - pool
  terms["memory outside the allocator's pool"] = term(ROOM, outside, ALLOCATOR_SOURCE)
  sized = {n: t["bytes"] for n, t in terms.items() if t["part"] == OUTSIDE_POOL and t["bytes"] is not None}
  available = outside - sum(sized.values())
  account = RuntimeAccount(runtime_available_bytes=available, runtime_terms=terms)
  if available >= 0:
    return dataclasses.replace(account, runtime_verdict=YES)
  largest = max(sized, key=sized.get)
  return dataclasses.replace(
      account, runtime_verdict=AT_RISK, runtime_term=largest,
      runtime_remedy=(f"lower the allocator's share so {-available:,} more bytes stay outside its pool "
                      f"(XLA_PYTHON_CLIENT_MEM_FRACTION={max(pool + available, 0) / memory:.2f}), or shrink NCCL's "
                      "buffers (NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS)"),
  )


def with_job(account: RuntimeAccount, job: Mapping[str, dict], *, from_arguments: int = 0,
             cap_option: str = "xla_tpu_max_hbm_size_mib") -> RuntimeAccount:
  """``account`` (a TPU account of :func:`tpu_account`) with the terms a job adds beside its step
  (``job``: what its loop keeps, read from its source), ``from_arguments`` bytes of the step's
  arguments moved into them (a batch the loop puts on the device anew each step is an argument
  of the step and a per-step buffer of the loop), judged again. An account without a heap (a GPU
  account, or none) is returned as it is."""
  terms = dict(account.runtime_terms)
  if "arguments" not in terms or None in (account.runtime_available_bytes, account.runtime_heap_bytes,
                                          account.runtime_program_bytes):
    return account
  capacity = account.runtime_available_bytes + account.runtime_heap_bytes + account.runtime_program_bytes
  arguments = terms["arguments"]
  terms["arguments"] = {**arguments, "bytes": arguments["bytes"] - from_arguments}
  terms.update(job)
  return tpu_account(terms, capacity, cap_option=cap_option)

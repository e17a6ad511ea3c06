"""The files XLA writes with ``xla_dump_to``: buffer assignment, live ranges, and the HLO text.

Checked with jax/jaxlib 0.10.2 (libtpu 0.0.42.1, CUDA plugin 0.10.2) and 0.12.0.1 (libtpu
0.0.50.1, CUDA plugin 0.12.0.1) on XLA:CPU, TPU compiled without a TPU and GPU compiled without
a GPU. All three backends write the same four text files for the optimized module (the prefix
differs: ``cpu_after_optimizations``, ``after_optimizations``,
``sm_9.0a_gpu_after_optimizations``):

- ``*-buffer-assignment.txt``: every allocation (its size, whether it holds an entry parameter,
  the output, constants, thread-local scratch or the pre-allocated temp heap, its memory color)
  and every HLO value placed in it, with the value's size and offset in the allocation.
- ``*-live-range.txt``: the flattened schedule (``InstructionSequence``: every instruction of
  the entry computation and of the loop bodies, in execution order) and each buffer's live range
  as ``name{shape index}:start-end`` positions in that sequence.
- ``*after_optimizations.txt``: the scheduled HLO, read by :mod:`jaxmem.hlo.text` (its metadata
  carries the jax op name and the Python source of each instruction).

These are debugging dumps, not a stable interface: parsing is strict about the lines it needs
and a file it cannot read raises :class:`DumpFormatError` rather than giving a wrong figure.

What changed between jaxlib 0.10.2 and 0.12.0.1, and is read in both forms: the HLO text's
tuple element reads (see :mod:`jaxmem.hlo.text`); allocation headers gain ``, page N``
(ignored). Unchanged: the live-range file's format and the value lines.
"""

from __future__ import annotations

import dataclasses
import os
import re

from jaxmem.errors import JaxmemError
from jaxmem.hlo.text import Module, parse_module


class DumpFormatError(JaxmemError):
  """XLA's dump files are missing or not in the format this jaxmem reads."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Value:
  """One HLO value placed in an allocation."""

  key: str  # "name{index}", the spelling the live-range file uses
  name: str  # the defining instruction
  size: int
  offset: int
  shape: str  # "bf16[2,64,64]{2,1,0}" as XLA prints it
  phi: bool  # a loop-carried merge of other values (same memory as them)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Allocation:
  index: int
  size: int
  color: int  # memory space; 0 is the device's main memory (HBM)
  kind: str  # parameter, output, temp, constant, thread-local, live-out
  parameter: int | None
  values: tuple[Value, ...]


_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE = re.compile(r"^ value: <\d+ (\S+?)(\{[^}]*\})?( \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")


def parse_buffer_assignment(text: str) -> list[Allocation]:
  allocs: list[Allocation] = []
  cur: dict | None = None
  values: list[Value] = []

  def close():
    if cur is not None:
      allocs.append(Allocation(**cur, values=tuple(values)))

  for line in text.splitlines():
    m = _ALLOC.match(line)
    if m:
      close()
      rest = m.group(3)
      color = re.search(r", color (\d+)", rest)
      param = re.search(r", parameter (\d+)", rest)
      if param:
        kind = "parameter"
      elif "output shape is" in rest:
        kind = "output"
      elif "preallocated-temp" in rest:
        kind = "temp"
      elif "constant" in rest:
        kind = "constant"
      elif "thread-local" in rest:
        kind = "thread-local"
      elif "maybe-live-out" in rest:
        kind = "live-out"
      else:
        kind = "temp"
      cur = dict(
          index=int(m.group(1)),
          size=int(m.group(2)),
          color=int(color.group(1)) if color else 0,
          kind=kind,
          parameter=int(param.group(1)) if param else None,
      )
      values = []
      continue
    m = _VALUE.match(line)
    if m and cur is not None:
      name, index = m.group(1), m.group(2) or "{}"
      values.append(
          Value(
              key=f"{name}{index}",
              name=name,
              size=int(m.group(4)),
              offset=int(m.group(5)),
              shape=m.group(6).strip(),
              phi=bool(m.group(3)),
          )
      )
    elif line.startswith("Used values") or line.startswith("BufferAssignment stats"):
      break
  close()
  if not allocs:
    raise DumpFormatError("no allocations found in XLA's buffer-assignment dump")
  return allocs


@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveRanges:
  sequence: tuple[str, ...]  # instruction names in schedule order
  ranges: dict[str, tuple[int, int]]  # "name{index}" -> (first, last) position, inclusive
  xla_peak_bytes: int | None  # the live-range file's own "peak usage" line, all memory spaces


_RANGE = re.compile(r"^\s+(\S+\{[^}]*\}):(\d+)-(\d+)\s*$")
_SEQ = re.compile(r"^\s+(\d+):(\S+)\s*$")


def parse_live_range(text: str) -> LiveRanges:
  seq: list[str] = []
  ranges: dict[str, tuple[int, int]] = {}
  section = None
  peak = None
  for line in text.splitlines():
    s = line.strip()
    if s == "InstructionSequence:":
      section = "seq"
      continue
    if s == "BufferLiveRange:":
      section = "ranges"
      continue
    if s.startswith("Live ranges at"):
      section = None
      continue
    if s.startswith("Stack trace breakdown for peak usage:"):
      peak = int(re.sub(r"\D", "", s.split(":", 1)[1]) or 0)
      break
    if section == "seq":
      m = _SEQ.match(line)
      if m:
        seq.append(m.group(2))
    elif section == "ranges":
      m = _RANGE.match(line)
      if m:
        ranges[m.group(1)] = (int(m.group(2)), int(m.group(3)))
  if not seq or not ranges:
    raise DumpFormatError("no instruction sequence or live ranges in XLA's live-range dump")
  return LiveRanges(sequence=tuple(seq), ranges=ranges, xla_peak_bytes=peak)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dump:
  """The three files of one optimized module, parsed."""

  allocations: list[Allocation]
  live: LiveRanges
  hlo: Module  # the optimized module's HLO text, parsed
  files: tuple[str, ...]  # the file names read


def read_dump(directory: str) -> Dump:
  """Finds the train step's optimized module in ``directory`` and parses its files.

  When XLA dumped several modules (a backend may compile helper programs), the one with the
  largest live-range file is the step.
  """
  names = sorted(os.listdir(directory))
  live_files = [n for n in names if n.endswith("after_optimizations-live-range.txt")]
  if not live_files:
    raise DumpFormatError(f"XLA wrote no *after_optimizations-live-range.txt under {directory}")
  live_name = max(live_files, key=lambda n: os.path.getsize(os.path.join(directory, n)))
  prefix = live_name.removesuffix("-live-range.txt")
  ba_name, hlo_name = f"{prefix}-buffer-assignment.txt", f"{prefix}.txt"
  for n in (ba_name, hlo_name):
    if n not in names:
      raise DumpFormatError(f"XLA wrote {live_name} but not {n}")

  def read(n):
    with open(os.path.join(directory, n)) as f:
      return f.read()

  return Dump(
      allocations=parse_buffer_assignment(read(ba_name)),
      live=parse_live_range(read(live_name)),
      hlo=parse_module(read(hlo_name)),
      files=(ba_name, live_name, hlo_name),
  )

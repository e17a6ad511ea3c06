"""Parsers for the files XLA writes with ``xla_dump_to``: buffer assignment, live ranges, HLO.

Checked with jax/jaxlib 0.10.2 on XLA:CPU, libtpu 0.0.42 (TPU compiled without a TPU) and the
CUDA plugin (GPU compiled without a GPU). All three backends write the same four text files for
the optimized module (the prefix differs: ``cpu_after_optimizations``, ``after_optimizations``,
``sm_9.0a_gpu_after_optimizations``):

- ``*-buffer-assignment.txt``: every allocation (its size, whether it holds an entry parameter,
  the output, constants, thread-local scratch or the pre-allocated temp heap, its memory color)
  and every HLO value placed in it, with the value's size and offset in the allocation.
- ``*-live-range.txt``: the flattened schedule (``InstructionSequence``: every instruction of
  the entry computation and of the loop bodies, in execution order) and each buffer's live range
  as ``name{shape index}:start-end`` positions in that sequence.
- ``*after_optimizations.txt``: the scheduled HLO, whose ``metadata`` carries the jax op name
  and a ``stack_frame_id`` into the module's ``FileNames``/``FunctionNames``/``FileLocations``/
  ``StackFrames`` tables (the Python source of each op).

These are debugging dumps, not a stable interface: parsing is strict about the lines it needs
and a file it cannot read raises :class:`DumpFormatError` rather than giving a wrong figure.
"""

from __future__ import annotations

import dataclasses
import os
import re

from jaxmem.errors import JaxmemError


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
class Instruction:
  name: str
  opcode: str
  shape: str
  op_name: str
  frame: int | None  # stack_frame_id
  operands: tuple[str, ...] = ()
  calls: tuple[str, ...] = ()  # computations it calls (fusion bodies, loop bodies, wrapped ops)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hlo:
  instructions: dict[str, Instruction]
  computations: dict[str, tuple[str, ...]]  # name -> its instructions, the root first
  files: dict[int, str]
  functions: dict[int, str]
  locations: dict[int, tuple[int, int, int]]  # id -> (file id, function id, line)
  frames: dict[int, tuple[int, int]]  # id -> (location id, parent frame id)

  def described(self, name: str, depth: int = 4) -> Instruction | None:
    """The instruction, or for one without metadata (XLA:CPU's wrapped ops, copies it adds)
    the nearest with some: inside what it calls (the root first), then its operands."""
    seen: set[str] = set()
    todo = [(name, 0)]
    while todo:
      n, d = todo.pop(0)
      if n in seen or n not in self.instructions:
        continue
      seen.add(n)
      ins = self.instructions[n]
      if ins.op_name:
        return ins
      if d >= depth:
        continue
      for c in ins.calls:
        todo += [(m, d + 1) for m in self.computations.get(c, ())]
      todo += [(o, d + 1) for o in ins.operands]
    return None

  def stack(self, frame: int | None) -> list[tuple[str, str, int]]:
    """(file, function, line) from the innermost frame outwards."""
    out = []
    seen = set()
    while frame and frame in self.frames and frame not in seen:
      seen.add(frame)
      loc, parent = self.frames[frame]
      if loc in self.locations:
        f, fn, line = self.locations[loc]
        out.append((self.files.get(f, "?"), self.functions.get(fn, "?"), line))
      frame = parent
    return out


_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?(%[^,}\s]+(?:, %[^,}\s]+)*)")


def parse_hlo(text: str) -> Hlo:
  instructions: dict[str, Instruction] = {}
  files: dict[int, str] = {}
  functions: dict[int, str] = {}
  locations: dict[int, tuple[int, int, int]] = {}
  frames: dict[int, tuple[int, int]] = {}
  computations: dict[str, list[str]] = {}
  comp: list[str] | None = None
  table = None
  for line in text.splitlines():
    s = line.strip()
    if line.endswith("{") and not line.startswith(" ") and "(" in line:
      cname = line.removeprefix("ENTRY ").split(" ", 1)[0].lstrip("%")
      comp = computations.setdefault(cname, [])
      continue
    if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      table = s
      continue
    if table and not s:
      table = None
      continue
    if table:
      num, _, rest = s.partition(" ")
      if not num.isdigit():
        table = None
      else:
        i = int(num)
        if table == "FileNames":
          files[i] = rest.strip('"')
        elif table == "FunctionNames":
          functions[i] = rest.strip('"')
        elif table == "FileLocations":
          g = dict(re.findall(r"(\w+)=(-?\d+)", rest))
          locations[i] = (int(g.get("file_name_id", 0)), int(g.get("function_name_id", 0)), int(g.get("line", 0)))
        else:
          g = dict(re.findall(r"(\w+)=(-?\d+)", rest))
          frames[i] = (int(g.get("file_location_id", 0)), int(g.get("parent_frame_id", 0)))
        continue
    if " = " not in line or not line.startswith("  "):
      continue
    name, _, rest = s.removeprefix("ROOT ").partition(" = ")
    name = name.lstrip("%")
    # "f32[2,64]{1,0:T(8,128)} add(...)" or "(f32[2], s32[]) while(...)": the shape is one token
    # (TPU layouts hold parentheses but no spaces) or a parenthesised tuple.
    cut = _tuple_end(rest) if rest.startswith("(") else rest.find(" ")
    shape, tail = rest[:cut], rest[cut:].strip()
    opcode = tail.split("(", 1)[0]
    args = tail[len(opcode) + 1:]
    meta = rest.rpartition("metadata={")[2] if "metadata={" in rest else ""
    op = re.search(r'op_name="([^"]*)"', meta)
    fr = re.search(r"stack_frame_id=(\d+)", meta)
    operands = tuple(re.findall(r"%([\w.\-]+)", args.split(")", 1)[0]))
    calls = tuple(c.lstrip("%") for m in _CALLS.finditer(rest) for c in m.group(1).split(", "))
    instructions[name] = Instruction(
        name=name,
        opcode=opcode,
        shape=shape,
        op_name=op.group(1) if op else "",
        frame=int(fr.group(1)) if fr else None,
        operands=operands,
        calls=calls,
    )
    if comp is not None:
      if s.startswith("ROOT "):
        comp.insert(0, name)
      else:
        comp.append(name)
  return Hlo(instructions=instructions, computations={k: tuple(v) for k, v in computations.items()}, files=files, functions=functions, locations=locations, frames=frames)


def _tuple_end(s: str) -> int:
  depth = 0
  for i, c in enumerate(s):
    if c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dump:
  """The three files of one optimized module, parsed."""

  allocations: list[Allocation]
  live: LiveRanges
  hlo: Hlo
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
      hlo=parse_hlo(read(hlo_name)),
      files=(ba_name, live_name, hlo_name),
  )

"""Parsers for the files XLA writes with ``xla_dump_to``: buffer assignment, live ranges, HLO.

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
- ``*after_optimizations.txt``: the scheduled HLO, whose ``metadata`` carries the jax op name
  and a ``stack_frame_id`` into the module's ``FileNames``/``FunctionNames``/``FileLocations``/
  ``StackFrames`` tables (the Python source of each op).

These are debugging dumps, not a stable interface: parsing is strict about the lines it needs
and a file it cannot read raises :class:`DumpFormatError` rather than giving a wrong figure.

What changed between jaxlib 0.10.2 and 0.12.0.1, and is read in both forms:

- HLO text: no ``get-tuple-element`` instructions are printed; an operand reads a tuple element
  in place, ``%while.3#14`` (:func:`_element_reads`). The live-range schedule still lists the
  unprinted instructions.
- Buffer assignment: allocation headers gain ``, page N`` (ignored).
- The CUDA plugin runs the backward layer scan's per-layer slices of stacked residuals as
  ``async-start``/``async-done`` pairs around a dynamic-slice fusion (:meth:`Hlo.origin`).
- Unchanged: the live-range file's format, the value lines, the metadata tables.
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
  index: int | None = None  # a parameter's number, a get-tuple-element's tuple index
  computation: str = ""  # the computation it belongs to
  body: str | None = None  # a while loop's body computation


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

  def origin(self, name: str, index: int | None = None) -> Origin | None:
    """The instruction that computes ``name`` (tuple element ``index``), followed back through
    data movement: tuple plumbing, the stacked write of a loop (a ``dynamic-update-slice``'s
    update operand), relayouts (bitcast, copy, transpose, reshape, convert, broadcast) and into
    fusions (their root) and loop bodies (the body's ROOT tuple element) and out again (a fused
    parameter is the fusion's operand). None when the value went through no loop: the
    instruction's own metadata (:meth:`described`) already names it then.

    A scanned layer's residual is a tuple element of the ``while`` that runs the layers, and XLA
    tags the ``while`` with the scan's name and source; the op that made the value, and its
    source line in the layer, are inside the body.
    """
    stack: list[str] = []  # the fusions and loops entered, innermost last
    loop = loop_index = None
    path: list[Instruction] = []
    entered = 0  # where on the path the innermost loop body was entered
    n, idx = name, index
    for _ in range(_ORIGIN_STEPS):
      ins = self.instructions.get(n)
      if ins is None:
        return None
      path.append(ins)
      op = ins.opcode
      if op == "get-tuple-element" and ins.operands:
        n, idx = ins.operands[0], ins.index
      elif op == "tuple" and idx is not None and idx < len(ins.operands):
        n, idx = ins.operands[idx], None
      elif op == "while" and ins.body in self.computations and idx is not None:
        if loop is None:
          loop, loop_index = ins.name, idx
        stack.append(n)
        entered = len(path)
        n = self.computations[ins.body][0]  # the body's ROOT tuple, element idx
      elif op in ("fusion", "call") and ins.calls and ins.calls[0] in self.computations:
        stack.append(n)
        n = self.computations[ins.calls[0]][0]
      elif op == "async-done" and ins.operands:
        # An async op's result (the CUDA plugin 0.12.0.1 runs the backward layer scan's
        # per-layer slices of the stacked residuals as async dynamic-slice fusions; 0.10.2 did
        # not): element 1 of its async-start's ((operands), result, context) tuple.
        n, idx = ins.operands[0], 1
      elif op == "async-start" and idx == 1 and ins.calls and ins.calls[0] in self.computations:
        stack.append(n)
        n, idx = self.computations[ins.calls[0]][0], None
      elif op == "dynamic-update-slice" and len(ins.operands) > 1:
        n = ins.operands[1]  # the slice written this iteration, not the buffer written into
      elif op == "dynamic-slice" and ins.operands and any(p in ins.op_name for p in _SCAN_PLUMBING):
        n, idx = ins.operands[0], None  # this layer's slice of a stacked loop input (its weights)
      elif op in _MOVES and ins.operands:
        n, idx = ins.operands[0], None
      elif op == "opt-barrier" and ins.operands:
        n = ins.operands[0]  # a tuple passed through unchanged; idx still selects in it
      elif op == "parameter":
        caller = self.instructions.get(stack.pop()) if stack else self._only_caller(ins.computation)
        if caller is None or ins.computation == "" or caller.opcode not in ("fusion", "call", "while", "async-start"):
          break
        if caller.opcode == "while":
          # A value carried into this iteration (the layer's input): an op in the body that cast
          # or moved it names the residual better than whatever made the loop's first input.
          if not caller.operands or any(_named(i) for i in path[entered:]):
            break
          n = caller.operands[0]  # a value passed through unchanged: its initial value names it
        elif ins.index is not None and ins.index < len(caller.operands):
          n = caller.operands[ins.index]
        else:
          break
      else:
        break
    else:
      return None
    if loop is None:
      return None
    # Its own metadata, or (a constant, an entry parameter) the nearest on the way with some
    # that is not the loop's or the stacked write's.
    named = [i for i in path if _named(i)]
    computed = [i for i in named if i.opcode not in _MOVES]
    # Else (a stacked layer weight: the scan's slice of an input of the step) that slice.
    sliced = [i for i in path if i.op_name and i.opcode == "dynamic-slice"]
    by = path[-1] if _named(path[-1]) else (computed or named or sliced or [None])[-1]
    return None if by is None else Origin(instruction=by, loop=loop, index=loop_index)

  def carried(self, loop: str, index: int) -> set[str]:
    """The values (``name{index}`` keys, as the buffer assignment names them) that hold element
    ``index`` of the ``while`` ``loop``'s carry over the loop's life: the initial value the loop
    starts from (a stacked residual's zeros), the body's and condition's parameter, what the body
    writes into it (the stacked write, and the in-place updates before it) and the loop's output.
    XLA keeps them all in one buffer."""
    w = self.instructions.get(loop)
    if w is None or w.opcode != "while":
      return set()
    keys = {f"{loop}{{{index}}}"}
    params = set()
    for c in w.calls:
      p = next((self.instructions[n] for n in self.computations.get(c, ()) if self.instructions[n].opcode == "parameter"), None)
      if p is not None:
        keys.add(f"{p.name}{{{index}}}")
        params.add(p.name)
    if w.operands:
      keys |= self._aliases(w.operands[0], index)[0]
    if w.body in self.computations:
      # The body's result, back through the in-place updates (a dynamic-update-slice, or a fusion
      # of one, writing into its first operand) to the body's parameter.
      got, ins = self._aliases(self.computations[w.body][0], index)
      for _ in range(_ORIGIN_STEPS):
        keys |= got
        if ins is None or ins.opcode == "parameter" or not ins.operands or not self._writes_in_place(ins):
          break
        got, ins = self._aliases(ins.operands[0], None)
    return keys

  def _writes_in_place(self, ins: Instruction) -> bool:
    """A dynamic-update-slice, or a fusion whose root is one: it writes into its first operand."""
    if ins.opcode == "dynamic-update-slice":
      return True
    if ins.opcode != "fusion" or not ins.calls or not self.computations.get(ins.calls[0]):
      return False
    _, root = self._aliases(self.computations[ins.calls[0]][0], None)
    return root is not None and root.opcode == "dynamic-update-slice"

  def _aliases(self, name: str, index: int | None) -> tuple[set[str], Instruction | None]:
    """The value keys that name (element ``index`` of) ``name`` through the ops that alias their
    operand (tuple plumbing, bitcast), and the instruction that defines it."""
    keys: set[str] = set()
    n, idx = name, index
    for _ in range(_ORIGIN_STEPS):
      ins = self.instructions.get(n)
      if ins is None:
        return keys, None
      keys.add(f"{n}{{{'' if idx is None else idx}}}")
      if ins.opcode == "tuple" and idx is not None and idx < len(ins.operands):
        n, idx = ins.operands[idx], None
      elif ins.opcode == "get-tuple-element" and ins.operands:
        n, idx = ins.operands[0], ins.index
      elif ins.opcode in ("bitcast", "opt-barrier") and ins.operands:
        n = ins.operands[0]
      else:
        return keys, ins
    return keys, None

  def _only_caller(self, computation: str) -> Instruction | None:
    callers = [i for i in self.instructions.values() if computation and (i.body == computation or (i.opcode != "while" and computation in i.calls))]
    return callers[0] if len(callers) == 1 else None

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


_ORIGIN_STEPS = 200
# Ops that move or retype a value without computing it: a value read through them is made by
# their (first) operand. Convert is here because a bf16 residual is a cast of the op's f32 value.
_MOVES = frozenset({"bitcast", "copy", "copy-start", "copy-done", "transpose", "reshape", "convert", "broadcast", "bitcast-convert"})
# Ops whose metadata names the plumbing (the scan, the stacked write, a fusion's first op), not the value.
_PLUMBING = frozenset({"while", "tuple", "get-tuple-element", "dynamic-update-slice", "fusion", "call", "parameter", "opt-barrier"})


# jax's scan reads and writes its stacked inputs and outputs with these; XLA gives their names to
# the slices and reshapes it adds around them.
_SCAN_PLUMBING = ("dynamic_update_index_in_dim", "dynamic_index_in_dim")


def _named(ins: Instruction) -> bool:
  return bool(ins.op_name) and ins.opcode not in _PLUMBING and not any(p in ins.op_name for p in _SCAN_PLUMBING)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Origin:
  """Where a loop's output comes from: the instruction in the body that computes it."""

  instruction: Instruction  # whose metadata names the value
  loop: str  # the while instruction it came out of
  index: int | None = None  # the element of the loop's output tuple it came out of


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
    operands = tuple(re.findall(r"%([\w.\-]+(?:#\d+)*)", args.split(")", 1)[0]))
    for ref in operands:
      _element_reads(ref, cname if comp is not None else "", instructions)
    if opcode == "parameter":
      num = re.match(r"(\d+)\)", args)
      index = int(num.group(1)) if num else None
    elif opcode == "get-tuple-element":
      num = re.search(r"\), index=(\d+)", tail)  # not the "/*index=5*/" comments inside tuples
      index = int(num.group(1)) if num else None
    else:
      index = None
    calls = tuple(c.lstrip("%") for m in _CALLS.finditer(rest) for c in m.group(1).split(", "))
    instructions[name] = Instruction(
        name=name,
        opcode=opcode,
        shape=shape,
        op_name=op.group(1) if op else "",
        frame=int(fr.group(1)) if fr else None,
        operands=operands,
        calls=calls,
        index=index,
        computation=cname if comp is not None else "",
        body=body.group(1) if (body := re.search(r"\bbody=%([^,}\s]+)", rest)) else None,
    )
    if comp is not None:
      if s.startswith("ROOT "):
        comp.insert(0, name)
      else:
        comp.append(name)
  return Hlo(instructions=instructions, computations={k: tuple(v) for k, v in computations.items()}, files=files, functions=functions, locations=locations, frames=frames)


def _element_reads(ref: str, computation: str, instructions: dict[str, Instruction]) -> None:
  """Restores the get-tuple-element instructions behind an operand ``%t#i`` (``%t#i#j`` nested).

  Format change: jaxlib 0.10.2's XLA prints a tuple element read as its own instruction,
  ``%get-tuple-element.7 = f32[4] get-tuple-element(%t), index=1``, and operands name it. jaxlib
  0.12.0.1's prints no get-tuple-element instructions in the optimized module (CPU, the CUDA
  plugin and libtpu 0.0.50 alike): operands read the element in place as ``%t#1``. The
  live-range file still lists the unprinted instructions in its schedule (``get-tuple-element.7``,
  ``while.55.0``), under names the HLO text no longer shows; they define no buffers. Here each
  ``t#i`` becomes a get-tuple-element named ``t#i``, so the walks over tuple plumbing
  (:meth:`Hlo.origin`, :meth:`Hlo.carried`) read both formats alike.
  """
  tuple_name, _, rest = ref.partition("#")
  for index in rest.split("#") if rest else ():
    name = f"{tuple_name}#{index}"
    if name not in instructions:
      instructions[name] = Instruction(
          name=name, opcode="get-tuple-element", shape="", op_name="", frame=None,
          operands=(tuple_name,), index=int(index), computation=computation,
      )
    tuple_name = name


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

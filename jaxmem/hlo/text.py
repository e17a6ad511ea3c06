"""The one reader of XLA's HLO text: modules, computations, instructions, source frames.

Both readers of HLO in jaxmem build on :func:`parse_module`: :mod:`jaxmem.hlo.comms` (the bytes
each collective sends, from ``compiled.as_text()``) and :mod:`jaxmem.hlo.dump` with
:mod:`jaxmem.hlo.values` (the buffers of the optimized module that ``xla_dump_to`` writes).

What is read, per instruction: its name, shape (``f32[2,64]{1,0}``, or a parenthesised tuple),
opcode, operands, the attributes after the operand list (``calls=``, ``channel_id=``,
``backend_config=``, ...), the called computations, and from ``metadata={...}`` jax's
``op_name`` and the ``stack_frame_id`` into the module's source tables. Per module: its name,
``replica_count`` and ``num_partitions``, the ENTRY computation, and the ``FileNames``,
``FunctionNames``, ``FileLocations`` and ``StackFrames`` tables behind each instruction's Python
stack (:meth:`Module.stack`). Per ``while``: its trip count (:meth:`Module.trip_count`).

Spellings read in both forms (checked with jaxlib 0.10.2 and 0.12.0.1, XLA:CPU, the CUDA plugin
and libtpu):

- jaxlib 0.12.0.1's dumps print no ``get-tuple-element`` instructions: an operand reads a tuple
  element in place, ``%while.3#14`` (``#i#j`` nested). Each such read becomes a
  ``get-tuple-element`` instruction named ``while.3#14`` (:func:`_element_reads`), so walks over
  tuple plumbing read both formats alike. ``compiled.as_text()`` still prints them.
- Operands are ``%x`` or, in older printers, ``f32[2] %x``; ``/*index=5*/`` comments are dropped.
- An instruction may span lines: attribute values are printed as they are, and libtpu's Pallas
  kernels (splash attention) carry ``frontend_attributes={kernel_metadata={`` with a JSON text
  over three lines, the last starting ``}}``. Lines are joined while an instruction leaves a
  bracket or string open (:func:`_whole_instruction`); seen with libtpu 0.0.50.1.
- TPU layouts hold parentheses inside braces (``{1,0:T(8,128)}``), so shapes and operand lists
  are cut by bracket matching, not by the first parenthesis.
- ``StackFrames`` print each frame's parent as the parent's id plus one (a root frame prints
  ``parent_frame_id=1``): checked on both jaxlib versions against a known call chain (see
  tests/test_explain.py); a table that prints a 0 (no parent) is read as plain ids.
"""

from __future__ import annotations

import dataclasses
import functools
import re

# Ops that move or retype a value without computing a new one: a value read through them is
# made by their (first) operand. The one list every walk over HLO values uses: the source of a
# saved residual (a bf16 residual is a convert of the op's f32 value; copies relayout it) and the
# loop counter a trip count is derived from.
PASS_THROUGH = frozenset({
    "bitcast", "bitcast-convert", "broadcast", "convert", "copy", "copy-start", "copy-done", "reshape", "transpose",
})

_MAX_STEPS = 200  # how far a walk through pass-through ops goes before giving up


@dataclasses.dataclass(frozen=True, kw_only=True)
class Instruction:
  """One HLO instruction. ``operands`` are instruction names (``t#i`` for an element read in
  place); ``attrs`` is the text after the operand list without the metadata."""

  name: str
  opcode: str
  shape: str  # as printed, e.g. "bf16[2,64,64]{2,1,0}" or "(f32[2], s32[])"
  operands: tuple[str, ...] = ()
  attrs: str = ""
  literal: str | None = None  # a constant's value as printed
  op_name: str = ""  # jax's name for the op (metadata), quotes unescaped
  frame: int | None = None  # metadata stack_frame_id
  calls: tuple[str, ...] = ()  # computations it calls (fusion bodies, loop body and condition, ...)
  index: int | None = None  # a parameter's number, a get-tuple-element's tuple index
  computation: str = ""  # the computation it belongs to
  body: str | None = None  # a while loop's body computation
  condition: str | None = None  # a while loop's condition computation


@dataclasses.dataclass(frozen=True, kw_only=True)
class Computation:
  name: str
  instructions: dict[str, Instruction]  # in the order printed (the schedule, in a scheduled module)
  root: str | None


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Module:
  """A parsed HLO module. XLA keeps instruction names unique in a module, so ``instructions``
  is one dict over all computations; each computation also has its own (hand-written HLO may
  repeat a name in another computation), which :meth:`get` prefers."""

  name: str
  entry: str | None
  computations: dict[str, Computation]
  instructions: dict[str, Instruction]
  replica_count: int = 1
  num_partitions: int = 1
  files: dict[int, str] = dataclasses.field(default_factory=dict)
  functions: dict[int, str] = dataclasses.field(default_factory=dict)
  locations: dict[int, tuple[int, int, int]] = dataclasses.field(default_factory=dict)  # id -> (file, function, line)
  frames: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # id -> (location, parent frame id)

  def stack(self, frame: int | None) -> list[tuple[str, str, int]]:
    """(file, function, line) from the innermost frame outwards."""
    out: list[tuple[str, str, int]] = []
    seen: set[int] = set()
    shift = self._parent_shift
    while frame and frame in self.frames and frame not in seen:
      seen.add(frame)
      loc, parent = self.frames[frame]
      if loc in self.locations:
        f, fn, line = self.locations[loc]
        out.append((self.files.get(f, "?"), self.functions.get(fn, "?"), line))
      frame = parent - shift
    return out

  @functools.cached_property
  def _parent_shift(self) -> int:
    # XLA's printer writes parent ids one above the frame ids (a root prints 1); a table with a
    # 0 among its parents is read as written.
    return 0 if any(parent == 0 for _, parent in self.frames.values()) else 1

  def get(self, name: str, computation: str | None = None) -> Instruction | None:
    """Instruction ``name``, looked up in ``computation`` first."""
    comp = self.computations.get(computation or "")
    ins = comp.instructions.get(name) if comp is not None else None
    return ins if ins is not None else self.instructions.get(name)

  def through(self, name: str, computation: str | None = None) -> Instruction | None:
    """The instruction behind ``name`` once :data:`PASS_THROUGH` ops are looked past."""
    for _ in range(_MAX_STEPS):
      ins = self.get(name, computation)
      if ins is None or ins.opcode not in PASS_THROUGH or not ins.operands:
        return ins
      name = ins.operands[0]
    return None

  def callers(self, computation: str) -> list[Instruction]:
    """The instructions that call ``computation`` (a while as its body only)."""
    return self._callers.get(computation, [])

  @functools.cached_property
  def _callers(self) -> dict[str, list[Instruction]]:
    out: dict[str, list[Instruction]] = {}
    for ins in self.instructions.values():
      for c in ins.calls:
        if ins.opcode != "while" or c == ins.body:
          out.setdefault(c, []).append(ins)
    return out

  def trip_count(self, loop: str, computation: str | None = None) -> int | None:
    """How many times the ``while`` ``loop`` runs its body: ``known_trip_count`` where XLA
    records it (CPU and GPU do), else derived as XLA's ``ComputeWhileLoopTripCount`` does for the
    common shape (libtpu records none): the condition's root compares a loop-tuple element with a
    constant, the element starts at a constant and the body adds a constant to it. None when
    neither gives it."""
    ins = self.get(loop, computation)
    if ins is None or ins.opcode != "while":
      return None
    if m := re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', ins.attrs):
      return int(m.group(1))
    return _derived_trip_count(self, ins)


def _derived_trip_count(module: Module, ins: Instruction) -> int | None:
  cond, body = module.computations.get(ins.condition or ""), module.computations.get(ins.body or "")
  if cond is None or body is None or cond.root is None or body.root is None or not ins.operands:
    return None
  root = module.through(cond.root, cond.name)
  direction = re.search(r"direction=(\w+)", root.attrs) if root else None
  if root is None or root.opcode != "compare" or not direction or len(root.operands) != 2:
    return None
  a, b = (_counter_or_constant(module, o, cond.name) for o in root.operands)
  op = direction.group(1)
  if a and b and a[0] == "const" and b[0] == "gte":  # limit OP i: flip to i OP' limit
    a, b = b, a
    op = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(op, op)
  if not (a and b and a[0] == "gte" and b[0] == "const"):
    return None
  index, limit = a[1], b[1]
  init = _tuple_constant(module, ins.operands[0], index, ins.computation)
  step = _loop_step(module, body, index)
  if init is None or step is None or step == 0:
    return None
  if op == "LT" and step > 0:
    return max(0, -(-(limit - init) // step))
  if op == "LE" and step > 0:
    return max(0, (limit - init) // step + 1)
  if op == "GT" and step < 0:
    return max(0, -(-(init - limit) // -step))
  if op == "GE" and step < 0:
    return max(0, (init - limit) // -step + 1)
  if op == "NE" and (limit - init) % step == 0 and (limit - init) // step >= 0:
    return (limit - init) // step
  return None


def _counter_or_constant(module: Module, name: str, computation: str) -> tuple[str, int] | None:
  """('const', value) for a scalar integer constant, ('gte', k) for element k of parameter 0."""
  ins = module.through(name, computation)
  if ins is None:
    return None
  if ins.opcode == "constant":
    try:
      return ("const", int(ins.literal or ""))
    except ValueError:
      return None
  if ins.opcode == "get-tuple-element" and ins.operands and ins.index is not None:
    src = module.through(ins.operands[0], computation)
    if src is not None and src.opcode == "parameter":
      return ("gte", ins.index)
  return None


def _tuple_constant(module: Module, name: str, index: int, computation: str) -> int | None:
  ins = module.through(name, computation)
  if ins is None or ins.opcode != "tuple" or index >= len(ins.operands):
    return None
  r = _counter_or_constant(module, ins.operands[index], computation)
  return r[1] if r and r[0] == "const" else None


def _loop_step(module: Module, body: Computation, index: int) -> int | None:
  root = module.through(body.root, body.name) if body.root else None
  if root is None or root.opcode != "tuple" or index >= len(root.operands):
    return None
  update = module.through(root.operands[index], body.name)
  if update is None or update.opcode not in ("add", "subtract") or len(update.operands) != 2:
    return None
  x, y = (_counter_or_constant(module, o, body.name) for o in update.operands)
  if update.opcode == "add" and y == ("gte", index) and x and x[0] == "const":
    x, y = y, x
  if x != ("gte", index) or not y or y[0] != "const":
    return None
  return y[1] if update.opcode == "add" else -y[1]


# ----------------------------------------------------------------------------- text helpers


def matching(text: str, start: int) -> int:
  """Index just past the bracket closing the one at ``start`` (layouts nest parens in braces)."""
  depth = 0
  for i in range(start, len(text)):
    c = text[i]
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def split_top(text: str) -> list[str]:
  """Splits at commas outside any brackets."""
  parts, depth, cur = [], 0, []
  for c in text:
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    if c == "," and depth == 0:
      parts.append("".join(cur).strip())
      cur = []
    else:
      cur.append(c)
  if "".join(cur).strip():
    parts.append("".join(cur).strip())
  return parts


def braced(attrs: str, key: str) -> str | None:
  """The text inside ``key={...}`` in ``attrs``, or None."""
  if f"{key}={{" not in attrs:  # most attributes name no such key: skip the regular expression
    return None
  m = _key_pattern(key, r"=\{").search(attrs)
  if not m:
    return None
  start = m.end() - 1
  return attrs[start + 1:matching(attrs, start) - 1]


def computation_refs(attrs: str, key: str) -> list[str]:
  """The computations ``key=%c`` or ``key={%a, %b}`` names in ``attrs``."""
  if f"{key}=" not in attrs:  # the common case, tested before any regular expression
    return []
  listed = braced(attrs, key)
  if listed is not None:
    return [c.strip().lstrip("%") for c in split_top(listed) if c.strip().startswith("%")]
  m = _key_pattern(key, r"=%([\w.\-]+)").search(attrs)
  return [m.group(1)] if m else []


@functools.lru_cache(maxsize=None)
def _key_pattern(key: str, tail: str) -> re.Pattern:
  """``key`` as an attribute name (at the start or after a space or comma), then ``tail``:
  compiled once per key, since a module's parse asks for the same few keys on every instruction."""
  return re.compile(r"(?:^|[\s,])" + re.escape(key) + tail)


# Attributes that name called computations.
_CALL_KEYS = ("calls", "to_apply", "body", "condition", "branch_computations", "true_computation", "false_computation")
_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\)\s*->\s*.*?)?\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_OP_NAME = re.compile(r'\bop_name="((?:[^"\\]|\\.)*)"')
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_NEXT_INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?[\w.\-]+\s*=\s")


# ----------------------------------------------------------------------------- parsing


def parse_instruction(text: str, name: str, computation: str = "") -> Instruction | None:
  """One instruction from the text after ``name =`` (None for a line that is not one)."""
  text = text.strip()
  end = matching(text, 0) if text.startswith("(") else len(text.split(" ", 1)[0])
  shape, tail = text[:end], text[end:].lstrip()
  m = re.match(r"([\w\-]+)\(", tail)
  if not m or not shape:
    return None
  opcode = m.group(1)
  close = matching(tail, m.end() - 1)
  inner = tail[m.end():close - 1]
  attrs, meta = _cut_metadata(tail[close:])
  if opcode == "constant":
    operands, literal = (), inner.strip()
  else:
    operands, literal = tuple(_operand_name(p) for p in split_top(_COMMENT.sub("", inner))), None
  index = None
  if opcode == "parameter":
    index = int(inner) if inner.strip().isdigit() else None
  elif opcode == "get-tuple-element":
    num = re.search(r"(?:^|[\s,])index=(\d+)", attrs)
    index = int(num.group(1)) if num else None
  op = _OP_NAME.search(meta)
  frame = re.search(r"\bstack_frame_id=(\d+)", meta)
  body = computation_refs(attrs, "body") if opcode == "while" else []
  condition = computation_refs(attrs, "condition") if opcode == "while" else []
  return Instruction(
      name=name, opcode=opcode, shape=_COMMENT.sub("", shape), operands=operands, attrs=attrs, literal=literal,
      op_name=re.sub(r"\\(.)", r"\1", op.group(1)) if op else "", frame=int(frame.group(1)) if frame else None,
      calls=tuple(c for key in _CALL_KEYS for c in computation_refs(attrs, key)), index=index,
      computation=computation, body=body[0] if body else None, condition=condition[0] if condition else None,
  )


def _cut_metadata(attrs: str) -> tuple[str, str]:
  """(the attributes without ``metadata={...}``, the metadata's text)."""
  m = re.search(r"(?:^|[\s,])metadata=\{", attrs)
  if not m:
    return attrs, ""
  start = m.end() - 1
  end = matching(attrs, start)
  return attrs[:m.start()] + attrs[end:], attrs[start + 1:end - 1]


def _operand_name(text: str) -> str:
  # "%x", "%x.8#2" (element 2 of tuple x.8, read in place) or "f32[2] %x" (older printers).
  tok = text.split()[-1] if text.split() else text
  return tok.lstrip("%")


def _element_reads(ins: Instruction, instructions: dict[str, Instruction]) -> None:
  """Restores the get-tuple-element instructions behind each operand ``%t#i`` (``%t#i#j``
  nested) of ``ins``: jaxlib 0.10.2's XLA prints a tuple element read as its own instruction,
  ``%get-tuple-element.7 = f32[4] get-tuple-element(%t), index=1``, and operands name it; jaxlib
  0.12.0.1's dumps print none (CPU, the CUDA plugin and libtpu 0.0.50 alike) and operands read
  the element in place as ``%t#1``. The live-range file still lists the unprinted instructions
  in its schedule under names the text no longer shows; they define no buffers."""
  for ref in ins.operands:
    tuple_name, _, rest = ref.partition("#")
    for index in rest.split("#") if rest else ():
      name = f"{tuple_name}#{index}"
      if name not in instructions:
        instructions[name] = Instruction(
            name=name, opcode="get-tuple-element", shape="", operands=(tuple_name,), attrs=f", index={index}",
            index=int(index), computation=ins.computation,
        )
      tuple_name = name


def _table_row(table: str, rest: str, module: dict) -> None:
  num, _, value = rest.partition(" ")
  i = int(num)
  if table == "FileNames":
    module["files"][i] = value.strip().strip('"')
  elif table == "FunctionNames":
    module["functions"][i] = value.strip().strip('"')
  else:
    g = dict(re.findall(r"(\w+)=(-?\d+)", value))
    if table == "FileLocations":
      module["locations"][i] = (int(g.get("file_name_id", 0)), int(g.get("function_name_id", 0)), int(g.get("line", 0)))
    else:
      module["frames"][i] = (int(g.get("file_location_id", 0)), int(g.get("parent_frame_id", 0)))


def _unclosed(text: str) -> bool:
  """Whether ``text`` leaves a bracket or a string open (quoted strings' brackets not counted)."""
  bare = _QUOTED.sub("", text)
  if '"' in bare:
    return True
  return sum(bare.count(c) for c in "([{") > sum(bare.count(c) for c in ")]}")


def _whole_instruction(lines: list[str], i: int) -> tuple[str, int]:
  """Line ``i`` with the lines after it that continue the same instruction, and the index of
  the next line to read. XLA prints attribute values as they are, newlines included: libtpu's
  Pallas kernels (splash attention) carry ``frontend_attributes={kernel_metadata={`` and a JSON
  text over three lines, the last starting ``}}, metadata=...``. Read line by line, that ``}``
  closed the computation early and the rest of a loop body (its counter, its collectives) was
  lost. A next line that starts another instruction, or closes the computation, is never taken
  in, so a bracket miscounted in one line cannot swallow the module."""
  line, i = lines[i], i + 1
  while _unclosed(line) and i < len(lines) and lines[i].strip() != "}" and not _NEXT_INSTRUCTION.match(lines[i]):
    line, i = f"{line} {lines[i].strip()}", i + 1
  return line, i


def parse_module(text: str) -> Module:
  """Parses HLO text: ``compiled.as_text()`` or a ``*after_optimizations.txt`` dump."""
  m: dict = dict(name="", entry=None, replica_count=1, num_partitions=1, files={}, functions={}, locations={}, frames={})
  computations: dict[str, Computation] = {}
  instructions: dict[str, Instruction] = {}
  cur: tuple[str, dict[str, Instruction], list[str | None]] | None = None  # (name, instructions, [root])
  table = None
  lines, i = text.splitlines(), 0
  while i < len(lines):
    line, i = lines[i], i + 1
    if cur is not None:
      if line.startswith("}"):
        computations[cur[0]] = Computation(name=cur[0], instructions=cur[1], root=cur[2][0])
        instructions.update(cur[1])
        cur = None
        continue
      im = _INSTRUCTION.match(line)
      if im and _unclosed(line):
        line, i = _whole_instruction(lines, i - 1)
        im = _INSTRUCTION.match(line)
      ins = parse_instruction(im.group(3), im.group(2), cur[0]) if im else None
      if ins is not None:
        cur[1][ins.name] = ins
        _element_reads(ins, cur[1])
        if im.group(1):
          cur[2][0] = ins.name
      continue
    s = line.strip()
    if line.startswith("HloModule"):
      m["name"] = line.split()[1].rstrip(",") if len(line.split()) > 1 else ""
      for key in ("replica_count", "num_partitions"):
        if found := re.search(rf"\b{key}=(\d+)", line):
          m[key] = int(found.group(1))
    elif s in _TABLES:
      table = s
    elif table and s[:1].isdigit():
      _table_row(table, s, m)
    elif (h := _HEADER.match(line)) and not line.startswith((" ", "\t")):
      table = None
      cur = (h.group(2), {}, [None])
      if h.group(1):
        m["entry"] = h.group(2)
    else:
      table = None
  return Module(computations=computations, instructions=instructions, **m)

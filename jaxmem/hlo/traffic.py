"""Bytes one device moves through its main memory (HBM) per step, read from the optimized HLO.

Why not ``cost_analysis()["bytes accessed"]``: like its FLOPs, XLA's cost analysis counts a while
loop's body once (jaxmem's models scan their layers, so it misses all layers but one), and a GPU
program compiled without a device gives no cost analysis at all (jaxlib 0.10.2 and 0.12.0.1).
So the scheduled module is walked as :mod:`jaxmem.hlo.comms` walks it, loop bodies times their
trip counts, and each top-level instruction (a fusion, a custom call such as an attention
kernel, a collective, an unfused op) is charged the bytes of its operands and its result: what
XLA's ``HloCostAnalysis`` charges a fusion, since what a fusion keeps inside itself lives in
registers, shared memory or VMEM, not HBM.

Three refinements follow XLA's cost analysis, where counting whole operands would charge a
scanned layer for the whole stack of layers:

- an operand a fusion reads only through ``dynamic-slice``, ``slice`` or ``gather`` (a layer's
  weights out of the stacked ``[L, ...]`` parameters) is charged the slices read;
- a ``dynamic-update-slice`` writes in place: its buffer operand is not read, and its result is
  charged the update's bytes (a layer's residual written into the stack it is saved in);
- either is seen through a view of the buffer that moves nothing itself: a ``bitcast``, or a
  nested fusion returning its operand's buffer in place (``output_to_operand_aliasing``), which
  XLA:TPU wraps around a stacked buffer to retile it where one layer is sliced or written;
- plumbing moves nothing: parameters, constants, tuples, ``get-tuple-element``, ``bitcast``,
  the ``-done`` halves of async pairs. An async ``fusion-start`` (GPU) is charged as its fusion,
  an ``async-start`` as the op it wraps.

The figure is an estimate of traffic, not a count of it: caches (GPU L2, which can hold a small
program whole) and TPU's on-chip memories make real traffic lower; layouts padded to tiles make
it higher. A loop without a known trip count counts once, and the figure is then a lower bound
(``lower_bound``, with a note), as for communication.
"""

from __future__ import annotations

import dataclasses
import re

from jaxmem.hlo.comms import collective_kind, shape_bytes as _all_bytes
from jaxmem.hlo.text import Computation, Instruction, Module, computation_refs, parse_module
from jaxmem.records import Record

_FREE = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id", "replica-id",
    "opt-barrier", "add-dependency", "domain",
})
_SLICING = frozenset({"dynamic-slice", "slice", "gather"})
# One array in a shape, with its layout: bf16[8,128]{1,0:T(8,128)(2,1)S(1)}.
_ARRAY = re.compile(r"\b[a-z][a-z0-9]*\[[^\]]*\](\{[^}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")


def shape_bytes(shape: str) -> int:
  """The bytes of ``shape`` held in the device's main memory: a TPU layout's ``S(n)`` with n > 0
  places an array elsewhere (n = 1: the on-chip VMEM, 5: host memory), so it is left out."""
  total = 0
  for m in _ARRAY.finditer(shape):
    space = _MEMORY_SPACE.search(m.group(1) or "")
    if space is None or space.group(1) == "0":
      total += _all_bytes(m.group(0))
  return total


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traffic(Record):
  """HBM bytes one device reads and writes per step (see the module docstring)."""

  bytes_accessed: int
  lower_bound: bool = False
  notes: tuple[str, ...] = ()


def _users(comp: Computation) -> dict[str, list[Instruction]]:
  out: dict[str, list[Instruction]] = {}
  for ins in comp.instructions.values():
    for op in ins.operands:
      out.setdefault(op, []).append(ins)
  return out


def _operand_bytes(module: Module, name: str, comp: str) -> int:
  ins = module.get(name, comp)
  return 0 if ins is None else shape_bytes(ins.shape)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpTraffic:
  """One top-level instruction's HBM bytes: ``bytes_once`` per execution, ``count`` executions
  per step (the trip counts of the loops around it)."""

  instruction: Instruction
  count: int
  bytes_once: int


class _Walker:

  def __init__(self, module: Module):
    self.module = module
    self.notes: list[str] = []
    self.lower_bound = False
    self.ops: dict[tuple[str, str], list] = {}  # (computation, instruction) -> [instruction, count, bytes once]
    self._memo: dict[str, int] = {}
    self._active: set[str] = set()
    self._async = _async_collectives(module)

  def visit(self, name: str, times: int = 1, record: bool = True) -> int:
    """Bytes of one execution of computation ``name``, callees included; with ``record``, each
    top-level instruction is entered in :attr:`ops` at ``times`` executions (its loops' trips)."""
    if not record and name in self._memo:
      return self._memo[name]
    comp = self.module.computations.get(name)
    if comp is None or name in self._active:
      if comp is None:
        self.lower_bound = True
        self._note(f"computation {name} not found in the HLO text; not counted")
      return 0
    self._active.add(name)
    total = sum(self._instruction(comp, ins, times, record) for ins in comp.instructions.values())
    self._active.discard(name)
    if not record:
      self._memo[name] = total
    return total

  def _note(self, text: str) -> None:
    if text not in self.notes:
      self.notes.append(text)

  def _instruction(self, comp: Computation, ins: Instruction, times: int, record: bool) -> int:
    op = ins.opcode
    if op in _FREE or op.endswith("-done") or op == "async-update":
      return 0
    if op == "while":
      trips = self.module.trip_count(ins.name, comp.name)
      if trips is None:
        if ins.body and self.visit(ins.body, record=False):
          self.lower_bound = True
          self._note(f"{ins.name}: while loop without a known trip count; its traffic is counted once")
        trips = 1
      body = self.visit(ins.body, times * trips, record) if ins.body else 0
      cond = self.visit(ins.condition, times * (trips + 1), record) if ins.condition else 0
      return body * trips + cond * (trips + 1)
    if op == "call":
      return sum(self.visit(c, times, record) for c in computation_refs(ins.attrs, "to_apply"))
    if op == "conditional":
      branches = [c for key in ("true_computation", "false_computation", "branch_computations")
                  for c in computation_refs(ins.attrs, key)]
      if not branches:
        return 0
      heaviest = max(branches, key=lambda b: self.visit(b, record=False))  # the costliest branch, as for comms
      return self.visit(heaviest, times, record)
    once = self._leaf(comp, ins)
    if record:
      entry = self.ops.setdefault((comp.name, ins.name), [ins, 0, once])
      entry[1] += times
    return once

  def _leaf(self, comp: Computation, ins: Instruction) -> int:
    """Bytes of one execution of a top-level instruction that is not control flow."""
    if ins.opcode == "async-start":  # the wrapped op (a collective, a custom call) as if it stood here
      return sum(self.visit(c, record=False) for c in computation_refs(ins.attrs, "calls"))
    if ins.opcode in ("fusion", "fusion-start"):  # GPU runs some fusions asynchronously (fusion-start/-done)
      fused = self.module.computations.get(next(iter(computation_refs(ins.attrs, "calls")), ""))
      if fused is not None:
        return self._fusion(comp, ins, fused)
    return self._plain(comp, ins)

  def _plain(self, comp: Computation, ins: Instruction) -> int:
    if ins.opcode in _SLICING:
      return 2 * shape_bytes(ins.shape)  # reads what it returns
    if ins.opcode == "dynamic-update-slice" and len(ins.operands) > 1:
      return 2 * _operand_bytes(self.module, ins.operands[1], comp.name)  # in place: the update
    return shape_bytes(ins.shape) + sum(_operand_bytes(self.module, o, comp.name) for o in ins.operands)

  def _fusion(self, comp: Computation, ins: Instruction, fused: Computation) -> int:
    users = _users(fused)
    params = {p.index: p for p in fused.instructions.values() if p.opcode == "parameter"}
    in_place: set[str] = set()
    written = self._written(fused, in_place)
    idle = self._carried(ins, fused)
    read = 0
    for i, operand in enumerate(ins.operands):
      p = params.get(i)
      uses = users.get(p.name, []) if p is not None else []
      if p is not None and (p.name in in_place or (uses and all(u.name in idle for u in uses))):
        continue  # the buffer a dynamic-update-slice writes into, or one only carried through: not read
      sliced = self._sliced_read(fused, p) if p is not None else None
      read += _operand_bytes(self.module, operand, comp.name) if sliced is None else sliced
    root = fused.instructions.get(fused.root or "")
    if root is not None and root.opcode == "tuple" and idle:
      result = sum(shape_bytes(e.shape) for o in root.operands if o not in idle and (e := fused.instructions.get(o)))
    else:
      result = shape_bytes(ins.shape if root is None else root.shape)  # fusion-start's shape holds its operands too
    return read + (result if written is None else written)

  def _carried(self, ins: Instruction, fused: Computation) -> set[str]:
    """What a fusion only carries through, moving nothing: root tuple elements that are its
    parameters, returned in place (``output_to_operand_aliasing``), and, in TPU's overlap fusions,
    the asynchronous collective they progress (its start fusion moves its bytes; the overlap
    fusion around it passes the collective's buffers along, which once charged every layer for
    every buffer in flight, an embedding table's gather included). The root tuple is in the set
    when anything is, so parameters used only by it and by idle collectives count as unread."""
    root = fused.instructions.get(fused.root or "")
    if root is None or root.opcode != "tuple":
      return set()
    aliased = {int(k) for k in re.findall(r"\{(\d+)\}:\s*\(", ins.attrs)} if "output_to_operand_aliasing" in ins.attrs else set()
    idle = {i.name for i in fused.instructions.values() if _progresses(i, self._async, fused.name)}
    for k, name in enumerate(root.operands):
      e = fused.instructions.get(name)
      if e is not None and e.opcode == "parameter" and k in aliased:
        idle.add(name)
    return idle | {root.name} if idle else set()

  def _sliced_read(self, fused: Computation, param: Instruction, depth: int = 0) -> int | None:
    """The bytes a fusion reads of ``param`` when it reads it only through slices (directly, or
    through a nested fusion that does: TPU nests them); ``None`` when it reads it whole."""
    uses = _users(fused).get(param.name, [])
    if not uses or depth > 8:
      return None
    total = 0
    for u in uses:
      if u.opcode in _SLICING and u.operands[:1] == (param.name,):
        total += shape_bytes(u.shape)
        continue
      if _is_view(u, param.name):  # read as its view is read
        got = self._sliced_read(fused, u, depth + 1)
        if got is None:
          return None
        total += got
        continue
      inner = self.module.computations.get(next(iter(computation_refs(u.attrs, "calls")), "")) if u.opcode == "fusion" else None
      if inner is None:
        return None
      inner_params = {p.index: p for p in inner.instructions.values() if p.opcode == "parameter"}
      for i, op in enumerate(u.operands):
        if op != param.name:
          continue
        got = self._sliced_read(inner, inner_params[i], depth + 1) if i in inner_params else None
        if got is None:
          return None
        total += got
    return total

  def _written(self, fused: Computation, in_place: set[str]) -> int | None:
    """The bytes a fusion whose root is (a tuple of) in-place updates writes; ``None`` when its
    root is an ordinary value (then its whole result is written). Fills ``in_place`` with the
    fused parameters the updates write into."""
    root = fused.instructions.get(fused.root or "")
    if root is None:
      return None
    outs = [fused.instructions.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
    if not any(o is not None and o.opcode == "dynamic-update-slice" for o in outs):
      return None
    total = 0
    for o in outs:
      if o is None:
        continue
      if o.opcode == "dynamic-update-slice" and len(o.operands) > 1:
        buffer = fused.instructions.get(o.operands[0])
        while buffer is not None and buffer.operands and _is_view(buffer, buffer.operands[0]):
          buffer = fused.instructions.get(buffer.operands[0])
        if buffer is not None and buffer.opcode == "parameter":
          in_place.add(buffer.name)
        update = fused.instructions.get(o.operands[1])
        total += 0 if update is None else shape_bytes(update.shape)
      else:
        total += shape_bytes(o.shape)
    return total


# A nested fusion whose whole result is its first operand's buffer
# (output_to_operand_aliasing={{}: (0, {})}): XLA:TPU wraps a stacked buffer in one to change its
# tiling (T(16,128) to T(8,128) for bf16) where a fusion slices or updates one layer of it, and the
# kernel moves only the windows it slices or updates.
_ALIASES_FIRST = re.compile(r"output_to_operand_aliasing=\{\{\}:\s*\(0,\s*\{\}\)\}")


def _is_view(ins: Instruction, of: str) -> bool:
  """Whether ``ins`` is ``of``'s buffer seen another way, moving nothing itself: a bitcast of it,
  or a nested fusion returning it in place."""
  if ins.operands[:1] != (of,):
    return False
  return ins.opcode == "bitcast" or (ins.opcode == "fusion" and _ALIASES_FIRST.search(ins.attrs) is not None)


def _async_collectives(module: Module) -> dict[str, str]:
  """TPU's asynchronous collectives: channel id -> the start fusion's computation (one holding a
  custom call ``AsyncCollectiveStart``), as :mod:`jaxmem.hlo.comms` finds them."""
  out: dict[str, str] = {}
  for comp in module.computations.values():
    insts = comp.instructions.values()
    if any(i.opcode == "custom-call" and '"AsyncCollectiveStart"' in i.attrs for i in insts):
      for i in insts:
        if (m := re.search(r"(?:^|[\s,])channel_id=(\d+)", i.attrs)) and collective_kind(i):
          out[m.group(1)] = comp.name
  return out


def _progresses(ins: Instruction, starts: dict[str, str], computation: str) -> bool:
  """Whether ``ins`` is an asynchronous collective's copy inside a fusion other than its start."""
  m = re.search(r"(?:^|[\s,])channel_id=(\d+)", ins.attrs) if collective_kind(ins) else None
  return m is not None and starts.get(m.group(1), computation) != computation


def _walked(module: Module) -> _Walker:
  walker = _Walker(module)
  entry = module.entry or (list(module.computations)[-1] if module.computations else None)
  if entry:
    walker.visit(entry)
  return walker


def traffic_of_module(module: Module) -> Traffic:
  """Per-device HBM bytes per step of a parsed optimized module: the sum of :func:`op_traffic`'s."""
  walker = _walked(module)
  total = sum(count * once for _, count, once in walker.ops.values())
  return Traffic(bytes_accessed=total, lower_bound=walker.lower_bound, notes=tuple(walker.notes))


def op_traffic(module: Module) -> tuple[list[OpTraffic], Traffic]:
  """Each top-level instruction's bytes (in the entry computation and in the loop bodies, calls
  and branch counted, with its executions per step), in program order; and their total."""
  walker = _walked(module)
  ops = [OpTraffic(instruction=ins, count=count, bytes_once=once) for ins, count, once in walker.ops.values()]
  total = sum(o.count * o.bytes_once for o in ops)
  return ops, Traffic(bytes_accessed=total, lower_bound=walker.lower_bound, notes=tuple(walker.notes))


def traffic(hlo_text: str) -> Traffic:
  """:func:`traffic_of_module` of optimized HLO text (``compiled.as_text()``)."""
  return traffic_of_module(parse_module(hlo_text))

"""Bytes each device sends per step in collectives, read from a compiled program's optimized HLO.

Why: sharding trades memory for communication. FSDP's saved parameter memory comes back as
all-gathers in the forward and backward passes and reduce-scatters of the gradients, and only the
compiled program says which collectives the partitioner actually chose. :func:`collectives` reads
``compiled.as_text()`` (XLA's optimized, scheduled HLO) and totals, per collective kind, the bytes
one device sends in one call of the program.

Cost convention (bytes a device SENDS per step under ring algorithms; it receives the same). With
``g`` the number of devices in the collective's group and ``S`` the per-device buffer in bytes:

  * all-gather          (g-1)/g * S_out   (S_out: the gathered output, g times the input)
  * reduce-scatter      (g-1)/g * S_in    (S_in: the full input, g times the output)
  * all-reduce          2(g-1)/g * S      (a reduce-scatter followed by an all-gather)
  * all-to-all          (g-1)/g * S       (every device keeps 1/g of its buffer)
  * collective-permute  S per pair in ``source_target_pairs`` the device is the source of
                        (self-pairs excluded); the device with the most sends is reported.
  * ragged-all-to-all   (g-1)/g * min(S_in, S_out), counted as all-to-all. How many rows it
                        sends is data (its send_sizes operand), which a compile cannot know; its
                        buffers bound it: a device sends at most its input, and with balanced
                        routing sends and receives equally, so the smaller of the input and the
                        output buffer (MoE dispatch sizes the receive buffer for the worst case,
                        MaxText's ``buffer_size``; the return trip, the send buffer) is what
                        moves, (g-1)/g of it to other devices as for all-to-all.

Ring costs: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 19(1), 2005 (ring all-gather, and all-reduce as reduce-scatter plus
all-gather: 2(p-1)/p * n bytes per process); NCCL's performance notes (nccl-tests
doc/PERFORMANCE.md: "bus bandwidth" factors 2(n-1)/n for all-reduce and (n-1)/n for all-gather,
reduce-scatter and all-to-all). Tuples (XLA's combined collectives) sum their elements; a result
is rounded to whole bytes per collective. Sizes are logical (elements x dtype width): TPU tile
padding in layouts such as ``{1,0:T(8,128)}`` is ignored.

Group size ``g`` comes from ``replica_groups`` in any of XLA's three spellings: explicit lists
``{{0,1},{2,3}}`` (the largest group is used if they differ, with a note), the iota form
``[G,g]<=[dims]`` with optional ``T(perm)`` (G groups of g), and the named-mesh form
``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}`` (product of the named axes' sizes; a sub-axis
``'axis_0':(2)4`` counts its own size, 4). Which ids the groups hold follows XLA's
``CollectiveOpGroupMode`` (hlo/ir/collective_op_group_mode): without ``channel_id`` groups are
replicas; all-to-all and collective-permute with ``channel_id`` are across partitions;
all-reduce/all-gather/reduce-scatter with ``channel_id`` but without ``use_global_device_ids``
group replicas and take every partition of them (g = len(group) * num_partitions); with
``use_global_device_ids=true`` ids are flattened device ids. Empty groups ``{}`` mean everyone
in that mode (replica_count and num_partitions from the ``HloModule`` line, 1 if absent).

Execution counts: the call graph is walked from the ENTRY computation. A ``while`` multiplies its
body by the trip count (its condition by trip count + 1): ``backend_config={..."known_trip_count":
{"n":"6"}}`` where XLA records it (CPU and GPU do); the TPU compiler leaves it out, so the count
is then derived as XLA's ``ComputeWhileLoopTripCount`` does for the common shape: the condition's
root compares a loop-tuple element with a constant, the element starts at a constant and the body
adds a constant to it. A loop whose count cannot be derived and whose body communicates counts
once, with a note, and the figures are then a lower bound (``lower_bound``), never a total; so
are they when a computation the call graph names is missing from the text. ``call``
counts its callee once; ``conditional`` counts the branch with the most bytes (an upper bound for
one step; a note says so when branches differ). Fusions and ``async-start`` wrapped computations
are looked into (TPU puts collectives inside fusions) as part of the computation that holds them.

Each logical collective counts once: ``-done`` halves of async pairs (``all-gather-start``/
``-done``, ``all-reduce-start``, ``collective-permute-start``, ``reduce-scatter-start``,
``all-to-all-start``; ``async-update``/``async-done``) are skipped, and a collective met again in
one computation under the same ``channel_id`` counts once. An asynchronous ``call-start``
counts the collectives of the computation it calls (``to_apply``): XLA:TPU offloads collectives
to the SparseCores as such calls, the callee on the ``sparsecore`` execution thread, started by
the ``call-start`` and finished by its ``call-done``. The TPU compiler writes an async
collective as three fusions sharing one channel id: a start fusion (custom-call
``AsyncCollectiveStart``), overlap fusions ``async_collective_fusion*`` and a done fusion
(``AsyncCollectiveDone``); the overlap fusions may sit inside a loop the collective spans (seen
for GPT-2's embedding all-gather, started before the layer scan and finished after it), so only
the start fusion's copy counts, at the start's execution count. The TPU compiler also spells a
reduce-scatter as a fusion named ``all-reduce-scatter*`` around an all-reduce and a
dynamic-slice; that all-reduce is counted as the reduce-scatter it is.

Reading the kinds: the kind is what the compiler emitted, not what the sharding asked for. The
TPU compiler may turn an FSDP all-gather or reduce-scatter next to a matmul into a windowed
einsum ("collective matmul": ``windowed_dot_general_body_ag``/``_rs`` loops of
collective-permutes in both ring directions), so on TPU FSDP traffic can show up as
``collective_permute``; the CPU compiler reduced FSDP gradients with all-reduces rather than
reduce-scatters in the programs checked; GPU and TPU may reduce gradients in bf16 where CPU uses
f32. Across backends, compare ``total_bytes``.

Not counted: send/recv and ``collective-broadcast`` (noted when present);
transfers between hosts; and communication hidden inside custom calls.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from jaxmem.hlo.text import Computation, Instruction, Module, braced, computation_refs, matching, parse_module, split_top
from jaxmem.records import Record

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute")

_OPCODE_KIND = {
    "all-gather": "all_gather", "all-gather-start": "all_gather",
    "reduce-scatter": "reduce_scatter", "reduce-scatter-start": "reduce_scatter",
    "all-reduce": "all_reduce", "all-reduce-start": "all_reduce",
    "all-to-all": "all_to_all", "all-to-all-start": "all_to_all",
    "collective-permute": "collective_permute", "collective-permute-start": "collective_permute",
    "ragged-all-to-all": "all_to_all", "ragged-all-to-all-start": "all_to_all",
}
_UNCOUNTED = ("send", "recv", "collective-broadcast")

# Bits per element; sub-byte types are rounded up per buffer.
_DTYPE_BITS = {
    "pred": 8, "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128, "tf32": 32,
    "f4e2m1fn": 4, "f8e8m0fnu": 8,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collectives(Record):
  """Per-device communication of one step, by collective kind (see the module docstring)."""

  bytes_by_kind: dict[str, int]  # keys: KINDS, always all five
  count_by_kind: dict[str, int]  # logical collectives executed per step, loop trip counts applied
  total_bytes: int
  # True when some collectives may be missing from the figures, which are then a lower bound: a
  # loop whose trip count is unknown holds collectives (counted once), or a computation is missing.
  lower_bound: bool = False
  notes: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# Shapes and groups


def _leaf_bytes(shape: str) -> int:
  total = 0
  for dtype, dims in re.findall(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]", shape):
    if dtype.startswith("f8"):
      bits = 8
    elif dtype in _DTYPE_BITS:
      bits = _DTYPE_BITS[dtype]
    else:  # token[], opaque: carry no data
      continue
    n = math.prod(int(d.replace("<=", "")) for d in dims.split(",") if d.strip()) if dims else 1
    total += (n * bits + 7) // 8
  return total


def shape_bytes(shape: str) -> int:
  """The bytes of an HLO shape as printed (``bf16[8,128]{1,0}``, or a tuple: its elements summed),
  logical sizes (tile padding ignored)."""
  return _leaf_bytes(shape)


def _tuple_elements(shape: str) -> list[str]:
  shape = shape.strip()
  if not shape.startswith("("):
    return [shape]
  return split_top(shape[1:matching(shape, 0) - 1])


def _group_size(inst: Instruction, module: Module, notes: list[str]) -> int:
  attrs = inst.attrs
  channel = re.search(r"(?:^|[\s,])channel_id=\d+", attrs) is not None
  global_ids = re.search(r"use_global_device_ids=true", attrs) is not None
  base = inst.opcode.removesuffix("-start")
  # XLA's GetCollectiveOpGroupMode: all-to-all and collective-permute have no
  # use_global_device_ids flag, so a channel_id makes them cross-partition.
  if base in ("all-to-all", "ragged-all-to-all", "collective-permute"):
    mode = "partition" if channel else "replica"
  elif not channel:
    mode = "replica"
  elif not global_ids:
    mode = "replica_and_partition"
  else:
    mode = "flattened"
  everyone = {
      "replica": module.replica_count,
      "partition": module.num_partitions,
      "replica_and_partition": module.replica_count * module.num_partitions,
      "flattened": module.replica_count * module.num_partitions,
  }[mode]

  size = None
  if m := re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs):
    size = int(m.group(2))
  elif m := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs):
    axes = {a: int(s) for a, s in re.findall(r"'([^']*)'\s*=\s*(\d+)", m.group(1))}
    size = 1
    for ref in split_top(m.group(2)):
      sub = re.match(r"'([^']*)'\s*:\s*\((\d+)\)\s*(\d+)", ref)
      if sub:
        size *= int(sub.group(3))
      else:
        size *= axes.get(ref.strip().strip("'"), 1)
  else:
    groups = braced(attrs, "replica_groups")
    if groups is not None and groups.strip():
      sizes = [len(split_top(g.strip()[1:-1])) for g in split_top(groups)]
      if len(set(sizes)) > 1:
        notes.append(f"{inst.name}: replica groups of unequal sizes {sorted(set(sizes))}; the largest is used")
      size = max(sizes)
  if size is None:
    return everyone
  # Cross-replica-and-partition: the groups list replicas, each taking all its partitions.
  return size * module.num_partitions if mode == "replica_and_partition" else size


def collective_groups(inst: Instruction, module: Module) -> list[list[int]] | None:
  """The device groups a collective runs over, as lists of ids, where the HLO spells them:
  explicit lists ``{{0,1},{2,3}}``, the iota form ``[G,g]<=[dims]T(perm)`` (ids ``0..n-1``
  laid out as ``dims``, transposed by ``perm``, cut into G rows of g) and the named-mesh form
  ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}`` (ids laid out as the mesh, a group for each
  position of the other axes). ``None``: empty groups (everyone), a sub-axis, or another
  spelling. The ids are partitions (devices) in a program of one replica."""
  attrs = inst.attrs
  if m := re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs):
    g, shape = int(m.group(2)), [int(d) for d in m.group(3).split(",")]
    ids = np.arange(math.prod(shape)).reshape(shape)
    if m.group(4):
      ids = ids.transpose([int(d) for d in m.group(4).split(",")])
    return ids.reshape(-1, g).tolist()
  if m := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs):
    axes = [(a, int(s)) for a, s in re.findall(r"'([^']*)'\s*=\s*(\d+)", m.group(1))]
    named = [ref.strip().strip("'") for ref in split_top(m.group(2))]
    names = [a for a, _ in axes]
    if not axes or any(n not in names for n in named):
      return None  # a sub-axis ('axis_0':(2)4) or a spelling not read here
    ids = np.arange(math.prod(s for _, s in axes)).reshape([s for _, s in axes])
    order = [i for i, a in enumerate(names) if a not in named] + [names.index(n) for n in named]
    g = math.prod(s for a, s in axes if a in named)
    return ids.transpose(order).reshape(-1, g).tolist()
  groups = braced(attrs, "replica_groups")
  if groups is None or not groups.strip():
    return None
  return [[int(x) for x in split_top(grp.strip()[1:-1])] for grp in split_top(groups)]


def group_size(inst: Instruction, module: Module) -> int:
  """The number of devices in each of the collective's groups (the largest where they differ)."""
  return _group_size(inst, module, [])


def collective_kind(inst: Instruction) -> str | None:
  """The :data:`KINDS` entry of a collective instruction (its ``-start`` form too), else None."""
  return _OPCODE_KIND.get(inst.opcode)


def _channel(inst: Instruction) -> str | None:
  m = re.search(r"(?:^|[\s,])channel_id=(\d+)", inst.attrs)
  return m.group(1) if m else None


def _permute_sends(attrs: str) -> int:
  pairs = braced(attrs, "source_target_pairs")
  if not pairs:
    return 0
  sends: dict[int, int] = {}
  for s, t in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", pairs):
    if s != t:
      sends[int(s)] = sends.get(int(s), 0) + 1
  return max(sends.values(), default=0)


def _ragged_buffers(inst: Instruction, comp: Computation | None) -> tuple[int, int]:
  """(input, output) buffer bytes of a ragged-all-to-all: its first two operands. The async
  form's result spells them ((operands...), output); otherwise the input is looked up by name."""
  elements = _tuple_elements(inst.shape)
  if inst.opcode.endswith("-start") and len(elements) > 1:
    operands = _tuple_elements(elements[0])
    return _leaf_bytes(operands[0]), _leaf_bytes(elements[1])
  out = _leaf_bytes(inst.shape)
  source = comp.instructions.get(inst.operands[0]) if comp is not None and inst.operands else None
  return (_leaf_bytes(source.shape) if source is not None and source.shape else out), out


def _collective_bytes(inst: Instruction, kind: str, module: Module, notes: list[str], *,
                      from_input: bool = False, comp: Computation | None = None) -> int:
  """Bytes one device sends for one execution of ``inst`` (formulas in the module docstring)."""
  if inst.opcode.startswith("ragged-all-to-all"):
    g = _group_size(inst, module, notes)
    return round((g - 1) * min(_ragged_buffers(inst, comp)) / g) if g > 1 else 0
  if inst.opcode.endswith("-start") and inst.opcode != "all-reduce-start":
    # all-gather-start: (operands, results); the async-wrapped forms: ((operands), results, ...).
    elements = _tuple_elements(inst.shape)
    out = _leaf_bytes(elements[1] if len(elements) > 1 else elements[0])
  else:
    out = _leaf_bytes(inst.shape)
  if kind == "collective_permute":
    return _permute_sends(inst.attrs) * out
  g = _group_size(inst, module, notes)
  if g <= 1:
    return 0
  if kind == "all_reduce":
    return round(2 * (g - 1) * out / g)
  if kind == "reduce_scatter":
    # ``from_input``: TPU's all-reduce-scatter fusion, whose all-reduce carries the full input.
    return round((g - 1) * out / g) if from_input else (g - 1) * out
  return round((g - 1) * out / g)  # all-gather (out is the gathered result), all-to-all


# ---------------------------------------------------------------------------------------------
# Call graph


@dataclasses.dataclass(kw_only=True)
class _Tally:
  bytes: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
  counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))

  def add(self, other: _Tally, times: int = 1) -> None:
    for k in KINDS:
      self.bytes[k] += other.bytes[k] * times
      self.counts[k] += other.counts[k] * times

  @property
  def total(self) -> int:
    return sum(self.bytes.values())


class _Walker:

  def __init__(self, module: Module):
    self.module = module
    self.notes: list[str] = []
    self.lower_bound = False
    self._memo: dict[str, _Tally] = {}
    self._active: set[str] = set()
    # Bytes one execution of each top-level collective (or fusion holding one) sends, by
    # (computation, instruction): the per-op breakdown (jaxmem.hlo.ops) reads it.
    self.per_instruction: dict[tuple[str, str], int] = {}
    # TPU async collectives: a fusion holding custom-call AsyncCollectiveStart starts the
    # collective; the same channel id reappears in overlap fusions (possibly inside a loop the
    # collective spans) and in the AsyncCollectiveDone fusion. Only the start counts.
    self._async_starts: dict[str, str] = {}
    for comp in module.computations.values():
      insts = comp.instructions.values()
      if any(i.opcode == "custom-call" and '"AsyncCollectiveStart"' in i.attrs for i in insts):
        for i in insts:
          if i.opcode in _OPCODE_KIND and (ch := _channel(i)):
            self._async_starts[ch] = comp.name

  def note(self, text: str) -> None:
    if text not in self.notes:
      self.notes.append(text)

  def visit(self, name: str) -> _Tally:
    """Communication of one execution of computation ``name``, callees included."""
    if name in self._memo:
      return self._memo[name]
    tally = _Tally()
    comp = self.module.computations.get(name)
    if comp is None or name in self._active:
      if comp is None:
        self.note(f"computation {name} not found in the HLO text; not counted")
        self.lower_bound = True
      return tally
    self._active.add(name)
    seen_channels: set[str] = set()
    self._collect(comp, tally, seen_channels, in_reduce_scatter_fusion=False, nested=False)
    self._active.discard(name)
    self._memo[name] = tally
    return tally

  def _collect(self, comp: Computation, tally: _Tally, seen_channels: set[str], *,
               in_reduce_scatter_fusion: bool, nested: bool) -> None:
    """Adds ``comp``'s collectives; fusions and async-wrapped computations count as part of it.

    A channel id met again counts once only inside fusions (TPU's async collective fusions):
    XLA:CPU gives every collective of a cloned loop body the same channel id, so two
    instructions of one computation (a forward and a backward all-to-all) are two collectives."""
    for iname, inst in comp.instructions.items():
      before = tally.total
      self._collect_one(comp, iname, inst, tally, seen_channels, in_reduce_scatter_fusion=in_reduce_scatter_fusion,
                        nested=nested)
      if not nested and tally.total != before and inst.opcode not in ("while", "call", "conditional"):
        self.per_instruction[(comp.name, iname)] = tally.total - before

  def _collect_one(self, comp: Computation, iname: str, inst: Instruction, tally: _Tally, seen_channels: set[str], *,
                   in_reduce_scatter_fusion: bool, nested: bool) -> None:
    op = inst.opcode
    kind = _OPCODE_KIND.get(op)
    if kind is not None:
      channel = _channel(inst)
      if channel:
        if (nested and channel in seen_channels) or self._async_starts.get(channel, comp.name) != comp.name:
          return
        seen_channels.add(channel)
      from_input = False
      if kind == "all_reduce" and in_reduce_scatter_fusion:
        kind, from_input = "reduce_scatter", True
      tally.bytes[kind] += _collective_bytes(inst, kind, self.module, self.notes, from_input=from_input, comp=comp)
      tally.counts[kind] += 1
    elif op in _UNCOUNTED or op.removesuffix("-start") in _UNCOUNTED:
      self.note(f"{op} present; not counted")
    elif op in ("fusion", "async-start", "call-start"):
      # call-start: an asynchronous call (XLA:TPU's SparseCore offload of a collective, the
      # callee on the ``sparsecore`` execution thread); its callee's collectives are the start's.
      for callee in computation_refs(inst.attrs, "to_apply" if op == "call-start" else "calls"):
        sub = self.module.computations.get(callee)
        if sub is None or callee in self._active:
          continue
        self._active.add(callee)
        self._collect(sub, tally, seen_channels, in_reduce_scatter_fusion=in_reduce_scatter_fusion
                      or callee.startswith("all-reduce-scatter"), nested=True)
        self._active.discard(callee)
    elif op == "while":
      self._loop(iname, inst, comp, tally)
    elif op == "call":
      for callee in computation_refs(inst.attrs, "to_apply"):
        tally.add(self.visit(callee))
    elif op == "conditional":
      branches = [c for key in ("true_computation", "false_computation", "branch_computations")
                  for c in computation_refs(inst.attrs, key)]
      tallies = [self.visit(b) for b in branches]
      if tallies:
        best = max(tallies, key=lambda t: t.total)
        if len({t.total for t in tallies}) > 1:
          self.note(f"{iname}: conditional branches communicate differently; the largest is counted")
        tally.add(best)

  def _loop(self, name: str, inst: Instruction, comp: Computation, tally: _Tally) -> None:
    """A ``while``: its body times the trip count, its condition once more. Without a count, a
    loop that communicates counts once and makes the figures a lower bound."""
    body = self.visit(inst.body) if inst.body else _Tally()
    cond = self.visit(inst.condition) if inst.condition else _Tally()
    trips = self.module.trip_count(name, comp.name)
    if trips is None:
      if not any(body.counts.values()) and not any(cond.counts.values()):
        return  # nothing inside to multiply: the figures stay exact
      self.note(f"{name}: while loop without a known trip count; its collectives are counted once "
                "(the figures are a lower bound)")
      self.lower_bound = True
      trips = 1
    tally.add(body, trips)
    tally.add(cond, trips + 1)


# ---------------------------------------------------------------------------------------------
# Public API


def collectives_from_hlo(hlo_text: str) -> Collectives:
  """Per-device bytes sent per step, by collective kind, from optimized HLO text."""
  return collectives_of_module(parse_module(hlo_text))


def collectives_of_module(module: Module) -> Collectives:
  """:func:`collectives_from_hlo` of a module already parsed."""
  return collectives_by_instruction(module)[0]


def collectives_by_instruction(module: Module) -> tuple[Collectives, dict[tuple[str, str], int]]:
  """:func:`collectives_of_module`, and the bytes one execution of each top-level instruction
  that communicates sends, by (computation, instruction name): a collective, or a fusion or
  ``async-start`` holding one; loops and calls are not entered (their bodies' instructions are)."""
  walker = _Walker(module)
  entry = module.entry
  if entry is None and module.computations:
    entry = list(module.computations)[-1]
    walker.note(f"no ENTRY computation marked; {entry} (the last one) is used")
  tally = walker.visit(entry) if entry else _Tally()
  return Collectives(bytes_by_kind=dict(tally.bytes), count_by_kind=dict(tally.counts),
                     total_bytes=tally.total, lower_bound=walker.lower_bound, notes=tuple(walker.notes)), walker.per_instruction


def collectives(compiled) -> Collectives:
  """:func:`collectives_from_hlo` of a ``jax.stages.Compiled`` (``compiled.as_text()``)."""
  return collectives_from_hlo(compiled.as_text())



def communicator_groups(module: Module) -> int:
  """How many distinct device groups one device (partition 0) runs the module's collectives in:
  XLA:GPU keeps an NCCL communicator for each (a clique per device group), so this is the count
  of communicators a device holds buffers for (:func:`jaxmem.hardware.runtime.nccl_bytes`).
  A collective with empty groups counts as the group of every device; a collective-permute (point
  to point, its pairs not a group) is not counted."""
  seen: set[tuple[int, ...]] = set()
  for inst in module.instructions.values():
    kind = collective_kind(inst)
    if kind is None or kind == "collective_permute":
      continue
    groups = collective_groups(inst, module)
    if groups is None:
      seen.add(())  # every device
      continue
    mine = next((g for g in groups if 0 in g), None)
    if mine is not None and len(mine) > 1:
      seen.add(tuple(sorted(mine)))
  return len(seen)

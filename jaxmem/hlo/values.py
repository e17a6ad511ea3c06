"""Following HLO values through a module: which instruction names a value, and which values
share one buffer over a loop.

The optimized module names a scanned layer's residual after the ``while`` that runs the layers;
the op that made it, and its source line in the layer, are inside the loop body. These walks
(over a :class:`~jaxmem.hlo.text.Module`) find it, and the values a loop carries in one buffer,
for :mod:`jaxmem.buffers.analyse`.

The CUDA plugin 0.12.0.1 runs the backward layer scan's per-layer slices of stacked residuals as
``async-start``/``async-done`` pairs around a dynamic-slice fusion (0.10.2 did not); both are
followed.
"""

from __future__ import annotations

import dataclasses

from jaxmem.hlo.text import PASS_THROUGH, Instruction, Module

_MAX_STEPS = 200  # how far a walk goes before giving up
# Ops whose metadata names the plumbing (the scan, the stacked write, a fusion's first op), not the value.
_PLUMBING = frozenset({"while", "tuple", "get-tuple-element", "dynamic-update-slice", "fusion", "call", "parameter", "opt-barrier"})
# jax's scan reads and writes its stacked inputs and outputs with these; XLA gives their names to
# the slices and reshapes it adds around them.
_SCAN_PLUMBING = ("dynamic_update_index_in_dim", "dynamic_index_in_dim")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Origin:
  """Where a loop's output comes from: the instruction in the body that computes it."""

  instruction: Instruction  # whose metadata names the value
  loop: str  # the while instruction it came out of
  index: int | None = None  # the element of the loop's output tuple it came out of


def named(ins: Instruction) -> bool:
  """Whether ``ins``'s metadata names a value rather than plumbing around it."""
  return bool(ins.op_name) and ins.opcode not in _PLUMBING and not any(p in ins.op_name for p in _SCAN_PLUMBING)


def described(module: Module, name: str, depth: int = 4) -> Instruction | None:
  """The instruction, or for one without metadata (XLA:CPU's wrapped ops, copies it adds) the
  nearest with some: inside what it calls (the root first), then its operands."""
  seen: set[str] = set()
  todo = [(name, 0)]
  while todo:
    n, d = todo.pop(0)
    if n in seen or n not in module.instructions:
      continue
    seen.add(n)
    ins = module.instructions[n]
    if ins.op_name:
      return ins
    if d >= depth:
      continue
    for c in ins.calls:
      comp = module.computations.get(c)
      if comp is not None:
        todo += [(m, d + 1) for m in ([comp.root] if comp.root else []) + [m for m in comp.instructions if m != comp.root]]
    todo += [(o, d + 1) for o in ins.operands]
  return None


@dataclasses.dataclass
class _Walk:
  """The state of :func:`origin`'s walk back from a value."""

  n: str | None
  idx: int | None
  stack: list[str] = dataclasses.field(default_factory=list)  # fusions and loops entered, innermost last
  path: list[Instruction] = dataclasses.field(default_factory=list)
  loop: str | None = None
  loop_index: int | None = None
  entered: int = 0  # where on the path the innermost loop body was entered


def origin(module: Module, name: str, index: int | None = None) -> Origin | None:
  """The instruction that computes ``name`` (tuple element ``index``), followed back through
  data movement: tuple plumbing, the stacked write of a loop (a ``dynamic-update-slice``'s update
  operand), :data:`~jaxmem.hlo.text.PASS_THROUGH` ops and into fusions (their root) and loop
  bodies (the body's ROOT tuple element) and out again (a fused parameter is the fusion's
  operand). None when the value went through no loop: the instruction's own metadata
  (:func:`described`) already names it then.
  """
  w = _Walk(n=name, idx=index)
  for _ in range(_MAX_STEPS):
    ins = module.instructions.get(w.n) if w.n else None
    if ins is None:
      return None
    w.path.append(ins)
    if not _step(module, ins, w):
      break
  else:
    return None
  if w.loop is None:
    return None
  # Its own metadata, or (a constant, an entry parameter) the nearest on the way with some that
  # is not the loop's or the stacked write's; else (a stacked layer weight: the scan's slice of an
  # input of the step) that slice.
  path = w.path
  with_names = [i for i in path if named(i)]
  computed = [i for i in with_names if i.opcode not in PASS_THROUGH]
  sliced = [i for i in path if i.op_name and i.opcode == "dynamic-slice"]
  by = path[-1] if named(path[-1]) else (computed or with_names or sliced or [None])[-1]
  return None if by is None else Origin(instruction=by, loop=w.loop, index=w.loop_index)


def _step(module: Module, ins: Instruction, w: _Walk) -> bool:
  """One step of :func:`origin` back from ``ins``; False where the walk ends."""
  op, comps = ins.opcode, module.computations
  if op == "get-tuple-element" and ins.operands:
    w.n, w.idx = ins.operands[0], ins.index
  elif op == "tuple" and w.idx is not None and w.idx < len(ins.operands):
    w.n, w.idx = ins.operands[w.idx], None
  elif op == "while" and ins.body in comps and w.idx is not None:
    if w.loop is None:
      w.loop, w.loop_index = ins.name, w.idx
    w.stack.append(w.n)
    w.entered = len(w.path)
    w.n = comps[ins.body].root  # the body's ROOT tuple, element idx
  elif op in ("fusion", "call") and ins.calls and ins.calls[0] in comps:
    w.stack.append(w.n)
    w.n = comps[ins.calls[0]].root
  elif op == "async-done" and ins.operands:
    # An async op's result: element 1 of its async-start's ((operands), result, context) tuple.
    w.n, w.idx = ins.operands[0], 1
  elif op == "async-start" and w.idx == 1 and ins.calls and ins.calls[0] in comps:
    w.stack.append(w.n)
    w.n, w.idx = comps[ins.calls[0]].root, None
  elif op == "dynamic-update-slice" and len(ins.operands) > 1:
    w.n = ins.operands[1]  # the slice written this iteration, not the buffer written into
  elif op == "dynamic-slice" and ins.operands and any(p in ins.op_name for p in _SCAN_PLUMBING):
    w.n, w.idx = ins.operands[0], None  # this layer's slice of a stacked loop input (its weights)
  elif op in PASS_THROUGH and ins.operands:
    w.n, w.idx = ins.operands[0], None
  elif op == "opt-barrier" and ins.operands:
    w.n = ins.operands[0]  # a tuple passed through unchanged; idx still selects in it
  elif op == "parameter":
    return _out_of_parameter(module, ins, w)
  else:
    return False
  return True


def _out_of_parameter(module: Module, ins: Instruction, w: _Walk) -> bool:
  """From a computation's parameter to the caller's operand it stands for."""
  callers = module.callers(ins.computation)
  caller = module.instructions.get(w.stack.pop()) if w.stack else (callers[0] if len(callers) == 1 else None)
  if caller is None or ins.computation == "" or caller.opcode not in ("fusion", "call", "while", "async-start"):
    return False
  if caller.opcode == "while":
    # A value carried into this iteration (the layer's input): an op in the body that cast or
    # moved it names the residual better than whatever made the loop's first input.
    if not caller.operands or any(named(i) for i in w.path[w.entered:]):
      return False
    w.n = caller.operands[0]  # a value passed through unchanged: its initial value names it
    return True
  if ins.index is not None and ins.index < len(caller.operands):
    w.n = caller.operands[ins.index]
    return True
  return False


def carried(module: Module, loop: str, index: int) -> set[str]:
  """The values (``name{index}`` keys, as the buffer assignment names them) that hold element
  ``index`` of the ``while`` ``loop``'s carry over the loop's life: the initial value the loop
  starts from (a stacked residual's zeros), the body's and condition's parameter, what the body
  writes into it (the stacked write, and the in-place updates before it) and the loop's output.
  XLA keeps them all in one buffer."""
  w = module.instructions.get(loop)
  if w is None or w.opcode != "while":
    return set()
  keys = {f"{loop}{{{index}}}"}
  for c in w.calls:
    comp = module.computations.get(c)
    p = next((i for i in comp.instructions.values() if i.opcode == "parameter"), None) if comp else None
    if p is not None:
      keys.add(f"{p.name}{{{index}}}")
  if w.operands:
    keys |= _aliases(module, w.operands[0], index)[0]
  if w.body in module.computations:
    # The body's result, back through the in-place updates (a dynamic-update-slice, or a fusion
    # of one, writing into its first operand) to the body's parameter.
    got, ins = _aliases(module, module.computations[w.body].root, index)
    for _ in range(_MAX_STEPS):
      keys |= got
      if ins is None or ins.opcode == "parameter" or not ins.operands or not _writes_in_place(module, ins):
        break
      got, ins = _aliases(module, ins.operands[0], None)
  return keys


def _writes_in_place(module: Module, ins: Instruction) -> bool:
  """A dynamic-update-slice, or a fusion whose root is one: it writes into its first operand."""
  if ins.opcode == "dynamic-update-slice":
    return True
  comp = module.computations.get(ins.calls[0]) if ins.opcode == "fusion" and ins.calls else None
  if comp is None or comp.root is None:
    return False
  _, root = _aliases(module, comp.root, None)
  return root is not None and root.opcode == "dynamic-update-slice"


def _aliases(module: Module, name: str | None, index: int | None) -> tuple[set[str], Instruction | None]:
  """The value keys that name (element ``index`` of) ``name`` through the ops that alias their
  operand (tuple plumbing, bitcast), and the instruction that defines it."""
  keys: set[str] = set()
  n, idx = name, index
  for _ in range(_MAX_STEPS):
    ins = module.instructions.get(n) if n else None
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

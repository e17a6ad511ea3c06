"""The compiled schedule walked: a step's simulated time per device, op by op, with the overlap
of asynchronous collectives the compiler scheduled (:func:`simulate`; :func:`timeline` walks it
a second time where the machine has a slow link, to say what that link costs).

A compiled module is scheduled: each computation's instructions are printed in the order the
device runs them, and an asynchronous collective is a start and a done with the work the
scheduler placed between them. The walk keeps two clocks, the device's compute stream and its
links:

- every other top-level op (a fusion, a custom call, an unfused op) occupies the stream for its
  own roofline, ``max(compute, memory)``: its matrix FLOPs (:mod:`jaxmem.hlo.ops`) over their
  rate, and its HBM bytes (:mod:`jaxmem.hlo.traffic`) over the bandwidth. The rate: where the
  machine has a measured rate by shape (``matmul_rate``: a GPU part in XLA's own GEMM throughput
  table, :mod:`jaxmem.hardware.matmul_rates`), each dot and cuBLAS / cuDNN GEMM at its shape's
  achieved rate (never above the peak); elsewhere (TPU, whose per-shape rates are not published)
  the peak, each matmul's rows, contracted size and columns rounded up to the matrix unit's tile
  where the machine has one. Vector work (elementwise ops and reductions,
  :func:`jaxmem.hlo.ops.vector_ops`) runs beside the matrix work, at the vector unit's rate where
  the part's is published (``Machine.vector_rate``), and the op's compute term is the slower of
  the two; the insides of kernels (splash's softmax) are not in the HLO and are not counted.
  Kernels' matrix work counts at the peak: megablox's grouped matmuls as their tiles do the work
  (:mod:`jaxmem.steptime.kernels`: every row-tile visit over the ragged groups a whole block,
  each grid step the slower of its block matmul and the blocks it fetches; never faster than the
  kernel's measured rate at its shape where the part has one, :mod:`jaxmem.hardware.gmm_rates`),
  the fused attention kernels by their FLOP count;
- a collective's transfer takes ``latency + bytes / bandwidth`` on its link (the bytes it
  sends: :mod:`jaxmem.hlo.comms`), and the link carries one transfer at a time (a second waits
  for the first). Inside a TPU slice whose devices' chip coordinates are known
  (:class:`jaxmem.hardware.machine.Torus`) the bandwidth is that of the links the collective's
  group drives: one link a direction per grid axis it spans, both directions where it covers a whole axis that wraps around, so a
  collective over one axis of a small slice (no wraparound) sends at a sixth of what the chip's
  six links carry together; elsewhere the chip's whole ICI (or a GPU's NVLink). The latency
  is ``base + steps x step`` with the ring's steps (all-reduce 2(g-1), all-gather,
  reduce-scatter and all-to-all g-1, collective-permute 1: the step counts of NCCL's tuning
  model, ``src/graph/tuning.cc``);
- a synchronous collective blocks the stream until its transfer ends; a start lets the stream
  go on and its done waits only for what is left of the transfer: the exposed communication;
- a collective offloaded to another execution thread runs in a queue of its own. With the
  recipes' flags XLA:TPU runs FSDP's all-gathers and reduce-scatters on the SparseCores ("Each
  TPU7x chip contains two TensorCores and four SparseCores", cloud.google.com/tpu/docs/tpu7x; "a
  TPU chip may have 2 or 4 SparseCores", docs.jax.dev/en/latest/pallas/tpu/sparsecore.html): a
  ``call-start`` of a computation on the ``sparsecore`` execution thread (the start's
  ``async_execution_thread="sparsecore"``, its ``sparse_core_config`` ``"offload":
  "OFFLOAD_COLLECTIVE"``), a ``call-update`` that hands over the shard, and a ``call-done``. None
  of them takes time on the TensorCore's stream; the transfer starts at the last update (the
  start, where it takes its operands itself), on the links the group drives as any collective's,
  the SparseCore's collectives one after another in their own queue beside the TensorCore's, and
  the done waits for what is left of it. No rate of the SparseCore's own for collectives is
  published: the links' rate, their bound, times them;
- host offload's transfers (an array copied to or from host memory, space ``S(5)`` in a TPU
  layout, or sliced out of or written into a buffer there: :func:`host_transfer`) take their bytes
  over the device's host link (``Machine.host``: PCIe, the part's published rate each way, shared
  by a chip's devices), one queue a direction: a ``copy-start`` or an asynchronous slice's start
  lets the stream go on and its done waits for what is left; a plain copy blocks the stream. Where
  the part publishes no host link rate (v5e, v5p, TPU7x) they are not timed, and a note says so;
- a collective whose group spans several slices (TPU, over DCN) or hosts (GPU, over the hosts'
  network) runs hierarchically (Jia et al. 2018, "Highly Scalable Deep Learning Training System
  with Mixed-Precision", hierarchical all-reduce): a ring inside each slice or host over the fast
  link, then one across them over the slow link carrying 1/a of the buffer (a devices per slice
  or host in the group); an all-to-all or a collective-permute that spans them sends all its
  bytes over the slow link;
- a ``while`` runs its body trip-count times: the first two trips are walked (an asynchronous
  collective may start in one trip and finish in the next) and the second's time stands for
  the trips after it; a ``conditional`` runs its slowest branch; a ``call`` runs its callee.

The walk's time is never below the roofline's bound (:mod:`jaxmem.steptime.roofline`): each
op takes at least its own terms at the peak rates, and the stream and the links each do all
their work. Each op's own figures (its compute and memory terms, what it sends) are read once
(:class:`OpWork`) and shared by every walk of the same module on the same device rates.
"""

from __future__ import annotations

import dataclasses
import re

from jaxmem.hardware.machine import Link, Machine
from jaxmem.hlo.comms import collective_groups, collective_kind, group_size, shape_bytes
from jaxmem.hlo.ops import HloCosts, matrix_flops, matrix_seconds, vector_ops
from jaxmem.hlo.text import Computation, Instruction, Module, computation_refs, matching, split_top
from jaxmem.records import Record
from jaxmem.steptime.kernels import GroupedMatmul, grouped_matmul
from jaxmem.steptime.moe import MoeTerms, moe_terms

TERMS = ("compute", "memory", "comm")  # the terms an op's time, and the step's, is bound by
_ASYNC_DONE = ("all-gather-done", "all-reduce-done", "collective-permute-done", "async-done")
_FREE = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id", "replica-id",
    "opt-barrier", "add-dependency", "domain", "async-update",
})
# The execution thread an asynchronous start runs its computation on, where not the main one (XLA
# prints it on the start, ``async_execution_thread="sparsecore"``, and on the computation, after
# its closing brace: ``execution_thread="sparsecore"``).
_THREAD = re.compile(r'(?:^|[\s,])async_execution_thread="([^"]+)"')
# Host memory's space in a TPU layout, ``{1,0:T(8,128)S(5)}`` (jaxmem.hlo.traffic: S(1) is the
# on-chip VMEM); an array in it lives in the host's pinned memory (remat offload's destination).
_ARRAY = re.compile(r"\b[a-z][a-z0-9]*\[[^\]]*\](\{[^}]*\})?")
_HOST_SPACE = re.compile(r"S\(5\)")
# The ops that move an array to or from host memory: a copy, or a slice read from or written into
# a host buffer (remat offload's layer stack), each also as an asynchronous start and done.
_HOST_MOVES = frozenset({"copy", "dynamic-slice", "dynamic-update-slice"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpRun(Record):
  """One top-level op's simulated figures per step (all its executions). ``compute_time_s``
  times its matrix FLOPs rounded up to the tile (``padded_flops``) at the peak, or each matmul at
  its shape's achieved rate where the machine has one (``Machine.matmul_rate``), or its elementwise
  operations (``vector_ops``) at the vector unit's rate where that takes longer (the two units
  run at once); ``comm_time_s`` its
  transfers on their link; ``time_s`` what it adds to the step: its time on the stream, plus,
  for a collective, the wait it causes (``exposed_comm_time_s``). ``bound``: the term that sets
  its time on the stream (``comm`` for a collective)."""

  name: str
  opcode: str
  kind: str = ""
  op_name: str = ""
  computation: str = ""
  count: int = 0
  flops: float = 0.0
  padded_flops: float = 0.0
  vector_ops: float = 0.0
  bytes_accessed: int = 0
  comm_bytes: int = 0
  link: str | None = None
  compute_time_s: float = 0.0
  memory_time_s: float = 0.0
  comm_time_s: float = 0.0
  exposed_comm_time_s: float = 0.0
  time_s: float = 0.0
  bound: str = "memory"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timeline(Record):
  """The walk's result: ``step_time_s`` (the simulated step), how much of it each term bounds
  (``*_bound_time_s``: the stream's time in ops each term bounds, and the communication the
  stream waited for; they sum to the step), the links' busy time (``comm_time_s``, every link
  together) and the part of it nothing overlapped (``exposed_comm_time_s``), and every op,
  slowest first.

  ``link_comm_time_s``: the transfer time on each of the machine's links, keyed by the link's
  step-time field (``{"ici_comm_time_s": ...}``, :class:`jaxmem.hardware.machine.Link`): a
  collective whose group spans slices or hosts is counted whole on the slow link (DCN, the hosts'
  network), its inside rings included, and every other on the fast one (ICI, NVLink); ``None``
  for a link with no published bandwidth (its collectives are not timed). They sum to
  ``comm_time_s`` where every link is timed."""

  step_time_s: float
  compute_bound_time_s: float
  memory_bound_time_s: float
  comm_bound_time_s: float
  comm_time_s: float
  exposed_comm_time_s: float
  link_comm_time_s: dict[str, float | None] = dataclasses.field(default_factory=dict)
  # The slow link (DCN across slices, the hosts' network across hosts); None where the machine is
  # one slice or host.
  slow_link: Link | None = None
  # The same schedule walked with every collective on the fast link (ICI, NVLink), as if the
  # slices or hosts were one: the step minus it is what the slow link costs (:func:`timeline`).
  fast_link_step_time_s: float | None = None
  # The matrix FLOPs of matmuls of two fp8 operands, per step (those the machine's fp8 rate timed).
  fp8_flops: float = 0.0
  ops: tuple[OpRun, ...] = ()
  notes: tuple[str, ...] = ()
  # What a mixture-of-experts step spends its time on, by term (jaxmem.steptime.moe); None for a
  # program without grouped matmul kernels.
  moe: MoeTerms | None = None
  # Of exposed_comm_time_s, the wait for transfers over the host link (host offload's copies).
  exposed_host_time_s: float = 0.0

  def across(self) -> dict[str, float]:
    """The collectives that cross slices or hosts, by kind, with their transfer seconds per step,
    largest first; empty where nothing crosses."""
    out: dict[str, float] = {}
    for o in self.ops:
      if self.slow_link is not None and o.link == self.slow_link.name:
        kind = o.opcode.removesuffix("-start")
        out[kind] = out.get(kind, 0.0) + o.comm_time_s
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))

  def share(self, term: str) -> float | None:
    """The fraction of the step that ``term`` bounds."""
    return None if not self.step_time_s else getattr(self, f"{term}_bound_time_s") / self.step_time_s


@dataclasses.dataclass
class _Cost:
  """One execution of an op: its stream time and terms, and its transfer (if a collective)."""

  compute: float
  memory: float
  flops: float
  padded: float
  bytes: int
  comm_bytes: int = 0
  vector_ops: float = 0.0
  transfer: float = 0.0  # seconds on its link
  link: str | None = None
  start: bool = False  # a start of an asynchronous collective
  sync: bool = False  # a synchronous collective
  channels: tuple[str, ...] = ()  # TPU's async collective fusions: the channels a start or done carries
  done_of: str | None = None  # a done: the start it finishes
  inner: Instruction | None = None  # a collective step: the collective whose transfer it times
  # The queue its transfer waits in: None, the links' (the TensorCore's collectives); an execution
  # thread's ("sparsecore": the collectives offloaded to it); the host link's, each way ("host:to",
  # "host:from").
  queue: str | None = None
  key: str | None = None  # what its done finds it by, where not its own name (the chain's start)
  off_stream: bool = False  # another engine does its work: it takes no time on the stream
  host_bytes: int = 0  # a transfer to or from host memory: the bytes it moves over the host link


class _State:
  def __init__(self):
    self.clock = 0.0
    self.link_free = 0.0
    self.queues: dict[str, float] = {}  # queue -> when it is free (the link's is link_free)
    self.pending: dict[str, tuple[float, tuple[str, str]]] = {}  # start key -> (transfer end, start op)

  def copy(self) -> _State:
    other = _State()
    other.clock, other.link_free, other.pending = self.clock, self.link_free, dict(self.pending)
    other.queues = dict(self.queues)
    return other

  def shift(self, dt: float) -> None:
    self.clock += dt
    self.link_free += dt
    self.queues = {q: t + dt for q, t in self.queues.items()}
    self.pending = {k: (end + dt, op) for k, (end, op) in self.pending.items()}

  def free(self, queue: str | None) -> float:
    return self.link_free if queue is None else self.queues.get(queue, 0.0)

  def occupy(self, queue: str | None, begin: float, seconds: float) -> float:
    """Puts a transfer of ``seconds`` on ``queue`` from ``begin``; returns when it ends."""
    end = begin + seconds
    if queue is None:
      self.link_free = end
    else:
      self.queues[queue] = end
    return end

  def last(self) -> float:
    """When the last transfer on any queue ends."""
    return max([self.link_free, *self.queues.values()])


def _async_role(module: Module, ins: Instruction) -> str | None:
  """``start`` or ``done`` for TPU's asynchronous collective fusions (a fusion around a custom
  call ``AsyncCollectiveStart`` or ``AsyncCollectiveDone``), else None."""
  if ins.opcode != "fusion":
    return None
  for callee in ins.calls:
    comp = module.computations.get(callee)
    for inner in comp.instructions.values() if comp is not None else ():
      if inner.opcode == "custom-call" and '"AsyncCollectiveStart"' in inner.attrs:
        return "start"
      if inner.opcode == "custom-call" and '"AsyncCollectiveDone"' in inner.attrs:
        return "done"
  return None


def _inner_collectives(module: Module, ins: Instruction, depth: int = 0) -> list[Instruction]:
  """The collectives ``ins`` is or holds (fusions, async-wrapped computations and asynchronous
  calls looked into)."""
  if collective_kind(ins):
    return [ins]
  if depth > 4 or ins.opcode not in ("fusion", "async-start", "call-start"):
    return []
  out: list[Instruction] = []
  for callee in ins.calls:
    comp = module.computations.get(callee)
    for inner in comp.instructions.values() if comp is not None else ():
      out += _inner_collectives(module, inner, depth + 1)
  return out


def _thread(ins: Instruction) -> str | None:
  """The execution thread an asynchronous start runs on, where not the main one."""
  m = _THREAD.search(ins.attrs) if "async_execution_thread" in ins.attrs else None
  return m.group(1) if m and m.group(1) != "main" else None


def _chain_start(module: Module, comp: str, ins: Instruction) -> Instruction | None:
  """The ``-start`` an asynchronous op belongs to: itself, or the start an ``-update`` or ``-done``
  continues, looked through the updates between (XLA's async-start / async-update / async-done,
  printed by the wrapped op's name: ``call-start``, ``call-update``, ``call-done``)."""
  for _ in range(32):
    if ins.opcode.endswith("-start"):
      return ins
    if not ins.opcode.endswith(("-update", "-done")) or not ins.operands:
      return None
    ins = module.get(ins.operands[0].partition("#")[0], comp)
    if ins is None:
      return None
  return None


def _elements(shape: str) -> list[str]:
  shape = shape.strip()
  return split_top(shape[1:matching(shape, 0) - 1]) if shape.startswith("(") else [shape]


def _split_host(shapes: list[str]) -> tuple[int, int]:
  """(bytes in host memory, bytes on the device) of the arrays in ``shapes``."""
  host = device = 0
  for shape in shapes:
    for m in _ARRAY.finditer(shape):
      if "[]" in m.group(0):
        continue  # a scalar: a slice's index, not the data moved
      if _HOST_SPACE.search(m.group(1) or ""):
        host += shape_bytes(m.group(0))
      else:
        device += shape_bytes(m.group(0))
  return host, device


def host_transfer(module: Module, comp: str, ins: Instruction) -> tuple[str, int] | None:
  """``("to", bytes)`` or ``("from", bytes)`` where ``ins`` moves an array between the device and
  host memory (memory space S(5)): a copy whose result or operand is there, a dynamic-update-slice
  into a host buffer or a dynamic-slice out of one, each also as an asynchronous start (``copy-start``'s
  shape is (destination, source, context); a wrapped op's start's ((operands), result, context)).
  The bytes are what crosses: the device's side (the update written, the slice read, the copy)."""
  op = ins.opcode.removesuffix("-start")
  if op not in _HOST_MOVES:
    return None
  parts = _elements(ins.shape)
  if ins.opcode == "copy-start" and len(parts) >= 2:
    result, operands = parts[0], [parts[1]]
  elif ins.opcode.endswith("-start") and len(parts) >= 2:
    result, operands = parts[1], _elements(parts[0])
  elif ins.opcode.endswith("-start"):
    return None
  else:
    result = ins.shape
    operands = [src.shape for o in ins.operands if (src := module.get(o.partition("#")[0], comp)) is not None]
  into, out = _split_host([result]), _split_host(operands)
  if (into[0] and not out[0]) or (op == "dynamic-update-slice" and into[0]):  # written into host memory
    return ("to", out[1]) if out[1] else None
  if out[0] and not into[0]:  # read out of host memory
    return ("from", into[1]) if into[1] else None
  return None


def _channels(insts: list[Instruction]) -> tuple[str, ...]:
  return tuple(m.group(1) for i in insts if (m := re.search(r"(?:^|[\s,])channel_id=(\d+)", i.attrs)))


_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "collective_permute": lambda n: 1}


def _steps(kind: str, n: int) -> int:
  """Ring steps of a collective over ``n`` devices (NCCL's tuning model, src/graph/tuning.cc)."""
  return 0 if n <= 1 else _STEPS.get(kind, lambda n: n - 1)(n)


def transfer_time(machine: Machine, kind: str, sent: int, g: int, units: int,
                  links: int | None = None) -> tuple[float | None, str]:
  """Seconds a collective of ``kind`` takes on its link(s) to send ``sent`` bytes from one
  device over a group of ``g`` devices that spans ``units`` slices or hosts, and the link's name
  (the slow one where it spans several). ``links``: how many of the torus's links the group drives
  inside a slice (:meth:`Torus.links`; ``None``: the fast link's whole bandwidth). ``None``: the
  link has no published bandwidth."""
  fast, slow = machine.fast, machine.slow
  if links and machine.torus is not None:
    fast = dataclasses.replace(fast, bandwidth=links * machine.torus.link_bandwidth)
  if units <= 1 or slow is None or g <= 1:
    if fast.bandwidth is None:
      return None, fast.name
    return fast.base_latency_s + _steps(kind, g) * fast.step_latency_s + sent / fast.bandwidth, fast.name
  if slow.bandwidth is None:
    return None, slow.name
  a = max(1, g // units)  # devices of the group in each slice or host
  if kind in ("all_to_all", "collective_permute") or fast.bandwidth is None:
    return slow.base_latency_s + _steps(kind, units) * slow.step_latency_s + sent / slow.bandwidth, slow.name
  ring = lambda n: (n - 1) / n  # noqa: E731  (the ring's share of the buffer each device sends)
  whole = sent / ring(g)  # the buffer the ring factor was taken of (2x for an all-reduce: both halves)
  fast_bytes, slow_bytes = whole * ring(a), whole * ring(units) / a
  latency = fast.base_latency_s + _steps(kind, a) * fast.step_latency_s + _steps(kind, units) * slow.step_latency_s
  return latency + fast_bytes / fast.bandwidth + slow_bytes / slow.bandwidth, slow.name


class OpWork:
  """Each op's own figures for one execution on ``machine``'s rates (its compute and memory terms,
  what it sends, and what kind of collective step it is), read once and shared by every walk of
  ``costs``'s module at those rates: they do not depend on the links (the walk's
  :meth:`_Walker.cost` adds each collective's transfer on them)."""

  def __init__(self, costs: HloCosts, machine: Machine):
    self.module: Module = costs.module
    self.machine = machine
    self.per_op = {(o.computation, o.name): o for o in costs.ops}
    # Kernels' matrix work (fused attention, grouped matmuls) is timed too (at the peak), though the
    # module's matrix FLOPs leave it out (jaxmem.hlo.ops): fused attention by its count, unpadded;
    # the grouped matmuls by their tiles (self.grouped, below).
    self.flops = matrix_flops(self.module, kernels=True)
    self.padded = matrix_flops(self.module, machine.tile, kernels=True)
    # Of those, the matmuls of two fp8 operands, at the part's fp8 rate where it has one.
    self.fp8 = matrix_flops(self.module, machine.tile, kernels=True, fp8=True) if machine.peak_fp8_flops else None
    rate = machine.matmul_rate
    self.seconds = None if rate is None else matrix_seconds(self.module, machine.peak_flops, rate, machine.peak_fp8_flops)
    self.vector = vector_ops(self.module)
    self._memo: dict[tuple[str, str], _Cost] = {}
    # The grouped matmul kernels (megablox), timed by their tiles where the machine's matmuls are
    # timed at the peak (a measured rate by shape, a GPU's, holds no such kernel).
    self.grouped: dict[tuple[str, str], GroupedMatmul] = {} if rate is not None else self._grouped()
    # An asynchronous call's last update, by (computation, start): where its operands are all handed
    # over (a SparseCore collective's call-start takes none; its call-update passes the shard).
    self.launch: dict[tuple[str, str], str] = {}
    for comp in self.module.computations.values():
      for ins in comp.instructions.values():
        if ins.opcode.endswith("-update") and (start := _chain_start(self.module, comp.name, ins)) is not None:
          self.launch[(comp.name, start.name)] = ins.name

  def _grouped(self) -> dict[tuple[str, str], GroupedMatmul]:
    out = {}
    for comp in self.module.computations.values():
      for ins in comp.instructions.values():
        if ins.opcode != "custom-call" or '"tpu_custom_call"' not in ins.attrs:
          continue
        shapes = [src.shape if (src := self.module.get(o.partition("#")[0], comp.name)) else "" for o in ins.operands]
        kernel = grouped_matmul(ins, shapes, self.machine.tile, self.machine.part)
        if kernel is not None:
          out[(comp.name, ins.name)] = kernel
    return out

  def of(self, comp: Computation, ins: Instruction) -> _Cost:
    """One execution of ``ins``: its terms, and what kind of collective step it is, if any (its
    transfer left at 0: the links' to say)."""
    key = (comp.name, ins.name)
    if key in self._memo:
      return self._memo[key]
    o = self.per_op.get(key)
    runs = max(1, o.count) if o is not None else 1
    moved, sent = (o.bytes_accessed // runs, o.comm_bytes // runs) if o is not None else (0, 0)
    flops, padded = self.flops.of(ins), self.padded.of(ins)
    m = self.machine
    fp8 = 0.0 if self.fp8 is None else self.fp8.of(ins)
    compute = (padded - fp8) / m.peak_flops + (fp8 and fp8 / m.peak_fp8_flops) if self.seconds is None else self.seconds.of(ins)
    kernel = self.grouped.get(key)
    if kernel is not None:  # its tiles' work and the blocks it fetches (jaxmem.steptime.kernels)
      padded, moved = kernel.flops, round(kernel.bytes)
      compute = max(padded / m.peak_flops, kernel.measured_s or 0.0)  # never faster than measured
    elementwise = self.vector.of(ins)
    if m.vector_rate:
      compute = max(compute, elementwise / m.vector_rate)
    c = _Cost(compute=compute, memory=moved / m.hbm_bandwidth, flops=flops, padded=padded, bytes=moved,
              comm_bytes=sent, vector_ops=elementwise)
    self._memo[key] = c
    if self._offloaded(comp, ins, c) or self._to_host(comp, ins, c):
      return c
    role = _async_role(self.module, ins)
    if ins.opcode in _ASYNC_DONE:
      c.done_of = ins.operands[0].partition("#")[0] if ins.operands else None
    elif role == "done":
      c.channels = _channels(_inner_collectives(self.module, ins))
    elif sent or collective_kind(ins):
      inner = _inner_collectives(self.module, ins)
      if inner:
        c.inner = inner[0]
        c.start = role == "start" or ins.opcode.endswith("-start") or ins.opcode == "async-start"
        c.sync = not c.start
        c.channels = _channels(inner) if role == "start" else ()
    return c

  def _offloaded(self, comp: Computation, ins: Instruction, c: _Cost) -> bool:
    """Whether ``ins`` is a step of a collective offloaded to another execution thread (XLA:TPU's
    SparseCores: a ``call-start`` of a computation on the ``sparsecore`` thread that holds the
    collective, its ``call-update``s and its ``call-done``); if so, fills in ``c``: no time on the
    stream (the SparseCore runs it), the transfer launched at the last update (where the shard is
    handed over; at the start if it takes its operands itself) on the thread's own queue, and
    the done waiting for it."""
    start = _chain_start(self.module, comp.name, ins) if ins.opcode.endswith(("-start", "-update", "-done")) else None
    thread = None if start is None else _thread(start)
    inner = [] if thread is None else _inner_collectives(self.module, start)
    if not inner:
      return False
    c.off_stream = True
    if ins.opcode.endswith("-done"):
      c.done_of = start.name
    elif self.launch.get((comp.name, start.name), start.name) == ins.name:
      o = self.per_op.get((comp.name, start.name))
      c.comm_bytes = o.comm_bytes // max(1, o.count) if o is not None else 0
      c.inner, c.start, c.queue, c.key = inner[0], True, thread, start.name
    return True

  def _to_host(self, comp: Computation, ins: Instruction, c: _Cost) -> bool:
    """Whether ``ins`` moves an array to or from host memory (:func:`host_transfer`), or is the
    done of such a start; if so, fills in ``c``: a start is asynchronous (a DMA: no time on the
    stream, its done waits for it), a plain copy or slice blocks the stream, each on the host
    link's queue of its direction."""
    if ins.opcode.endswith("-done"):
      start = _chain_start(self.module, comp.name, ins)
      if start is not None and host_transfer(self.module, comp.name, start) is not None:
        c.done_of = start.name
        return True
      return False
    moved = host_transfer(self.module, comp.name, ins)
    if moved is None:
      return False
    c.queue, c.host_bytes = f"host:{moved[0]}", moved[1]
    c.start = ins.opcode.endswith("-start")
    c.sync, c.off_stream = not c.start, c.start
    return True


class _Walker:
  """Walks computations in schedule order, advancing a :class:`_State` (see the module docstring)."""

  def __init__(self, work: OpWork, machine: Machine):
    self.module: Module = work.module
    self.machine = machine
    self.work = work
    self.per_op = work.per_op
    self.runs: dict[tuple[str, str], dict] = {}  # (computation, op) -> accumulated figures
    self.bound_time = dict.fromkeys(TERMS, 0.0)
    self.host_exposed = 0.0  # of the communication the stream waited for, the host link's
    self.notes: list[str] = []
    self._costs: dict[tuple[str, str], _Cost] = {}

  def note(self, text: str) -> None:
    if text not in self.notes:
      self.notes.append(text)

  def run(self, name: str, state: _State, weight: float, record: bool) -> None:
    comp = self.module.computations.get(name)
    if comp is None:
      self.note(f"computation {name} not found in the HLO text; not timed")
      return
    for ins in comp.instructions.values():
      self.step(comp, ins, state, weight, record)

  def step(self, comp: Computation, ins: Instruction, state: _State, weight: float, record: bool) -> None:
    op = ins.opcode
    if op in _FREE:
      return
    if op.endswith("-done") and op not in _ASYNC_DONE:  # waited at: an offloaded collective's, a host transfer's
      cost = self.cost(comp, ins)
      if cost.done_of is not None:
        self._wait(cost, state, weight, record)
      return
    if op == "while":
      return self._loop(comp, ins, state, weight, record)
    if op == "call":
      for callee in computation_refs(ins.attrs, "to_apply"):
        self.run(callee, state, weight, record)
      return
    if op == "conditional":
      return self._branch(ins, state, weight, record)
    cost = self.cost(comp, ins)
    if cost.done_of is not None or (cost.channels and not cost.start):
      self._wait(cost, state, weight, record)
    before = state.clock
    if cost.sync:
      end = state.occupy(cost.queue, max(state.clock, state.free(cost.queue)), cost.transfer)
      state.clock = max(state.clock + cost.memory, end)
    elif not cost.off_stream:
      state.clock += max(cost.compute, cost.memory)
    if cost.start:
      end = state.occupy(cost.queue, max(state.clock, state.free(cost.queue)), cost.transfer)
      for key in cost.channels or (cost.key or ins.name,):
        state.pending[key] = (end, (comp.name, ins.name))
    if record:
      self._record(comp, ins, cost, state.clock - before, weight)

  def _wait(self, cost: _Cost, state: _State, weight: float, record: bool) -> None:
    """A done: the stream waits for what is left of its start's transfer."""
    found = [state.pending.pop(k) for k in (cost.channels or (cost.done_of,)) if k in state.pending]
    if not found:
      return  # started before a loop trip this walk did not simulate: nothing left to wait for
    end = max(e for e, _ in found)
    wait = max(0.0, end - state.clock)
    state.clock += wait
    if record and wait:
      start = found[0][1]
      self._run(start)["exposed"] += wait * weight
      self.bound_time["comm"] += wait * weight
      if self._costs[start].host_bytes:
        self.host_exposed += wait * weight

  def _record(self, comp: Computation, ins: Instruction, cost: _Cost, took: float, weight: float) -> None:
    r = self._run((comp.name, ins.name))
    r["count"] += weight
    r["stream"] += took * weight
    r["transfer"] += cost.transfer * weight
    if cost.sync:
      blocked = max(0.0, took - cost.memory)
      r["exposed"] += blocked * weight
      self.bound_time["comm"] += blocked * weight
      if cost.host_bytes:
        self.host_exposed += blocked * weight
      self.bound_time["memory"] += (took - blocked) * weight
    else:
      self.bound_time["compute" if cost.compute > cost.memory else "memory"] += took * weight

  def _run(self, key: tuple[str, str]) -> dict:
    return self.runs.setdefault(key, dict(count=0.0, stream=0.0, transfer=0.0, exposed=0.0))

  def _loop(self, comp: Computation, ins: Instruction, state: _State, weight: float, record: bool) -> None:
    trips = self.module.trip_count(ins.name, comp.name)
    if trips is None:
      self.note(f"{ins.name}: while loop without a known trip count; its body is timed once (the step time is "
                "then a lower bound)")
      trips = 1
    if trips == 0 or ins.body is None:
      return
    self.run(ins.body, state, weight, record)
    if trips == 1:
      return
    second = state.clock
    self.run(ins.body, state, weight * (trips - 1), record)
    state.shift((state.clock - second) * (trips - 2))

  def _branch(self, ins: Instruction, state: _State, weight: float, record: bool) -> None:
    branches = [c for key in ("true_computation", "false_computation", "branch_computations")
                for c in computation_refs(ins.attrs, key)]
    if not branches:
      return
    def took(b: str) -> float:
      trial = state.copy()
      self.run(b, trial, weight, record=False)
      return trial.clock
    slowest = max(branches, key=took) if len(branches) > 1 else branches[0]
    self.run(slowest, state, weight, record)

  def cost(self, comp: Computation, ins: Instruction) -> _Cost:
    """One execution of ``ins`` (:meth:`OpWork.of`), a collective's transfer timed on its link."""
    key = (comp.name, ins.name)
    if key in self._costs:
      return self._costs[key]
    c = self.work.of(comp, ins)
    if c.inner is not None:
      transfer, link = self._transfer(c.inner, c.comm_bytes)
      c = dataclasses.replace(c, transfer=transfer, link=link)
      if c.queue is not None:
        self.note(f"comm: the collectives offloaded to the {c.queue} execution thread (asynchronous calls of "
                  f"computations on it) are timed on the links their groups drive, in a queue of their own beside "
                  "the TensorCore's collectives, from the update that hands over their operand to their done; the "
                  f"{c.queue}'s own rate for collectives is not published, so the links' rate (their bound) times them")
    elif c.host_bytes:
      c = dataclasses.replace(c, **self._host(c.host_bytes))
    self._costs[key] = c
    return c

  def _host(self, moved: int) -> dict:
    """A transfer of ``moved`` bytes over the device's host link: its seconds and the link's name."""
    host = self.machine.host
    if host is None or host.bandwidth is None:
      why = "" if self.machine.host_note is None else f" ({self.machine.host_note})"
      self.note(f"host_comm_time_s: no published host link (PCIe) bandwidth for {self.machine.part}{why}; its "
                "transfers to and from host memory are not timed")
      return dict(transfer=0.0, link=None if host is None else host.name)
    return dict(transfer=moved / host.bandwidth, link=host.name)

  def _transfer(self, inner: Instruction, sent: int) -> tuple[float, str | None]:
    kind = collective_kind(inner) or "all_gather"
    g = group_size(inner, self.module)
    if g <= 1 and not sent:
      return 0.0, None
    seconds, link = transfer_time(self.machine, kind, sent, g, self._units(inner), self._links(inner, kind, g))
    if seconds is None:
      self.note(f"comm: no published bandwidth for {link} on {self.machine.part}; its collectives are not timed")
      return 0.0, link
    return seconds, link

  def _links(self, inner: Instruction, kind: str, g: int) -> int | None:
    """The torus links a collective's group drives (the fewest any of its groups does: they run
    at once, and the slowest sets the time), or ``None`` (no torus, groups not read, or a group
    on one chip: the chip's whole bandwidth)."""
    torus = self.machine.torus
    if torus is None:
      return None
    if kind == "collective_permute":
      return 1  # each device sends to one peer, over one link in one direction
    groups = collective_groups(inner, self.module)
    if groups is None:
      if g != len(torus.coords):
        self.note("comm: a collective's device groups were not read; it is timed at the chip's whole ICI bandwidth")
        return None
      groups = [list(range(g))]
    counts = [torus.links(grp) for grp in groups]
    if any(c is None for c in counts):
      self.note("comm: a collective's device ids are outside the program's devices; it is timed at the chip's "
                "whole ICI bandwidth")
      return None
    driven = [c for c in counts if c]
    return min(driven) if driven else None

  def _units(self, inner: Instruction) -> int:
    """How many slices or hosts the collective's largest group spans (1 where it cannot be told)."""
    per = self.machine.devices_per_unit
    if self.machine.slow is None or self.module.replica_count != 1:
      return 1
    if collective_kind(inner) == "collective_permute":
      pairs = re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", inner.attrs)
      return 2 if any(int(s) // per != int(t) // per for s, t in pairs) else 1
    groups = collective_groups(inner, self.module)
    if groups is None:  # every device, or a spelling not read: as many as its size fills
      return max(1, -(-group_size(inner, self.module) // per))
    return max((len({i // per for i in grp}) for grp in groups), default=1)


def simulate(costs: HloCosts, machine: Machine, work: OpWork | None = None) -> Timeline:
  """The step of ``costs``'s module (:func:`jaxmem.hlo.ops.hlo_costs_of_module`, which keeps the
  parsed module) walked on ``machine`` (see the module docstring). ``work``: its ops' own figures
  at ``machine``'s rates, where another walk already read them."""
  module = costs.module
  if module is None:
    raise ValueError("simulate needs the HloCosts of a parsed module (hlo_costs_of_module keeps it)")
  walker = _Walker(OpWork(costs, machine) if work is None else work, machine)
  state = _State()
  entry = module.entry or (list(module.computations)[-1] if module.computations else None)
  if entry:
    walker.run(entry, state, 1.0, record=True)
  tail = max(0.0, state.last() - state.clock)  # transfers no done waited for: the step ends after them
  walker.bound_time["comm"] += tail
  ops = tuple(sorted(_op_runs(walker), key=lambda o: -o.time_s))
  moe = moe_terms(module, ops, walker.work.grouped, peak_flops=machine.peak_flops)
  if moe is not None:
    walker.note(moe.summary())
  return Timeline(
      step_time_s=state.clock + tail, compute_bound_time_s=walker.bound_time["compute"],
      memory_bound_time_s=walker.bound_time["memory"], comm_bound_time_s=walker.bound_time["comm"],
      comm_time_s=sum(r["transfer"] for r in walker.runs.values()), exposed_comm_time_s=walker.bound_time["comm"],
      link_comm_time_s={link.field: None if link.bandwidth is None else sum((o.comm_time_s for o in ops
                                                                               if o.link == link.name), 0.0)
                        for link in machine.links},
      slow_link=machine.slow, ops=ops, fp8_flops=_fp8_flops(walker, machine),
      notes=tuple(machine.notes) + tuple(walker.notes), moe=moe, exposed_host_time_s=walker.host_exposed,
  )


def _fp8_flops(walker: _Walker, machine: Machine) -> float:
  """The walked ops' matrix FLOPs of two fp8 operands, unpadded (the roofline's compute term times
  them at the fp8 peak); 0 on a machine without an fp8 rate."""
  if not machine.peak_fp8_flops:
    return 0.0
  fp8 = matrix_flops(walker.module, fp8=True)
  runs = ((walker.module.get(name, comp), r["count"]) for (comp, name), r in walker.runs.items())
  return sum(fp8.of(ins) * n for ins, n in runs if ins is not None)


def timeline(costs: HloCosts, machine: Machine) -> Timeline:
  """:func:`simulate`, and where ``machine`` has a slow link that some collective crossed, the same
  schedule walked again with that link given the fast one's rates, its collectives keeping their
  hierarchical rings and their own queue (``fast_link_step_time_s``): never slower than the walk,
  so the difference is what the slow link costs. The two walks share their ops' own figures."""
  work = OpWork(costs, machine)
  walk = simulate(costs, machine, work)
  if machine.slow is None or not walk.link_comm_time_s.get(machine.slow.field):
    return walk
  fast = machine.fast
  as_fast = dataclasses.replace(machine.slow, bandwidth=fast.bandwidth, base_latency_s=fast.base_latency_s,
                                step_latency_s=fast.step_latency_s)
  twin = simulate(costs, dataclasses.replace(machine, slow=as_fast), work)
  return dataclasses.replace(walk, fast_link_step_time_s=twin.step_time_s)


def _op_runs(walker: _Walker) -> list[OpRun]:
  out = []
  for key, r in walker.runs.items():
    ins = walker.module.get(key[1], key[0])
    cost, o, n = walker._costs[key], walker.per_op.get(key), r["count"]
    own = max(cost.compute, cost.memory) * n
    collective = cost.sync or cost.start
    bound = "comm" if collective and r["transfer"] >= own else ("compute" if cost.compute > cost.memory else "memory")
    out.append(OpRun(
        name=key[1], opcode=ins.opcode if ins else "", kind=o.kind if o else "", op_name=ins.op_name if ins else "",
        computation=key[0], count=round(n), flops=cost.flops * n, padded_flops=cost.padded * n,
        vector_ops=cost.vector_ops * n,
        bytes_accessed=round(cost.bytes * n), comm_bytes=round(cost.comm_bytes * n), link=cost.link,
        compute_time_s=cost.compute * n, memory_time_s=cost.memory * n, comm_time_s=r["transfer"],
        exposed_comm_time_s=r["exposed"], time_s=r["stream"] + (0.0 if cost.sync else r["exposed"]), bound=bound,
    ))
  return out

"""Each top-level op's work per step, read from the optimized HLO: matrix FLOPs, HBM bytes and
bytes sent in collectives, with loop trip counts.

Why: the step-time terms of :mod:`jaxmem.steptime` are per step; which ops set them, and
whether each is compute-, memory- or communication-bound, is only in the per-op figures. And
``cost_analysis()`` counts a while loop's body once, which misses more than the layer scan: under
a ``tensor`` axis the TPU compiler turns matmuls into collective matmuls (``windowed_dot_general``
loops, one slice of the matmul per trip), so the per-device FLOPs it reports fall short. Counted
here with trip counts, the matrix FLOPs are right under every mesh.

An op is what :mod:`jaxmem.hlo.traffic` charges bytes to: a top-level instruction of the entry
computation or of a loop body, call or branch (a fusion, a custom call, a collective, an unfused
op), with ``count`` its executions per step (the trip counts of the loops around it multiplied).
Its figures are per step (all executions):

- ``flops``: matrix FLOPs only, of every ``dot`` and ``convolution`` it holds (nested fusions
  included) and of cuBLAS GEMM custom calls. Elementwise ops, reductions and the insides of other
  custom calls (Pallas and cuDNN attention kernels) count nothing: the matrix units' peak is what
  the compute term times, and the vector work beside it is not at that rate. (The schedule walk
  does time the fused attention kernels' matrix work, :func:`kernel_call_flops`, kept out of
  ``flops`` for the reason given there.) A ``dot``: 2 x the
  result's elements x the contracted size; a ``convolution`` (the TPU compiler writes batched
  matmuls as convolutions with dilated or padded windows): 2 x the input features / feature
  groups x the output features x the batch / batch groups x the valid (output, kernel) position
  pairs of each spatial dimension, as XLA's ``HloCostAnalysis::GetConvolutionFlops`` counts them.
- ``bytes_accessed``: :mod:`jaxmem.hlo.traffic`'s, so the ops' bytes sum to the step's.
- ``comm_bytes``: :mod:`jaxmem.hlo.comms`'s bytes sent by a collective (or by the fusion or
  ``async-start`` holding one), so the ops' sum to the step's ``comm_bytes``.
"""

from __future__ import annotations

import dataclasses
import math
import re

from jaxmem.hardware.machine import MatmulRate, MatrixTile
from jaxmem.hlo.comms import Collectives, collectives_by_instruction
from jaxmem.kernels import CUDNN_TERMS, SPLASH_TERMS, attention_kernel_flops, splash_part
from jaxmem.hlo.text import Instruction, Module, braced, parse_module
from jaxmem.hlo.traffic import Traffic, op_traffic
from jaxmem.records import Record

_DIMS = re.compile(r"^\(?\s*[a-z][a-z0-9]*\[([^\]]*)\]")
_ELEMENT = re.compile(r"^\(?\s*([a-z][a-z0-9]*)\[")
# cuBLAS and cuDNN GEMMs as XLA:GPU calls them; ``$f8``: a GEMM of fp8 operands (XLA's GemmRewriter).
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8", "__cudnn$matmul")
_SHAPE = re.compile(r"\b(bf16|f16|f32|f64|f8\w*)\[([\d,]*)\]")
_SPLASH_CALL = re.compile(r"/(splash_\w+)/pallas_call")
_COST_ESTIMATE = re.compile(r'"cost_estimate"\s*:\s*\{\s*"flops"\s*:\s*"?(\d+)')


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpCost(Record):
  """One top-level op's work per step (see the module docstring). ``name`` is the HLO
  instruction's, ``op_name`` jax's (from the metadata: the jaxpr equation it came from, e.g.
  ``jit(train_step)/jvp()/while/body/.../dot_general``), ``kind`` the fusion kind or custom-call
  target (``""`` for other ops), ``computation`` the HLO computation it sits in."""

  name: str
  opcode: str
  kind: str = ""
  op_name: str = ""
  computation: str = ""
  count: int = 1
  flops: float = 0.0
  bytes_accessed: int = 0
  comm_bytes: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class HloCosts(Record):
  """Every op's :class:`OpCost` in program order, and their totals per device per step.
  ``lower_bound``: a loop without a known trip count was counted once (the notes say which)."""

  ops: tuple[OpCost, ...] = ()
  flops: float = 0.0
  bytes_accessed: int = 0
  comm_bytes: int = 0
  lower_bound: bool = False
  notes: tuple[str, ...] = ()
  # The step's totals as their walkers give them (the report's bytes_accessed and comm fields).
  traffic: Traffic | None = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})
  collectives: Collectives | None = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})
  # The parsed module the figures were read from: its schedule (jaxmem.steptime.walk) is walked in it.
  module: Module | None = dataclasses.field(default=None, repr=False, compare=False, metadata={"as_dict": False})


def dims(shape: str) -> tuple[int, ...]:
  """The dimensions of an array shape (the first element of a tuple shape)."""
  m = _DIMS.match(shape.strip())
  if m is None or not m.group(1).strip():
    return ()
  return tuple(int(d.lstrip("<=")) for d in m.group(1).split(","))


def matrix_flops(module: Module, tile: MatrixTile | None = None, *, kernels: bool = False, fp8: bool = False):
  """A counter of the matrix FLOPs of one execution of a top-level instruction (its ``of``; see
  the module docstring), each matmul rounded up to ``tile`` where one is given; with ``kernels``,
  the kernels' custom calls too (:func:`kernel_call_flops`); with ``fp8``, only the matmuls whose
  two operands are fp8 (:func:`fp8_operands`: what a part with an fp8 matrix rate runs at it)."""
  return _Flops(module, tile, kernels=kernels, fp8=fp8)


def fp8_operands(module: Module, ins: Instruction) -> bool:
  """Whether the matmul ``ins`` (a dot, a convolution, a GEMM call) takes two fp8 operands
  (``f8e4m3fn``, ``f8e5m2``...): a matrix unit with fp8 inputs runs it at its fp8 rate; one fp8
  operand beside a bf16 one is converted and runs at the bf16 rate."""
  srcs = [module.get(o, ins.computation) for o in ins.operands[:2]]
  return len(srcs) == 2 and all(s is not None and element_type(s.shape).startswith("f8") for s in srcs)


def kernel_call_flops(ins: Instruction) -> float:
  """The matrix FLOPs of one kernel custom call: the kernel's own count where its call carries one
  (a Pallas kernel's ``pl.CostEstimate``, serialized as ``"cost_estimate":{"flops":...}`` in the
  ``tpu_custom_call``'s backend config: megablox's ``gmm`` and ``tgmm`` give 2·m·k·n), else, for
  the fused attention kernels, the accounting the models' jaxpr counters use
  (:func:`jaxmem.kernels.attention_kernel_flops`) from the call's operand shapes: splash's Pallas
  kernels (a ``tpu_custom_call`` whose jax op name ends ``/splash_.../pallas_call``, which carry
  no estimate; counted causal, as the jaxpr counter counts them) and cuDNN's fused attention
  (``__cudnn$fmha*``, its mask type from the backend config). 0 for any other custom call.

  Kept out of the op's ``flops``: the per-device share of the row's FLOPs divides the HLO's matrix
  FLOPs by the jaxpr's with kernels left out of both (:func:`jaxmem.compiler.flops.per_device_flops`);
  the schedule walk times them (:mod:`jaxmem.steptime.walk`)."""
  estimate = _COST_ESTIMATE.search(ins.attrs)
  if estimate is not None:
    return float(estimate.group(1))
  floats = [tuple(int(d) for d in dims_.split(",") if d) for _, dims_ in _SHAPE.findall(braced(ins.attrs, "operand_layout_constraints") or "")]
  floats = [d for d in floats if len(d) >= 3]
  if len(floats) < 3:
    return 0.0
  q, k, v = floats[:3]
  target = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
  target = target.group(1) if target else ""
  if target == "tpu_custom_call":
    kernel = _SPLASH_CALL.search(ins.op_name or "")
    part = splash_part(kernel.group(1)) if kernel else None
    if part is None:
      return 0.0
    t, s, h = q[-2], k[-2], q[-1]  # splash's [..., heads, T, head size]
    return attention_kernel_flops(SPLASH_TERMS[part], pairs=math.prod(q) // (t * h), t=t, s=s, h=h, vd=v[-1], causal=True)
  if target.startswith("__cudnn$fmha"):
    scores = re.search(r'"intermediate_tensor_shape"\s*:\s*\{[^}]*?"dimensions"\s*:\s*\[([^\]]*)\]', ins.attrs)
    if scores is None:
      return 0.0
    b, n, t, s = (int(x.strip().strip('"')) for x in scores.group(1).split(",")[:4])
    causal = re.search(r'"mask_type"\s*:\s*"[A-Z_]*CAUSAL', ins.attrs) is not None
    terms = CUDNN_TERMS["bwd" if "Backward" in target else "fwd"]
    return attention_kernel_flops(terms, pairs=b * n, t=t, s=s, h=q[-1], vd=v[-1], causal=causal)
  return 0.0


# The ops a vector unit runs an element at a time (XLA's HloCostAnalysis counts each as one FLOP or one
# transcendental an output element): arithmetic, comparisons, selects, conversions, and the
# transcendental functions (one op each here, the least they can cost).
_VECTOR_OPS = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "remainder", "power", "atan2", "and", "or", "xor",
    "not", "negate", "abs", "sign", "compare", "select", "clamp", "convert", "floor", "ceil", "round-nearest-afz",
    "round-nearest-even", "is-finite", "shift-left", "shift-right-logical", "shift-right-arithmetic", "popcnt",
    "count-leading-zeros", "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "sqrt", "rsqrt",
    "cbrt", "tanh", "sine", "cosine", "tan", "erf",
})


def vector_ops(module: Module):
  """A counter of the vector unit's element operations in one execution of a top-level instruction
  (its ``of``): each elementwise op of a fusion (nested fusions and calls looked into) or unfused,
  one per output element, and each ``reduce`` one per input element (XLA's HloCostAnalysis
  counts). Kernels' custom calls count nothing: their insides are not in the HLO."""
  return _VectorOps(module)


class _Counter:
  """A figure of one execution of an instruction (``of``), a called computation's being the sum
  over its instructions, each computation counted once."""

  def __init__(self, module: Module):
    self.module = module
    self._memo: dict[str, float] = {}

  def of(self, ins: Instruction) -> float:
    raise NotImplementedError

  def _computation(self, name: str) -> float:
    if name not in self._memo:
      self._memo[name] = 0.0  # a cycle counts nothing
      comp = self.module.computations.get(name)
      self._memo[name] = 0.0 if comp is None else sum(self.of(i) for i in comp.instructions.values())
    return self._memo[name]


class _VectorOps(_Counter):
  def of(self, ins: Instruction) -> float:
    op = ins.opcode
    if op in ("fusion", "call"):
      return sum(self._computation(c) for c in ins.calls)
    if op in _VECTOR_OPS:
      return float(math.prod(dims(ins.shape)))
    if op == "reduce" and ins.operands:
      src = self.module.get(ins.operands[0], ins.computation)
      return 0.0 if src is None else float(math.prod(dims(src.shape)) * max(1, len(ins.operands) // 2))
    return 0.0


def matrix_seconds(module: Module, peak_flops: float, rate: MatmulRate, peak_fp8_flops: float | None = None):
  """A counter of the seconds the matrix FLOPs of one execution of a top-level instruction take
  (its ``of``): each ``dot`` and cuBLAS / cuDNN GEMM at ``rate`` for its shape (the achieved rate,
  never above ``peak_flops``: the datasheet peak is the ceiling), or at ``peak_flops`` where
  ``rate`` has none; a ``convolution`` at ``peak_flops``. A matmul of two fp8 operands
  (:func:`fp8_operands`) has ``peak_fp8_flops`` for its peak where given. Matmuls are not rounded
  up to a tile: a measured rate by shape already holds what a tile would cost."""
  return _Seconds(module, peak_flops, rate, peak_fp8_flops)


def element_type(shape: str) -> str:
  """The element type of an array shape (of the first element of a tuple shape): ``bf16``."""
  m = _ELEMENT.match(shape.strip())
  return "" if m is None else m.group(1)


def _listed(attrs: str, key: str) -> tuple[int, ...]:
  text = braced(attrs, key)
  return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()


class _Flops(_Counter):
  """Matrix FLOPs of one execution of an instruction, fused computations looked into. With
  ``tile`` (the matrix unit's (rows, contracted, columns) granule, :class:`MatrixTile`), each
  matmul's dimensions are first rounded up to it: the FLOPs the matrix unit spends on them."""

  def __init__(self, module: Module, tile: MatrixTile | None = None, *, kernels: bool = False, fp8: bool = False):
    super().__init__(module)
    self.tile = tile
    self.kernels = kernels
    self.fp8 = fp8  # only the matmuls of two fp8 operands (a kernel's operands are not read: none)

  def of(self, ins: Instruction) -> float:
    op = ins.opcode
    if self.fp8 and op in ("dot", "convolution", "custom-call") and not fp8_operands(self.module, ins):
      return 0.0
    if op == "dot":
      return self._dot(ins)
    if op == "convolution":
      return self._convolution(ins)
    if op == "custom-call" and any(f'custom_call_target="{t}"' in ins.attrs for t in _GEMM_TARGETS):
      return self._gemm(ins)
    if op == "custom-call" and self.kernels:
      return self._kernel(ins)
    if op in ("fusion", "fusion-start", "async-start", "call"):
      return sum(self._computation(c) for c in ins.calls)
    return 0.0

  def _kernel(self, ins: Instruction) -> float:
    return kernel_call_flops(ins)


  def _operand(self, ins: Instruction, i: int) -> Instruction | None:
    return self.module.get(ins.operands[i], ins.computation) if len(ins.operands) > i else None

  def _operand_dims(self, ins: Instruction, i: int) -> tuple[int, ...]:
    src = self._operand(ins, i)
    return () if src is None else dims(src.shape)

  def _dot(self, ins: Instruction) -> float:
    lhs = self._operand_dims(ins, 0)
    contracting = _listed(ins.attrs, "lhs_contracting_dims")
    contracted = math.prod(lhs[d] for d in contracting if d < len(lhs))
    if self.tile is None:
      return 2.0 * math.prod(dims(ins.shape)) * contracted
    rhs = self._operand_dims(ins, 1)
    lhs_batch, rhs_batch = _listed(ins.attrs, "lhs_batch_dims"), _listed(ins.attrs, "rhs_batch_dims")
    rhs_contracting = _listed(ins.attrs, "rhs_contracting_dims")
    batch = math.prod(lhs[d] for d in lhs_batch if d < len(lhs))
    rows = math.prod(n for d, n in enumerate(lhs) if d not in lhs_batch and d not in contracting)
    cols = math.prod(n for d, n in enumerate(rhs) if d not in rhs_batch and d not in rhs_contracting)
    return 2.0 * batch * self.tile.padded(rows, contracted, cols)

  def _gemm(self, ins: Instruction) -> float:
    lhs = self._operand_dims(ins, 0)
    contracting = _configured(ins.attrs, "lhs_contracting_dimensions")
    return 2.0 * math.prod(dims(ins.shape)) * math.prod(lhs[d] for d in contracting if d < len(lhs))

  def _shape(self, ins: Instruction, lhs_batch, lhs_contracting, rhs_batch, rhs_contracting) -> tuple:
    """A matmul's (batch, rows, columns, contracted) and XLA's dtype key (``bf16xbf16->bf16``),
    as XLA's ``ExtractDotSpec`` reads them (matmul_interpolator.cc)."""
    lhs, rhs = self._operand_dims(ins, 0), self._operand_dims(ins, 1)
    batch = math.prod(lhs[d] for d in lhs_batch if d < len(lhs))
    contracted = math.prod(lhs[d] for d in lhs_contracting if d < len(lhs))
    rows = math.prod(n for d, n in enumerate(lhs) if d not in lhs_batch and d not in lhs_contracting)
    cols = math.prod(n for d, n in enumerate(rhs) if d not in rhs_batch and d not in rhs_contracting)
    types = [self._operand(ins, i) for i in (0, 1)]
    lhs_type, rhs_type = ("" if t is None else element_type(t.shape) for t in types)
    return batch, rows, cols, contracted, f"{lhs_type}x{rhs_type}->{element_type(ins.shape)}"

  def _convolution(self, ins: Instruction) -> float:
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs)
    lhs, rhs, out = self._operand_dims(ins, 0), self._operand_dims(ins, 1), dims(ins.shape)
    if labels is None or not lhs or not rhs or not out:
      return 0.0
    ll, rl, ol = labels.groups()
    groups = re.search(r"feature_group_count=(\d+)", ins.attrs)
    batch_groups = re.search(r"batch_group_count=(\d+)", ins.attrs)
    fma = (lhs[ll.index("f")] // (int(groups.group(1)) if groups else 1)) * out[ol.index("f")]
    fma *= lhs[ll.index("b")] // (int(batch_groups.group(1)) if batch_groups else 1)
    window = _window(ins.attrs)
    spatial = sorted(c for c in ll if c.isdigit())
    rows = float(lhs[ll.index("b")] // (int(batch_groups.group(1)) if batch_groups else 1))
    contracted = float(lhs[ll.index("f")] // (int(groups.group(1)) if groups else 1))
    for k, d in enumerate(spatial):
      w = window[k] if k < len(window) else {}
      kernel, output = rhs[rl.index(d)], out[ol.index(d)]
      valid = _valid_positions(lhs[ll.index(d)], kernel, output, **w)
      fma *= valid
      # The matmul a spatial dimension makes of the convolution (im2col): the output positions
      # that share a kernel position are more rows of one matmul, and the kernel positions that
      # sum into one output more of its contracted size (the heads a projection's window spans,
      # 64 x 128 as one contraction of 8192); a dimension where each output has a kernel position
      # of its own (a batched matmul written as a convolution) adds neither.
      if valid:
        rows *= valid / kernel
        contracted *= valid / output
    if self.tile is not None:  # each rounded up to the tile, as a dot's
      r, c, n = max(1, round(rows)), max(1, round(contracted)), out[ol.index("f")]
      fma *= self.tile.padded(r, c, n) / (r * c * n)
    return 2.0 * fma


def _configured(attrs: str, key: str) -> list[int]:
  """A dimension list from a cuBLAS call's backend config (which carries the dot's dimension
  numbers): ``"lhs_contracting_dimensions":["1"]``."""
  m = re.search(rf'"{key}"\s*:\s*\[([^\]]*)\]', attrs)
  return [int(x.strip().strip('"')) for x in m.group(1).split(",") if x.strip()] if m else []


class _Seconds(_Flops):
  """Seconds of the matrix FLOPs of one execution of an instruction (see :func:`matrix_seconds`)."""

  def __init__(self, module: Module, peak_flops: float, rate: MatmulRate, peak_fp8_flops: float | None = None):
    super().__init__(module, kernels=True)
    self.peak, self.rate, self.peak_fp8 = peak_flops, rate, peak_fp8_flops

  def _kernel(self, ins: Instruction) -> float:
    return super()._kernel(ins) / self.peak  # no measured rate for fused attention: at the peak

  def _peak(self, ins: Instruction) -> float:
    return self.peak_fp8 if self.peak_fp8 and fp8_operands(self.module, ins) else self.peak

  def _at_rate(self, flops: float, shape: tuple, peak: float) -> float:
    achieved = self.rate(*shape) if flops else None
    return flops / (peak if achieved is None else min(achieved, peak))

  def _dot(self, ins: Instruction) -> float:
    shape = self._shape(ins, _listed(ins.attrs, "lhs_batch_dims"), _listed(ins.attrs, "lhs_contracting_dims"),
                        _listed(ins.attrs, "rhs_batch_dims"), _listed(ins.attrs, "rhs_contracting_dims"))
    return self._at_rate(super()._dot(ins), shape, self._peak(ins))

  def _gemm(self, ins: Instruction) -> float:
    shape = self._shape(ins, *(_configured(ins.attrs, f"{side}_{kind}_dimensions")
                               for side in ("lhs", "rhs") for kind in ("batch", "contracting")))
    return self._at_rate(super()._gemm(ins), shape, self._peak(ins))

  def _convolution(self, ins: Instruction) -> float:
    return super()._convolution(ins) / self._peak(ins)


def _window(attrs: str) -> list[dict[str, int]]:
  """``window={size=8x3 stride=7 pad=7_7x0_0 lhs_dilate=8 rhs_dilate=1}`` per spatial dimension."""
  text = braced(attrs, "window") or ""
  fields = dict(kv.split("=", 1) for kv in text.split() if "=" in kv)
  n = len(fields.get("size", "").split("x")) if fields.get("size") else 0
  out: list[dict[str, int]] = [{} for _ in range(n)]
  for key, name in (("stride", "stride"), ("lhs_dilate", "base_dilation"), ("rhs_dilate", "window_dilation")):
    for i, v in enumerate(fields.get(key, "").split("x") if key in fields else []):
      out[i][name] = int(v)
  for i, v in enumerate(fields.get("pad", "").split("x") if "pad" in fields else []):
    out[i]["pad_low"] = int(v.split("_")[0])
  return out


def _valid_positions(input_size: int, kernel: int, output: int, *, stride: int = 1, pad_low: int = 0,
                     base_dilation: int = 1, window_dilation: int = 1) -> int:
  """The (output, kernel) position pairs of one spatial dimension that read an input element (not
  padding, not a hole of the base dilation): XLA's ``valid_position_count``."""
  count = 0
  for k in range(kernel):
    start = k * window_dilation - pad_low  # the (base-dilated) input index kernel position k reads at output 0
    if base_dilation == 1:  # the outputs o with 0 <= start + o * stride < input_size, in closed form
      first = -(start // stride) if start < 0 else 0  # ceil(-start / stride)
      last = min(output - 1, (input_size - 1 - start) // stride) if start <= input_size - 1 else -1
      count += max(0, last - first + 1)
    else:  # only indices on the dilation grid read an input element
      count += _on_grid(start, stride, base_dilation, input_size, output)
  return count


def _on_grid(start: int, stride: int, dilation: int, input_size: int, output: int) -> int:
  """The outputs ``o`` in ``[0, output)`` whose index ``u = start + o * stride`` is on the base
  dilation's grid (``u % dilation == 0``) and inside the input (``0 <= u // dilation <
  input_size``), in closed form: a linear congruence ``o * stride = -start (mod dilation)``
  counted over the range of ``o`` that stays inside (a loop over the outputs took minutes on the
  batch-sized dimensions of a large batch's gradient convolutions)."""
  lo = max(0, -(start // stride) if start < 0 else 0)  # u >= 0
  hi = min(output - 1, ((input_size - 1) * dilation - start) // stride)  # u <= the last input's index
  g = math.gcd(stride, dilation)
  if hi < lo or (-start) % g:
    return 0
  m = dilation // g  # the solutions repeat every m outputs
  first_solution = ((-start) // g * pow(stride // g, -1, m)) % m if m > 1 else 0
  first = lo + (first_solution - lo) % m
  return 0 if first > hi else (hi - first) // m + 1


def hlo_costs_of_module(module: Module) -> HloCosts:
  """Every top-level op's figures per step (see the module docstring) and their totals."""
  traffic_ops, traffic = op_traffic(module)
  comm, sent = collectives_by_instruction(module)
  counter = _Flops(module)
  ops = []
  for t in traffic_ops:
    ins = t.instruction
    target = re.search(r'custom_call_target="([^"]*)"', ins.attrs) if ins.opcode == "custom-call" else None
    kind = re.search(r"\bkind=(k\w+)", ins.attrs) if ins.opcode.startswith("fusion") else None
    ops.append(OpCost(
        name=ins.name, opcode=ins.opcode, kind=(target or kind).group(1) if (target or kind) else "",
        op_name=ins.op_name, computation=ins.computation, count=t.count, flops=t.count * counter.of(ins),
        bytes_accessed=t.count * t.bytes_once, comm_bytes=t.count * sent.get((ins.computation, ins.name), 0),
    ))
  notes = traffic.notes + tuple(n for n in comm.notes if n not in traffic.notes)
  return HloCosts(
      ops=tuple(ops), flops=sum(o.flops for o in ops), bytes_accessed=traffic.bytes_accessed,
      comm_bytes=sum(o.comm_bytes for o in ops), lower_bound=traffic.lower_bound or comm.lower_bound, notes=notes,
      traffic=traffic, collectives=comm, module=module,
  )


def hlo_costs(hlo_text: str) -> HloCosts:
  """:func:`hlo_costs_of_module` of optimized HLO text (``compiled.as_text()``)."""
  return hlo_costs_of_module(parse_module(hlo_text))

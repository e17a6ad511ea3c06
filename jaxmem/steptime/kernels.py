"""The grouped matmul kernel of a mixture-of-experts step timed as its tiles do the work.

A dropless MoE layer on TPU runs its experts' matmuls in megablox's grouped matmul, a Pallas
(Mosaic) kernel the optimized HLO holds as a ``tpu_custom_call``: ``gmm`` (tokens sorted by expert
times each expert's weights) and ``tgmm`` (the weights' gradient, one output block per expert).
Its call carries ``pl.CostEstimate(flops=2*m*k*n)`` (jax ``experimental/pallas/ops/tpu/megablox/
gmm.py``, ``gmm`` and ``tgmm``), the matmul as if the rows were packed; the kernel does more.

How the kernel works (megablox ``gmm.py``, the same algorithm in MaxText's fork and tokamax's
``ragged_dot``):

- its rows (the routed tokens, ``m`` = tokens x top-k, sorted by expert) are cut into row tiles of
  ``tm``; ``make_group_metadata`` visits a row tile once for the group that owns its first row and
  once more for every other group that starts inside it ("tiles_m <= group_tiles.sum() <=
  tiles_m + num_groups - 1"), and each visit runs the whole ``tm x tk x tn`` block on the matrix
  unit, the rows of other groups masked. The number of visits is dynamic (the grid's row
  dimension, ``num_active_tiles``); its static bound sizes the metadata arrays;
- ``k`` and ``n`` not divisible by their tiles take one more, masked, block
  (``_calculate_irregular_num_tiles``);
- the grid is ``(tiles_n, visits, tiles_k)`` for ``gmm`` and ``(tiles_n, tiles_k, visits)`` for
  ``tgmm``, which also visits every empty group once (``visit_empty_groups=True``: its output
  block must be written).

The tiles are read from the compiled program itself: the call's Mosaic body (its backend config's
``"body"``, MLIR bytecode) declares the kernel's grid (``iteration_bounds``, the dynamic dimension
as INT64_MIN), its scalar-prefetch arrays (the group metadata: ``group_offsets`` of G + 1 entries,
then the visit arrays) and each pipelined operand's block (``window_params``; the kernel's
argument types give each block's element type). Read there, ``tm``, ``tk``, ``tn`` are whatever
the model asked for: MaxText's ``tile_batch_seq``, ``tile_activation_dim``, ``tile_weight_dim``
(512, 1024, 1024 in its base.yml, cut to each dimension with ``min(tile, dim)``, layers/moe.py),
jaxmem's own model's ``GMM_TILING`` (the same), a recipe's ``wi_tile_*``.

The visits a step makes depend on the routing: under random routing (MaxText's
``use_random_routing``: every (token, k) slot draws its expert uniformly) a group's size is
binomial with mean ``m / G``, and where a group starts inside a row tile is uniform over the
tile, so each non-empty group after the first splits a tile with probability ``(tm - 1) / tm``
(:func:`expected_visits`). Learned routing with a load-balancing loss lands its group boundaries
the same way; only sizes that are multiples of ``tm`` would not.

Each grid step is timed as the Pallas TPU guide times a pipelined kernel ("Performance of
pipelined kernels", docs/pallas/tpu/matmul.md: "we actually care about the FLOPs vs memory
bandwidth usage of each individual instance of the kernel"): its block matmul at the matrix rate
against the blocks it fetches at HBM bandwidth (both inputs' blocks change index every step;
each output element is written once), the slower of the two.

The tiles at the peak are what the kernel cannot beat; what it reaches is measured: tokamax's
autotuning cache times its copy of the algorithm by shape on TPU v5p, v5e and Ironwood
(:mod:`jaxmem.hardware.gmm_rates`). Where the call's part has one, the call takes at least its
2·m·k·n at the nearest measured shape's achieved rate (``measured_s``).
"""

from __future__ import annotations

import base64
import dataclasses
import math
import re
from functools import lru_cache

from jaxmem.hardware.gmm_rates import achieved_flops
from jaxmem.hardware.machine import MatrixTile
from jaxmem.hlo.text import Instruction
from jaxmem.records import Record

_BODY = re.compile(r'"custom_call_config"\s*:\s*\{\s*"body"\s*:\s*"([^"]*)"')
_ARRAYS = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_DYNAMIC = -(2**63)  # how Mosaic spells a grid dimension known only at run time (INT64_MIN)
_BYTES = {"f64": 8, "f32": 4, "i32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "i16": 2, "i8": 1, "s8": 1,
          "u8": 1}


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelPlan(Record):
  """A Pallas TPU kernel's static plan as its Mosaic body declares it: ``grid`` (the iteration
  bounds, ``None`` for a dimension known only at run time), ``prefetch`` (the scalar-prefetch
  arrays' lengths), ``blocks`` (each pipelined operand's block, inputs then outputs) and
  ``block_bytes`` (each block's element size)."""

  grid: tuple[int | None, ...]
  prefetch: tuple[int, ...]
  blocks: tuple[tuple[int, ...], ...]
  block_bytes: tuple[int, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupedMatmul(Record):
  """One grouped matmul call's tiles (see the module docstring): row, contracted and column
  tiles ``tm``, ``tk``, ``tn``; ``rows`` (``m``), ``groups`` (all experts, ``G``) and
  ``local_groups`` (the experts this device holds); ``k`` and ``n`` (the contracted and the
  output's columns: ``[m, k] x [k, n]`` a group); ``static_steps`` (the grid's static
  dimensions' product: tiles of ``k`` x tiles of ``n``); ``visits`` (the expected row-tile
  visits, :func:`expected_visits`); ``step_flops`` (one block matmul, rounded up to the matrix
  unit's tile); ``step_bytes`` (the input blocks one step fetches); ``out_bytes`` (the output);
  ``measured_s``: the call's time at its part's measured rate (:mod:`jaxmem.hardware.gmm_rates`),
  ``None`` where the part has none."""

  tm: int
  tk: int
  tn: int
  rows: int
  groups: int
  local_groups: int
  k: int
  n: int
  static_steps: int
  visits: float
  visits_empty: bool
  step_flops: float
  step_bytes: int
  out_bytes: int
  measured_s: float | None = None

  @property
  def kind(self) -> str:
    """``tgmm`` (the weights' gradient: an output block per expert) or ``gmm``."""
    return "tgmm" if self.visits_empty else "gmm"

  @property
  def cost_flops(self) -> float:
    """The matmul as if the rows were packed, 2·m·k·n (the call's cost estimate)."""
    return 2.0 * self.rows * self.k * self.n

  @property
  def steps(self) -> float:
    return self.static_steps * self.visits

  @property
  def flops(self) -> float:
    """The matrix unit's work over every step: what the kernel runs."""
    return self.steps * self.step_flops

  @property
  def bytes(self) -> float:
    """HBM bytes: every step's input blocks, and the output once."""
    return self.steps * self.step_bytes + self.out_bytes


def expected_visits(*, rows: int, tm: int, groups: int, local_groups: int, visit_empty: bool) -> float:
  """The row-tile visits one call makes, expected under random routing (each row's group uniform
  over ``groups``): the tiles the local groups' rows fill, plus one for each non-empty group that
  starts inside a tile (a boundary lands on a tile's first row with probability ``1 / tm``; the
  first group of all starts at row 0), plus one for each empty group where the kernel visits them
  (megablox ``make_group_metadata``: ``tiles_m + num_groups - 1`` at most, the bound kept)."""
  share = local_groups / groups
  empty = (1.0 - 1.0 / groups) ** rows if groups > 1 else 0.0
  nonempty = local_groups * (1.0 - empty)
  starts_inside = max(0.0, nonempty - (1.0 if share == 1 else 0.0)) * (tm - 1) / tm
  visits = math.ceil(rows * share / tm) + starts_inside + (local_groups * empty if visit_empty else 0.0)
  return min(visits, math.ceil(rows / tm) + groups - 1)


def kernel_plan(ins: Instruction) -> KernelPlan | None:
  """The plan of a ``tpu_custom_call`` (:class:`KernelPlan`), or ``None`` for another op or a
  body this jaxlib cannot read."""
  body = _BODY.search(ins.attrs) if ins.opcode == "custom-call" else None
  return None if body is None else _plan(body.group(1))


@lru_cache(maxsize=256)
def _plan(body: str) -> KernelPlan | None:
  attrs = _kernel_attributes(body)
  if attrs is None or not {"iteration_bounds", "function_type", "window_params"} <= attrs.keys():
    return None
  bounds = re.search(r"array<i64(?::\s*([^>]*))?>", attrs["iteration_bounds"])
  signature = re.match(r"\s*\(([^)]*)\)", attrs["function_type"])
  if bounds is None or signature is None:
    return None
  grid = tuple(None if int(b) == _DYNAMIC else int(b) for b in (bounds.group(1) or "").split(",") if b.strip())
  memrefs = re.findall(r"memref<([^,>]*)", signature.group(1))
  prefetch = re.match(r"\s*(\d+)", attrs.get("scalar_prefetch", "0"))
  n_prefetch = int(prefetch.group(1)) if prefetch else 0
  n_blocks = attrs["window_params"].count("window_bounds")
  if len(memrefs) < n_prefetch + n_blocks:
    return None
  parsed = [_memref(m) for m in memrefs]
  blocks = parsed[n_prefetch:n_prefetch + n_blocks]
  return KernelPlan(grid=grid, prefetch=tuple(math.prod(s) for s, _ in parsed[:n_prefetch]),
                    blocks=tuple(s for s, _ in blocks), block_bytes=tuple(b for _, b in blocks))


def _memref(spec: str) -> tuple[tuple[int, ...], int]:
  """``512x1024xbf16`` -> ((512, 1024), 2)."""
  *dims_, element = spec.strip().split("x")
  return tuple(int(d) for d in dims_ if d.isdigit()), _BYTES.get(element.lower(), 4)


def _kernel_attributes(body: str) -> dict[str, str] | None:
  """The attributes of the kernel function in a call's body (base64 MLIR bytecode), each printed,
  read with jaxlib's own MLIR bindings and its Mosaic ``tpu`` dialect (jax 0.10's reader needs it
  for the blocks' memory spaces; other dialects are left unregistered: only the attributes are
  read): the function that declares ``window_params``."""
  from jax._src import lib  # private, but jaxlib's own bindings; there since jax 0.4
  from jax._src.lib.mlir import ir

  try:
    data = base64.b64decode(body)
  except ValueError:
    return None
  ctx = ir.Context()
  ctx.allow_unregistered_dialects = True
  if getattr(lib, "tpu", None) is not None:
    lib.tpu.register_dialect(ctx)
  with ctx:
    try:
      module = ir.Module.parse(data)
    except ir.MLIRError:  # a body this jaxlib's bytecode reader does not know
      return None
    for op in module.body.operations:
      named = [op.attributes[i] for i in range(len(op.attributes))]
      attrs = {a.name: str(a.attr) for a in named}
      if "window_params" in attrs:
        return attrs
  return None


def grouped_matmul(ins: Instruction, operand_shapes: list[str], tile: MatrixTile | None,
                   part: str | None = None) -> GroupedMatmul | None:
  """The tiles of a grouped matmul call (:class:`GroupedMatmul`), or ``None`` where ``ins`` is no
  such kernel: a Pallas call with one grid dimension known only at run time (the row-tile visits),
  group metadata in scalar prefetch (``group_offsets`` first, G + 1 entries), and three blocks: two
  of rows (``tm`` first) and one of a single group's ``(1, a, b)``, the weights (``gmm``) or the
  weights' gradient (``tgmm``). ``operand_shapes``: the call's operands' HLO shapes, in order;
  ``tile``: the matrix unit's (its step's matmul is rounded up to it); ``part``: the machine's part
  name (``"TPU v5p"``), for its measured rate."""
  plan = kernel_plan(ins)
  if plan is None or plan.grid.count(None) != 1 or not plan.prefetch or len(plan.blocks) != 3:
    return None
  by_rows = [b for b in plan.blocks if len(b) == 2]
  grouped = [b for b in plan.blocks if len(b) == 3 and b[0] == 1]
  if len(by_rows) != 2 or len(grouped) != 1 or by_rows[0][0] != by_rows[1][0]:
    return None
  tm, (_, a, b) = by_rows[0][0], grouped[0]
  arrays = [_dims(s) for s in operand_shapes] + [_dims(ins.shape)]
  lhs = next((d for d in arrays if len(d) == 2), ())
  rows = lhs[0] if lhs else None
  local = next((d[0] for d in arrays if len(d) == 3), None)
  groups = plan.prefetch[0] - 1
  if rows is None or local is None or groups < 1:
    return None
  visit_empty = plan.blocks.index(grouped[0]) == len(plan.blocks) - 1  # its output is per group
  visits = expected_visits(rows=rows, tm=tm, groups=groups, local_groups=local, visit_empty=visit_empty)
  static = math.prod(g for g in plan.grid if g is not None)
  step = 2.0 * (tile.padded(tm, a, b) if tile is not None else tm * a * b)
  inputs = sum(math.prod(blk) * n for blk, n in zip(plan.blocks[:-1], plan.block_bytes[:-1]))
  out_dims = _dims(ins.shape)
  out_bytes = math.prod(out_dims) * plan.block_bytes[-1] if out_dims else 0
  # gmm: [m, k] x [G, k, n] -> [m, n]; tgmm: [m, k] x [m, n] -> [G, k, n].
  k, n = (out_dims[1], out_dims[2]) if visit_empty and len(out_dims) == 3 else (lhs[-1], out_dims[-1])
  kernel = GroupedMatmul(tm=tm, tk=a, tn=b, rows=rows, groups=groups, local_groups=local, k=k, n=n,
                         static_steps=static, visits=visits, visits_empty=visit_empty, step_flops=step,
                         step_bytes=inputs, out_bytes=out_bytes)
  rate = None if part is None else achieved_flops(part, kernel.kind, groups=local, rows=rows, k=k, n=n)
  return dataclasses.replace(kernel, measured_s=kernel.cost_flops / rate) if rate else kernel


def _dims(shape: str) -> tuple[int, ...]:
  m = _ARRAYS.search(shape or "")
  return tuple(int(d) for d in m.group(2).split(",") if d) if m else ()

"""FLOPs of a traced program, counted from its jaxpr with loop trip counts.

Why not only ``Compiled.cost_analysis()``: XLA's cost analysis counts the body of a while loop
once, whatever its trip count (checked on jaxlib 0.10: a ``lax.scan`` over 1 or 10 layers
reports the same flops). jaxmem's models scan their layers, so the compiler's figure misses
all layers but one and cannot show the price of recomputation. This counter walks the jaxpr
that is lowered (forward, backward with remat's recomputation, optimizer) and multiplies scan
bodies by their length.

Counting convention (as XLA's ``HloCostAnalysis``): a ``dot_general`` costs ``2*M*N*K`` per batch
element; an elementwise arithmetic op one flop per output element; a reduction one per input
element. Data movement (reshape, transpose, gather, convert...) costs nothing.

Two kinds of equation the jaxpr cannot see into are counted otherwise:

- ``shard_map``: its body is written for one device's shard (local shapes), so it is counted
  once per device it runs on (the product of its manual mesh axes), like the global-shape ops
  around it; :func:`jaxpr_flops` is a whole-program count that callers divide by the devices.
- Fused attention kernels (Pallas splash and Triton ``pallas_call`` kernels, cuDNN's fused
  attention custom calls): a cuDNN call has no jaxpr at all, and a Pallas kernel's body is one
  grid step whose loops run a data-dependent number of times. Each call is counted from its
  operand shapes instead, by the counter its defining code registered in :mod:`jaxmem.kernels`
  (the attention registry's entries: FlashAttention-2's accounting, Dao 2023, in
  ``jaxmem.models.attention_flops``; megablox's grouped matmuls, ``jaxmem.models.moe_kernels``).
  Any other Pallas kernel is counted as its body times its grid.
"""

from __future__ import annotations

import math

from jax.extend import core as jcore

from jaxmem.kernels import kernel_flops

# What a row using a fused attention kernel says about its FLOPs.
KERNEL_FLOPS_NOTE = (
    "flops: the attention kernel's FLOPs are counted per call from its shapes (matrix products only, "
    "halved for the causal mask, the backward pass with its recomputation, as FlashAttention-2 counts "
    "them, Dao 2023); the program around it is counted op by op"
)
# What a row whose dropless experts ran megablox's gmm says about its FLOPs (jaxmem.models.moe_kernels).
GMM_FLOPS_NOTE = (
    "flops: megablox's gmm and tgmm calls (the experts' grouped matmuls) are counted per call from their shapes, "
    "2 x rows x contracted x output width, as the kernel's own cost estimate counts them (the rows padded to its "
    "row tile); hlo_flops leaves them out, as it leaves out every custom call"
)

_ELEMENTWISE = {
    "add", "sub", "mul", "div", "neg", "max", "min", "exp", "exp2", "log", "log1p", "tanh", "logistic",
    "sqrt", "rsqrt", "pow", "integer_pow", "erf", "sin", "cos", "abs", "sign", "select_n", "square",
    "expm1", "erf_inv", "atan2", "rem", "floor", "ceil", "round", "clamp", "nextafter", "cbrt",
}
_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "cumsum", "cumlogsumexp", "cummax"}


def _size(aval) -> int:
  return math.prod(getattr(aval, "shape", ()) or ()) if hasattr(aval, "shape") else 1


def _dot_flops(eqn) -> float:
  lhs, rhs = (v.aval for v in eqn.invars[:2])
  (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
  contract = math.prod(lhs.shape[d] for d in lc)
  batch = math.prod(lhs.shape[d] for d in lb)
  m = math.prod(s for d, s in enumerate(lhs.shape) if d not in lc and d not in lb)
  n = math.prod(s for d, s in enumerate(rhs.shape) if d not in rc and d not in eqn.params["dimension_numbers"][1][1])
  return 2.0 * batch * m * n * contract


def _sub_jaxprs(eqn):
  for v in eqn.params.values():
    if isinstance(v, jcore.ClosedJaxpr):
      yield v.jaxpr
    elif isinstance(v, jcore.Jaxpr):
      yield v
    elif isinstance(v, (tuple, list)):
      for x in v:
        if isinstance(x, jcore.ClosedJaxpr):
          yield x.jaxpr
        elif isinstance(x, jcore.Jaxpr):
          yield x


def _manual_devices(eqn) -> int:
  """How many devices run a shard_map's body: the product of its manual mesh axes."""
  shape = dict(getattr(eqn.params.get("mesh"), "shape", None) or {})
  axes = eqn.params.get("newly_manual_axes", eqn.params.get("manual_axes"))
  if axes is None:  # older jax names the axes left to XLA instead
    auto = eqn.params.get("auto") or frozenset()
    axes = [a for a in shape if a not in auto]
  return math.prod(shape[a] for a in axes if a in shape)


def _grid_size(eqn) -> int:
  grid = getattr(eqn.params.get("grid_mapping"), "grid", ()) or ()
  return math.prod(g for g in grid if isinstance(g, int))


def jaxpr_flops(jaxpr: jcore.Jaxpr, *, loop_trips: bool = True, kernels: bool = True, matmuls_only: bool = False) -> float:
  """FLOPs of ``jaxpr``; with ``loop_trips=False`` a scan body counts once, as XLA's cost
  analysis counts a loop body; with ``kernels=False`` fused attention and other Pallas kernels
  count nothing, as XLA's cost analysis counts their custom calls; with ``matmuls_only`` only
  ``dot_general`` counts, as :mod:`jaxmem.hlo.ops` counts the optimized HLO."""
  kw = dict(loop_trips=loop_trips, kernels=kernels, matmuls_only=matmuls_only)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    kernel = kernel_flops(eqn)
    if kernel is not None:
      total += kernel if kernels else 0.0
    elif name == "pallas_call":
      if not kernels:
        continue
      # An unknown kernel: its body is one grid step.
      total += _grid_size(eqn) * sum(jaxpr_flops(sub, **kw) for sub in _sub_jaxprs(eqn))
    elif name == "shard_map":
      total += _manual_devices(eqn) * sum(jaxpr_flops(sub, **kw) for sub in _sub_jaxprs(eqn))
    elif name == "dot_general":
      total += _dot_flops(eqn)
    elif matmuls_only and name in _ELEMENTWISE | _REDUCTIONS:
      continue
    elif name in _ELEMENTWISE:
      total += sum(_size(v.aval) for v in eqn.outvars)
    elif name in _REDUCTIONS:
      total += sum(_size(v.aval) for v in eqn.invars)
    elif name == "scan":
      trips = eqn.params["length"] if loop_trips else 1
      total += trips * jaxpr_flops(eqn.params["jaxpr"].jaxpr, **kw)
    elif name == "cond":
      total += max((jaxpr_flops(b.jaxpr, **kw) for b in eqn.params["branches"]), default=0.0)
    elif name == "while":
      # Unknown trip count: the body is counted once, as XLA does.
      total += sum(jaxpr_flops(eqn.params[k].jaxpr, **kw) for k in ("body_jaxpr", "cond_jaxpr"))
    else:
      for sub in _sub_jaxprs(eqn):  # pjit, remat/checkpoint, custom_jvp/vjp, shard_map, ...
        total += jaxpr_flops(sub, **kw)
  return total



def compiled_flops(compiled) -> float | None:
  """XLA's ``cost_analysis()["flops"]`` of the optimized per-device program (a loop body
  counted once), or ``None`` where the backend gives none.

  Compile-only GPU executables answer ``cost_analysis()`` with ``None`` (jaxlib 0.10.2 and
  0.12.0.1); their optimized module is then costed with XLA's generic ``HloCostAnalysis``
  through the CPU client, which counts the same ops (checked: a sharded matmul's module on
  gpu:h100x2 gave exactly 2*M*N*K per device plus its elementwise ops).
  """
  cost = compiled.cost_analysis()
  # Older jaxlibs return a list with one dict per program, newer ones the dict itself.
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if cost and "flops" in cost:
    return float(cost["flops"])
  return _module_flops(compiled)


def _module_flops(compiled) -> float | None:
  try:  # private to jaxlib, so used only where the public call gives nothing
    from jax._src import xla_bridge
    from jax._src.lib import _jax
  except ImportError:
    return None
  analyse = getattr(_jax, "hlo_module_cost_analysis", None)
  modules = compiled.runtime_executable().hlo_modules() if hasattr(compiled, "runtime_executable") else []
  if analyse is None or len(modules) != 1:
    return None
  cost = analyse(xla_bridge.get_backend("cpu"), modules[0])
  return float(cost["flops"]) if cost and "flops" in cost else None


def per_device_flops(
    jaxpr: jcore.Jaxpr, compiled, num_devices: int, *, hlo_flops: float | None = None
) -> tuple[float, str | None]:
  """FLOPs one device runs per step, and a note where the figure is an even split.

  Under SPMD a device runs the share of the program its shardings give it: all of a replicated
  step, about 1/N of one whose batch is split N ways, something between for partly replicated
  work (an optimizer update over replicated parameters). The jaxpr counts every op and every
  layer but is the whole program; the optimized, partitioned HLO knows one device's share. So:
  flops = jaxpr flops x share, with the share taken with the same counting on both sides:

  - ``hlo_flops`` given (the optimized HLO's matrix FLOPs per device with loop trip counts,
    :mod:`jaxmem.hlo.ops`): share = hlo_flops / the jaxpr's matrix FLOPs (kernels left out of
    both: the HLO sees a custom call). Right under a ``tensor`` axis too, where the TPU compiler
    runs matmuls as collective-matmul loops that XLA's cost analysis counts once (MaxText's 32B on
    tpu:v5p-128, fsdp=16,tensor=4, remat full: 0.79x the model FLOPs by cost analysis, 1.24x
    by this share, as the same remat gives under fsdp alone; llama3-8b's layers on tpu:v5p-8:
    tensor=4 and fsdp=4 give the same figure; docs/examples.md). Elementwise work is taken to
    split as the matrix work does (an optimizer update over replicated parameters runs whole on
    every device, so there it is undercounted: small beside the matmuls of any real model).
  - else XLA's cost analysis of the per-device program, which counts a loop body once: share =
    compiled flops / the jaxpr's flops with loops counted once. Checked on jax 0.10.2 and 0.12.0.1
    with a scanned, rematerialised step over 4 devices: share 1.005-1.019 replicated and
    0.253-0.261 with the batch split, on CPU, H100 and TPU v5e alike.

  One device: the jaxpr's count as it is. Without either: an even split over the devices, with a note.
  """
  full = jaxpr_flops(jaxpr)
  if num_devices <= 1:
    return full, None
  if hlo_flops:
    matmuls = jaxpr_flops(jaxpr, kernels=False, matmuls_only=True)
    if matmuls:
      return full * hlo_flops / matmuls, None
  # Kernels (custom calls) are left out of both sides of the share: XLA's cost analysis counts
  # them as nothing (splash on tpu:v5p-8 over 4 devices: counted on the jaxpr's side only, the
  # step came out at a seventh of dot's instead of just under it).
  once = jaxpr_flops(jaxpr, loop_trips=False, kernels=False)
  device = compiled_flops(compiled)
  if not device or not once:
    return full / num_devices, "flops: split evenly over the devices (the compiler gave no cost analysis)"
  return full * device / once, None

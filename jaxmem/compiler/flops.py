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
"""

from __future__ import annotations

import math

from jax.extend import core as jcore

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


def jaxpr_flops(jaxpr: jcore.Jaxpr) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name in _ELEMENTWISE:
      total += sum(_size(v.aval) for v in eqn.outvars)
    elif name in _REDUCTIONS:
      total += sum(_size(v.aval) for v in eqn.invars)
    elif name == "scan":
      total += eqn.params["length"] * jaxpr_flops(eqn.params["jaxpr"].jaxpr)
    elif name == "cond":
      total += max((jaxpr_flops(b.jaxpr) for b in eqn.params["branches"]), default=0.0)
    elif name == "while":
      # Unknown trip count: the body is counted once, as XLA does.
      total += jaxpr_flops(eqn.params["body_jaxpr"].jaxpr) + jaxpr_flops(eqn.params["cond_jaxpr"].jaxpr)
    else:
      for sub in _sub_jaxprs(eqn):  # pjit, remat/checkpoint, custom_jvp/vjp, shard_map, ...
        total += jaxpr_flops(sub)
  return total


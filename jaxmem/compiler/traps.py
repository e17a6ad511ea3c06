"""Framework traps: what a traced program does that the target would not run.

A framework that chooses its attention kernel at trace time (Keras 3 picks splash or cuDNN
attention from ``jax.devices()``) chooses for the host that traces, not for a compile-only
target; and ``jax.nn.dot_product_attention`` without ``implementation="cudnn"`` is always the
plain path. Either way the program computes attention in plain XLA ops and materialises the
whole scores, which the target's fused kernel (splash attention on TPU, cuDNN's on GPU) never
holds. :func:`attention_scores` finds that computation by what the program does, not by a
value's shape:

- the scores: a batched ``dot_general`` of two activations (both operands with batch
  dimensions, as queries and keys are under their batch and head axes; a product with a weight
  matrix has none);
- a softmax over them: ``exp`` of values computed elementwise from the scores (the scale, the
  mask and the row max subtracted on the way) and a ``reduce_sum`` of that exponential;
- a second ``dot_general`` (with the values) reading the exponential at the scores' size,
  normalised before it (divided by its sum, or ``exp(s - logsumexp(s))``: ``jax.nn.softmax``)
  or after it (the product divided by the sum: MaxText's order).

A blockwise attention in plain JAX (FlashAttention-2's online softmax, as jaxmem's own
``chunked``) divides by the sum it carried through its loop over key blocks, after the loop:
what a loop makes of the scores it computes inside is not followed out of it, so such a program
is not taken for one that materialises its scores. The walk follows values into the jaxprs of
calls, ``jax.checkpoint``, ``scan``, ``while``, ``cond``, custom derivative rules and
``shard_map``; it does not look inside Pallas kernels, which keep their blocks on chip.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from jax.extend import core as jcore

# What a value computed from one candidate's scores has been through, as bits.
_FULL = 1  # computed elementwise from the scores (at their size: no reduction since)
_EXP = 2  # an exponential of such values
_SUM = 4  # a sum over an exponential of the scores: a softmax's denominator
_NORMALISED = 8  # the exponential divided by its sum: softmax probabilities
_PRODUCT = 16  # a dot of the unnormalised exponential with the values

# A value's taint: candidate scores (by index) -> what it has been through since them.
Taint = dict[int, int]

# Primitives whose inner jaxpr is a kernel of its own (its blocks stay on chip): not walked.
_KERNELS = frozenset({"pallas_call"})
# Loops: what their bodies make of scores computed inside is accumulated over the iterations
# (blockwise attention), so those candidates are not followed out of them.
_LOOPS = frozenset({"scan", "while"})
# Reductions: their output is no longer at the scores' size.
_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin",
                         "reduce_and", "reduce_or", "reduce_xor"})


def attention_scores(jaxpr: jcore.Jaxpr) -> tuple[int, ...] | None:
  """The largest attention scores ``jaxpr`` materialises (the scores dot's output shape, unit
  dimensions left out), or ``None`` where it computes no attention in plain ops (see the module
  docstring)."""
  walk = _Walk()
  walk.jaxpr(jaxpr, [{} for _ in jaxpr.invars])
  return max(walk.found, key=math.prod) if walk.found else None


def kernel_note(jaxpr: jcore.Jaxpr, platform: str) -> str | None:
  """The note for a program that materialises attention scores compiled for an accelerator
  (``platform`` ``tpu`` or ``gpu``; the CPU runs what it was given), else ``None``."""
  if platform not in ("tpu", "gpu"):
    return None
  shape = attention_scores(jaxpr)
  if shape is None:
    return None
  kernel = "splash attention (Pallas)" if platform == "tpu" else "cuDNN's fused attention"
  return (
      f"attention: the program materialises [{','.join(map(str, shape))}] scores (a batched dot of queries and keys, "
      "a softmax over it and a dot with the values, in plain XLA ops): plain attention "
      "(jax.nn.dot_product_attention without implementation='cudnn' always is), or a kernel its framework chose "
      f"from this compile host's jax.devices() (Keras does), not for the {platform.upper()} target, where {kernel} "
      "keeps no such scores; force the target's kernel in the step (docs/examples.md, 'A third-party model')"
  )


class _Walk:
  """One pass over a program's values, carrying each value's taint forward."""

  def __init__(self) -> None:
    self.scores: list[tuple[int, ...]] = []  # each candidate's output shape, by index
    self.found: list[tuple[int, ...]] = []  # the scores of each attention found

  def jaxpr(self, jaxpr: jcore.Jaxpr, taints: Sequence[Taint]) -> list[Taint]:
    """The taints of ``jaxpr``'s outputs given its inputs'."""
    env: dict[Any, Taint] = dict(zip(jaxpr.invars, taints))
    for eqn in jaxpr.eqns:
      ins = [env.get(v, {}) if isinstance(v, jcore.Var) else {} for v in eqn.invars]
      for v, t in zip(eqn.outvars, self.eqn(eqn, ins)):
        if t:
          env[v] = t
    return [env.get(v, {}) if isinstance(v, jcore.Var) else {} for v in jaxpr.outvars]

  def eqn(self, eqn: Any, ins: list[Taint]) -> list[Taint]:
    name = eqn.primitive.name
    if name == "dot_general":
      return [self.dot(eqn, ins)]
    if name in _KERNELS:
      return [{} for _ in eqn.outvars]
    inner = list(_inner_jaxprs(eqn))
    if inner:
      return self.call(eqn, inner, ins)
    out = _union(ins)
    if name in _REDUCTIONS:
      out = {c: (f & ~_FULL) | (_SUM if name == "reduce_sum" and f & _EXP and f & _FULL else 0) for c, f in out.items()}
    elif name == "exp":
      out = {c: f | _EXP | (_NORMALISED if f & _FULL and f & _SUM else 0) for c, f in out.items()}
    elif name in ("div", "mul") and len(ins) == 2:
      out = {c: f | (_NORMALISED if _with_sum(ins, c, _FULL | _EXP) else 0) for c, f in out.items()}
      self.found += [self.shown(c) for c in out if _with_sum(ins, c, _PRODUCT)]
    return [out for _ in eqn.outvars]

  def dot(self, eqn: Any, ins: list[Taint]) -> Taint:
    """A dot reading a candidate's exponential at its size: normalised, an attention; else its
    output is the product, an attention once divided by the sum. A batched dot of two
    activations is a new candidate. Its output carries nothing else: a dot ends a softmax."""
    out: Taint = {}
    for v, taint in zip(eqn.invars, ins):
      for c, flags in taint.items():
        if flags & _FULL and flags & _EXP and math.prod(v.aval.shape) == math.prod(self.scores[c]):
          if flags & _NORMALISED:
            self.found.append(self.shown(c))
          else:
            out[c] = _PRODUCT
    if _batched_activations(eqn):
      self.scores.append(tuple(eqn.outvars[0].aval.shape))
      out[len(self.scores) - 1] = _FULL
    return out

  def shown(self, c: int) -> tuple[int, ...]:
    return tuple(d for d in self.scores[c] if d != 1)

  def call(self, eqn: Any, inner: list[jcore.Jaxpr], ins: list[Taint]) -> list[Taint]:
    """A call, loop or branch: each inner jaxpr walked with the operands its inputs are (the
    trailing ones: a ``while`` body's come after the condition's constants, a ``cond`` branch's
    after the index), its outputs mapped back where they are the equation's."""
    first = len(self.scores)  # candidates from here on are made inside
    outs: list[Taint] | None = None
    for j in inner:
      n = len(j.invars)
      given = ins[len(ins) - n:] if n <= len(ins) else [_union(ins)] * n
      result = self.jaxpr(j, given)
      if len(result) == len(eqn.outvars):
        outs = result if outs is None else [_union([a, b]) for a, b in zip(outs, result)]
    outs = outs if outs is not None else [_union(ins) for _ in eqn.outvars]
    if eqn.primitive.name in _LOOPS:
      outs = [{c: f for c, f in t.items() if c < first} for t in outs]
    return outs


def _inner_jaxprs(eqn: Any) -> Iterator[jcore.Jaxpr]:
  for value in eqn.params.values():
    for v in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(v, jcore.ClosedJaxpr):
        yield v.jaxpr
      elif isinstance(v, jcore.Jaxpr):
        yield v


def _union(taints: Sequence[Taint]) -> Taint:
  out: Taint = {}
  for t in taints:
    for c, f in t.items():
      out[c] = out.get(c, 0) | f
  return out


def _with_sum(ins: list[Taint], c: int, wanted: int) -> bool:
  """Whether a division or product of ``ins`` divides candidate ``c``'s ``wanted`` (all its bits;
  not itself a sum) by ``c``'s softmax sum."""
  a, b = (t.get(c, 0) for t in ins)
  return any(x & wanted == wanted and not x & _SUM and y & _SUM for x, y in ((a, b), (b, a)))


def _batched_activations(eqn: Any) -> bool:
  """Whether a ``dot_general`` multiplies two operands that both have batch dimensions and a
  free one each (queries and keys under their batch and head axes), not an activation by a
  weight matrix (which has no batch dimension)."""
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  lhs, rhs = (v.aval for v in eqn.invars[:2])
  return bool(lb) and len(lhs.shape) > len(lc) + len(lb) and len(rhs.shape) > len(rc) + len(rb)

"""Training matmuls in fp8, as MaxText's ``quantization=fp8_full`` runs them (``--quantization``).

MaxText 0.2.5 with ``use_qwix_quantization=True quantization=fp8_full`` quantizes every
``dot_general`` of its decoder layers through qwix (``layers/quantizations.py``,
``get_fp8_full_qwix_rule_w_sparsity``, lines 1109-1159: module path ``decoder/.*layers.*``,
``weight_qtype = act_qtype = float8_e4m3fn``, ``bwd_qtype = float8_e5m2``; the same formats in
``QwixQuantization._get_fp8_full_qwix_config``, lines 451-463), with the calibration the Ironwood
recipes set, ``weight_/act_quantization_calibration_method=fixed,-224,224``, and the backward's
default, ``bwd_quantization_calibration_method=absmax`` (``configs/base.yml``:171-173). What qwix
0.1.8 then runs (``qwix/_src/core/dot_general_qt.py``, ``dot_general_qt`` and its custom VJP;
``qarray.py`` ``calibrate``, ``compute_scale_zero_point``, ``quantize_with_scale_zero_point``,
``clip_gradient_to_calibration``; ``dot_general.py`` ``get_how_to_quantize``, ``_fast_dot_general``):

- forward: each operand divided by its scale, clipped to the format's range and converted to
  ``float8_e4m3fn``; fixed calibration is one scale per tensor, ``224 / finfo(e4m3fn).max``
  (= 224/448), a constant, so no amax reduction runs. The dot takes the two fp8 operands and
  gives the compute dtype, then is multiplied by both scales.
- backward, each gradient's dot: the incoming gradient multiplied by the other operand's scale,
  quantized to ``float8_e5m2`` with absmax calibration per channel (reduced over the backward
  dot's contracted axes, kept over the others), dotted with the forward's quantized operand (its
  fp8 value reused, not quantized again: ``use_original_residuals`` False when the backward is
  quantized, qwix ``providers/qt.py``), then multiplied by the gradient's scale.
- each gradient masked to zero where its forward operand fell outside the fixed range
  (``clip_gradient_to_calibration``; qwix's default ``disable_gradient_clipping=False``), so the
  original operands stay residuals of the backward beside their fp8 copies.

Here that is :func:`fp8_einsum`, one two-operand einsum whose every index of an operand appears in
the other or the output (the projections' einsums: ``btd,df->btf``); :func:`projection` gives the
einsum a layer's projections use under a quantization name (``none``: ``jnp.einsum`` itself).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxmem.registry import publish

# The quantization names a step may run its projections with (--quantization), MaxText's spelling.
QUANTIZATIONS: tuple[str, ...] = publish("quantization", ("none", "fp8_full"))

FORWARD = jnp.float8_e4m3fn  # qwix fp8_full: lhs_qtype, rhs_qtype
BACKWARD = jnp.float8_e5m2  # dlhs_grad_qtype, drhs_grad_qtype
FIXED_RANGE = 224.0  # the recipes' fixed,-224,224 calibration of weights and activations

Einsum = Callable[[str, jax.Array, jax.Array], jax.Array]


def projection(quantization: str | None) -> Einsum:
  """The einsum of a layer's projections (activation, weight) under ``quantization``: jnp.einsum
  itself for none (so the program, and the source lines explain names, are as without the axis)."""
  return fp8_einsum if quantization == "fp8_full" else jnp.einsum


def _parse(spec: str) -> tuple[str, str, str]:
  ins, out = spec.replace(" ", "").split("->")
  a, b = ins.split(",")
  return a, b, out


def _fixed_scale(dtype: jnp.dtype, qtype: jnp.dtype) -> jax.Array:
  # qarray.compute_scale_zero_point of calibrate("fixed,-224,224"): absmax 224 over the format's bound.
  return jnp.asarray(FIXED_RANGE / float(jnp.finfo(qtype).max), dtype)


def _convert(x: jax.Array, qtype: jnp.dtype) -> jax.Array:
  # numerics.convert_to: clipped to the format's range (no inf or nan in e4m3fn), then converted.
  bound = float(jnp.finfo(qtype).max)
  return jnp.clip(x, -bound, bound).astype(qtype)


def _quantized(x: jax.Array) -> jax.Array:
  return _convert(x / _fixed_scale(x.dtype, FORWARD), FORWARD)


def _arranged(a: jax.Array, have: str, want: str) -> jax.Array:
  """``a`` (indices ``have``, each of them in ``want``) transposed and broadcastable to ``want``."""
  kept = [i for i in want if i in have]
  a = jnp.transpose(a, [have.index(i) for i in kept])
  return a.reshape([a.shape[kept.index(i)] if i in kept else 1 for i in want])


def _gradient_dot(g: jax.Array, g_idx: str, y_q: jax.Array, y_idx: str, out_idx: str) -> jax.Array:
  """``einsum(g, y)`` as qwix's backward runs it: ``g`` (already multiplied by ``y``'s scale)
  quantized to e5m2 per channel with absmax (reduced over the indices the dot contracts), dotted
  with the fp8 ``y_q``, then multiplied by ``g``'s scale."""
  contracted = [k for k, i in enumerate(g_idx) if i not in out_idx]
  absmax = jnp.max(jnp.abs(g), axis=contracted, keepdims=True)
  scale = absmax / float(jnp.finfo(BACKWARD).max)
  scale = jnp.where(scale < jnp.sqrt(jnp.finfo(scale.dtype).tiny), jnp.ones_like(scale), scale)
  g_q = _convert(g / scale, BACKWARD)
  out = jnp.einsum(f"{g_idx},{y_idx}->{out_idx}", g_q, y_q, preferred_element_type=g.dtype)
  kept = "".join(i for i in g_idx if i in out_idx)
  return out * _arranged(jnp.squeeze(scale, contracted), kept, out_idx)


def _in_range(g: jax.Array, x: jax.Array) -> jax.Array:
  return jnp.where((x >= -FIXED_RANGE) & (x <= FIXED_RANGE), g, jnp.zeros_like(g))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def fp8_einsum(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
  """``jnp.einsum(spec, x, w)`` with both operands in float8_e4m3fn and, in the backward, the
  gradients in float8_e5m2: qwix's ``dot_general_qt`` under MaxText's fp8_full (module docstring)."""
  return _forward(spec, x, w)[0]


def _forward(spec: str, x: jax.Array, w: jax.Array):
  x_q, w_q = _quantized(x), _quantized(w)
  out = jnp.einsum(spec, x_q, w_q, preferred_element_type=x.dtype)
  out = out * _fixed_scale(x.dtype, FORWARD) * _fixed_scale(w.dtype, FORWARD)
  return out.astype(x.dtype), (x, w, x_q, w_q)


def _backward(spec: str, residuals, g: jax.Array):
  x, w, x_q, w_q = residuals
  x_idx, w_idx, out_idx = _parse(spec)
  dx = _gradient_dot(g * _fixed_scale(g.dtype, FORWARD), out_idx, w_q, w_idx, x_idx)
  dw = _gradient_dot(g * _fixed_scale(g.dtype, FORWARD), out_idx, x_q, x_idx, w_idx)
  return _in_range(dx, x).astype(x.dtype), _in_range(dw, w).astype(w.dtype)


fp8_einsum.defvjp(_forward, _backward)

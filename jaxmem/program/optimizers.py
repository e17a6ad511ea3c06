"""Optimizers (optax) by name.

Each entry builds an ``optax.GradientTransformation`` from a learning rate; the optimizer only
matters here through the state it keeps, which the compiler counts as argument memory.

>>> OPTIMIZERS.get("adamw").build(1e-3).init  # doctest: +ELLIPSIS
<function ...>
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxmem.registry import Registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class Optimizer:
  """``build(lr)`` the optax transformation; ``with_moments(lr, dtype)`` the same with its
  moments stored in ``dtype`` (``None``: the optimizer cannot choose its moments' dtype).

  The state it keeps, as the closed forms read it (:mod:`jaxmem.planning.estimate`: ZeRO's K
  bytes per parameter): ``state_moments``, the parameter-sized arrays its state holds per
  parameter (Adam: m and v, 2; a factored or per-layer statistic counts about 0), and
  ``state_dtype``, their dtype where the optimizer fixes it (``None``: the dtype it updates in).
  ``state_moments`` ``None``: not declared, so the closed forms refuse this optimizer rather
  than guess. tests/test_registries.py holds each declaration against optax's own state."""

  name: str
  build: Callable[[float], optax.GradientTransformation]
  description: str
  with_moments: Callable[[float, Any], optax.GradientTransformation] | None = None
  state_moments: float | None = None
  state_dtype: str | None = None

  def moments_refusal(self) -> str | None:
    """Why a dtype for its moments does not apply to this optimizer (it keeps none, or fixes
    theirs), as the end of a sentence that names the option; ``None`` where it does."""
    if self.with_moments is not None:
      return None
    return (f"applies to optimizers whose moments' dtype can be chosen ({', '.join(MOMENTS_DTYPE_OPTIMIZERS)}); "
            f"{self.name} {_NO_MOMENTS.get(self.name, 'does not take one')}")


class _LowpAdamState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam_lowp(
    dtype=jnp.bfloat16, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
) -> optax.GradientTransformation:
  """Adam (Kingma & Ba 2015, Algorithm 1) with both moments stored in ``dtype``.

  optax's ``mu_dtype`` lowers only the first moment; keeping both in bf16 halves Adam's
  8 bytes of state per parameter to 4, which is what "AdamW with bf16 moments" promises.
  The update is computed in fp32 and the moments rounded on store.
  """

  def init(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=dtype)  # noqa: E731
    return _LowpAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params))

  def update(updates, state, params=None):
    del params
    f32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)  # noqa: E731
    mu = jax.tree.map(lambda g, m: b1 * m + (1 - b1) * g, f32(updates), f32(state.mu))
    nu = jax.tree.map(lambda g, v: b2 * v + (1 - b2) * g * g, f32(updates), f32(state.nu))
    count = state.count + 1
    c1, c2 = 1 - b1**count, 1 - b2**count
    new = jax.tree.map(lambda m, v, g: ((m / c1) / (jnp.sqrt(v / c2) + eps)).astype(g.dtype), mu, nu, updates)
    cast = lambda t: jax.tree.map(lambda x: x.astype(dtype), t)  # noqa: E731
    return new, _LowpAdamState(count, cast(mu), cast(nu))

  return optax.GradientTransformation(init, update)


def _adamw_bf16(lr: float) -> optax.GradientTransformation:
  return _adamw_moments(lr, jnp.bfloat16)


def _adamw_moments(lr: float, dtype: Any) -> optax.GradientTransformation:
  # optax.adamw's chain (weight decay 1e-4, its default) with both moments in ``dtype``:
  # optax's own ``mu_dtype`` would lower the first moment only.
  return optax.chain(scale_by_adam_lowp(dtype), optax.add_decayed_weights(1e-4), optax.scale(-lr))


def _adam_moments(lr: float, dtype: Any) -> optax.GradientTransformation:
  return optax.chain(scale_by_adam_lowp(dtype), optax.scale(-lr))


# The optimizers whose moments' dtype can be set (with_moments): Adam's two moments through
# scale_by_adam_lowp, momentum's accumulator through optax.sgd's ``accumulator_dtype``, Lion's
# through its ``mu_dtype``.
_WITH_MOMENTS: dict[str, Callable[[float, Any], optax.GradientTransformation]] = {
    "adam": _adam_moments,
    "adamw": _adamw_moments,
    "momentum": lambda lr, dt: optax.sgd(lr, momentum=0.9, accumulator_dtype=dt),
    "nesterov": lambda lr, dt: optax.sgd(lr, momentum=0.9, nesterov=True, accumulator_dtype=dt),
    "lion": lambda lr, dt: optax.lion(lr, mu_dtype=dt),
}
MOMENTS_DTYPE_OPTIMIZERS = tuple(_WITH_MOMENTS)
# Why the others do not take one, where there is a short reason.
_NO_MOMENTS = {
    "sgd": "keeps no moments",
    "adamw_bf16": "fixes its moments at bfloat16 (use adamw with bfloat16 moments)",
}


def _muon(lr: float) -> optax.GradientTransformation:
  # Layers are stacked on a leading axis by the scan; treat every axis but the last two as a
  # batch of matrices, which is what Muon's orthogonalisation expects (Jordan et al. 2024).
  def dims(params):
    def one(p):
      if p.ndim < 2:
        return None
      return optax.contrib.MuonDimensionNumbers(reduction_axis=(p.ndim - 2,), output_axis=(p.ndim - 1,))

    return jax.tree.map(one, params)

  return optax.contrib.muon(lr, muon_weight_dimension_numbers=dims)


def _registry() -> Registry[Optimizer]:
  # (name, build, description, parameter-sized arrays of state per parameter).
  entries = [
      ("sgd", lambda lr: optax.sgd(lr), "plain SGD: no state", 0),
      ("momentum", lambda lr: optax.sgd(lr, momentum=0.9), "SGD with heavy-ball momentum: 1 state per parameter", 1),
      ("nesterov", lambda lr: optax.sgd(lr, momentum=0.9, nesterov=True), "Nesterov momentum: 1 state per parameter", 1),
      ("adam", lambda lr: optax.adam(lr), "Adam: 2 fp32 moments per parameter", 2),
      ("adamw", lambda lr: optax.adamw(lr), "AdamW: 2 fp32 moments per parameter", 2),
      ("adamw_bf16", _adamw_bf16, "AdamW with both moments in bf16: half of AdamW's state", 2),
      # The factored second moment is O(rows + columns) per matrix: about 0 per parameter.
      ("adafactor", lambda lr: optax.adafactor(lr), "Adafactor: factored second moment, rows + columns", 0),
      ("lion", lambda lr: optax.lion(lr), "Lion: 1 moment per parameter", 1),
      ("lamb", lambda lr: optax.lamb(lr), "LAMB: Adam moments with layer-wise trust ratio", 2),
      ("adagrad", lambda lr: optax.adagrad(lr), "Adagrad: 1 accumulator per parameter", 1),
      ("rmsprop", lambda lr: optax.rmsprop(lr), "RMSProp: 1 accumulator per parameter", 1),
      ("adabelief", lambda lr: optax.adabelief(lr), "AdaBelief: 2 moments per parameter", 2),
      ("radam", lambda lr: optax.radam(lr), "RAdam: 2 moments per parameter", 2),
      ("nadam", lambda lr: optax.nadam(lr), "NAdam: 2 moments per parameter", 2),
      ("adamax", lambda lr: optax.adamax(lr), "Adamax: 2 moments per parameter", 2),
      ("lars", lambda lr: optax.lars(lr), "LARS: momentum with layer-wise trust ratio", 1),
      # The second moment is one number per layer; the first is per parameter.
      ("novograd", lambda lr: optax.novograd(lr), "NovoGrad: layer-wise second moment", 1),
      # The cover-set accumulators are O(rows + columns); the momentum is per parameter.
      ("sm3", lambda lr: optax.sm3(lr), "SM3: cover-set accumulators, sublinear memory", 1),
  ]
  if hasattr(optax, "adan"):
    # optax's state: the first, second and third moments and the previous gradient.
    entries.append(("adan", lambda lr: optax.adan(lr), "Adan: 3 moments and the last gradient per parameter", 4))
  if hasattr(getattr(optax, "contrib", None), "muon"):
    # The momentum buffer, per parameter (Adam's two moments only for the vectors, a small share).
    entries.append(("muon", _muon, "Muon: momentum + Newton-Schulz orthogonalisation (Adam for vectors)", 1))
  fixed = {"adamw_bf16": "bfloat16"}  # the moments' dtype where the optimizer fixes it
  return Registry("optimizer", {
      n: Optimizer(name=n, build=b, description=d, with_moments=_WITH_MOMENTS.get(n), state_moments=k,
                   state_dtype=fixed.get(n))
      for n, b, d, k in entries
  })


OPTIMIZERS: Registry[Optimizer] = _registry()

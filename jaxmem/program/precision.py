"""Mixed precision as big runs train: a float32 master copy of bf16
parameters in the optimizer state, the optimizer moments' own dtype, and the dtype gradients
are reduced in across the data axes.

The layout of ZeRO (Rajbhandari et al. 2020, sec. 3) and Megatron: bf16 parameters (2 bytes
per parameter) used by the forward and backward passes, their bf16 gradients (2), and in the
optimizer state a float32 master copy (4) with Adam's float32 moments (4 + 4), 16 in all.
:func:`with_master` is that master copy as an optax wrapper, the way optax users keep one: the
inner optimizer sees float32 gradients and updates the float32 master; the parameters are the
master cast down (:func:`apply`).

``grad_reduce_dtype``: the train step is one SPMD program, so the reduction of gradients over
``data``/``fsdp`` is the compiler's (an all-reduce or reduce-scatter where the gradient of a
sharded or replicated parameter is formed). The step takes the loss's gradients with respect to
the parameters cast to that dtype at their own sharding (:func:`grads_in`), so the cotangent the
compiler reduces is in that dtype where the compiler forms it so: bfloat16 takes a float32
model's embedding and norm gradients down to bf16 (tpu:v5e-8, data=8: 14% fewer all-reduce
bytes, tests/test_precision.py). The TPU and GPU compilers already reduce a matmul's weight
gradient in the compute dtype, before widening it to float32 parameters, so ``float32`` beside
bf16 compute widens the other gradients only (a row's note says so); forcing float32 partial
sums would take the matmuls' own accumulation dtype, which the models do not expose.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxmem.errors import JaxmemError

DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(field: str, value: str | None) -> None:
  """``value`` is None (the default) or one of :data:`DTYPES`, else a one-line error naming ``field``."""
  if value is not None and value not in DTYPES:
    raise JaxmemError(f"unknown `{field}` {value!r}; valid: {', '.join(DTYPES)}, or none for the default")


def itemsize(dtype: str) -> int:
  """Bytes per element of ``dtype`` (a name jnp knows)."""
  return jnp.dtype(dtype).itemsize


@dataclasses.dataclass(frozen=True, kw_only=True)
class Precision:
  """The dtypes of a train step beyond the model's own (``param_dtype``, compute ``dtype``).
  ``None``: as before, the parameters' dtype (no master copy; moments and gradients in the
  dtype of the parameters the optimizer updates)."""

  master_dtype: str | None = None
  moments_dtype: str | None = None
  grad_reduce_dtype: str | None = None

  @classmethod
  def of(cls, options: Mapping[str, Any]) -> Precision:
    """The precision one configuration's options give (each dtype by its axis's name; ``None``
    where not given)."""
    return cls(**{f.name: options.get(f.name) for f in dataclasses.fields(cls)})

  def transformation(self, optimizer: Any, lr: float) -> optax.GradientTransformation:
    """``optimizer`` (a :class:`jaxmem.program.optimizers.Optimizer`) at ``lr`` in these dtypes:
    its moments in ``moments_dtype`` where given (a one-line error where it keeps none or fixes
    their dtype), on a master copy in ``master_dtype`` where given."""
    if self.moments_dtype is None:
      tx = optimizer.build(lr)
    elif (refusal := optimizer.moments_refusal()) is not None:
      raise JaxmemError(f"`moments_dtype` {refusal}")
    else:
      tx = optimizer.with_moments(lr, jnp.dtype(self.moments_dtype))
    return tx if self.master_dtype is None else with_master(tx, self.master_dtype)

  def grads(self, grad_fn, param_sh: Any):
    """``grad_fn`` with its gradients formed (and so reduced) in ``grad_reduce_dtype``
    (:func:`grads_in`)."""
    return grads_in(grad_fn, self.grad_reduce_dtype, param_sh)

  def recorded(self, opt_state: Any) -> dict[str, str | None]:
    """What a row records of these dtypes, by name: each as asked, the moments' as the optimizer
    state holds them (:func:`stored_dtype`)."""
    return {**dataclasses.asdict(self), "moments_dtype": stored_dtype(opt_state)}

  def check(self, param_dtype: str) -> None:
    """One-line errors for dtypes that are not dtypes, and for a master copy that is not wider
    than the parameters: a float32 master of float32 parameters would be a second copy of the
    same numbers (the flag was most likely given without ``param_dtype`` bfloat16), so it is
    refused rather than silently compiled as 4 more bytes per parameter."""
    for f in dataclasses.fields(self):
      check_dtype(f.name, getattr(self, f.name))
    if self.master_dtype is not None and itemsize(self.master_dtype) <= itemsize(param_dtype):
      raise JaxmemError(
          f"`master_dtype` {self.master_dtype} is not wider than the parameters' {param_dtype}; a master copy "
          "needs lower-precision parameters (`param_dtype` bfloat16 with `master_dtype` float32)"
      )

  def notes(self, compute_dtype: str) -> tuple[str, ...]:
    """What a row must say about these dtypes."""
    out = []
    if self.master_dtype is not None:
      out.append(f"master_dtype {self.master_dtype}: optimizer_state_bytes include the master copy of the parameters")
    if self.grad_reduce_dtype is not None and (
        jnp.dtype(self.grad_reduce_dtype).itemsize > jnp.dtype(compute_dtype).itemsize
    ):
      out.append(
          f"grad_reduce_dtype {self.grad_reduce_dtype}: gradients are taken with respect to {self.grad_reduce_dtype} "
          f"parameters, but a matmul's weight gradient is a {compute_dtype} product (the compute dtype), which the "
          "compiler may reduce over the data axes before widening it (the TPU and GPU compilers do: only the "
          "embedding and norm gradients are reduced in float32; see the comm columns)"
      )
    return tuple(out)

  def update_dtype(self, param_dtype: str) -> str:
    """The dtype the optimizer updates in: the master copy's, else the parameters'."""
    return self.master_dtype or param_dtype

  def reduce_dtype(self, param_dtype: str) -> str:
    """The dtype gradients are formed (and so reduced) in: ``grad_reduce_dtype``, else the parameters'."""
    return self.grad_reduce_dtype or param_dtype


class MasterState(NamedTuple):
  """The optimizer state of :func:`with_master`: the master copy and the inner optimizer's state."""

  master: optax.Params
  inner: optax.OptState


def with_master(inner: optax.GradientTransformation, dtype: str) -> optax.GradientTransformation:
  """``inner`` run on a ``dtype`` (float32) master copy of the parameters kept in the state.

  ``init`` copies the parameters up to ``dtype`` and initialises ``inner`` on the copy, so its
  moments are in ``dtype`` too unless it fixes its own. ``update`` casts the gradients up,
  updates the master, and returns the change to the low-precision parameters (the master cast
  down minus the parameters), so ``optax.apply_updates`` works; :func:`apply` gives the cast
  master itself, which is exact."""
  up = jnp.dtype(dtype)

  def init(params):
    master = jax.tree.map(lambda p: p.astype(up), params)
    return MasterState(master=master, inner=inner.init(master))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("with_master needs the parameters (tx.update(grads, state, params))")
    grads = jax.tree.map(lambda g: g.astype(up), updates)
    steps, inner_state = inner.update(grads, state.inner, state.master)
    master = optax.apply_updates(state.master, steps)
    delta = jax.tree.map(lambda m, p: m.astype(p.dtype) - p, master, params)
    return delta, MasterState(master=master, inner=inner_state)

  return optax.GradientTransformation(init, update)


def apply(params: Any, updates: Any, opt_state: Any) -> Any:
  """The new parameters: the master copy cast down where the state keeps one, else
  ``optax.apply_updates``."""
  if isinstance(opt_state, MasterState):
    return jax.tree.map(lambda m, p: m.astype(p.dtype), opt_state.master, params)
  return optax.apply_updates(params, updates)


def grads_in(grad_fn, dtype: str | None, param_sh: Any):
  """``grad_fn(p, *batch) -> (loss, grads)`` taken with respect to the parameters cast to
  ``dtype`` at their own sharding (before any gather), so the gradient the compiler reduces
  over the data axes is in ``dtype``; the gradients are returned in that dtype. ``dtype`` None:
  ``grad_fn`` itself."""
  if dtype is None:
    return grad_fn
  to = jnp.dtype(dtype)

  def run(p, *batch):
    cast = jax.tree.map(lambda a: a.astype(to), p)
    return grad_fn(jax.lax.with_sharding_constraint(cast, param_sh), *batch)

  return run


def stored_dtype(opt_state: Any) -> str | None:
  """The dtype most optimizer-state elements are in, beside a master copy (step counts and
  other integers aside): the moments' dtype as the step resolved it; None for an optimizer
  without state."""
  if isinstance(opt_state, MasterState):
    opt_state = opt_state.inner
  counts: dict[str, int] = {}
  for leaf in jax.tree.leaves(opt_state):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      counts[str(jnp.dtype(leaf.dtype))] = counts.get(str(jnp.dtype(leaf.dtype)), 0) + math.prod(leaf.shape)
  return max(counts, key=counts.get) if counts else None

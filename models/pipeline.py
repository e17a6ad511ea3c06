"""Pipeline parallelism over the ``stage`` mesh axis: GPipe and MaxText's circular schedule.

A stack of ``L`` scanned layers is split into ``S`` stages (the sharding rules put the stacked
``layers`` dimension over ``stage``: MaxText's ``layers -> stage``), the batch into ``M``
pipeline microbatches, and each device runs its stage on one microbatch per iteration while the
stage inputs move one stage on. The design is MaxText's (``layers/pipeline.py``), written anew:

- The stage computation is ``jax.vmap`` over the stage dimension with ``spmd_axis_name="stage"``,
  so inside a stage everything else (FSDP, tensor, the attention kernels' own ``shard_map``\\ s)
  is partitioned as in the unpipelined model.
- The stage outputs move on with ``jax.lax.ppermute`` under ``shard_map`` (stage ``s`` to
  ``s + 1``, the last to the first): the only communication the schedule adds.
- The iterations are one ``jax.lax.scan`` of ``M·R + S - 1`` steps (``R`` repeats), and the VJP
  goes through it: the scan keeps each iteration's stage input (``iteration_input``) and what
  the remat policy saves inside the stage, for every iteration, so every microbatch's
  activations are kept until the backward pass (GPipe's memory, Huang et al. 2019). The
  iteration body is under ``jax.checkpoint`` saving what the layer policy saves plus the
  iteration and layer inputs (MaxText's ``get_pipeline_remat_policy``).
- Circular (``R > 1``, MaxText's ``num_pipeline_repeats``; Narayanan et al. 2021's interleaved
  stages): each device holds ``R`` non-adjacent groups of ``L / (S·R)`` layers; group ``r·S + s``
  is on stage ``s``. Microbatch ``m`` leaves the last stage after repeat ``r`` and re-enters the
  first for repeat ``r + 1``, which needs ``M >= S`` (checked by the caller).

Layer order: the stacked arrays keep their ``[L, ...]`` layout, split contiguously over
``stage``, so device ``s`` holds rows ``s·R·Lps`` to ``(s+1)·R·Lps - 1`` (``Lps = L / (S·R)``).
Row ``s·R·Lps + r·Lps + j`` is layer ``(r·S + s)·Lps + j`` of the computation: with ``R = 1``
that is the identity; with ``R > 1`` the storage order is stage-major, which changes no byte
count (:func:`storage_order` gives the permutation, for comparing with the unpipelined model).

One buffer of all ``M`` microbatches sits with every stage (``io`` below: the inputs, then the
last stage's outputs, which the first stage reads again in the next repeat); only the first
stage's copy is used, as MaxText's ``circ_storage``. The bubble iterations compute on whatever
is in flight and their results are never written back, as in MaxText.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh

from .mesh_axes import MeshAxes, shard_map
from .names import DECODER_LAYER_INPUT, ITERATION_INPUT, PIPELINE_WEIGHTS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pipeline:
  """How the layer stacks are pipelined: over ``axes.layers`` (the ``stage`` axis) of ``mesh``,
  ``microbatches`` pipeline microbatches, ``repeats`` circular repeats."""

  mesh: Mesh
  axes: MeshAxes
  microbatches: int
  repeats: int = 1

  @property
  def stages(self) -> int:
    return self.axes.ways("layers")

  @property
  def iterations(self) -> int:
    return self.microbatches * self.repeats + self.stages - 1


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
  """The idle share of a GPipe-style schedule: ``(S - 1) / (M·R + S - 1)`` of the iterations
  compute nothing useful on some stage (GPipe, Huang et al. 2019, section 2.3; with ``R``
  circular repeats MaxText's ``layers/pipeline.py`` runs ``M·R + S - 1`` iterations, of which
  ``S - 1`` fill and drain the pipeline)."""
  return (stages - 1) / (microbatches * repeats + stages - 1)


def in_flight_1f1b(stages: int, microbatches: int, repeats: int = 1) -> int:
  """Stage-activations (one microbatch through one group of ``L / (S·R)`` layers) the first
  stage holds at most under 1F1B: ``min(M, S)`` microbatches of its layers (PipeDream-Flush,
  Narayanan et al. 2021, section 2.2.1); interleaved over ``R > 1`` groups, Megatron's
  accounting scales that by ``1 + (S - 1) / (S·R)`` (``theoretical_memory_usage.py``), i.e.
  ``S·R + S - 1`` groups' worth. Never more than the GPipe schedule's iterations."""
  groups = min(microbatches, stages) * repeats + ((stages - 1) if repeats > 1 else 0)
  return min(groups, microbatches * repeats + stages - 1)


def storage_order(num_layers: int, stages: int, repeats: int) -> np.ndarray:
  """``order[i]``: the layer of the computation that row ``i`` of a stacked array holds."""
  per = num_layers // (stages * repeats)
  s, r, j = np.meshgrid(np.arange(stages), np.arange(repeats), np.arange(per), indexing="ij")
  return ((r * stages + s) * per + j).reshape(-1)


def _rotate(pipe: Pipeline, x_s: jax.Array) -> jax.Array:
  """Stage ``s``'s block of ``x_s`` ([S, mb, ...]) to stage ``s + 1`` (the last to the first)."""
  axes, n = pipe.axes, pipe.stages
  spec = axes.spec("layers", "batch", "seq", *([None] * (x_s.ndim - 3)))
  perm = [(i, (i + 1) % n) for i in range(n)]
  stage = axes.entry("layers")
  return shard_map(
      lambda a: jax.lax.ppermute(a, stage, perm), mesh=pipe.mesh, axes=axes, in_specs=spec, out_specs=spec
  )(x_s)


def _to_microbatches(x_btd: jax.Array, m: int) -> jax.Array:
  """[B, ...] -> [M, B/M, ...], microbatch i the rows i, i + M, ...: a data-parallel device's
  contiguous rows hold its share of every microbatch (as gradient accumulation splits)."""
  return jnp.swapaxes(x_btd.reshape(x_btd.shape[0] // m, m, *x_btd.shape[1:]), 0, 1)


def _from_microbatches(x_mbtd: jax.Array) -> jax.Array:
  return jnp.swapaxes(x_mbtd, 0, 1).reshape(-1, *x_mbtd.shape[2:])


def iteration_policy(layer_policy: Callable | None) -> Callable:
  """The ``jax.checkpoint`` policy of one pipeline iteration: what the layer policy saves, plus
  the iteration's stage input and the layers' inputs (MaxText's
  ``save_from_both_policies(remat_policy, save_only_these_names("iteration_input",
  "decoder_layer_input"))``). Without a layer policy (no remat) everything is saved but the
  gathered repeat weights, which the backward pass slices again rather than keeping a copy per
  iteration."""
  cp = jax.checkpoint_policies
  if layer_policy is None:
    return cp.save_anything_except_these_names(PIPELINE_WEIGHTS)
  # The layer policy first: one that offloads decoder_layer_input keeps offloading it.
  return cp.save_from_both_policies(layer_policy, cp.save_only_these_names(ITERATION_INPUT, DECODER_LAYER_INPUT))


def run(
    pipe: Pipeline, stage_fn: Callable[[Any, jax.Array], jax.Array], weights: Any, x_btd: jax.Array,
    *, layer_policy: Callable | None,
) -> jax.Array:
  """``x_btd`` through every layer of ``weights`` (a pytree of stacked [L, ...] layer
  parameters) pipelined as ``pipe`` says. ``stage_fn(stage_weights, x)`` runs one group of
  layers (leaves [L / (S·R), ...]) on one microbatch ``x`` [mb, T, D]."""
  s_n, m_n, r_n = pipe.stages, pipe.microbatches, pipe.repeats
  # [L, ...] -> [S, R, Lps, ...]: splits the contiguous stage shards, so no data moves.
  grouped = jax.tree.map(lambda a: a.reshape(s_n, r_n, a.shape[0] // (s_n * r_n), *a.shape[1:]), weights)
  x_mbtd = _to_microbatches(x_btd, m_n)
  io = jnp.broadcast_to(x_mbtd[None], (s_n, *x_mbtd.shape))  # [S, M, mb, T, D], each stage's copy
  shift = jnp.zeros((s_n, *x_mbtd.shape[1:]), x_mbtd.dtype)  # what each stage receives
  stage_ids = jnp.arange(s_n)
  run_stages = jax.vmap(stage_fn, spmd_axis_name=pipe.axes.entry("layers"))

  def iteration(carry, t):
    shift, io = carry
    # The first stage takes microbatch t % M from its buffer (an input, or repeat r - 1's
    # output); the others what the previous stage sent.
    first = jax.lax.dynamic_index_in_dim(io, t % m_n, axis=1, keepdims=False)
    x_s = jnp.where((stage_ids == 0)[:, None, None, None], first, shift)
    x_s = checkpoint_name(x_s, ITERATION_INPUT)
    if r_n == 1:
      w = jax.tree.map(lambda a: a[:, 0], grouped)
    else:  # each stage's repeat: the one its current microbatch is in
      r_s = jnp.clip(t - stage_ids, 0, m_n * r_n - 1) // m_n
      w = jax.vmap(lambda a, r: jax.lax.dynamic_index_in_dim(a, r, axis=0, keepdims=False))
      w = jax.tree.map(lambda a: checkpoint_name(w(a, r_s), PIPELINE_WEIGHTS), grouped)
    shift = _rotate(pipe, run_stages(w, x_s))
    # shift[0] is now the last stage's output for item t - (S - 1): microbatch (t - S + 1) % M.
    done = t - (s_n - 1)
    slot = jnp.maximum(done, 0) % m_n
    old = jax.lax.dynamic_index_in_dim(io, slot, axis=1, keepdims=False)
    io = jax.lax.dynamic_update_index_in_dim(io, jnp.where(done >= 0, shift, old), slot, axis=1)
    return (shift, io), None

  iteration = jax.checkpoint(iteration, policy=iteration_policy(layer_policy), prevent_cse=False)
  (_, io), _ = jax.lax.scan(iteration, (shift, io), jnp.arange(pipe.iterations))
  return _from_microbatches(_first_stage(pipe, io))


def _first_stage(pipe: Pipeline, io: jax.Array) -> jax.Array:
  """The first stage's buffer ([S, M, ...] -> [M, ...]), on every stage: a sum over ``stage``
  of it and zeros (one all-reduce of the outputs, once per step)."""
  axes = pipe.axes
  stage = axes.entry("layers")
  spec = axes.spec("layers", None, "batch", "seq", *([None] * (io.ndim - 4)))
  out_spec = axes.spec(None, "batch", "seq", *([None] * (io.ndim - 4)))

  def pick(a):
    mine = jnp.where(jax.lax.axis_index(stage) == 0, a[0], jnp.zeros_like(a[0]))
    return jax.lax.psum(mine, stage)

  return shard_map(pick, mesh=pipe.mesh, axes=axes, in_specs=spec, out_specs=out_spec)(io)

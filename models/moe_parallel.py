"""Dropless routed experts over a device mesh: every device sorts only its own tokens, and expert
parallelism sends the sorted copies to the devices that hold their experts and back.

:func:`~.moe.dropless_experts` sorts all the tokens it is given, and a global sort is not
something GSPMD can split: on a batch-sharded mesh every device would sort every token. Here the
experts run inside ``jax.shard_map`` (MaxText's ``RoutedMoE.sparse_matmul``, layers/moe.py), per
device:

1. Permute: the device's N = b*t tokens are copied k times (M = N*k rows) and sorted by chosen
   expert (as in :func:`~.moe.dropless_experts`); ``group_sizes`` counts rows per expert.
2. Without expert parallelism (``expert`` axis absent or 1): the grouped SwiGLU (the grouped
   matmul of :mod:`.moe_kernels`, ``ragged_dot`` or megablox's ``gmm``) over all E experts, on
   the device's rows only.
3. With an ``expert`` axis of size P, each device holds E/P experts. The devices of one expert
   group all-gather their group sizes ([P, E]), from which each knows what it sends to and
   receives from every other (MaxText's ``get_all_to_all_params``), and the rows travel with
   ``jax.lax.ragged_all_to_all`` into a receive buffer of P * N * min(E/P, k) rows (MaxText's
   ``buffer_size``: the most a device can be sent if every source routes all its tokens to its
   experts, each token reaching at most min(E/P, k) of them). The received rows, grouped by
   source, are regrouped by local expert (MaxText's ``local_permute``), run through the grouped
   SwiGLU with the local experts, put back in source order, and returned by a second
   ``ragged_all_to_all``; then unsorted and combined with the router weights.

   XLA:CPU cannot compile ``ragged-all-to-all`` ("not supported by XLA:CPU ThunkEmitter", jaxlib
   0.10.2 and 0.12.0.1), so on CPU the same exchange runs as a padded ``jax.lax.all_to_all``:
   a [P, N * min(E/P, k), D] buffer per direction, each destination's rows padded to the
   most it could receive. The numbers are the same; the bytes are the padded buffer's, which is
   what an equivalent dense exchange costs.

A ``tensor`` axis splits every expert's hidden width F (Megatron's MLP split, as MaxText's
"mlp" rule does for experts): the two input projections are local, the output projection a
partial sum, added up with ``psum`` over ``tensor``. The expert weights enter the shard_map
whole along d_model (gathered over ``fsdp`` at its edge, as MaxText's ``mlp_no_fsdp`` specs do).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jax.ad_checkpoint import checkpoint_name

from .mesh_axes import MeshAxes, require, shard_map
from .moe import ExpertsFn, _permute, _swiglu_named
from .moe_kernels import GroupedMatmul, ragged_dot
from .names import MOE_MLPWO


def _exclusive_cumsum(x: jax.Array, axis: int = 0) -> jax.Array:
  return jnp.cumsum(x, axis=axis) - x


def _grouped_swiglu(
  x_md,
  group_sizes_e,
  w_gate_edf,
  w_up_edf,
  w_down_efd,
  tensor: str | tuple[str, ...] | None,
  matmul: GroupedMatmul,
  act: str = "silu",
) -> jax.Array:
  """Every expert's SwiGLU (GeGLU with ``act`` gelu_tanh) on its contiguous rows (the grouped
  ``matmul``), summed over ``tensor``."""
  gate_mf = matmul(x_md, w_gate_edf, group_sizes_e)
  up_mf = matmul(x_md, w_up_edf, group_sizes_e)
  out_md = matmul(_swiglu_named(gate_mf, up_mf, act), w_down_efd, group_sizes_e)
  if tensor is not None:
    out_md = jax.lax.psum(out_md, tensor)  # each device held F / tensor of the hidden width
  return checkpoint_name(out_md, MOE_MLPWO)


def _local_regroup(ids_r: jax.Array, valid_r: jax.Array, e_loc: int) -> jax.Array:
  """The order that groups received rows by local expert, padding rows (not ``valid``) last."""
  return jnp.argsort(jnp.where(valid_r, ids_r, e_loc), stable=True)


# Module-level so that a test can put an emulation in its place on XLA:CPU, which cannot compile it.
_ragged_all_to_all = jax.lax.ragged_all_to_all


def _ragged_exchange(x_md, sizes_e, me, p, e_loc, buffer, expert, run):
  """Rows to their experts' devices and back with ``ragged_all_to_all`` (module docstring)."""
  d = x_md.shape[1]
  all_pe = jax.lax.all_gather(sizes_e, expert)  # [source, E]: every source's group sizes
  send_pp = all_pe.reshape(p, p, e_loc).sum(-1)  # [source, destination] rows
  sent_p, got_p = send_pp[me], send_pp[:, me]
  # Where my rows start in every receiver's buffer: after those of the sources before me.
  placed_p = _exclusive_cumsum(send_pp, axis=0)[me]
  recv_bd = _ragged_all_to_all(
    x_md, jnp.zeros((buffer, d), x_md.dtype), _exclusive_cumsum(sent_p), sent_p, placed_p, got_p, axis_name=expert
  )
  # Received rows come by source, each source's sorted by expert: label them by local expert.
  local_pl = jax.lax.dynamic_slice_in_dim(all_pe, me * e_loc, e_loc, axis=1)  # [source, local expert]
  ids_b = jnp.repeat(jnp.tile(jnp.arange(e_loc), p), local_pl.reshape(-1), total_repeat_length=buffer)
  out_bd = run(recv_bd, ids_b, jnp.arange(buffer) < jnp.sum(got_p), local_pl.sum(0))
  # Back to the sources: each gets its rows at the offsets it sent them from.
  returned_at_p = _exclusive_cumsum(send_pp, axis=1)[:, me]
  return _ragged_all_to_all(
    out_bd, jnp.zeros_like(x_md), _exclusive_cumsum(got_p), got_p, returned_at_p, sent_p, axis_name=expert
  )


def _padded_exchange(x_md, sizes_e, me, p, e_loc, cap, expert, run):
  """The same exchange as a padded ``all_to_all`` of [P, cap, D] (for XLA:CPU)."""
  m, d = x_md.shape
  all_pe = jax.lax.all_gather(sizes_e, expert)
  sent_p = sizes_e.reshape(p, e_loc).sum(-1)
  start_p = _exclusive_cumsum(sent_p)
  slot_pc = start_p[:, None] + jnp.arange(cap)[None, :]  # row of x_md in each send slot
  filled_pc = jnp.arange(cap)[None, :] < sent_p[:, None]
  send_pcd = jnp.where(filled_pc[..., None], x_md[jnp.minimum(slot_pc, m - 1)], 0)
  recv_pcd = jax.lax.all_to_all(send_pcd, expert, 0, 0, tiled=True)
  local_pl = jax.lax.dynamic_slice_in_dim(all_pe, me * e_loc, e_loc, axis=1)
  ids_pc = jax.vmap(lambda s_l: jnp.repeat(jnp.arange(e_loc), s_l, total_repeat_length=cap))(local_pl)
  valid_pc = jnp.arange(cap)[None, :] < local_pl.sum(-1)[:, None]
  out_pcd = run(recv_pcd.reshape(p * cap, d), ids_pc.reshape(-1), valid_pc.reshape(-1), local_pl.sum(0))
  back_pcd = jax.lax.all_to_all(out_pcd.reshape(p, cap, d), expert, 0, 0, tiled=True)
  # Row r of x_md went to destination j, slot r - start_j.
  dest_m = jnp.repeat(jnp.arange(p), sent_p, total_repeat_length=m)
  return back_pcd[dest_m, jnp.arange(m) - start_p[dest_m]]


def sharded_dropless(
  mesh: Mesh, axes: MeshAxes, *, exchange: str | None = None, matmul: GroupedMatmul = ragged_dot
) -> ExpertsFn:
  """The :data:`~.moe.ExpertsFn` that runs dropless experts per device over ``mesh`` (module
  docstring), split as ``axes`` (the mesh's :class:`~.mesh_axes.MeshAxes`) says: tokens by
  ``batch`` and ``seq``, expert weights by ``experts`` and ``mlp``. ``exchange`` "ragged" or
  "padded"; None picks "padded" on CPU, else "ragged". ``matmul``: the grouped matmul each
  device runs (:mod:`.moe_kernels`; ``jax.lax.ragged_dot`` unless given)."""
  require(axes, mesh, "sharded_dropless")
  expert, tensor = axes.entry("experts"), axes.entry("mlp")
  p = axes.ways("experts")
  if exchange is None:
    exchange = "padded" if mesh.devices.flat[0].platform == "cpu" else "ragged"
  tok = axes.spec("batch", "seq", None)
  w_in, w_out = axes.spec("experts", None, "mlp"), axes.spec("experts", "mlp", None)

  def local(x_btd, weights_btk, experts_btk, w_gate_edf, w_up_edf, w_down_efd, *, act):
    b, t, d = x_btd.shape
    k, e_loc = experts_btk.shape[-1], w_gate_edf.shape[0]
    flat_m = experts_btk.reshape(-1)
    order_m = jnp.argsort(flat_m, stable=True)
    sizes_e = jnp.bincount(flat_m, length=e_loc * p).astype(jnp.int32)
    x_md = _permute(jnp.repeat(x_btd.reshape(b * t, d), k, axis=0), order_m)

    def run(rows_rd, ids_r, valid_r, local_sizes_l):
      regroup = _local_regroup(ids_r, valid_r, e_loc)
      out_rd = _grouped_swiglu(
        _permute(rows_rd, regroup), local_sizes_l.astype(jnp.int32), w_gate_edf, w_up_edf, w_down_efd, tensor, matmul,
        act,
      )
      return _permute(out_rd, jnp.argsort(regroup))

    if p == 1:
      out_md = _grouped_swiglu(x_md, sizes_e, w_gate_edf, w_up_edf, w_down_efd, tensor, matmul, act)
    else:
      me = jax.lax.axis_index(expert)
      cap = b * t * min(e_loc, k)  # the most one source can send one destination
      if exchange == "ragged":
        out_md = _ragged_exchange(x_md, sizes_e, me, p, e_loc, p * cap, expert, run)
      else:
        out_md = _padded_exchange(x_md, sizes_e, me, p, e_loc, cap, expert, run)
    out_nkd = _permute(out_md, jnp.argsort(order_m)).reshape(b * t, k, d)
    y_nd = jnp.einsum(
      "nkd,nk->nd", out_nkd, weights_btk.reshape(b * t, k).astype(out_nkd.dtype), preferred_element_type=jnp.float32
    )
    return y_nd.reshape(b, t, d).astype(x_btd.dtype)

  # A Pallas kernel's output carries no varying-manual-axes type, which shard_map's check refuses
  # with abstract inputs (as for the attention kernels, attention_kernels.py): off for those.
  check = {} if matmul is ragged_dot else {"check_vma": False}
  # One shard_map per expert activation (ModelConfig.expert_act), made when first asked for.
  sharded: dict[str, ExpertsFn] = {}

  def experts(x_btd, weights_btk, experts_btk, w_gate_edf, w_up_edf, w_down_efd, *, constrain, act="silu"):
    del constrain  # the shard_map's specs place every input
    if act not in sharded:
      sharded[act] = shard_map(
        functools.partial(local, act=act), mesh=mesh, axes=axes, in_specs=(tok, tok, tok, w_in, w_in, w_out),
        out_specs=tok, **check,
      )
    return sharded[act](x_btd, weights_btk, experts_btk, w_gate_edf, w_up_edf, w_down_efd)

  return experts

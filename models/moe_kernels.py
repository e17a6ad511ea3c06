"""The grouped matmul that dropless experts run: ``jax.lax.ragged_dot`` or megablox's ``gmm``.

Dropless experts (:func:`~.moe.dropless_experts`, :func:`~.moe_parallel.sharded_dropless`) sort
the tokens' copies by expert and multiply each expert's contiguous rows by its weights: a grouped
matmul ``out[rows of e] = x[rows of e] @ w[e]``. Two kernels compute it:

* ``ragged_dot``: ``jax.lax.ragged_dot``, left to the compiler. XLA's TPU and GPU compilers
  expand it into a dense matmul over all E experts (every row times every expert's weights,
  masked), so its FLOPs and temporaries are E times a grouped matmul's: MaxText's deepseek2-16b
  (64 experts) on v5p-8 compiled this way to 14x its model FLOPs.
* ``gmm``: megablox's Pallas TPU kernel (``jax.experimental.pallas.ops.tpu.megablox``: ``gmm``
  with a custom VJP whose weight gradient is ``tgmm``), which visits only the row tiles each
  group occupies. It is what MaxText's ``sparse_matmul`` path runs on TPU (``megablox=True``,
  its default; ``src/MaxText/layers/moe.py``, ``RoutedMoE.sparse_matmul``'s ``gmm``). A Mosaic
  TPU kernel: XLA:CPU and GPU cannot compile it (CPU runs it in Pallas's interpreter, for tests).

``auto`` (the default) is the target's production kernel: ``gmm`` on TPU, ``ragged_dot``
elsewhere, chosen as attention's ``auto`` is (:func:`choose_moe_kernel`).

FLOPs: a Pallas call is one jaxpr equation whose body is one grid step, so :func:`gmm_flops`,
registered in :mod:`jaxmem.kernels`, counts each megablox call from its shapes as megablox's own
``CostEstimate`` does: ``2 * m * k * n`` for ``gmm`` (lhs [m, k] times [k, n]) and for ``tgmm``
(lhs^T [k, m] times [m, n] per group, summed over groups), with m the rows padded to the tile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxmem.errors import JaxmemError
from jaxmem.kernels import register_kernel_flops
from jaxmem.registry import publish

# (x [m, k], w [E, k, n], group_sizes int32 [E]) -> [m, n]: the rows of group e (contiguous,
# in group order) times w[e]; rows past the groups' total are zero.
GroupedMatmul = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]

AUTO = "auto"
# The names --moe-kernel takes (the sweep axis jaxmem.axes declares checks them against these).
MOE_KERNELS = publish("MoE kernel", (AUTO, "gmm", "ragged_dot"))
# auto's kernel per platform (a platform not listed: ragged_dot).
AUTO_KERNEL = {"tpu": "gmm"}

# MaxText's default megablox tiles (configs/types.py: tile_batch_seq 512, tile_embed_dim 1024,
# tile_mlp_dim 1024), each cut to the dimension where that is smaller, as its gmm does.
GMM_TILING = (512, 1024, 1024)


def gmm_tiles(m: int, k: int, n: int) -> tuple[int, int, int]:
  """The (tm, tk, tn) tiles of one megablox call of m rows, k contracted and n output columns:
  :data:`GMM_TILING` cut to each dimension. Given to megablox as its tiling look-up, so that each
  call, the backward's transposed ``gmm`` and ``tgmm`` included, cuts the tiles to its own
  dimensions: a fixed tuple sized for the forward's k and n would give the backward (k and n
  swapped) a block Mosaic refuses where a width is under 128 and not the whole dimension."""
  return min(GMM_TILING[0], m), min(GMM_TILING[1], k), min(GMM_TILING[2], n)


def ragged_dot(x_mk: jax.Array, w_ekn: jax.Array, group_sizes_e: jax.Array) -> jax.Array:
  """The grouped matmul as ``jax.lax.ragged_dot``."""
  return jax.lax.ragged_dot(x_mk, w_ekn, group_sizes_e)


def gmm(x_mk: jax.Array, w_ekn: jax.Array, group_sizes_e: jax.Array, *, interpret: bool = False) -> jax.Array:
  """The grouped matmul through megablox's ``gmm`` (its custom VJP: ``gmm`` for the input's
  gradient, ``tgmm`` for the weights'). The kernel needs the rows to be a multiple of the row
  tile, so they are padded with zeros to it (as MaxText's ``sparse_matmul`` pads to
  ``tile_batch_seq``) and cut off after; the padded rows belong to no group, so the group sizes
  stand as they are. ``interpret``: Pallas's interpreter (CPU, tests)."""
  from jax.experimental.pallas.ops.tpu.megablox import ops  # imports Pallas's TPU dialect: only when used

  m = x_mk.shape[0]
  pad = -m % min(GMM_TILING[0], m)
  if pad:
    x_mk = jnp.pad(x_mk, ((0, pad), (0, 0)))
  # Positional: megablox's custom_vjp takes preferred_element_type, tiling, transpose_rhs and
  # interpret as non-differentiable positions (3, 4, 7, 8), the same in jax 0.10.2 and 0.12.0.1.
  sizes = group_sizes_e.astype(jnp.int32)
  out = ops.gmm(x_mk, w_ekn.astype(x_mk.dtype), sizes, x_mk.dtype, gmm_tiles, None, None, False, interpret)
  out = out[:m] if pad else out
  # The kernel writes only the rows of its groups; rows past their total (an expert-parallel
  # receive buffer's unused tail) would hold whatever the memory held. Zeroed, as ragged_dot
  # gives them, so nothing downstream (the SwiGLU, the backward) meets garbage; one select that
  # XLA fuses into the consumer.
  return jnp.where(jnp.arange(m)[:, None] < jnp.sum(sizes), out, jnp.zeros((), out.dtype))


def grouped_matmul(kernel: str, *, interpret: bool = False) -> GroupedMatmul:
  """The :data:`GroupedMatmul` named ``kernel`` (``gmm`` or ``ragged_dot``; not ``auto``,
  which :func:`choose_moe_kernel` resolves first)."""
  if kernel == "gmm":
    return functools.partial(gmm, interpret=interpret)
  if kernel == "ragged_dot":
    return ragged_dot
  raise JaxmemError(f"unknown `moe_kernel` {kernel!r}; valid: {', '.join(MOE_KERNELS)}")


def choose_moe_kernel(requested: str | None, platform: str) -> str:
  """The kernel ``requested`` names on ``platform``: ``auto`` (or None) is ``gmm`` on TPU and
  ``ragged_dot`` elsewhere; ``gmm`` elsewhere than TPU is refused in one line."""
  name = AUTO if requested is None else requested
  if name not in MOE_KERNELS:
    raise JaxmemError(f"unknown `moe_kernel` {name!r}; valid: {', '.join(MOE_KERNELS)}")
  if name == AUTO:
    return AUTO_KERNEL.get(platform, "ragged_dot")
  if name == "gmm" and platform != "tpu":
    raise JaxmemError(
      f"`moe_kernel` gmm is megablox's Mosaic TPU kernel; a {platform.upper()} target cannot compile it "
      "(use ragged_dot or auto)"
    )
  return name


def _megablox_kernel(eqn: Any) -> bool:
  """Whether ``eqn`` is a ``pallas_call`` of a kernel defined in megablox's ``gmm.py`` (its
  ``gmm`` and ``tgmm`` calls name no kernel; their body's debug info names the file)."""
  if eqn.primitive.name != "pallas_call":
    return False
  info = getattr(getattr(eqn.params.get("jaxpr"), "debug_info", None), "func_src_info", None) or ""
  return "megablox" in info and "gmm.py" in info


@register_kernel_flops
def gmm_flops(eqn: Any) -> float | None:
  """The FLOPs of a megablox ``gmm`` or ``tgmm`` call (module docstring), else None: 2 x the
  lhs's elements (m x k) x the output's last dimension (n). The lhs follows the calls' index
  operands: the grid's dynamic bound (the active row tiles), then the group metadata and offset
  the grid prefetches."""
  if not _megablox_kernel(eqn):
    return None
  grid = eqn.params["grid_mapping"]
  lhs = eqn.invars[grid.num_dynamic_grid_bounds + grid.num_index_operands].aval
  out = eqn.outvars[0].aval
  return 2.0 * lhs.size * out.shape[-1]

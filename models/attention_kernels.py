"""Fused attention kernels behind the :data:`~.attention_ops.AttendFn` interface.

Each ``make_*_attend`` returns ``attend(q_btnh, k_bskh, v_bskv, *, causal=True) -> ctx_btnv``
in the model's layout; the layout changes, scaling and head grouping each kernel needs happen
inside. What each one accepts is checked by :mod:`.attention_registry` before it is built.

* :func:`make_splash_attend`: Pallas splash attention for TPU
  (``jax.experimental.pallas.ops.tpu.splash_attention``), MaxText's default TPU kernel.
* :func:`make_cudnn_attend`: cuDNN's fused flash attention through
  ``jax.nn.dot_product_attention(implementation="cudnn")``, MaxText's default GPU kernel (there
  through Transformer Engine or this same JAX entry point).
* :func:`make_triton_attend`: the Pallas Triton flash attention
  (``jax.experimental.pallas.ops.gpu.attention.mha``).

Partitioning: a Pallas kernel is a custom call XLA cannot partition ("Mosaic kernels cannot be
automatically partitioned. Please wrap the call in a shard_map."), so over a mesh each kernel
runs under ``jax.shard_map`` with the batch split over the data-parallel axes and the heads
over the tensor axis, as MaxText's ``tpu_flash_attention`` does. Attention needs every key of a
sequence, so a sequence-sharded mesh is refused (by the registry's support check, and here).
``check_vma=False``: the kernels' outputs carry no varying-manual-axes information, and with
abstract inputs the check refuses them (the keyword is ``check_vma`` in jax 0.10 and 0.12).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from jaxmem.errors import JaxmemError

from .attention_ops import AttendFn
from .names import CONTEXT


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshAxes:
  """Which mesh axes split the attention inputs: jaxmem's activation rules (batch over data,
  fsdp and expert, heads over tensor, positions over sequence). Axes the mesh lacks are ignored."""

  batch: tuple[str, ...] = ("data", "fsdp", "expert")
  heads: str = "tensor"
  seq: str = "sequence"


DEFAULT_MESH_AXES = MeshAxes()


def mesh_problem(
  name: str, mesh_shape: dict[str, int], *, num_heads: int, num_kv_heads: int, axes: MeshAxes = DEFAULT_MESH_AXES
) -> str | None:
  """Why kernel ``name`` cannot run under shard_map on a mesh of these axis sizes, or None."""
  seq_ways = mesh_shape.get(axes.seq, 1)
  if seq_ways > 1:
    return (
      f"{name} needs every key of a sequence on one device, and the mesh splits the sequence "
      f"{seq_ways} ways ({axes.seq}={seq_ways})"
    )
  tp = mesh_shape.get(axes.heads, 1)
  if num_heads % tp or num_kv_heads % tp:
    return (
      f"{name} runs per device on whole heads, and {axes.heads}={tp} does not divide "
      f"{num_heads} query heads and {num_kv_heads} kv heads"
    )
  return None


def over_mesh(local: AttendFn, mesh: Mesh | None, *, name: str, axes: MeshAxes = DEFAULT_MESH_AXES) -> AttendFn:
  """``local`` run on each device's batch and head shard under ``jax.shard_map``."""
  if mesh is None or mesh.size == 1:
    return local
  if mesh.shape.get(axes.seq, 1) > 1:
    raise JaxmemError(
      f"attention {name!r} cannot run on a mesh with a {axes.seq} axis > 1 (mesh {dict(mesh.shape)}); "
      f"use --attention chunked or dot, or drop the {axes.seq} axis"
    )
  batch = tuple(a for a in axes.batch if a in mesh.axis_names) or None
  heads = axes.heads if axes.heads in mesh.axis_names else None
  spec = PartitionSpec(batch, None, heads, None)

  def attend(q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True) -> jax.Array:
    run = functools.partial(local, causal=causal)
    return jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(
      q_btnh, k_bskh, v_bskv
    )

  return attend


# --- TPU: Pallas splash attention ------------------------------------------------------------

# MaxText's splash block sizes (configs/base.yml, sa_block_* = 512), smaller for shorter
# sequences; the kernel's key blocks must be multiples of the 128 TPU lanes.
SPLASH_BLOCKS = (512, 256, 128)


def splash_block(n: int) -> int | None:
  """The largest block in SPLASH_BLOCKS dividing n, or None (n is not a multiple of 128)."""
  return next((bl for bl in SPLASH_BLOCKS if n % bl == 0), None)


def make_splash_attend(
  mesh: Mesh | None = None, *, interpret: bool = False, axes: MeshAxes = DEFAULT_MESH_AXES
) -> AttendFn:
  """Splash attention (``make_splash_mha``, a causal ``MultiHeadMask``, [B, N, T, H] layout).

  GQA as MaxText feeds it: k and v keep their K heads ([K, S, H] per batch element) and the
  kernel maps each group of N / K query heads onto its kv head itself, so nothing is repeated.
  The kernel is built per device shard (inside the shard_map), for the local heads, so its mask
  metadata needs no sharding of its own. Its residuals (output and log-sum-exp) carry the
  ``context`` checkpoint name, as in MaxText (``residual_checkpoint_name="context"``).
  ``interpret=True`` runs the kernel in Pallas' interpreter (for CPU tests).
  """

  def local(q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True) -> jax.Array:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    t, n, h = q_btnh.shape[1:]
    s = k_bskh.shape[1]
    bq, bkv = splash_block(t), splash_block(s)
    if bq is None or bkv is None:
      raise JaxmemError(f"splash attention needs sequence lengths that are multiples of 128, got {t} and {s}")
    # Query t sits at key position t + (S - T), as in dot_attend.
    head_mask = sm.CausalMask((t, s), offset=s - t) if causal else sm.FullMask((t, s))
    sizes = sk.BlockSizes(
      block_q=bq, block_kv=bkv, block_kv_compute=bkv,
      block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
      block_q_dq=bq, block_kv_dq=bkv,
    )
    kernel = sk.make_splash_mha(
      sm.MultiHeadMask([head_mask] * n), block_sizes=sizes, head_shards=1, q_seq_shards=1,
      residual_checkpoint_name=CONTEXT, interpret=interpret,
    )
    q_bnth = jnp.swapaxes(q_btnh * jnp.asarray(1.0 / math.sqrt(h), q_btnh.dtype), 1, 2)
    out_bntv = jax.vmap(kernel)(q_bnth, jnp.swapaxes(k_bskh, 1, 2), jnp.swapaxes(v_bskv, 1, 2))
    return jnp.swapaxes(out_bntv, 1, 2).astype(v_bskv.dtype)

  return over_mesh(local, mesh, name="splash", axes=axes)


# --- GPU: cuDNN flash attention --------------------------------------------------------------

# What a deviceless cuDNN figure leaves out (measured: the compiled custom calls
# __cudnn$fmhaSoftmax / __cudnn$fmhaSoftmaxBackward keep workspace_size "0", because XLA runs
# its cuDNN passes, which size the workspace, only with a GPU attached).
CUDNN_WORKSPACE_NOTE = (
  "attention cudnn: the cuDNN workspace is not in these figures (XLA sizes it only with a GPU "
  "attached; a deviceless compile keeps workspace_size 0)"
)


def cudnn_version() -> int | None:
  """The cuDNN version JAX would trace against (e.g. 92800), or None when it is not installed.

  jax's cuDNN attention checks the library when it traces (``check_cudnn_version``), with no
  GPU needed; the ``nvidia-cudnn-cu12`` wheel (the ``cuda`` extra) provides it.
  """
  try:
    from jax._src.lib import cuda_versions
  except ImportError:
    return None
  if cuda_versions is None:
    return None
  try:
    return int(cuda_versions.cudnn_get_version())
  except RuntimeError:  # the plugin is there but libcudnn cannot be loaded
    return None


def make_cudnn_attend(
  mesh: Mesh | None = None, *, implementation: str = "cudnn", axes: MeshAxes = DEFAULT_MESH_AXES
) -> AttendFn:
  """``jax.nn.dot_product_attention(implementation="cudnn")`` in the model's [B, T, N, H] layout.

  cuDNN takes grouped kv heads as they are (N a multiple of K). ``implementation="xla"`` runs
  the same call through XLA's reference path, which is how CPU tests check this wrapper's
  layout, scale and grouping without a GPU.
  """

  def local(q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True) -> jax.Array:
    scale = 1.0 / math.sqrt(q_btnh.shape[-1])
    out_btnv = jax.nn.dot_product_attention(
      q_btnh, k_bskh, v_bskv, scale=scale, is_causal=causal, implementation=implementation
    )
    return out_btnv.astype(v_bskv.dtype)

  return over_mesh(local, mesh, name="cudnn", axes=axes)


# --- GPU: Pallas Triton flash attention ------------------------------------------------------

# The kernel's default block sizes (BlockSizes.get_default(): 128 forward, 32 backward); its
# sequence lengths must be multiples of the blocks it uses, and Triton blocks are powers of 2.
TRITON_BLOCK = 128


def make_triton_attend(
  mesh: Mesh | None = None, *, interpret: bool = False, axes: MeshAxes = DEFAULT_MESH_AXES
) -> AttendFn:
  """Pallas Triton ``mha`` ([B, T, N, H] layout, q, k and v with the same head count and size).

  The kernel indexes k and v by the query head, so grouped kv heads are repeated to N heads
  first (a [B, S, N, H] copy of each, per device). ``interpret=True`` runs it in Pallas'
  interpreter (for CPU tests).
  """

  def local(q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True) -> jax.Array:
    with warnings.catch_warnings():
      # jax 0.12 deprecates the module in favour of tokamax; it is still jax's kernel.
      warnings.simplefilter("ignore", DeprecationWarning)
      from jax.experimental.pallas.ops.gpu import attention as pallas_gpu

    n, k = q_btnh.shape[2], k_bskh.shape[2]
    if n != k:
      k_bskh = jnp.repeat(k_bskh, n // k, axis=2)
      v_bskv = jnp.repeat(v_bskv, n // k, axis=2)
    scale = 1.0 / math.sqrt(q_btnh.shape[-1])
    out_btnv = pallas_gpu.mha(q_btnh, k_bskh, v_bskv, None, sm_scale=scale, causal=causal, interpret=interpret)
    return out_btnv.astype(v_bskv.dtype)

  return over_mesh(local, mesh, name="triton", axes=axes)


@contextlib.contextmanager
def triton_lowering(mesh: Mesh | None) -> Iterator[None]:
  """Context in which to lower (``.lower()``) a program using :func:`make_triton_attend`.

  The Pallas Triton lowering asks which GPU it compiles for when the program is *lowered*, not
  traced: jax 0.12 reads the default device's kind (a CPU here, so it refuses: "No supported
  GPU devices found"); jax 0.10 asks for an attached GPU and, without one, assumes compute
  capability 9.0. Making the mesh's first (compile-only) GPU the default device answers both.
  """
  if mesh is None:
    yield
    return
  with jax.default_device(mesh.devices.flat[0]):
    yield

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
runs under ``jax.shard_map`` with the batch and the heads split over the mesh axes the sharding
rules give them (a :class:`~.mesh_axes.MeshAxes`, which every ``make_*_attend`` given a mesh
needs), as MaxText's ``tpu_flash_attention`` does. Attention needs every key of a
sequence, so a sequence-sharded mesh is refused here (by the registry's support check, and
here); over a ``context`` axis the registry runs a kernel through :mod:`.context_attention`.
``check_vma=False``: the kernels' outputs carry no varying-manual-axes information, and with
abstract inputs the check refuses them (the keyword is ``check_vma`` in jax 0.10 and 0.12).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxmem.errors import JaxmemError

from .attention_ops import AttendFn
from .mesh_axes import MeshAxes, require, shard_map
from .names import CONTEXT


def mesh_problem(name: str, axes: MeshAxes | None, *, num_heads: int, num_kv_heads: int) -> str | None:
  """Why kernel ``name`` cannot run under shard_map on the mesh ``axes`` describes, or None
  (None also without a mesh: one device)."""
  if axes is None:
    return None
  seq_ways = axes.ways("seq")
  if seq_ways > 1:
    return (
      f"{name} needs every key of a sequence on one device, and the mesh splits the sequence "
      f"{seq_ways} ways ({axes.describe('seq')})"
    )
  tp = axes.ways("heads")
  if num_heads % tp or num_kv_heads % tp:
    return (
      f"{name} runs per device on whole heads, and {axes.describe('heads')} does not divide "
      f"{num_heads} query heads and {num_kv_heads} kv heads"
    )
  return None


def over_mesh(local: AttendFn, mesh: Mesh | None, axes: MeshAxes | None, *, name: str) -> AttendFn:
  """``local`` run on each device's batch and head shard under ``jax.shard_map``; a mesh
  without its ``axes`` is an error (no default axis names)."""
  if mesh is None:
    return local
  axes = require(axes, mesh, f"attention {name!r}")
  if mesh.size == 1:
    return local
  if axes.ways("seq") > 1:
    raise JaxmemError(
      f"attention {name!r} cannot run on a mesh that splits the sequence ({axes.describe('seq')}; mesh "
      f"{dict(mesh.shape)}); use `attention` chunked or dot, or drop that axis"
    )
  spec = axes.spec("batch", None, "heads", None)

  def attend(
    q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True, sinks=None, **layer
  ) -> jax.Array:
    # The sinks [N], where a layer has them, are split over the heads as q is: each shard gets
    # its own heads' logits.
    extra, extra_specs = ((), ()) if sinks is None else ((sinks,), (axes.spec("heads"),))

    def run(q, k, v, *s):
      return local(q, k, v, causal=causal, **layer, **({"sinks": s[0]} if s else {}))

    return shard_map(
      run, mesh=mesh, axes=axes, in_specs=(spec, spec, spec, *extra_specs), out_specs=spec, check_vma=False
    )(q_btnh, k_bskh, v_bskv, *extra)

  return attend


# --- TPU: Pallas splash attention ------------------------------------------------------------

# MaxText's splash block sizes (configs/base.yml, sa_block_* = 512), smaller for shorter
# sequences; the kernel's key blocks must be multiples of the 128 TPU lanes.
SPLASH_BLOCKS = (512, 256, 128)


def splash_block(n: int) -> int | None:
  """The largest block in SPLASH_BLOCKS dividing n, or None (n is not a multiple of 128)."""
  return next((bl for bl in SPLASH_BLOCKS if n % bl == 0), None)


def splash_mask_module():
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask

  return splash_attention_mask


def make_splash_attend(
  mesh: Mesh | None = None, axes: MeshAxes | None = None, *, interpret: bool = False
) -> AttendFn:
  """Splash attention (``make_splash_mha``, a causal ``MultiHeadMask``, [B, N, T, H] layout).

  GQA as MaxText feeds it: k and v keep their K heads ([K, S, H] per batch element) and the
  kernel maps each group of N / K query heads onto its kv head itself, so nothing is repeated.
  The kernel is built per device shard (inside the shard_map), for the local heads, so its mask
  metadata needs no sharding of its own. Its residuals (output and log-sum-exp) carry the
  ``context`` checkpoint name, as in MaxText (``residual_checkpoint_name="context"``).
  ``interpret=True`` runs the kernel in Pallas' interpreter (for CPU tests). A windowed layer's
  mask is splash's ``LocalMask`` (sliding: ``window_size=(W - 1, 0)``, the causal band of W
  keys) or ``ChunkedCausalMask`` (chunked), whose empty blocks the kernel skips; ``softcap`` is
  its ``attn_logits_soft_cap``; ``sinks`` (GPT-OSS's one logit per query head) are the kernel's
  own ``sinks``, which join every row's softmax denominator, with their gradient.
  """

  def local(
    q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True, local=None, softcap=None,
    sinks=None,
  ) -> jax.Array:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    t, n, h = q_btnh.shape[1:]
    s = k_bskh.shape[1]
    bq, bkv = splash_block(t), splash_block(s)
    if bq is None or bkv is None:
      raise JaxmemError(f"splash attention needs sequence lengths that are multiples of 128, got {t} and {s}")
    # Query t sits at key position t + (S - T), as in dot_attend.
    head_mask = sm.CausalMask((t, s), offset=s - t) if causal else sm.FullMask((t, s))
    if local is not None and local.chunked:
      head_mask = sm.ChunkedCausalMask((t, s), chunk_size=local.window)
    elif local is not None:
      head_mask = sm.LocalMask((t, s), window_size=(local.window - 1, 0 if causal else None), offset=s - t)
    sizes = sk.BlockSizes(
      block_q=bq, block_kv=bkv, block_kv_compute=bkv,
      block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
      block_q_dq=bq, block_kv_dq=bkv,
    )
    kernel = sk.make_splash_mha(
      sm.MultiHeadMask([head_mask] * n), block_sizes=sizes, head_shards=1, q_seq_shards=1,
      residual_checkpoint_name=CONTEXT, interpret=interpret, attn_logits_soft_cap=softcap,
    )
    q_bnth = jnp.swapaxes(q_btnh * jnp.asarray(1.0 / math.sqrt(h), q_btnh.dtype), 1, 2)
    run = kernel if sinks is None else functools.partial(kernel, sinks=sinks.astype(jnp.float32))
    out_bntv = jax.vmap(run)(q_bnth, jnp.swapaxes(k_bskh, 1, 2), jnp.swapaxes(v_bskv, 1, 2))
    return jnp.swapaxes(out_bntv, 1, 2).astype(v_bskv.dtype)

  return over_mesh(local, mesh, axes, name="splash")


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
  mesh: Mesh | None = None, axes: MeshAxes | None = None, *, implementation: str = "cudnn"
) -> AttendFn:
  """``jax.nn.dot_product_attention(implementation="cudnn")`` in the model's [B, T, N, H] layout.

  cuDNN takes grouped kv heads as they are (N a multiple of K). ``implementation="xla"`` runs
  the same call through XLA's reference path, which is how CPU tests check this wrapper's
  layout, scale and grouping without a GPU. A sliding window is cuDNN's
  ``local_window_size=(W - 1, 0)``; chunked windows, soft-capping and attention sinks it does not
  take (refused by the registry's support check, and here).
  """

  def local(
    q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True, local=None, softcap=None,
    sinks=None,
  ) -> jax.Array:
    if softcap is not None or (local is not None and local.chunked) or sinks is not None:
      raise JaxmemError(
        "cudnn attention takes neither soft-capping, chunked windows nor attention sinks; use chunked or dot"
      )
    scale = 1.0 / math.sqrt(q_btnh.shape[-1])
    window = None if local is None else (local.window - 1, 0)
    out_btnv = jax.nn.dot_product_attention(
      q_btnh, k_bskh, v_bskv, scale=scale, is_causal=causal, implementation=implementation,
      local_window_size=window,
    )
    return out_btnv.astype(v_bskv.dtype)

  return over_mesh(local, mesh, axes, name="cudnn")


# --- GPU: Pallas Triton flash attention ------------------------------------------------------

# The kernel's default block sizes (BlockSizes.get_default(): 128 forward, 32 backward); its
# sequence lengths must be multiples of the blocks it uses, and Triton blocks are powers of 2.
TRITON_BLOCK = 128


def make_triton_attend(
  mesh: Mesh | None = None, axes: MeshAxes | None = None, *, interpret: bool = False
) -> AttendFn:
  """Pallas Triton ``mha`` ([B, T, N, H] layout, q, k and v with the same head count and size).

  The kernel indexes k and v by the query head, so grouped kv heads are repeated to N heads
  first (a [B, S, N, H] copy of each, per device). ``interpret=True`` runs it in Pallas'
  interpreter (for CPU tests). Windows, soft-capping and attention sinks it does not take
  (refused by the registry's support check, and here).
  """

  def local(q_btnh: jax.Array, k_bskh: jax.Array, v_bskv: jax.Array, *, causal: bool = True, **layer) -> jax.Array:
    if any(layer.get(f) is not None for f in ("local", "softcap", "sinks")):
      raise JaxmemError("triton attention takes neither windows, soft-capping nor attention sinks; use chunked or dot")
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

  return over_mesh(local, mesh, axes, name="triton")


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

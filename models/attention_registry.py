"""Which attention implementation a train step uses: the registry and the ``auto`` choice.

Names (what ``--attention`` will take):

  dot       plain einsums, the full T x S scores (:func:`~.attention_ops.dot_attend`); the
            reference and the naive baseline. Scores in the compute dtype by default (MaxText's
            ``float32_qk_product=False``), float32 with ``qk_dtype="float32"``.
  chunked   pure-JAX blockwise online softmax with a FlashAttention-2-style backward
            (:func:`~.attention_ops.chunked_attend`); every backend.
  splash    Pallas splash attention, TPU.
  cudnn     cuDNN flash attention (``jax.nn.dot_product_attention``), GPU.
  triton    Pallas Triton flash attention, GPU.
  auto      the kernel a production trainer uses on the platform (MaxText's defaults: splash
            on TPU, cuDNN on GPU; chunked on CPU), or chunked, with a note saying why, where
            that kernel cannot take the shapes or the mesh.

``qk_dtype`` applies to ``dot`` only: the fused kernels and ``chunked`` keep their block scores
in float32 whatever it says (they never materialise the scores, so it does not change memory).

An implementation named explicitly that cannot run is a :class:`JaxmemError` naming those that
can; it is never replaced silently.

Each implementation is one :class:`AttentionImpl` entry in :data:`IMPLEMENTATIONS`: its
platforms, whether it is a fused kernel, its FLOPs accounting (:mod:`.attention_flops`;
:func:`kernel_flops`, registered in :mod:`jaxmem.kernels`, is what ``jaxmem.compiler.flops``
reads), its constraints and its notes. What
the library and the CLI say about implementations (``--attention``'s help,
:func:`attention_help`; the errors of :func:`get_attention` and :func:`choose_attention`; which
rows carry the kernel FLOPs note) is read from there, so adding one is adding its entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, ContextManager

import jax.numpy as jnp
from jax.sharding import Mesh

from jaxmem.errors import JaxmemError
from jaxmem.kernels import register_kernel_flops
from jaxmem.registry import publish

from . import attention_flops as kflops
from . import attention_kernels as kernels
from . import context_attention as ctx
from .attention_ops import AttendFn, chunked_attend, dot_attend
from .config import ModelConfig
from .mesh_axes import MeshAxes, require

PLATFORMS: tuple[str, ...] = ("cpu", "gpu", "tpu")
# platform -> the implementation ``auto`` prefers there.
AUTO_PREFERENCE: dict[str, str] = {"tpu": "splash", "gpu": "cudnn", "cpu": "chunked"}
AUTO = "auto"
FALLBACK = "chunked"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionShapes:
  """One attention call's global shapes: what a support check needs to know."""

  batch: int
  seq: int  # T, query positions
  kv_seq: int  # S, key positions (== seq in training and in prefill)
  num_heads: int  # N
  num_kv_heads: int  # K, divides N
  head_dim: int  # H, of q and k
  v_head_dim: int  # V, of v (== H except in multi-head latent attention)
  dtype: str  # the compute dtype of q, k, v, e.g. "bfloat16"
  causal: bool = True
  # Per-layer features of the model (any layer's): a window (sliding, or chunked), soft-capping,
  # attention sinks (GPT-OSS's one logit per query head in every softmax denominator).
  window: int | None = None
  window_chunked: bool = False
  softcap: float | None = None
  sinks: bool = False

  @classmethod
  def of(cls, cfg: ModelConfig, *, batch: int, seq: int) -> AttentionShapes:
    """The self-attention of ``cfg`` in a train step (or prefill) of batch x seq tokens.
    Multi-head latent attention hands ``attend`` q/k heads of ``head_dim`` (nope + rope) and v
    heads of ``v_head_dim`` (mla.py)."""
    return cls(
      batch=batch, seq=seq, kv_seq=seq, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, v_head_dim=cfg.v_head_dim if cfg.is_mla else cfg.head_dim, dtype=cfg.dtype,
      window=cfg.sliding_window, window_chunked=cfg.window_chunked, softcap=cfg.attn_softcap,
      sinks=cfg.attention_sinks,
    )


# --- support checks: the reason an implementation cannot take (platform, shapes, mesh) ------


def _splash_problem(shapes: AttentionShapes) -> str | None:
  if shapes.window_chunked and shapes.window is not None and not hasattr(kernels.splash_mask_module(), "ChunkedCausalMask"):
    return "this jax's splash attention has no chunked mask"
  for what, n in (("sequence", shapes.seq), ("key sequence", shapes.kv_seq)):
    if kernels.splash_block(n) is None:
      return f"splash needs a {what} length that is a multiple of 128 (its blocks are 128 lanes wide), got {n}"
  if jnp.dtype(shapes.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)):
    return f"splash takes bfloat16 or float32 inputs, got {shapes.dtype}"
  return None


# Head sizes cuDNN's fused attention takes as jax checks them when tracing
# (fused_attention_stablehlo.check_is_flash_attention): <= 128 and a multiple of 8 unless the
# default backend is a Hopper-or-later GPU, which a deviceless compile's CPU backend is not; for
# the same reason it refuses multi-head latent attention (V != H) without a GPU attached.
_CUDNN_MAX_HEAD_DIM = 128


def _cudnn_problem(shapes: AttentionShapes) -> str | None:
  if jnp.dtype(shapes.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return f"cudnn takes bfloat16 or float16 inputs, got {shapes.dtype}"
  h = shapes.head_dim
  if h > _CUDNN_MAX_HEAD_DIM or h % 8:
    return f"cudnn (as jax checks it without a Hopper GPU attached) needs a head size <= 128 and a multiple of 8, got {h}"
  if shapes.v_head_dim != h:
    return f"cudnn takes a v head size ({shapes.v_head_dim}) unlike the q/k one ({h}) only on an attached Hopper GPU"
  if shapes.causal and shapes.seq != shapes.kv_seq:
    return "cudnn's causal mask is aligned at the first key, so it needs as many queries as keys"
  if shapes.seq % 2 or shapes.kv_seq % 2:  # check_is_flash_attention refuses odd ones in a train step (prefill alike here)
    return f"cudnn (as jax checks it for a train step) needs even sequence lengths, got {shapes.seq}"
  if shapes.softcap is not None:
    return "cudnn does not soft-cap attention logits"
  if shapes.window is not None and shapes.window_chunked:
    return "cudnn takes a sliding window, not a chunked one"
  if shapes.sinks:  # jax.nn.dot_product_attention has no sink argument (jax 0.10.2 to 0.12)
    return "jax's cuDNN fused attention takes no attention sinks"
  if kernels.cudnn_version() is None:
    return "cuDNN is not installed (it is needed to trace the call, even without a GPU): pip install 'jaxmem[cuda]'"
  return None


# Above this head size the kernel's default blocks need more shared memory than an H100 has
# (measured: head size 256 asks for 320 KiB of 227 KiB).
_TRITON_MAX_HEAD_DIM = 128


def _triton_problem(shapes: AttentionShapes) -> str | None:
  if shapes.window is not None or shapes.softcap is not None:
    return "triton's kernel takes neither windows nor soft-capping"
  if shapes.sinks:  # pallas.ops.gpu.attention.mha has no sink argument
    return "jax's Pallas Triton attention takes no attention sinks"
  if shapes.head_dim > _TRITON_MAX_HEAD_DIM:
    return f"triton's blocks at a head size over {_TRITON_MAX_HEAD_DIM} exceed a GPU's shared memory, got {shapes.head_dim}"
  for what, n in (("sequence", shapes.seq), ("key sequence", shapes.kv_seq)):
    if n % kernels.TRITON_BLOCK:
      return f"triton needs a {what} length that is a multiple of {kernels.TRITON_BLOCK}, got {n}"
  if shapes.v_head_dim != shapes.head_dim:
    return f"triton needs equal q/k and v head sizes, got {shapes.head_dim} and {shapes.v_head_dim}"
  if shapes.causal and shapes.seq != shapes.kv_seq:
    return "triton's causal mask is aligned at the first key, so it needs as many queries as keys"
  return None


# --- the registry ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionImpl:
  """One named way of computing attention: everything jaxmem knows about it, in one place.

  ``platforms`` it compiles for; ``fused``: a fused kernel, i.e. a custom call XLA can neither
  partition (so it runs under ``shard_map``, over the mesh axes a :class:`~.mesh_axes.MeshAxes`
  gives, and is refused on meshes it cannot shard) nor look into (so its FLOPs are counted per
  call from its shapes by ``kernel_flops``, :mod:`.attention_flops`, and a row using it says so);
  its constraints are ``shape_problem(shapes)`` (None, or why it cannot take them) and, when
  fused, :func:`~.attention_kernels.mesh_problem`. ``make(mesh=, axes=, qk_dtype=, interpret=)``
  builds the :data:`AttendFn`. ``deviceless_notes(shapes)`` are what a row using it must say (e.g.
  cuDNN's missing workspace) when compiled without the device; ``lowering(mesh)`` the context a
  program using it is lowered in (Triton's GPU, :func:`~.attention_kernels.triton_lowering`).
  """

  name: str
  platforms: tuple[str, ...]
  summary: str
  shape_problem: Callable[[AttentionShapes], str | None]
  factory: Callable[..., AttendFn]
  fused: bool
  # One jaxpr equation's FLOPs if it is this kernel's call, else None (fused kernels only).
  kernel_flops: Callable[[Any], float | None] | None = None
  deviceless_notes: Callable[[AttentionShapes], tuple[str, ...]] = lambda shapes: ()
  # The context a program using it is lowered in, given the train step's Mesh (or None).
  lowering: Callable[[Mesh | None], ContextManager[None]] = lambda mesh: contextlib.nullcontext()

  def supports(self, platform: str, shapes: AttentionShapes, *, axes: MeshAxes | None = None) -> str | None:
    """None when this implementation compiles for ``platform`` at ``shapes`` on the mesh
    ``axes`` describes (None: one device), else the reason it does not, as one clause."""
    if platform not in self.platforms:
      return f"{self.name} runs on {' and '.join(p.upper() for p in self.platforms)} targets, not {platform.upper()}"
    problem = self.shape_problem(shapes)
    if problem is None and self.fused:
      problem = kernels.mesh_problem(self.name, axes, num_heads=shapes.num_heads, num_kv_heads=shapes.num_kv_heads)
    return problem

  def make(
    self, *, mesh: Mesh | None = None, axes: MeshAxes | None = None, qk_dtype: str | None = None,
    interpret: bool = False,
  ) -> AttendFn:
    return self.factory(mesh=mesh, axes=axes, qk_dtype=qk_dtype, interpret=interpret)


def _make_dot(*, mesh, axes, qk_dtype, interpret) -> AttendFn:
  del mesh, axes, interpret  # XLA partitions einsums itself
  return dot_attend if qk_dtype is None else functools.partial(dot_attend, scores_dtype=jnp.dtype(qk_dtype))


def _make_chunked(*, mesh, axes, qk_dtype, interpret) -> AttendFn:
  del mesh, axes, qk_dtype, interpret  # pure JAX: XLA partitions it; its scores are always float32
  return chunked_attend


def _no_problem(shapes: AttentionShapes) -> None:
  del shapes


def _cudnn_notes(shapes: AttentionShapes) -> tuple[str, ...]:
  del shapes
  return (kernels.CUDNN_WORKSPACE_NOTE,)


def _triton_notes(shapes: AttentionShapes) -> tuple[str, ...]:
  if shapes.num_kv_heads == shapes.num_heads:
    return ()
  return ("attention triton: the kernel takes one kv head per query head, so k and v are repeated to all heads",)


IMPLEMENTATIONS: dict[str, AttentionImpl] = {
  impl.name: impl
  for impl in (
    AttentionImpl(
      name="dot", platforms=PLATFORMS, summary="einsum attention materialising the T x S scores",
      shape_problem=_no_problem, factory=_make_dot, fused=False,
    ),
    AttentionImpl(
      name="chunked", platforms=PLATFORMS,
      summary="pure-JAX blockwise online softmax, FlashAttention-2-style backward",
      shape_problem=_no_problem, factory=_make_chunked, fused=False,
    ),
    AttentionImpl(
      name="splash", platforms=("tpu",), summary="Pallas splash attention (TPU)",
      shape_problem=_splash_problem,
      factory=lambda *, mesh, axes, qk_dtype, interpret: kernels.make_splash_attend(mesh, axes, interpret=interpret),
      fused=True, kernel_flops=kflops.splash_flops,
    ),
    AttentionImpl(
      name="cudnn", platforms=("gpu",), summary="cuDNN flash attention via jax.nn.dot_product_attention (GPU)",
      shape_problem=_cudnn_problem,
      factory=lambda *, mesh, axes, qk_dtype, interpret: kernels.make_cudnn_attend(mesh, axes),
      fused=True, kernel_flops=kflops.cudnn_flops, deviceless_notes=_cudnn_notes,
    ),
    AttentionImpl(
      name="triton", platforms=("gpu",), summary="Pallas Triton flash attention (GPU)",
      shape_problem=_triton_problem,
      factory=lambda *, mesh, axes, qk_dtype, interpret: kernels.make_triton_attend(mesh, axes, interpret=interpret),
      fused=True, kernel_flops=kflops.triton_flops, deviceless_notes=_triton_notes,
      lowering=kernels.triton_lowering,
    ),
  )
}
ATTENTION_NAMES: tuple[str, ...] = publish("attention", (AUTO, *IMPLEMENTATIONS))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionChoice:
  """What a row reports: the implementation used (``name``, never "auto") and why."""

  requested: str  # what was asked for: "auto" or an implementation name
  name: str  # the implementation used
  attend: AttendFn
  notes: tuple[str, ...] = ()  # why auto fell back; what the figures leave out
  mesh: Mesh | None = None
  # How attention crosses a context-sharded sequence (context_attention.STRATEGIES); None when
  # the mesh has no context axis over the sequence.
  strategy: str | None = None

  def lowering(self) -> ContextManager[None]:
    """The context to lower (``jit(...).lower``) a program that uses ``attend`` in: the
    Triton kernel must learn its GPU there (:func:`~.attention_kernels.triton_lowering`)."""
    return IMPLEMENTATIONS[self.name].lowering(self.mesh)


def get_attention(name: str) -> AttentionImpl:
  """The registry entry ``name``; an unknown name is a :class:`JaxmemError` listing the valid ones."""
  if name not in IMPLEMENTATIONS:
    raise JaxmemError(f"unknown attention {name!r}; valid: {', '.join(ATTENTION_NAMES)}")
  return IMPLEMENTATIONS[name]


@register_kernel_flops
def kernel_flops(eqn: Any) -> float | None:
  """The FLOPs of jaxpr equation ``eqn`` if it is a fused kernel's call (by that entry's
  ``kernel_flops``), else None. Registered with :mod:`jaxmem.kernels`, where the compiler's FLOP
  counter finds it."""
  for impl in IMPLEMENTATIONS.values():
    flops = None if impl.kernel_flops is None else impl.kernel_flops(eqn)
    if flops is not None:
      return flops
  return None


def attention_help() -> str:
  """What ``--attention`` takes, from the registry: auto's kernel per platform, then the names."""
  prefs = ", ".join(f"{name} on {platform.upper()}" for platform, name in AUTO_PREFERENCE.items())
  return (
    f"attention implementations, comma separated: {AUTO} (the target's production kernel: {prefs}), "
    f"{', '.join(IMPLEMENTATIONS)}; default {AUTO}"
  )


def context_sharded(axes: MeshAxes | None) -> bool:
  """Whether the mesh splits the sequence over a ``context`` axis (the context strategies apply)."""
  return axes is not None and "context" in axes.seq


def choose_attention(
  requested: str = AUTO,
  *,
  platform: str,
  shapes: AttentionShapes,
  mesh: Mesh | None = None,
  axes: MeshAxes | None = None,
  qk_dtype: str | None = None,
  deviceless: bool = True,
  interpret: bool = False,
  strategy: str | None = None,
) -> AttentionChoice:
  """The implementation for ``requested`` on ``platform`` ("cpu", "gpu", "tpu") at ``shapes``
  on the mesh ``axes`` describes (``jaxmem.program.sharding.mesh_axes``; None: one device).
  ``mesh``, the train step's Mesh, is what a kernel's shard_map is built on; it needs its
  ``axes``. ``axes`` alone answers the support checks (the kernel is then built unsharded).

  ``auto`` takes :data:`AUTO_PREFERENCE`'s kernel, or ``chunked`` with a note when that kernel
  cannot take the shapes or the mesh. A name given explicitly that cannot run raises a
  :class:`JaxmemError` naming the implementations that can. ``deviceless``: the program is
  compiled without the device, so notes about what such a compile leaves out apply.

  On a mesh whose ``context`` axis splits the sequence, attention runs under ``strategy``
  (:data:`~.context_attention.STRATEGIES`, default ``all_gather``) with the chosen kernel on
  each shard (:func:`_choose_context`).

  Call it after JAX has started its backends (the CUDA plugin loads cuDNN then), i.e. once
  the target's devices exist.
  """
  if mesh is not None:
    axes = require(axes, mesh, "choose_attention")
  if context_sharded(axes):
    return _choose_context(requested, platform=platform, shapes=shapes, mesh=mesh, axes=axes,
                           strategy=strategy or ctx.DEFAULT_STRATEGY, deviceless=deviceless, interpret=interpret)
  notes: list[str] = []
  if requested == AUTO:
    name = AUTO_PREFERENCE.get(platform, FALLBACK)
    reason = IMPLEMENTATIONS[name].supports(platform, shapes, axes=axes)
    if reason is not None:
      notes.append(f"attention auto: {reason}; using {FALLBACK}")
      name = FALLBACK
  else:
    name = get_attention(requested).name
    reason = IMPLEMENTATIONS[name].supports(platform, shapes, axes=axes)
    if reason is not None:
      able = [n for n, impl in IMPLEMENTATIONS.items() if impl.supports(platform, shapes, axes=axes) is None]
      raise JaxmemError(f"attention {name!r} cannot be used here: {reason}; use one of {', '.join([AUTO, *able])}")
  impl = IMPLEMENTATIONS[name]
  if deviceless:
    notes.extend(impl.deviceless_notes(shapes))
  attend = impl.make(mesh=mesh, axes=axes, qk_dtype=qk_dtype, interpret=interpret)
  return AttentionChoice(requested=requested, name=name, attend=attend, notes=tuple(notes), mesh=mesh)


def _context_problem(name: str, platform: str, shapes: AttentionShapes, axes: MeshAxes, strategy: str) -> str | None:
  """Why kernel ``name`` cannot serve ``strategy`` on this platform, shapes and mesh, or None."""
  impl = get_attention(name)
  if platform not in impl.platforms:
    return impl.supports(platform, shapes)
  problem = ctx.strategy_problem(strategy, name, tuple(n for n, i in IMPLEMENTATIONS.items() if platform in i.platforms))
  if problem is None and name != "dot":
    problem = impl.shape_problem(shapes)
  if problem is None and name == "splash":
    try:
      ctx.check_seq(shapes.seq, axes.ways("seq"), strategy, name)
    except JaxmemError as e:
      problem = str(e)
  if problem is None:
    tp = axes.ways("heads")
    if shapes.num_heads % tp or shapes.num_kv_heads % tp:
      problem = (f"context strategy {strategy} runs per device on whole heads, and {axes.describe('heads')} does not "
                 f"divide {shapes.num_heads} query heads and {shapes.num_kv_heads} kv heads")
  return problem


# How all_gather runs cuDNN (context_attention._cudnn_all_gather), and what its FLOPs count.
CUDNN_ALL_GATHER_NOTE = (
  "attention cudnn under context strategy all_gather: each query chunk is cuDNN calls over the keys before it "
  "(mask-free, by a padding length into the gathered keys) and over its own chunk (causal), merged by their "
  "log-sum-exps; the backward pass adds two calls a part for the log-sum-exp's cotangent, which jax's cuDNN VJP "
  "drops. FLOPs count each padded call whole (the padding length is known only at run time): attention's "
  "forward FLOPs are overstated, about 3n/(2n-1) x over n context shards"
)


def _choose_context(requested, *, platform, shapes, mesh, axes, strategy, deviceless, interpret) -> AttentionChoice:
  """:func:`choose_attention` on a context-sharded mesh: the kernel each shard runs under
  ``strategy``; ``auto`` falls back to ``chunked`` (with a note) where the platform's kernel
  cannot serve the strategy. The sequence must split into the strategy's chunks."""
  if strategy not in ctx.STRATEGIES:
    raise JaxmemError(f"unknown context strategy {strategy!r}; valid: {', '.join(ctx.STRATEGIES)}")
  if shapes.window is not None or shapes.softcap is not None or shapes.sinks:
    raise JaxmemError(
      "a context axis with local attention, soft-capping or attention sinks is not built (the context strategies "
      "pass no window, soft-cap or sinks); drop the context axis"
    )
  notes: list[str] = []
  if requested == AUTO:
    name = AUTO_PREFERENCE.get(platform, FALLBACK)
    reason = _context_problem(name, platform, shapes, axes, strategy)
    if reason is not None:
      notes.append(f"attention auto: {reason}; using {FALLBACK}")
      name = FALLBACK
  else:
    name = get_attention(requested).name
    reason = _context_problem(name, platform, shapes, axes, strategy)
    if reason is not None:
      able = [n for n in IMPLEMENTATIONS if _context_problem(n, platform, shapes, axes, strategy) is None]
      raise JaxmemError(f"attention {name!r} cannot be used here: {reason}; use one of {', '.join([AUTO, *able])}")
  ctx.check_seq(shapes.seq, axes.ways("seq"), strategy, name)
  if name == "dot":
    notes.append(f"attention dot under context strategy {strategy}: scores in float32 (qk_dtype applies without a context axis)")
  if name == "cudnn":
    notes.append(CUDNN_ALL_GATHER_NOTE)
  if deviceless:
    notes.extend(IMPLEMENTATIONS[name].deviceless_notes(shapes))
  attend = ctx.ContextAttend(strategy, name, mesh, axes, interpret=interpret) if mesh is not None else dot_attend
  return AttentionChoice(requested=requested, name=name, attend=attend, notes=tuple(notes), mesh=mesh, strategy=strategy)

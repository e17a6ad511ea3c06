"""Attention across a context-sharded sequence: the all_gather and ring
strategies against plain ``dot`` attention on 8 simulated CPU devices, their communication, the
sweep axis, the sequence steps of ``fit --over seq`` and the one-line refusals.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from jaxmem.hardware.targets import get_target
from jaxmem.errors import JaxmemError
from jaxmem.hlo.comms import collectives
from jaxmem.models import choose_attention, get_config
from jaxmem.models import context_attention as ctx
from jaxmem.models.attention_ops import dot_attend
from jaxmem.models.attention_registry import AttentionShapes
from jaxmem.planning.fit import MAX_STEPS, seq_step
from jaxmem.resolve import plan
from jaxmem.program import sharding as shd
from jaxmem.program.remat import parse_remat

B, T, N, K, H = 1, 128, 4, 2, 16  # 8 context shards of 16 positions: two chunks of 8 each


def _mesh(shape: dict[str, int]) -> Mesh:
  return Mesh(np.array(jax.devices("cpu")[:8]).reshape(tuple(shape.values())), tuple(shape))


def _inputs(t: int = T, n: int = N, k: int = K, h: int = H):
  ks = jax.random.split(jax.random.key(0), 4)
  return [jax.random.normal(kk, shape) for kk, shape in zip(ks, [(B, t, n, h), (B, t, k, h), (B, t, k, h), (B, t, n, h)])]


def _reference(ways: int):
  """dot attention in natural order, taking and giving the load-balanced storage order."""
  pos = ctx.load_balanced_positions(T, ways)
  inv = np.argsort(pos)

  def ref(q, k, v):
    return dot_attend(q[:, inv], k[:, inv], v[:, inv], scores_dtype=jnp.float32)[:, pos]

  return ref


@pytest.mark.parametrize("strategy,kernel,mesh", [
    ("all_gather", "chunked", {"context": 8}),
    ("all_gather", "dot", {"context": 8}),
    ("ring", "chunked", {"context": 8}),
    ("ring", "chunked", {"tensor": 2, "context": 4}),  # heads split too: each device its heads' ring
])
def test_forward_and_gradients_equal_dot(strategy, kernel, mesh):
  jmesh = _mesh(mesh)
  attend = ctx.ContextAttend(strategy, kernel, jmesh, shd.mesh_axes(jmesh))
  ref = _reference(attend.ways)
  q, k, v, w = _inputs()
  np.testing.assert_allclose(jax.jit(attend)(q, k, v), ref(q, k, v), atol=2e-5)
  loss = lambda f: lambda *a: (f(*a) * w).sum()  # noqa: E731
  got = jax.jit(jax.grad(loss(attend), argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, atol=2e-5)


@pytest.mark.parametrize("mesh", [
    {"context": 8},
    pytest.param({"tensor": 2, "context": 4}, marks=pytest.mark.slow),  # heads split too
    pytest.param({"sequence": 2, "context": 4}, marks=pytest.mark.slow),  # the sequence over two axes
])
def test_cudnn_under_all_gather_merges_parts_to_equal_dot(mesh):
  # The cuDNN path's parts (keys before each chunk by a padding length, the chunk's own causal
  # diagonal) through XLA's reference implementation of the same call: the merge and the custom
  # VJP (the log-sum-exp's cotangent cuDNN's VJP drops) are what is checked; device 0's front
  # chunk has no keys before it (an empty part).
  jmesh = _mesh(mesh)
  attend = ctx.ContextAttend("all_gather", "cudnn", jmesh, shd.mesh_axes(jmesh), fused_implementation="xla")
  ref = _reference(attend.ways)
  q, k, v, w = _inputs()
  np.testing.assert_allclose(jax.jit(attend)(q, k, v), ref(q, k, v), atol=2e-5)
  loss = lambda f: lambda *a: (f(*a) * w).sum()  # noqa: E731
  got = jax.jit(jax.grad(loss(attend), argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, atol=2e-5)


@pytest.mark.slow  # Pallas' interpreter: ~20 s on 2 cores
def test_splash_under_all_gather_equals_dot():
  t = 512  # two chunks of 128 (splash's lanes) on each of 2 devices
  jmesh = Mesh(np.array(jax.devices("cpu")[:2]), ("context",))
  attend = ctx.ContextAttend("all_gather", "splash", jmesh, shd.mesh_axes(jmesh), interpret=True)
  q, k, v, w = _inputs(t=t, n=2, k=1, h=128)
  pos = ctx.load_balanced_positions(t, 2)
  inv = np.argsort(pos)
  ref = lambda q, k, v: dot_attend(q[:, inv], k[:, inv], v[:, inv], scores_dtype=jnp.float32)[:, pos]  # noqa: E731
  np.testing.assert_allclose(jax.jit(attend)(q, k, v), ref(q, k, v), atol=2e-5)
  got = jax.jit(jax.grad(lambda *a: (attend(*a) * w).sum(), argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(lambda *a: (ref(*a) * w).sum(), argnums=(0, 1, 2))(q, k, v)
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, atol=5e-5)


def test_load_balanced_layout_gives_every_device_equal_causal_work():
  n, t = 8, 1024
  pos = ctx.load_balanced_positions(t, n)
  assert sorted(pos.tolist()) == list(range(t))
  work = (pos + 1).reshape(n, -1).sum(axis=1)  # keys each device's queries see
  assert work.min() == work.max()
  contiguous = (np.arange(t) + 1).reshape(n, -1).sum(axis=1)
  assert contiguous.max() > 10 * contiguous.min()  # what the reorder avoids


@pytest.fixture(scope="module")
def comms():
  """Each strategy's attention (forward and backward) compiled over context=8: its collectives."""
  jmesh = _mesh({"context": 8})
  q, k, v, w = _inputs(t=256, n=2, k=2, h=32)
  out = {}
  for strategy in ctx.STRATEGIES:
    attend = ctx.ContextAttend(strategy, "chunked", jmesh, shd.mesh_axes(jmesh))
    step = jax.jit(jax.grad(lambda q, k, v: (attend(q, k, v) * w).sum(), argnums=(0, 1, 2)))
    out[strategy] = collectives(step.lower(q, k, v).compile()).bytes_by_kind
  kv_bytes = 2 * k.size * k.dtype.itemsize  # K and V, the whole sequence, float32 here
  return out, kv_bytes


def test_ring_passes_key_value_blocks_round_the_ring_in_both_passes(comms):
  by_kind, kv = comms
  n = 8
  ring = by_kind["ring"]
  assert ring["all_gather"] == 0 and ring["reduce_scatter"] == 0  # no full-length K/V anywhere
  # Forward: n - 1 hops of this device's K/V block (1/n of the whole); backward: n - 1 hops again
  # and the K/V gradients (float32) n hops home.
  # (Inputs and travelling gradients are both float32 here, so the gradients weigh kv too.)
  expected = kv * (n - 1) / n * 2 + kv * n / n
  assert ring["collective_permute"] == pytest.approx(expected, rel=0.02)


def test_all_gather_gathers_key_values_and_reduce_scatters_their_gradients(comms):
  by_kind, kv = comms
  n = 8
  ag = by_kind["all_gather"]
  assert ag["collective_permute"] == 0
  assert ag["all_gather"] == pytest.approx(kv * (n - 1) / n, rel=0.02)
  assert ag["reduce_scatter"] == pytest.approx(kv * (n - 1) / n, rel=0.02)
  # The two algorithms' bytes differ as they say: ring moves each block n - 1 times per pass.
  assert by_kind["ring"]["collective_permute"] > ag["all_gather"] + ag["reduce_scatter"]


def test_the_strategy_is_a_sweep_axis_on_context_meshes_only():
  p = plan(model="tiny", target="cpu:8", batch=8, seq=256, remat="none", attention="chunked",
           mesh=["context=8", "fsdp=8"], context_strategy="all_gather,ring")
  tasks = p.tasks()
  assert [(t.workload.mesh[0], t.context_strategy) for t in tasks] == [
      ("context=8", "all_gather"), ("context=8", "ring"), ("fsdp=8", "all_gather")]
  keys = {t.cache_key() for t in tasks}
  assert len(keys) == 3  # the strategy is part of the row cache's key


def test_auto_picks_splash_on_tpu_for_all_gather_and_chunked_for_ring():
  shapes = AttentionShapes.of(get_config("tiny"), batch=1, seq=4096)
  axes = shd.mesh_axes({"context": 8})
  assert choose_attention("auto", platform="tpu", shapes=shapes, axes=axes).name == "splash"
  ring = choose_attention("auto", platform="tpu", shapes=shapes, axes=axes, strategy="ring")
  assert ring.name == "chunked" and ring.strategy == "ring"
  assert any("ring cannot run splash" in note for note in ring.notes)


def test_auto_picks_cudnn_on_gpu_for_all_gather_and_chunked_for_ring():
  shapes = AttentionShapes.of(get_config("tiny"), batch=1, seq=4096)
  axes = shd.mesh_axes({"context": 8})
  from jaxmem.models import attention_kernels as kernels
  from jaxmem.models.attention_registry import CUDNN_ALL_GATHER_NOTE

  if kernels.cudnn_version() is None:
    pytest.skip("cuDNN not installed (the cuda extra's nvidia-cudnn-cu12)")
  fused = choose_attention("auto", platform="gpu", shapes=shapes, axes=axes)
  assert fused.name == "cudnn" and fused.strategy == "all_gather" and CUDNN_ALL_GATHER_NOTE in fused.notes
  ring = choose_attention("auto", platform="gpu", shapes=shapes, axes=axes, strategy="ring")
  assert ring.name == "chunked" and any("ring cannot run cudnn" in note for note in ring.notes)


def test_ring_with_a_kernel_that_cannot_take_it_names_chunked():
  shapes = AttentionShapes.of(get_config("tiny"), batch=1, seq=4096)
  with pytest.raises(JaxmemError) as err:
    choose_attention("splash", platform="tpu", shapes=shapes, axes=shd.mesh_axes({"context": 8}), strategy="ring")
  msg = str(err.value)
  assert "\n" not in msg and "ring cannot run splash" in msg and "use attention chunked" in msg


@pytest.mark.parametrize("seq,kernel,nearest", [(1001, "chunked", 1008), (3000, "splash", 2048), (6000, "splash", 6144)])
def test_a_sequence_the_shards_or_the_kernel_block_cannot_divide_names_the_nearest(seq, kernel, nearest):
  with pytest.raises(JaxmemError) as err:
    ctx.check_seq(seq, 8, "all_gather", kernel)
  msg = str(err.value)
  assert "\n" not in msg and f"seq {seq}" in msg and f"nearest {nearest}" in msg


def test_plan_refuses_a_sequence_the_load_balanced_layout_cannot_split():
  # 8 divides 264 (the context axis's own check), but 2 chunks x 8 shards do not.
  with pytest.raises(JaxmemError, match="nearest 256"):
    plan(model="tiny", target="cpu:8", batch=1, seq=264, mesh="context=8", attention="chunked", remat="none")


def test_offload_on_a_target_without_host_memory_names_the_device_policy():
  with pytest.raises(JaxmemError) as err:
    parse_remat("minimal_offloaded", host_memory=False)
  msg = str(err.value)
  assert "\n" not in msg and "use minimal" in msg
  assert all(not p.needs_host_memory for p in parse_remat("all", host_memory=False))


def test_fit_over_seq_steps_by_the_kernel_block_and_reaches_millions():
  def step_of(mesh, strategy, platform, **options):
    return seq_step(shd.parse_mesh(mesh), {"attention": "auto", "context_strategy": strategy, **options}, platform)

  assert step_of("context=16,tensor=8", "all_gather", "tpu") == 4096  # 2 x 16 x 128
  assert step_of("context=16,tensor=8", "ring", "tpu") == 2048  # 128 x 16 (chunked)
  step = step_of("context=8", "all_gather", "gpu", vocab_tiles=16)
  assert step == 1024 and 1 << 20 == step * 1024  # 1M is a power-of-two number of steps
  assert MAX_STEPS * step >= 1 << 24  # the doubling's ceiling is far above a million tokens


@pytest.mark.slow  # ~30 s on 2 shared cores; tests/test_mesh_axes.py traces the same path (context cases)
def test_the_model_in_load_balanced_order_computes_the_natural_loss():
  """tiny's loss over tokens stored load balanced, with ring attention and the positions it
  gives, equals the loss over the natural order with dot attention: RoPE reads the natural
  positions and the mask compares them."""
  from flax import nnx

  from jaxmem.models import Transformer

  cfg = get_config("tiny")
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  jmesh = _mesh({"context": 8})
  attend = ctx.ContextAttend("ring", "chunked", jmesh, shd.mesh_axes(jmesh))
  t = 32  # two chunks of 2 positions on each of 8 devices
  tokens = jax.random.randint(jax.random.key(1), (1, t + 1), 0, cfg.vocab_size)
  x, y = tokens[:, :-1], tokens[:, 1:]
  pos = attend.positions(t)
  natural = jax.jit(lambda x, y: model.loss(x, y, attend=lambda *a, **k: dot_attend(*a, **k, scores_dtype=jnp.float32)))(x, y)
  stored = jax.jit(lambda x, y: model.loss(x, y, attend=attend))(x[:, pos], y[:, pos])
  np.testing.assert_allclose(stored, natural, rtol=2e-3)


def test_an_unknown_strategy_is_one_line_naming_the_valid_ones():
  with pytest.raises(JaxmemError, match=r"unknown `context_strategy` 'zigzag'; valid: all_gather, ring$"):
    plan(model="tiny", target="cpu:8", batch=1, seq=256, mesh="context=8", context_strategy="zigzag", remat="none")


@pytest.mark.slow  # a deviceless GPU compile of the forward and backward, ~30 s on 2 shared cores
@pytest.mark.needs_gpu_compiler("a800")
def test_cudnn_under_all_gather_compiles_to_cudnn_calls_for_gpu():
  from jax.sharding import NamedSharding, PartitionSpec

  from jaxmem.hardware.targets import target

  jmesh = target("gpu:a800x8").mesh({"context": 8})
  attend = ctx.ContextAttend("all_gather", "cudnn", jmesh, shd.mesh_axes(jmesh))
  seq_sharded = NamedSharding(jmesh, PartitionSpec(None, "context"))
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=seq_sharded) for s in [(1, 2048, 4, 64), (1, 2048, 2, 64), (1, 2048, 2, 64)]]
  step = jax.jit(jax.grad(lambda q, k, v: attend(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
  text = step.lower(*args).compile().as_text()
  # Front chunk: 2 parts, back chunk: 3; each forward once, and backward per part: a recomputed
  # forward and its backward, a forward with the keys as values and its backward.
  assert text.count('custom_call_target="__cudnn$fmhaSoftmax"') >= 5
  assert "__cudnn$fmhaSoftmaxBackward" in text

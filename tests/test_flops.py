"""FLOPs counted from the jaxpr see every scanned layer; XLA's cost analysis sees one."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import jaxmem
from jaxmem.compiler.flops import jaxpr_flops


def _scan(ws, x):
  def body(x, w):
    return x @ w, None

  return jax.lax.scan(body, x, ws)[0]


def test_matmul_flops_exact():
  a = jax.ShapeDtypeStruct((32, 64), jnp.float32)
  b = jax.ShapeDtypeStruct((64, 16), jnp.float32)
  assert jaxpr_flops(jax.make_jaxpr(jnp.matmul)(a, b).jaxpr) == 2 * 32 * 64 * 16


def test_batched_dot_flops():
  a = jax.ShapeDtypeStruct((4, 8, 16), jnp.float32)
  b = jax.ShapeDtypeStruct((4, 16, 2), jnp.float32)
  f = lambda a, b: jnp.einsum("bij,bjk->bik", a, b)  # noqa: E731
  assert jaxpr_flops(jax.make_jaxpr(f)(a, b).jaxpr) == 2 * 4 * 8 * 16 * 2


def test_scan_multiplies_by_length_where_cost_analysis_does_not():
  x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
  one = jaxmem.analyze(_scan, jax.ShapeDtypeStruct((1, 128, 128), jnp.float32), x)
  ten = jaxmem.analyze(_scan, jax.ShapeDtypeStruct((10, 128, 128), jnp.float32), x)
  assert ten.flops == 10 * one.flops == 10 * 2 * 8 * 128 * 128
  # The reason jaxmem counts for itself: XLA counts a loop body once.
  assert ten.compiler_flops < 2 * one.compiler_flops


def test_flops_are_per_device():
  # Replicated, every device runs the whole step; with the batch split four ways, a quarter.
  w = jax.ShapeDtypeStruct((128, 128), jnp.float32)
  x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
  one = jaxmem.analyze(jnp.matmul, x, w)
  replicated = jaxmem.analyze(jnp.matmul, x, w, target="cpu:4")
  mesh = jaxmem.target("cpu:4").mesh({"batch": 4})
  split = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, PartitionSpec("batch")))
  sharded = jaxmem.analyze(jnp.matmul, split, w, target="cpu:4")
  assert one.flops == 2 * 64 * 128 * 128
  assert replicated.flops == pytest.approx(one.flops, rel=0.05)
  assert sharded.flops == pytest.approx(one.flops / 4, rel=0.05)


def test_per_device_flops_of_a_scanned_step():
  # The share comes from the compiled program, the layer count from the jaxpr: a scanned step
  # split four ways runs about a quarter of all its layers' FLOPs on each device.
  def step(ws, x):
    return jax.grad(lambda ws: (_scan(ws, x) ** 2).sum())(ws)

  ws = jax.ShapeDtypeStruct((6, 128, 128), jnp.float32)
  x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
  one = jaxmem.analyze(step, ws, x)
  mesh = jaxmem.target("cpu:4").mesh({"batch": 4})
  split = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, PartitionSpec("batch")))
  sharded = jaxmem.analyze(step, ws, split, target="cpu:4")
  assert sharded.flops == pytest.approx(one.flops / 4, rel=0.05)
  assert sharded.flops > 4 * sharded.compiler_flops  # the compiler's own count sees one layer of six


# --- what the jaxpr cannot see into: shard_map bodies and fused attention kernels ---------------


def test_shard_map_body_counts_once_per_device():
  import numpy as np
  from jax.sharding import Mesh, PartitionSpec as P

  mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("data",))
  a = jax.ShapeDtypeStruct((32, 64), jnp.float32)
  b = jax.ShapeDtypeStruct((64, 16), jnp.float32)
  local = jax.shard_map(jnp.matmul, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))
  # The body multiplies [8, 64] shards on each of 4 devices: the whole product, as unsharded.
  assert jaxpr_flops(jax.make_jaxpr(local)(a, b).jaxpr) == 2 * 32 * 64 * 16


def _attention_grad_flops(name, b=2, t=512, n=4, k=2, h=64):
  from jaxmem.models import AttentionShapes, choose_attention

  platform = {"splash": "tpu", "cudnn": "gpu", "triton": "gpu"}.get(name, "cpu")
  shapes = AttentionShapes(batch=b, seq=t, kv_seq=t, num_heads=n, num_kv_heads=k, head_dim=h, v_head_dim=h, dtype="bfloat16")
  attend = choose_attention(name, platform=platform, shapes=shapes).attend
  q = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((b, t, k, h), jnp.bfloat16)
  f = jax.grad(lambda q, k, v: attend(q, k, v, causal=True).astype(jnp.float32).sum(), argnums=(0, 1, 2))
  return jaxpr_flops(jax.make_jaxpr(f)(q, kv, kv).jaxpr), 2.0 * b * n * t * t * h  # one T x S product


# Matrix products per kernel call, in units of one T x S x H product, halved for the causal
# mask (FlashAttention-2's accounting): forward q k^T and p v (2), then splash's dq kernel (3)
# and dk/dv kernel (4), Triton's one backward kernel (the same 7), cuDNN's backward (5).
@pytest.mark.parametrize("name,products", [("splash", 2 + 3 + 4), ("triton", 2 + 7), ("cudnn", 2 + 5)])
def test_attention_kernels_count_their_products_once_per_call(name, products):
  if name == "cudnn":
    from jaxmem.models.attention_kernels import cudnn_version

    if cudnn_version() is None:
      pytest.skip("cuDNN not installed (the cuda extra): needed to trace")
  flops, one_product = _attention_grad_flops(name)
  # The kernels' products, and the elementwise ops around them (scaling q, casts, the sum)
  # within 1%: not 0 (cuDNN's custom call) and not one grid step (a Pallas body).
  assert flops == pytest.approx(products * one_product / 2, rel=0.01), flops / one_product


def test_dot_counts_every_product_of_the_full_scores():
  dot, one_product = _attention_grad_flops("dot")
  # q k^T and p v forward; dp, dv, dq and dk backward: six full products, plus the softmax.
  assert 6 * one_product < dot < 7 * one_product


def test_a_registered_kernel_counter_is_what_the_counter_asks(monkeypatch):
  from jaxmem import kernels
  from jaxmem.models import attention_registry

  # The models register their attention kernels' counter; the compiler's counter imports neither.
  assert attention_registry.kernel_flops in kernels._COUNTERS
  x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
  jaxpr = jax.make_jaxpr(jnp.sin)(x).jaxpr
  assert jaxpr_flops(jaxpr) == 64  # elementwise: one per output element
  monkeypatch.setattr(kernels, "_COUNTERS", [])
  kernels.register_kernel_flops(lambda eqn: 1000.0 if eqn.primitive.name == "sin" else None)
  assert jaxpr_flops(jaxpr) == 1000.0
  assert jaxpr_flops(jaxpr, kernels=False) == 0.0  # a kernel's count, left out as XLA's analysis does


def test_dilated_convolution_positions_are_counted_in_closed_form():
  """The outputs of a base-dilated window that read an input element (a convolution's gradient
  reads its input through holes), counted by a linear congruence: the same as visiting every
  output, and fast where the dimension is a large batch."""
  import itertools

  from jaxmem.hlo.ops import _on_grid

  def visited(start, stride, dilation, size, output):
    return sum(1 for o in range(output)
               if (u := start + o * stride) >= 0 and u % dilation == 0 and u // dilation < size)

  for start, stride, dilation, size, output in itertools.product(
      range(-13, 14, 3), (1, 2, 3, 4, 6), (2, 3, 4, 5, 8), (1, 2, 7, 16), (1, 5, 17, 40)):
    assert _on_grid(start, stride, dilation, size, output) == visited(start, stride, dilation, size, output)
  assert _on_grid(0, 1, 2, 10**9, 2 * 10**9) == 10**9  # a billion outputs, not visited one by one

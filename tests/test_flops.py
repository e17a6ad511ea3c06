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

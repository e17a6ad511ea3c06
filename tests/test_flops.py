"""FLOPs counted from the jaxpr see every scanned layer; XLA's cost analysis sees one."""

import jax
import jax.numpy as jnp

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
  w = jax.ShapeDtypeStruct((128, 128), jnp.float32)
  one = jaxmem.analyze(jnp.matmul, w, w)
  four = jaxmem.analyze(jnp.matmul, w, w, target="cpu:4")
  assert four.flops * 4 == one.flops

"""The dropless experts' grouped-matmul kernel (``moe_kernel``): megablox's ``gmm`` against
``jax.lax.ragged_dot`` in Pallas's interpreter, its FLOP counter, the choice per target, and the
option's one-line refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.cli import main
from jaxmem.compiler.flops import GMM_FLOPS_NOTE, jaxpr_flops
from jaxmem.errors import JaxmemError
from jaxmem.models import choose_moe_kernel
from jaxmem.models.moe import dropless_experts
from jaxmem.models.layers import no_constraint
from jaxmem.models.moe_kernels import gmm, gmm_flops, ragged_dot
from jaxmem.planning.sweep import compare
from jaxmem.resolve import plan
from jaxmem.workload import Workload

MOE = dict(model="tiny-moe", remat="none", batch=8, seq=16)


def normal(shape, seed: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def test_gmm_in_the_interpreter_matches_ragged_dot_forward_and_gradients():
  # 600 rows: above megablox's 512-row tile, so they are padded to 1024 and cut back; an empty
  # group and uneven sizes exercise the kernel's group metadata.
  m, k, n = 600, 64, 32
  sizes = jnp.array([100, 0, 150, 50, 120, 80, 60, 40], jnp.int32)
  x, w = normal((m, k), 0), 0.1 * normal((8, k, n), 1)
  interpret = lambda x, w, s: gmm(x, w, s, interpret=True)  # noqa: E731
  np.testing.assert_allclose(interpret(x, w, sizes), ragged_dot(x, w, sizes), atol=1e-4, rtol=1e-4)

  def loss(fn):
    return lambda x, w: (fn(x, w, sizes) ** 2).sum()

  got = jax.grad(loss(interpret), argnums=(0, 1))(x, w)
  want = jax.grad(loss(ragged_dot), argnums=(0, 1))(x, w)
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])  # gelu_tanh: Gemma 4's experts
def test_dropless_layer_through_gmm_matches_ragged_dot(act):
  b, t, d, f, e, k = 2, 8, 64, 32, 8, 2
  x = normal((b, t, d), 2)
  weights = jax.nn.softmax(normal((b, t, k), 3), axis=-1)
  experts = jnp.asarray(np.random.default_rng(4).choice(e, size=(b, t, k)), jnp.int32)
  ws = [0.1 * normal(s, i) for i, s in enumerate([(e, d, f), (e, d, f), (e, f, d)], start=5)]

  def layer(matmul):
    return lambda x, *w: dropless_experts(x, weights, experts, *w, constrain=no_constraint, matmul=matmul, act=act).sum()

  kern = lambda a, w, s: gmm(a, w, s, interpret=True)  # noqa: E731
  np.testing.assert_allclose(layer(kern)(x, *ws), layer(ragged_dot)(x, *ws), rtol=1e-5)
  got = jax.grad(layer(kern), argnums=(0, 1, 2, 3))(x, *ws)
  want = jax.grad(layer(ragged_dot), argnums=(0, 1, 2, 3))(x, *ws)
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


def test_gmm_calls_count_two_m_k_n_each_forward_and_backward():
  m, k, n = 256, 64, 32
  sizes = jnp.full((8,), m // 8, jnp.int32)
  x, w = jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((8, k, n), jnp.float32)
  fwd = jax.make_jaxpr(lambda x, w: gmm(x, w, sizes))(x, w).jaxpr
  step = jax.make_jaxpr(jax.grad(lambda x, w: gmm(x, w, sizes).sum(), argnums=(0, 1)))(x, w).jaxpr
  one = 2.0 * m * k * n
  # The forward gmm, then the backward's transposed gmm and tgmm: three of the same size.
  assert jaxpr_flops(fwd, matmuls_only=True) == one
  assert jaxpr_flops(step, matmuls_only=True) == 3 * one
  assert jaxpr_flops(step, kernels=False, matmuls_only=True) == 0
  assert gmm_flops(fwd.eqns[0]) is None or gmm_flops(fwd.eqns[0]) == one  # a jit around the call: not the kernel


def test_auto_is_gmm_on_tpu_and_ragged_dot_elsewhere():
  assert choose_moe_kernel("auto", "tpu") == "gmm"
  assert choose_moe_kernel(None, "gpu") == choose_moe_kernel("auto", "cpu") == "ragged_dot"
  assert choose_moe_kernel("ragged_dot", "tpu") == "ragged_dot"
  with pytest.raises(JaxmemError, match="Mosaic TPU kernel"):
    choose_moe_kernel("gmm", "gpu")


def test_the_kernel_is_a_task_axis_in_the_cache_key():
  p = plan(Workload(**MOE, target="tpu:v5e-1", moe_kernel="auto,ragged_dot"))
  tasks = p.tasks()
  assert [t.workload.moe_kernel for t in tasks] == [("auto",), ("ragged_dot",)]
  assert len({t.cache_key() for t in tasks}) == 2


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(model="tiny", moe_kernel="ragged_dot"), "no experts"),
        (dict(moe_kernel="gmm"), "Mosaic TPU kernel"),
        (dict(moe_kernel="ragged_dot", moe_impl="capacity"), "applies to `moe_impl` dropless"),
    ],
)
def test_a_kernel_that_would_change_nothing_or_cannot_compile_is_one_line(fields, match):
  with pytest.raises(JaxmemError, match=match) as err:
    plan(Workload(**{**MOE, **fields}, target="cpu"))
  assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "tiny-moe", "--moe-kernel", "foo"], ("unknown --moe-kernel 'foo'", "ragged_dot")),
        (["--model", "tiny", "--moe-kernel", "ragged_dot"], ("no experts",)),
    ],
)
def test_cli_refuses_a_bad_kernel_in_one_line(argv, words, capsys):
  assert main(["compare", "--target", "cpu", "--batch", "2", "--seq", "16", *argv]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and all(w in err for w in words), err


@pytest.mark.needs_tpu_compiler
def test_tpu_dropless_runs_megablox_and_its_flops_stay_near_the_models():
  rows = compare(model="tiny-moe", remat="none", batch=8, seq=64, target="tpu:v5e-1", moe_kernel="auto,ragged_dot")
  auto, plain = rows
  assert (auto.moe_kernel, plain.moe_kernel) == ("gmm", "ragged_dot")
  assert auto.error is None and plain.error is None
  # The kernel's calls are counted (2*m*k*n each), so the step's FLOPs sit just above the model's
  # 6*N*T (the padding, the router, the elementwise work); uncounted, they would fall below it.
  assert 1.0 < auto.flops / auto.model_flops < 2.0
  assert GMM_FLOPS_NOTE in auto.notes and GMM_FLOPS_NOTE not in plain.notes

"""jaxmem.testing: a team's memory gate in its own tests (the helpers used as a team would)."""

import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.testing import assert_fits, assert_memory_below


def step(w, x):
  return jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)


W = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
X = jax.ShapeDtypeStruct((256, 1024), jnp.float32)


def test_memory_below_passes_under_the_limit_and_fails_past_it():
  report = assert_memory_below(step, W, X, limit="64MiB")
  # The figure it gated on, as a limit: passes at exactly it, fails a byte below.
  required = report.total_bytes
  assert assert_memory_below(step, W, X, limit=required).total_bytes == required
  with pytest.raises(AssertionError, match="the step needs"):
    assert_memory_below(step, W, X, limit=required - 1)


@pytest.mark.needs_tpu_compiler
def test_fits_a_tpu_with_a_margin_and_fails_when_a_resident_program_leaves_too_little():
  report = assert_fits(step, W, X, target="tpu:v5e-1", margin=0.5)
  need = min(report.peak_memory_in_bytes, report.total_bytes)
  capacity = jaxmem.target("tpu:v5e-1").capacity_bytes
  # Another program holding all but half of what the step needs: refused, by jaxmem or by libtpu.
  with pytest.raises(AssertionError):
    assert_fits(step, W, X, target="tpu:v5e-1", resident=capacity - need // 2)

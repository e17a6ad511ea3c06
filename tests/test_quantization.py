"""fp8 training as MaxText's ``quantization=fp8_full`` runs it (``--quantization``): the layers'
projections in float8_e4m3fn with e5m2 gradients (models/fp8.py), swept like any axis, compiled on
the targets with an fp8 matmul and refused in one line elsewhere; the step-time walk times a
matmul of two fp8 operands at the part's fp8 rate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.axes import labels
from jaxmem.errors import JaxmemError
from jaxmem.hardware.targets import get_target, target_peaks
from jaxmem.maxtext import table
from jaxmem.models.fp8 import FIXED_RANGE, fp8_einsum
from jaxmem.resolve import plan
from jaxmem.workload import Workload

SPEC = "btd,dnh->btnh"  # an attention projection's


def _operands(seed=0):
  kx, kw = jax.random.split(jax.random.key(seed))
  return jax.random.normal(kx, (2, 8, 32), jnp.bfloat16), 0.1 * jax.random.normal(kw, (32, 4, 16), jnp.bfloat16)


def test_the_fp8_einsum_is_the_einsum_to_fp8_precision_and_so_are_its_gradients():
  x, w = _operands()
  loss = lambda f: lambda a, b: jnp.sum(f(SPEC, a, b).astype(jnp.float32) ** 2)  # noqa: E731
  exact, got = loss(jnp.einsum)(x, w), loss(fp8_einsum)(x, w)
  assert got != exact and abs(got - exact) < 0.05 * abs(exact)  # quantized, not a plain einsum
  for g, e in zip(jax.grad(loss(fp8_einsum), (0, 1))(x, w), jax.grad(loss(jnp.einsum), (0, 1))(x, w)):
    assert g.dtype == e.dtype and g.shape == e.shape
    assert float(jnp.max(jnp.abs(g - e))) < 0.15 * float(jnp.max(jnp.abs(e)))


def test_a_gradient_is_clipped_where_its_operand_left_the_fixed_range():
  """qwix's clip_gradient_to_calibration: an input outside [-224, 224] gets no gradient."""
  x, w = _operands()
  x = x.at[0, 0, 0].set(2 * FIXED_RANGE)
  dx = jax.grad(lambda a: jnp.sum(fp8_einsum(SPEC, a, w).astype(jnp.float32)))(x)
  assert dx[0, 0, 0] == 0 and jnp.all(dx[0, 0, 1:] != 0)


def test_the_forward_and_both_gradient_matmuls_take_fp8_operands():
  x, w = _operands()
  f = jax.grad(lambda a, b: jnp.sum(fp8_einsum(SPEC, a, b).astype(jnp.float32) ** 2), (0, 1))
  text = jax.jit(f).lower(x, w).as_text()
  dots = [line for line in text.splitlines() if "dot_general" in line]
  assert sum("f8E4M3FN" in d and "f8E5M2" not in d for d in dots) == 1  # forward: e4m3fn x e4m3fn
  assert sum("f8E5M2" in d and "f8E4M3FN" in d for d in dots) == 2  # dx and dw: e5m2 gradient x e4m3fn


def test_the_axis_sweeps_and_refuses_an_unknown_value_in_one_line():
  assert Workload(model="tiny", quantization="none,fp8_full").quantization == ("none", "fp8_full")
  assert Workload(model="tiny").quantization == ("none",)
  with pytest.raises(JaxmemError, match=r"unknown `quantization` 'fp8'; valid: none, fp8_full$") as e:
    plan(model="tiny", target="tpu:v5p-8", batch=8, seq=64, remat="none", quantization="none,fp8")
  assert "\n" not in str(e.value)


@pytest.mark.parametrize(("target", "why"), [
    ("tpu:v5e-8", "TPU v5e publishes no fp8 matrix rate"),
    ("tpu:v6e-8", "TPU v6e publishes no fp8 matrix rate"),
    ("gpu:a100-80gb", "publishes no fp8 matrix rate"),
    ("cpu", "no published peak figures"),
])
def test_a_target_without_an_fp8_matmul_is_refused_in_one_line(target, why):
  with pytest.raises(JaxmemError, match=r"`quantization` fp8_full needs fp8 matmuls") as e:
    plan(model="tiny", target=target, batch=8, seq=64, remat="none", quantization="none,fp8_full")
  assert why in str(e.value) and "\n" not in str(e.value)
  plan(model="tiny", target=target, batch=8, seq=64, remat="none", quantization="none")  # the bf16 twin plans


@pytest.mark.parametrize("model", ["tiny-moe", "tiny-mla"])
def test_a_model_whose_layers_bring_their_own_matmuls_is_refused(model):
  with pytest.raises(JaxmemError, match=r"`quantization` fp8_full is built for dense attention and MLP projections"):
    plan(model=model, target="tpu:v7x-8", batch=8, seq=64, remat="none", quantization="fp8_full")


def test_the_fp8_rate_is_the_parts_where_it_has_one():
  rates = {name: target_peaks(get_target(name))[0] for name in ("tpu:v7x-8", "tpu:v5p-8", "tpu:v5e-8", "gpu:h100")}
  assert rates["tpu:v7x-8"].peak_fp8_flops == 2 * rates["tpu:v7x-8"].peak_flops  # 4614 vs 2307 TFLOP/s a chip
  assert rates["tpu:v5p-8"].peak_fp8_flops == rates["tpu:v5p-8"].peak_flops  # 459 both
  assert rates["tpu:v5e-8"].peak_fp8_flops is None  # its 8-bit figure is int8
  assert rates["gpu:h100"].peak_fp8_flops > rates["gpu:h100"].peak_flops


def _matmul_seconds(target: str, f) -> float:
  x = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
  return jaxmem.op_times(jaxmem.analyze(f, x, x, target=target), target).compute_time_s


@pytest.mark.needs_tpu_compiler
def test_the_walk_times_an_fp8_matmul_at_the_fp8_rate():
  """The same matmul, its operands in fp8: half the matrix time on v7x (fp8 twice bf16), not less
  on v5p (fp8 at the bf16 rate)."""
  bf16 = lambda a, b: jnp.einsum("td,df->tf", a, b)  # noqa: E731
  fp8 = lambda a, b: fp8_einsum("td,df->tf", a, b)  # noqa: E731
  v7x = _matmul_seconds("tpu:v7x-2", fp8) / _matmul_seconds("tpu:v7x-2", bf16)
  v5p = _matmul_seconds("tpu:v5p-2", fp8) / _matmul_seconds("tpu:v5p-2", bf16)
  assert v7x == pytest.approx(0.5, rel=0.05)
  assert v5p >= 0.95


@pytest.fixture(scope="module")
def v7x_rows():
  return jaxmem.compare(model="tiny", target="tpu:v7x-8", remat="none", quantization="none,fp8_full", batch=8, seq=128)


@pytest.mark.needs_tpu_compiler
def test_the_fp8_row_and_its_bf16_twin_compile_with_the_same_parameters(v7x_rows):
  bf16, fp8 = v7x_rows
  assert (bf16.quantization, fp8.quantization) == ("none", "fp8_full")
  assert bf16.error is None and fp8.error is None
  # The parameters and the optimizer's state are the step's own: fp8 is how the matmuls run.
  assert (fp8.param_bytes, fp8.optimizer_state_bytes) == (bf16.param_bytes, bf16.optimizer_state_bytes)
  # The backward keeps each projection's operands twice, as qwix does (the fp8 copy for the
  # gradient matmuls, the original for the gradient's clipping): more temporaries, not fewer.
  assert fp8.temp_size_in_bytes > bf16.temp_size_in_bytes
  assert "quantization fp8_full" in labels(fp8) and not labels(bf16)


@pytest.mark.needs_gpu_compiler
def test_the_fp8_row_compiles_on_an_h100():
  (row,) = jaxmem.compare(model="tiny", target="gpu:h100", remat="none", quantization="fp8_full", batch=8, seq=128)
  assert row.quantization == "fp8_full" and row.error is None and row.step_time_s > 0


def test_maxtext_spells_fp8_full_as_the_recipes_do():
  written = table.row("quantization").write("fp8_full", table.At())
  assert written == {"quantization": "fp8_full", "use_qwix_quantization": True,
                     "weight_quantization_calibration_method": "fixed,-224,224",
                     "act_quantization_calibration_method": "fixed,-224,224"}
  assert table.row("quantization").write(None, table.At()) == {}  # none: MaxText's own ("")


def test_the_roofline_bound_times_the_fp8_share_at_the_fp8_peak():
  """So the bound stays below an fp8 step, which the walk times at the fp8 rate."""
  from jaxmem.steptime.roofline import roofline

  peaks = target_peaks(get_target("tpu:v7x-8"))[0]
  bound = lambda fp8: roofline(flops=1e12, bytes_accessed=None, comm_bytes=None, num_devices=1, peaks=peaks,  # noqa: E731
                               floor_flops=None, notes=[], fp8_flops=fp8).roofline_compute_time_s
  assert bound(0.0) == 1e12 / peaks.peak_flops
  assert bound(1e12) == 1e12 / peaks.peak_fp8_flops < bound(0.0)
  assert bound(0.0) > bound(0.5e12) > bound(1e12)
